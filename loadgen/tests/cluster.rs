//! End-to-end runs of `forkbox-loadgen` against a real redis-server and real `forkbox worker`
//! nodes: the counts in the report, the kill-worker fault mode, and the simulated hosts'
//! clean-up. No test asserts a throughput or latency figure.
//!
//! The worker binary is found as the load generator finds it (`FORKBOX_BIN`, else the
//! workspace's `target/{release,debug}/forkbox`). Where there is none, or it has no `worker`
//! subcommand, the tests print `SKIPPED:` and return, unless `FORKBOX_LOADGEN_REQUIRE_WORKER`
//! is set (CI sets it after building the worker), in which case they fail.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use forkbox_loadgen::report::Report;
use forkbox_testkit::RedisServer;

fn forkbox_worker() -> Option<PathBuf> {
    let reason = match forkbox_loadgen::cluster::forkbox_bin() {
        None => {
            "no forkbox binary (build it: cargo build -p forkbox, or set FORKBOX_BIN)".to_owned()
        }
        Some(bin) => {
            let ok = Command::new(&bin)
                .args(["worker", "--help"])
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return Some(bin);
            }
            format!("{} has no `worker` subcommand", bin.display())
        }
    };
    if std::env::var_os("FORKBOX_LOADGEN_REQUIRE_WORKER").is_some() {
        panic!("{reason}");
    }
    forkbox_testkit::skipped(reason);
    None
}

fn loadgen(args: &[&str], bin: &Path) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_forkbox-loadgen"))
        .args(args)
        .arg("--quiet")
        .env("FORKBOX_BIN", bin)
        .output()
        .expect("running forkbox-loadgen");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    out
}

/// A finished run against a test Redis of its own.
struct Run {
    out: Output,
    report: Report,
    /// Holds report.md and the plots.
    dir: tempfile::TempDir,
}

/// [`loadgen`] with `args` and a report directory; the load generator starts its own Redis
/// unless `args` name one.
fn run_with_report(args: &[&str], bin: &Path) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let mut all = args.to_vec();
    all.extend(["--report", dir.path().to_str().unwrap()]);
    let out = loadgen(&all, bin);
    let report = read_report(dir.path());
    Run { out, report, dir }
}

/// [`run_with_report`] on `queue` of a fresh test Redis.
fn run_on_test_redis(queue: &str, args: &[&str], bin: &Path) -> Run {
    let redis = RedisServer::start().expect("redis-server");
    let url = redis.url();
    run_with_report(&[&["--redis", &url, "--queue", queue], args].concat(), bin)
}

fn read_report(dir: &Path) -> Report {
    let text = std::fs::read_to_string(dir.join("report.json")).expect("report.json written");
    serde_json::from_str(&text).expect("report.json parses")
}

#[test]
fn five_hundred_jobs_two_workers_every_result_counted() {
    let Some(bin) = forkbox_worker() else { return };
    // One job in five exits 3: statuses must be counted, not just `ok`.
    let input = tempfile::tempdir().unwrap();
    let jobs = input.path().join("fail.jsonl");
    std::fs::write(&jobs, "{\"cmd\":\"exit 3\"}\n").unwrap();
    let mix = format!("noop:4,jsonl:{}:1", jobs.display());
    let args = [
        "--jobs",
        "500",
        "--concurrency",
        "16",
        "--mix",
        &mix,
        "--spawn-workers",
        "2",
        "--slots",
        "2",
    ];
    let Run {
        out,
        report: r,
        dir,
    } = run_on_test_redis("lg500", &args, &bin);
    assert!(out.status.success(), "exit status {}", out.status);
    assert_eq!(r.enqueued, 500);
    assert_eq!(r.completed, 500);
    assert_eq!(r.lost, 0);
    assert_eq!(r.duplicated, 0);
    assert_eq!(r.by_status.get("ok"), Some(&400), "{:?}", r.by_status);
    assert_eq!(r.by_status.get("failed"), Some(&100), "{:?}", r.by_status);
    assert_eq!(r.by_status.values().sum::<u64>(), 500);
    assert_eq!(r.unexpected, 0);
    assert_eq!(r.latency_ms.count, 500 - r.late_results);
    assert!(r.latency_ms.p50 <= r.latency_ms.p99 && r.latency_ms.p99 <= r.latency_ms.max);
    assert_eq!(r.parameters["jobs"], 500);
    for file in ["report.md", "latency.svg", "throughput.svg"] {
        assert!(dir.path().join(file).is_file(), "{file}");
    }
}

