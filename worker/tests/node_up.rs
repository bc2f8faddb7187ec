//! `forkbox up` as a user runs it (a private Redis, a job submitted with `forkbox submit`,
//! Ctrl-C), its `--demo`, and the client commands against a real worker.

mod node_support;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use forkbox_queue::{Job, Status};
use nix::sys::signal::Signal;
use node_support::*;

fn forkbox(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running forkbox")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What `up` prints on standard output once it serves (its last line starts with "Ctrl-C").
fn banner(up: &mut Child) -> String {
    let (tx, rx) = mpsc::channel();
    let stdout = up.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let _ = tx.send(line.unwrap_or_default());
        }
    });
    let mut banner = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !banner.iter().any(|l: &String| l.starts_with("Ctrl-C")) {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).expect("the banner within 60 s");
        banner.push(line);
    }
    banner.join("\n")
}

/// The private Redis's URL, read as the banner says: from the file of its
/// `export FORKBOX_REDIS_URL="$(cat FILE)"` line.
fn private_url(banner: &str) -> String {
    let file = banner
        .lines()
        .find_map(|l| l.trim().strip_prefix("export FORKBOX_REDIS_URL=\"$(cat "))
        .and_then(|rest| rest.strip_suffix(")\""))
        .unwrap_or_else(|| panic!("no FORKBOX_REDIS_URL line in {banner}"));
    std::fs::read_to_string(file).unwrap().trim().to_owned()
}

/// Whether `pid` runs (a zombie waiting to be reaped does not).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(") ")
                .map(|(_, rest)| !rest.starts_with(['Z', 'X']))
        })
        .unwrap_or(false)
}