#[test]
fn killing_a_worker_mid_run_loses_no_job() {
    let Some(bin) = forkbox_worker() else { return };
    let args = [
        "--jobs",
        "200",
        "--concurrency",
        "8",
        // Jobs long enough that the killed worker holds some when it dies.
        "--mix",
        "noop:1,sleep:200ms:1",
        "--spawn-workers",
        "2",
        "--slots",
        "2",
        "--kill-worker-at",
        "30%",
        "--visibility-timeout-ms",
        "1500",
    ];
    let Run { out, report: r, .. } = run_on_test_redis("lgkill", &args, &bin);
    assert_eq!(r.faults.len(), 1, "{:?}", r.faults);
    assert_eq!(r.lost, 0);
    assert_eq!(r.duplicated, 0);
    assert_eq!(r.completed, 200);
    assert!(out.status.success(), "exit status {}", out.status);
}

#[test]
fn simulated_hosts_are_removed_after_the_run() {
    if let Err(reason) = forkbox_loadgen::netns::available() {
        forkbox_testkit::skipped(format!("ip netns is unavailable here: {reason}"));
        return;
    }
    let Some(bin) = forkbox_worker() else { return };
    let dir = tempfile::tempdir().unwrap();
    let run = format!("t{:05}", std::process::id() % 100_000);
    let out = loadgen(
        &[
            "--jobs",
            "100",
            "--spawn-workers",
            "2",
            "--hosts",
            "2",
            "--run-id",
            &run,
            "--report",
            dir.path().to_str().unwrap(),
        ],
        &bin,
    );
    let r = read_report(dir.path());
    assert_eq!(r.completed, 100);
    assert_eq!(r.lost, 0);
    assert_eq!(r.parameters["hosts"], 2);
    assert!(out.status.success(), "exit status {}", out.status);
    let left = forkbox_loadgen::netns::leftovers(&run);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_closed_loop_with_no_worker_left_ends_and_counts_its_jobs_lost() {
    // Nobody reads the queue: without the stall check the closed loop waited forever for a
    // result that frees a slot.
    let redis = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_forkbox-loadgen"))
        .args([
            "--redis",
            &redis.url(),
            "--queue",
            "lgstall",
            "--jobs",
            "50",
        ])
        .args(["--concurrency", "4", "--drain-timeout", "1", "--quiet"])
        .arg("--report")
        .arg(dir.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running forkbox-loadgen");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("forkbox-loadgen still waiting after 60 s with no worker");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    eprintln!("{stderr}");
    assert!(!status.success(), "lost jobs must fail the run");
    assert!(stderr.contains("no result for"), "{stderr}");
    let r = read_report(dir.path());
    assert_eq!((r.enqueued, r.completed, r.lost), (4, 0, 4));
}

#[test]
fn a_backlog_is_enqueued_whole_before_the_workers_drain_it() {
    let Some(bin) = forkbox_worker() else { return };
    let args = [
        "--jobs",
        "300",
        "--backlog",
        "--spawn-workers",
        "1",
        "--slots",
        "2",
    ];
    let Run {
        out,
        report: r,
        dir,
    } = run_on_test_redis("lgbacklog", &args, &bin);
    assert!(out.status.success(), "exit status {}", out.status);
    assert!(String::from_utf8_lossy(&out.stderr).contains("300 jobs enqueued; workers started"));
    assert_eq!(
        (r.enqueued, r.completed, r.lost, r.duplicated),
        (300, 300, 0, 0)
    );
    assert_eq!(r.by_status.get("ok"), Some(&300), "{:?}", r.by_status);
    let phase = &r.phases[0];
    assert_eq!(phase.load["mode"], "backlog");
    // The worker started only once the whole backlog was in the queue.
    assert_eq!(phase.workers_started_after, Some(300));
    assert_eq!(phase.sent_before_first_result, Some(300));
    assert!(r.throughput_jobs_per_s > 0.0);
    let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(
        md.contains("Backlog of 300 jobs: the spawned workers started once 300 were in the queue"),
        "{md}"
    );
}

/// Starts a 60 s run of two workers in two simulated hosts, waits until its workers serve,
/// sends it `interrupts` SIGINTs, and returns its exit status and stderr.
fn interrupted_run(run: &str, queue: &str, interrupts: usize, bin: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_forkbox-loadgen"))
        .args(["--duration", "60", "--spawn-workers", "2", "--hosts", "2"])
        .args(["--run-id", run, "--queue", queue, "--quiet"])
        .env("FORKBOX_BIN", bin)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running forkbox-loadgen");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while workers_serving(queue) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the workers never started"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "forkbox-loadgen exited early"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Let jobs flow through the simulated network before the interrupt.
    std::thread::sleep(std::time::Duration::from_secs(2));
    for _ in 0..interrupts {
        let sent = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("{stderr}");
    (out.status.code(), stderr)
}

/// Worker processes serving `queue`.
fn workers_serving(queue: &str) -> usize {
    let out = Command::new("pgrep")
        .args(["-f", &format!("forkbox worker .*--queues {queue} ")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[test]
fn interrupting_a_run_leaves_no_host_link_or_worker_behind() {
    if let Err(reason) = forkbox_loadgen::netns::available() {
        forkbox_testkit::skipped(format!("ip netns is unavailable here: {reason}"));
        return;
    }
    let Some(bin) = forkbox_worker() else { return };
    let tag = std::process::id() % 100_000;
    // Once: sending stops, a partial report is printed, and everything is torn down. Twice: the
    // run is abandoned at once, and the guards still tear everything down.
    for (interrupts, says) in [
        (1, "the run was interrupted"),
        (2, "aborted; no report written"),
    ] {
        let (run, queue) = (
            format!("i{interrupts}{tag:05}"),
            format!("lgint{interrupts}{tag}"),
        );
        let (code, stderr) = interrupted_run(&run, &queue, interrupts, &bin);
        assert_eq!(code, Some(130), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        let left = forkbox_loadgen::netns::leftovers(&run);
        assert!(left.is_empty(), "left behind: {left:?}");
        assert_eq!(workers_serving(&queue), 0);
    }
}

#[test]
fn an_open_loop_sends_on_its_schedule_and_loses_nothing() {
    let Some(bin) = forkbox_worker() else { return };
    let args = ["--rate", "100", "--duration", "2", "--spawn-workers", "1"];
    let Run { out, report: r, .. } = run_on_test_redis("lgopen", &args, &bin);
    assert!(out.status.success(), "exit status {}", out.status);
    assert_eq!(r.phases[0].load["mode"], "open");
    // A fixed schedule: 100 jobs/s for 2 s, whatever the results do.
    assert_eq!((r.enqueued, r.completed, r.lost), (200, 200, 0));
    assert_eq!(r.by_status.get("ok"), Some(&200));
}

#[test]
fn a_ramp_reports_each_step_and_the_highest_sustained_rate() {
    let Some(bin) = forkbox_worker() else { return };
    let args = [
        "--ramp",
        "--ramp-start",
        "40",
        "--ramp-step-secs",
        "1",
        "--ramp-max-steps",
        "2",
        "--spawn-workers",
        "1",
    ];
    let Run {
        out,
        report: r,
        dir,
    } = run_on_test_redis("lgramp", &args, &bin);
    assert!(out.status.success(), "exit status {}", out.status);
    let ramp = r.ramp.expect("a ramp section");
    let offered: Vec<f64> = ramp.steps.iter().map(|s| s.offered_jobs_per_s).collect();
    assert!(offered == [40.0, 80.0] || offered == [40.0], "{offered:?}");
    // The highest sustainable rate is the achieved rate of the last step within both bounds.
    let sustained = ramp.steps.iter().take_while(|s| s.sustained).last();
    assert_eq!(
        ramp.max_sustainable_jobs_per_s,
        sustained.map_or(0.0, |s| s.achieved_jobs_per_s)
    );
    assert_eq!(r.lost, 0);
    assert!(dir.path().join("ramp.svg").is_file());
}

#[test]
fn the_humaneval_workload_passes_all_164_problems() {
    let Some(bin) = forkbox_worker() else { return };
    let data = forkbox_loadgen::humaneval::locate(None);
    if !data.is_file() {
        let reason = format!(
            "no HumanEval data at {} (set FORKBOX_HUMANEVAL)",
            data.display()
        );
        assert!(
            std::env::var_os("FORKBOX_LOADGEN_REQUIRE_WORKER").is_none(),
            "{reason}"
        );
        forkbox_testkit::skipped(reason);
        return;
    }
    let data = data.to_str().unwrap();
    let args = [
        "--jobs",
        "164",
        "--mix",
        "humaneval",
        "--humaneval",
        data,
        "--spawn-workers",
        "1",
    ];
    let Run { out, report: r, .. } = run_on_test_redis("lghumaneval", &args, &bin);
    assert!(out.status.success(), "exit status {}", out.status);
    let h = r.humaneval.expect("a HumanEval section");
    assert_eq!((h.sent, h.passed), (164, 164), "{:?}", h.not_passed);
    assert!(h.not_passed.is_empty());
}

#[test]
fn every_hostile_program_is_contained_beside_ordinary_jobs() {
    let Some(bin) = forkbox_worker() else { return };
    // One of each of the four hostile programs among twelve noop jobs.
    let args = [
        "--jobs",
        "16",
        "--mix",
        "noop:3,hostile:1",
        "--concurrency",
        "4",
        "--spawn-workers",
        "1",
    ];
    let Run { out, report: r, .. } = run_on_test_redis("lghostile", &args, &bin);
    assert!(out.status.success(), "exit status {}", out.status);
    assert_eq!((r.completed, r.lost, r.unexpected), (16, 0, 0));
    let h = r.hostile.expect("a hostile section");
    let names: Vec<&str> = h.programs.keys().map(String::as_str).collect();
    assert_eq!(names, ["flood", "forkbomb", "loop", "memorybomb"]);
    for (name, p) in &h.programs {
        assert_eq!((p.sent, p.contained), (1, 1), "{name}: {p:?}");
    }
    assert_eq!(h.programs["loop"].by_status.get("timeout"), Some(&1));
    assert_eq!(h.programs["flood"].by_status.get("output_limit"), Some(&1));
    // Every ordinary job's latency is counted on one side or the other.
    assert_eq!(
        h.others_beside_hostile_ms.count + h.others_apart_ms.count,
        12
    );
}

#[test]
fn restarting_redis_mid_run_loses_no_job() {
    let Some(bin) = forkbox_worker() else { return };
    // The load generator's own Redis (with an append-only file), killed and restarted at half.
    let args = [
        "--jobs",
        "300",
        "--concurrency",
        "8",
        "--spawn-workers",
        "2",
    ];
    let Run { out, report: r, .. } =
        run_with_report(&[&args[..], &["--restart-redis-at", "50%"]].concat(), &bin);
    assert_eq!(r.faults.len(), 1, "{:?}", r.faults);
    assert_eq!(
        r.faults[0].fault,
        forkbox_loadgen::driver::Fault::RestartRedis
    );
    assert_eq!((r.completed, r.lost, r.duplicated), (300, 0, 0));
    assert!(out.status.success(), "exit status {}", out.status);
}

#[test]
fn an_interrupted_backlog_ends_without_waiting_for_its_queue() {
    let Some(bin) = forkbox_worker() else { return };
    let redis = RedisServer::start().expect("redis-server");
    let queue = format!("lgbacklogint{}", std::process::id());
    // Far more jobs than the worker runs before the interrupt.
    let mut child = Command::new(env!("CARGO_BIN_EXE_forkbox-loadgen"))
        .args([
            "--redis",
            &redis.url(),
            "--queue",
            &queue,
            "--jobs",
            "100000",
        ])
        .args(["--backlog", "--spawn-workers", "1", "--quiet"])
        .env("FORKBOX_BIN", &bin)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running forkbox-loadgen");
    let started = std::time::Instant::now();
    while workers_serving(&queue) < 1 {
        assert!(started.elapsed().as_secs() < 60, "the worker never started");
        assert!(
            child.try_wait().unwrap().is_none(),
            "forkbox-loadgen exited early"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let interrupted = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if interrupted.elapsed().as_secs() > 30 {
            // A second Ctrl-C abandons the run, and its guards stop the worker.
            let _ = Command::new("kill").args(["-INT", &pid]).status();
            let _ = child.wait();
            panic!("still draining the backlog 30 s after Ctrl-C");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    eprintln!("{stderr}");
    assert_eq!(status.code(), Some(130));
    assert!(stderr.contains("of the backlog unanswered"), "{stderr}");
    assert_eq!(workers_serving(&queue), 0);
}

/// Runs the load generator (no workers of its own) with a report directory; asserts it exits 1
/// and returns its standard error.
fn failing_run(args: &[&str], report: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_forkbox-loadgen"))
        .args(args)
        .args(["--quiet", "--report"])
        .arg(report)
        .output()
        .expect("running forkbox-loadgen");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    stderr
}

#[test]
fn an_unreachable_redis_fails_the_run_with_its_address_and_no_password() {
    // A port that was free a moment ago: nothing listens on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://:hunter2@127.0.0.1:{port}/0");
    let dir = tempfile::tempdir().unwrap();
    let stderr = failing_run(&["--redis", &url, "--jobs", "10"], dir.path());
    assert!(
        stderr.contains(&format!("cannot reach Redis at 127.0.0.1:{port}")),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
    assert!(!dir.path().join("report.json").exists());
}

#[test]
fn a_queue_nobody_serves_is_named_before_the_run_and_its_jobs_counted_lost() {
    let redis = RedisServer::start().expect("redis-server");
    let url = redis.url();
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--redis",
        &url,
        "--queue",
        "unserved",
        "--jobs",
        "3",
        "--drain-timeout",
        "1",
    ];
    let stderr = failing_run(&args, dir.path());
    assert!(
        stderr.contains("no worker is serving queue unserved"),
        "{stderr}"
    );
    assert!(stderr.contains("no job got a result"), "{stderr}");
    let report = read_report(dir.path());
    assert_eq!((report.completed, report.lost), (0, 3));
}

/// Processes marked as started by load generator `owner_pid`.
fn marked_by(owner_pid: u32) -> Vec<u32> {
    let prefix = format!("{owner_pid}:");
    forkbox_loadgen::orphans::marked_processes()
        .into_iter()
        .filter(|(_, tag)| tag.starts_with(&prefix))
        .map(|(pid, _)| pid)
        .collect()
}

#[test]
fn what_a_load_generator_killed_outright_left_is_removed_by_cleanup() {
    let Some(bin) = forkbox_worker() else { return };
    let hosts = match forkbox_loadgen::netns::available() {
        Ok(()) => true,
        Err(reason) => {
            forkbox_testkit::skipped(format!(
                "the simulated hosts part: ip netns is unavailable here: {reason}"
            ));
            false
        }
    };
    let run = format!("k{:05}", std::process::id() % 100_000);
    let mut args = vec!["--spawn-workers", "2", "--duration", "120", "--rate", "5"];
    args.extend(["--run-id", &run, "--queue", "killed", "--quiet"]);
    if hosts {
        args.extend(["--hosts", "2"]);
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_forkbox-loadgen"))
        .args(&args)
        .env("FORKBOX_BIN", &bin)
        // Its own Redis, whatever the caller's environment names.
        .env_remove("FORKBOX_REDIS")
        .env_remove("FORKBOX_REDIS_URL")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let owner = child.id();
    // Its own redis-server and two workers.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while marked_by(owner).len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the run never started its cluster"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // SIGKILL runs no clean-up: all of it is still there.
    assert!(marked_by(owner).len() >= 3);
    if hosts {
        assert!(!forkbox_loadgen::netns::leftovers(&run).is_empty());
    }
    // Its report goes to the test's output.
    let cleanup = Command::new(env!("CARGO_BIN_EXE_forkbox-loadgen"))
        .arg("--cleanup")
        .status()
        .unwrap();
    assert!(cleanup.success(), "--cleanup exited with {cleanup}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !marked_by(owner).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "still running: {:?}",
            marked_by(owner)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let left = forkbox_loadgen::netns::leftovers(&run);
    assert!(left.is_empty(), "left behind: {left:?}");
    let dirs: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("forkbox-loadgen-{owner}:")))
        .collect();
    assert!(dirs.is_empty(), "left behind: {dirs:?}");
}