#[test]
fn a_private_redis_dies_with_up_even_when_up_is_killed_outright() {
    if !std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|d| d.join("setpriv").is_file())
    {
        forkbox_testkit::skipped(
            "no setpriv (util-linux) in PATH to tie redis-server's life to up's",
        );
        return;
    }
    let mut up = Command::new(BIN)
        .args(["up", "--own-redis", "--slots", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    banner(&mut up);
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", up.id()))
        .unwrap_or_default();
    let redis: u32 = children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|p: &u32| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| c.trim() == "redis-server")
        })
        .expect("up's private redis-server among its children");
    // Its data directory, named after `up`, is left (no clean-up runs) until the next start.
    let data = std::fs::read_link(format!("/proc/{redis}/cwd")).unwrap();
    up.kill().unwrap();
    up.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while running(redis) {
        if Instant::now() > deadline {
            let _ = Command::new("kill").arg(redis.to_string()).status();
            panic!("redis-server {redis} outlived up killed with SIGKILL");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(data.is_dir(), "{}", data.display());
    let out = forkbox(&["up", "--own-redis", "--demo", "--slots", "1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!data.exists(), "{} left behind", data.display());
}

#[test]
fn up_runs_a_submitted_job_and_stops_cleanly_on_sigint() {
    // Its own process group, so the test can send SIGINT to the group as a terminal's
    // Ctrl-C does (the private redis-server must not die before the node has finished).
    let mut child = Command::new(BIN)
        .args(["up", "--own-redis", "--slots", "2"])
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s).unwrap();
        s
    });
    // The banner names the Redis URL, the metrics address and how to submit.
    let banner = banner(&mut child);
    let field = |prefix: &str| {
        banner
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in {banner}"))
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    };
    let url = private_url(&banner);
    let metrics: std::net::SocketAddr = field("metrics:")
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .parse()
        .unwrap();
    assert!(banner.contains("forkbox submit --wait"), "{banner}");
    assert!(banner.contains("XADD 'forkbox:{default}:jobs'"), "{banner}");

    let page = http_get(metrics, "/metrics").1;
    let ok = [("queue", "default"), ("status", "ok")];
    assert_eq!(
        metric(&page, "forkbox_jobs_total", &ok),
        Some(0.0),
        "{page}"
    );
    assert_eq!(metric(&page, "forkbox_slots", &[]), Some(2.0));
    let out = forkbox(&["submit", "--redis", &url, "--wait", "--", "echo", "hi"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi\n");
    let page = metric_reaches(metrics, "forkbox_jobs_total", &ok, 1.0);
    assert!(
        page.contains("forkbox_job_duration_seconds_bucket"),
        "{page}"
    );
    assert!(page.contains("forkbox_spawn_seconds_bucket"), "{page}");

    // Ctrl-C while a job runs: the job finishes and its result is stored before the
    // private Redis stops (an unstored result would make `up` fail), then all stops.
    let out = forkbox(&[
        "submit",
        "--redis",
        &url,
        "--",
        "sh",
        "-c",
        "sleep 1; echo late",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    metric_reaches(metrics, "forkbox_slots_busy", &[], 1.0);
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGINT,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "up did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = log.join().unwrap();
    assert!(status.success(), "{status}; log:\n{log}");
    assert!(
        log.contains("stopped the worker and the private redis-server"),
        "{log}"
    );
    // The private Redis outlived the drain (it has a process group of its own).
    assert!(
        !log.contains("Redis unreachable"),
        "Redis went first: {log}"
    );
    // The running job was neither killed nor lost: `up` exits non-zero when a finished result
    // could not be stored, and the sandbox survived the terminal's Ctrl-C.
    assert!(!log.contains("killing"), "{log}");
    assert!(!log.contains("sandbox zygote exited"), "{log}");
    // The private Redis is gone with it.
    let out = forkbox(&["stats", "--redis", &url]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("cannot reach Redis at"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn up_demo_prints_a_table_of_results_and_stops() {
    let out = forkbox(&["up", "--own-redis", "--demo", "--slots", "2"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let row = |label: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no row {label}: {stdout}"))
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_owned()
    };
    assert_eq!(row("echo"), "ok");
    assert_eq!(row("failing"), "failed");
    assert_eq!(row("timeout"), "timeout");
    assert!(stdout.contains("hello from a sandbox"), "{stdout}");
    if have("/usr/bin/python3") {
        assert_eq!(row("python3"), "ok", "{stdout}");
        assert_eq!(row("humaneval"), "ok", "{stdout}");
    } else {
        forkbox_testkit::skipped("python3 rows (no /usr/bin/python3 on this host)");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn client_commands_against_a_real_worker() {
    let server = start_redis();
    let url = server.url();
    let mut w = WorkerProc::start(&url, "clients", &["--slots", "2"]);
    w.wait_ready();
    let run = |args: Vec<String>| async move {
        tokio::task::spawn_blocking(move || {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            forkbox(&a)
        })
        .await
        .unwrap()
    };
    let args = |a: &[&str]| -> Vec<String> {
        // Options go before a `--` (whose rest is the job's command), else at the end.
        let mut v: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        let at = v.iter().position(|s| s == "--").unwrap_or(v.len());
        v.splice(at..at, ["--redis".to_owned(), url.clone()]);
        v
    };

    // submit prints the id; result exits like `forkbox run`.
    let out = run(args(&[
        "submit",
        "--id",
        "c-1",
        "--",
        "sh",
        "-c",
        "echo out; exit 7",
    ]))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "c-1");
    let out = run(args(&["result", "c-1", "--wait", "30"])).await;
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(text(&out.stdout), "out\n");
    let out = run(args(&["result", "c-1", "--json"])).await;
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (r["status"].as_str(), r["worker"].as_str()),
        (Some("failed"), Some("clients"))
    );
    let out = run(args(&[
        "submit",
        "--wait",
        "--timeout-ms",
        "200",
        "--",
        "sleep",
        "5",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
    let out = run(args(&["result", "no-such-id"])).await;
    assert!(text(&out.stderr).contains("no result for no-such-id"));

    // batch submit: a bad line is reported with its number and nothing is enqueued.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"cmd\":\"true\"}\n{\"cmd\":\"true\",\"limits\":{\"pids\":0}}\n",
    )
    .unwrap();
    let out = run(args(&["batch", "submit", bad.to_str().unwrap()])).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("line 2: limits.pids"),
        "{}",
        text(&out.stderr)
    );
    let q = queue(&url, "default").await;
    let good = dir.path().join("good.jsonl");
    let mut lines = String::new();
    for i in 0..20 {
        lines.push_str(&format!("{{\"cmd\":\"exit {}\"}}\n", i % 2));
    }
    std::fs::write(&good, lines).unwrap();
    let out = run(args(&[
        "batch",
        "submit",
        good.to_str().unwrap(),
        "--batch",
        "b1",
    ]))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "b1");
    let out = run(args(&["batch", "wait", "b1", "--timeout", "60", "--json"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["done"], 20);
    assert_eq!(summary["by_status"]["ok"], 10);
    assert_eq!(summary["by_status"]["failed"], 10);

    // dlq: list, requeue, purge.
    q.enqueue_raw(br#"{"id":"broken","cmd":42}"#).await.unwrap();
    let letters = poll(Duration::from_secs(30), "a dead letter", || {
        let q = q.clone();
        async move {
            let l = q.dlq_list(10).await.unwrap();
            (!l.is_empty()).then_some(l)
        }
    })
    .await;
    let out = run(args(&["dlq", "list"])).await;
    assert!(
        text(&out.stdout).contains("broken"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stdout).contains("cmd: invalid type"),
        "{}",
        text(&out.stdout)
    );
    let out = run(args(&["dlq", "requeue", &letters[0].dead_id])).await;
    assert!(
        text(&out.stdout).contains("requeued 1"),
        "{}",
        text(&out.stdout)
    );
    // Still malformed, so it comes straight back.
    poll(Duration::from_secs(30), "dead-lettered again", || {
        let q = q.clone();
        async move { (q.dlq_list(10).await.unwrap().len() == 1).then_some(()) }
    })
    .await;
    let out = run(args(&["dlq", "purge"])).await;
    assert!(
        text(&out.stdout).contains("purged 1"),
        "{}",
        text(&out.stdout)
    );

    // stats and cancel.
    let out = run(args(&["stats", "--json"])).await;
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats[0]["queue"], "default");
    assert_eq!(stats[0]["dead"], 0);
    assert_eq!(stats[0]["consumers"][0]["name"], "clients");
    assert_eq!(stats[0]["consumers"][0]["alive"], true);
    q.enqueue(&Job {
        id: Some("c-long".into()),
        ..Job::shell("sleep 60")
    })
    .await
    .unwrap();
    let qq = q.clone();
    poll(Duration::from_secs(30), "c-long running", || {
        let q = qq.clone();
        async move { (q.stats().await.unwrap().pending == 1).then_some(()) }
    })
    .await;
    let out = run(args(&["cancel", "c-long"])).await;
    assert!(out.status.success());
    let r = q
        .wait_result("c-long", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.outcome.status, Status::Cancelled);

    // A clear error when Redis is not there.
    let out = forkbox(&["stats", "--redis", "redis://127.0.0.1:1/"]);
    assert!(text(&out.stderr).contains("cannot reach Redis at redis://127.0.0.1:1/"));
}

/// Every process descended from `root` (its children, theirs, ...), `root` included.
fn descendants(root: u32) -> Vec<u32> {
    let mut all = vec![root];
    let mut i = 0;
    while i < all.len() {
        let pid = all[i];
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
        {
            let children =
                std::fs::read_to_string(task.unwrap().path().join("children")).unwrap_or_default();
            all.extend(
                children
                    .split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
        i += 1;
    }
    all
}

#[test]
fn own_redis_is_closed_to_other_local_users() {
    if !nix::unistd::geteuid().is_root() || !have("/usr/sbin/runuser") && !have("/sbin/runuser") {
        forkbox_testkit::skipped("needs root and runuser to act as nobody");
        return;
    }
    let mut up = Command::new(BIN)
        .args(["up", "--own-redis", "--slots", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let banner = banner(&mut up);
    let url = private_url(&banner);
    let password = url
        .split_once("://:")
        .and_then(|(_, rest)| rest.split_once('@'))
        .map(|(p, _)| p.to_owned())
        .unwrap_or_else(|| panic!("no password in the private URL {url}"));
    assert!(password.len() >= 32, "{password}");
    assert!(
        !banner.contains(&password),
        "the banner shows the password: {banner}"
    );
    let port: u16 = url
        .rsplit_once(':')
        .unwrap()
        .1
        .trim_end_matches('/')
        .parse()
        .unwrap();

    // The URL the banner points at works, given through the environment.
    let out = Command::new(BIN)
        .args(["submit", "--wait", "--", "echo", "hi"])
        .env("FORKBOX_REDIS_URL", &url)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi\n");

    // No process carries the password on its command line, which every local user reads:
    // not up, its zygote or its redis-server, nor any other.
    let procs = descendants(up.id());
    assert!(
        procs.len() >= 3,
        "up, its zygote and redis-server: {procs:?}"
    );
    let everyone: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for pid in procs.iter().chain(&everyone) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !text(&cmdline).contains(&password),
            "pid {pid} shows the password: {}",
            text(&cmdline).replace('\0', " ")
        );
    }
    let redis = *procs
        .iter()
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| c.trim() == "redis-server")
        })
        .expect("up's redis-server");
    let data = std::fs::read_link(format!("/proc/{redis}/cwd")).unwrap();
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&data).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700, "{}", data.display());

    // Another local user: no data through the port, no look into the directory.
    let as_nobody = |argv: &[&str]| {
        let out = Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .args(argv)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        format!("{}{}", text(&out.stdout), text(&out.stderr))
    };
    let probe = format!(
        "import socket\n\
         try:\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=5)\n\
         except OSError as e:\n    print('refused', e); raise SystemExit\n\
         s.sendall(b'KEYS *\\r\\nSET forged 1\\r\\n')\n\
         got = b''\n\
         while got.count(b'\\n') < 2:\n    b = s.recv(4096)\n    if not b: break\n    got += b\n\
         print(got.decode(errors='replace'))\n"
    );
    let said = as_nobody(&["python3", "-c", &probe]);
    assert!(
        said.matches("NOAUTH").count() == 2 || said.contains("refused"),
        "nobody talked to the private Redis: {said}"
    );
    let listing = format!("ls {0}; cat {0}/url", data.display());
    let said = as_nobody(&["sh", "-c", &listing]);
    assert!(!said.contains(&password), "{said}");
    assert!(said.contains("Permission denied"), "{said}");

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(up.id() as i32), Signal::SIGINT).unwrap();
    assert!(up.wait().unwrap().success());
}

#[test]
fn up_with_a_gateway_answers_each_api() {
    let mut child = Command::new(BIN)
        .args([
            "up",
            "--own-redis",
            "--slots",
            "1",
            "--gateway",
            "127.0.0.1:0",
        ])
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s).unwrap();
        s
    });
    let banner = banner(&mut child);
    let gateway: std::net::SocketAddr = banner
        .lines()
        .find_map(|l| l.trim().strip_prefix("gateway: http://"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no gateway address in {banner}"));
    gateway_offers_python(gateway);

    let piston = serde_json::json!({"language": "python", "version": "*",
        "files": [{"content": "import sys; print(sys.stdin.read().upper())"}], "stdin": "piston"});
    let (code, v) = http_json(gateway, "POST", "/api/v2/execute", Some(&piston));
    assert_eq!(
        (code, &v["run"]["stdout"]),
        (200, &serde_json::json!("PISTON\n")),
        "{v}"
    );
    assert_eq!(v["run"]["code"], 0, "{v}");

    let judge0 = serde_json::json!({"source_code": "print(input()[::-1])", "language_id": 71, "stdin": "0egduj"});
    let (code, v) = http_json(gateway, "POST", "/submissions?wait=true", Some(&judge0));
    assert_eq!(
        (code, &v["status"]["id"], &v["stdout"]),
        (201, &serde_json::json!(3), &serde_json::json!("judge0\n")),
        "{v}"
    );

    let fusion = serde_json::json!({"code": "print('fusion', 6*7)", "language": "python"});
    let (code, v) = http_json(gateway, "POST", "/run_code", Some(&fusion));
    assert_eq!(
        (code, &v["status"], &v["run_result"]["stdout"]),
        (
            200,
            &serde_json::json!("Success"),
            &serde_json::json!("fusion 42\n")
        ),
        "{v}"
    );

    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGINT,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "up did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = log.join().unwrap();
    assert!(status.success(), "{status}; log:\n{log}");
}
