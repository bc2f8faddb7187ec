//! What a pipeline or an operator sees from the CLI and the node: a batch's results joined to
//! their input lines, exit codes of their own for bad input and for a wait that ran out, a
//! warning when no worker serves the queue, result timestamps, the node's metric names, and
//! error texts that say what is wrong once.

mod node_support;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use node_support::*;

fn forkbox(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("FORKBOX_REDIS_URL")
        .env_remove("FORKBOX_REDIS")
        .env_remove("FORKBOX_QUEUE")
        .stdin(Stdio::null())
        .output()
        .expect("running forkbox")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write_file(dir: &std::path::Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    path.to_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_batch_lines_exit_65_and_enqueue_nothing() {
    let server = start_redis();
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(
        dir.path(),
        "jobs.jsonl",
        "{\"cmd\":\"true\"}\n{\"cmd\":5}\n\nnot json\n",
    );
    let out = forkbox(&[
        "batch",
        "submit",
        "--redis",
        &server.url(),
        "-q",
        "bad",
        &file,
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{err}");
    assert!(err.contains("line 2: cmd"), "{err}");
    assert!(err.contains("line 4: "), "{err}");
    assert!(err.contains("2 bad line(s)"), "{err}");
    let stats = queue(&server.url(), "bad").await.stats().await.unwrap();
    assert_eq!(stats.length, 0, "nothing may be enqueued");
    let help = text(&forkbox(&["batch", "submit", "--help"]).stdout);
    assert!(help.contains("exit code is 65"), "{help}");
}

/// `cancel` says where the job was; a mistyped id cancels nothing, so a job submitted later
/// with it runs, unless the cancel was asked for ahead (and then only while it lives).
#[tokio::test(flavor = "multi_thread")]
async fn cancel_says_where_the_job_is_and_cancels_ahead_only_when_asked() {
    let server = start_redis();
    let url = server.url();
    let cancel = |extra: &[&str]| {
        let mut args = vec!["cancel", "--redis", &url, "-q", "cancels"];
        args.extend_from_slice(extra);
        forkbox(&args)
    };
    let q = queue(&url, "cancels").await;
    q.ensure_group().await.unwrap();
    let out = cancel(&["future-1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("no job future-1 on queue cancels")
            && text(&out.stderr).contains("--ahead"),
        "{}",
        text(&out.stderr)
    );
    let job = |id: &str| forkbox_queue::Job {
        id: Some(id.into()),
        ..forkbox_queue::Job::shell("true")
    };
    q.enqueue(&job("future-1")).await.unwrap();
    assert!(
        !q.is_cancelled("future-1").await.unwrap(),
        "a typo cancelled a later job"
    );

    // Queued, then running: cancelled, and said so.
    let out = cancel(&["future-1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("it will not run"),
        "{}",
        text(&out.stdout)
    );
    assert!(q.is_cancelled("future-1").await.unwrap());
    q.enqueue(&job("running-1")).await.unwrap();
    let got = q.read("w-7", 10, 100).await.unwrap();
    let running = got.iter().find(|d| d.id == "running-1").unwrap();
    let out = cancel(&["running-1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("running on w-7"),
        "{}",
        text(&out.stdout)
    );

    // Finished: nothing to cancel.
    let mut result = forkbox_queue::JobResult::new(
        "running-1".into(),
        forkbox_queue::Outcome::not_run(forkbox_queue::Status::Ok, ""),
        running.deliveries as u32,
        "w-7".into(),
    );
    result.outcome.error = None;
    q.complete(running, &result).await.unwrap();
    let out = cancel(&["running-1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("already finished (ok)"),
        "{}",
        text(&out.stderr)
    );

    // Ahead: the job submitted later is cancelled as it is added.
    let out = cancel(&["--ahead", "--lifetime", "600", "future-2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!q.is_cancelled("future-2").await.unwrap());
    q.enqueue(&job("future-2")).await.unwrap();
    assert!(q.is_cancelled("future-2").await.unwrap());
}

/// `batch results | head` ends quietly when its reader goes, as coreutils do, and Ctrl-C in
/// `batch wait` says how to resume the wait.
#[tokio::test(flavor = "multi_thread")]
async fn a_closed_pipe_ends_results_quietly_and_an_interrupted_wait_says_how_to_resume() {
    let server = start_redis();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let jobs: String = (0..50)
        .map(|i| format!("{{\"cmd\":\"echo {i}\"}}\n"))
        .collect();
    let file = write_file(dir.path(), "jobs.jsonl", &jobs);
    let out = forkbox(&[
        "batch", "submit", "--redis", &url, "-q", "idleq", &file, "--batch", "b2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let mut child = Command::new(BIN)
        .args(["batch", "results", "--redis", &url, "-q", "idleq", "b2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    // The reader is gone before the first line is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGPIPE),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        text(&out.stderr),
        "",
        "a closed pipe is not an error to report"
    );

    // Nobody serves idleq: the wait runs until interrupted.
    let child = Command::new(BIN)
        .args(["batch", "wait", "--redis", &url, "-q", "idleq", "b2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains(&format!("forkbox batch wait b2 --redis '{url}' -q idleq")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn batch_results_are_joined_to_their_input_lines() {
    let server = start_redis();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(
        dir.path(),
        "eval.jsonl",
        "{\"cmd\":\"echo one\"}\n\n{\"id\":\"mine\",\"cmd\":\"echo two; exit 3\"}\n\
         {\"cmd\":\"echo three\"}\n",
    );
    let ids_out = dir.path().join("ids.jsonl");
    let out = forkbox(&[
        "batch",
        "submit",
        "--redis",
        &url,
        "-q",
        "evalq",
        &file,
        "--batch",
        "b1",
        "--ids-out",
        ids_out.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "b1");
    let summary = text(&out.stderr);
    assert!(
        summary.contains("3 job(s) enqueued on queue evalq"),
        "{summary}"
    );
    let map: Vec<serde_json::Value> = std::fs::read_to_string(&ids_out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let lines: Vec<u64> = map.iter().map(|m| m["line"].as_u64().unwrap()).collect();
    assert_eq!(lines, [1, 3, 4]);
    assert_eq!(map[1]["id"], "mine");
    assert!(map.iter().all(|m| m["new"] == true));

    // Before any worker: every line is listed as unfinished.
    let out = forkbox(&["batch", "results", "--redis", &url, "-q", "evalq", "b1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert_eq!(table.matches("unfinished").count(), 3, "{table}");

    let mut worker = WorkerProc::start(&url, "ops-w", &["--queues", "evalq", "--slots", "2"]);
    worker.wait_ready();
    let out = forkbox(&[
        "batch",
        "wait",
        "--redis",
        &url,
        "-q",
        "evalq",
        "b1",
        "--timeout",
        "60",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // A pipeline gates on it: one job failed.
    let out = forkbox(&[
        "batch",
        "wait",
        "--redis",
        &url,
        "-q",
        "evalq",
        "b1",
        "--fail-on-error",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("failed 1"),
        "{}",
        text(&out.stdout)
    );

    let out = forkbox(&[
        "batch", "results", "--redis", &url, "-q", "evalq", "b1", "--jsonl",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    for (row, m) in rows.iter().zip(&map) {
        assert_eq!(row["line"], m["line"]);
        assert_eq!(row["id"], m["id"]);
        assert_eq!(row["result"]["id"], m["id"]);
    }
    assert_eq!(rows[0]["result"]["stdout"], "one\n");
    assert_eq!(rows[1]["result"]["status"], "failed");
    assert_eq!(rows[1]["result"]["exit_code"], 3);
    assert_eq!(rows[2]["result"]["stdout"], "three\n");

    let out = forkbox(&[
        "batch", "results", "--redis", &url, "-q", "evalq", "b1", "--jsonl", "--status", "not-ok",
    ]);
    let failed: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["line"], 3);
    assert_eq!(failed[0]["id"], "mine");

    let out = forkbox(&[
        "batch", "results", "--redis", &url, "-q", "evalq", "b1", "--status", "bogus",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not a status"),
        "{}",
        text(&out.stderr)
    );

    // Resubmitting the same file keeps one entry per line and enqueues nothing new.
    let out = forkbox(&[
        "batch", "submit", "--redis", &url, "-q", "evalq", &file, "--batch", "b1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = forkbox(&[
        "batch", "results", "--redis", &url, "-q", "evalq", "b1", "--jsonl",
    ]);
    let again = text(&out.stdout).lines().count();
    // Jobs without an id got fresh ids, so their lines now name the new copies; "mine" is
    // idempotent. Either way there is one row per input line.
    assert_eq!(again, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn submit_wait_to_a_queue_nobody_serves_warns_and_times_out() {
    let server = start_redis();
    let out = forkbox(&[
        "submit",
        "--redis",
        &server.url(),
        "-q",
        "typo-queue",
        "--wait",
        "--timeout",
        "0.5",
        "-c",
        "true",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(
        err.contains("no worker is serving queue typo-queue"),
        "{err}"
    );
    assert!(err.contains("within 0.5 s"), "{err}");
    let out = forkbox(&["submit", "--timeout", "1", "-c", "true"]);
    assert!(!out.status.success(), "--timeout needs --wait");
}

#[tokio::test(flavor = "multi_thread")]
async fn results_carry_enqueue_start_and_finish_times_and_metrics_count_the_wait() {
    let server = start_redis();
    let url = server.url();
    let mut worker = WorkerProc::start(&url, "times-w", &["--queues", "timesq"]);
    let addr = worker.metrics_addr();
    worker.wait_ready();
    let out = forkbox(&[
        "submit",
        "--redis",
        &url,
        "-q",
        "timesq",
        "--wait",
        "--timeout",
        "60",
        "--json",
        "-c",
        "sleep 0.2",
    ]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("no worker"), "a live worker serves it: {err}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let enq = r["enqueued_at_ms"].as_u64().expect("enqueued_at_ms");
    let start = r["started_at_ms"].as_u64().expect("started_at_ms");
    let fin = r["finished_at_ms"].as_u64().expect("finished_at_ms");
    assert!(enq <= start && start <= fin, "{r}");
    assert!(fin - start >= 200, "the job slept 200 ms: {r}");

    let page = metric_reaches(
        addr,
        "forkbox_queue_wait_seconds_count",
        &[("queue", "timesq")],
        1.0,
    );
    for (name, labels) in [
        ("forkbox_slots", vec![]),
        ("forkbox_jobs_in_flight", vec![("queue", "timesq")]),
        ("forkbox_queue_pending", vec![("queue", "timesq")]),
        ("forkbox_dead_letter_length", vec![("queue", "timesq")]),
        ("forkbox_dead_letter_total", vec![("queue", "timesq")]),
        ("forkbox_reclaimed_total", vec![("queue", "timesq")]),
        (
            "forkbox_job_duration_seconds_count",
            vec![("queue", "timesq")],
        ),
        ("forkbox_spawn_seconds_count", vec![("queue", "timesq")]),
        (
            "forkbox_build_info",
            vec![("version", env!("CARGO_PKG_VERSION"))],
        ),
    ] {
        assert!(
            metric(&page, name, &labels).is_some(),
            "{name}{labels:?}:\n{page}"
        );
    }
    assert!(metric(&page, "forkbox_slots_total", &[]).is_none());
    assert_eq!(
        metric(
            &page,
            "forkbox_job_duration_seconds_count",
            &[("queue", "timesq")]
        ),
        Some(1.0)
    );
}

#[test]
fn a_missing_config_file_is_said_once() {
    let out = forkbox(&["worker", "--config", "/nonexistent/forkbox-worker.toml"]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("reading config file /nonexistent/forkbox-worker.toml: No such file"),
        "{err}"
    );
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
}

#[test]
fn a_metrics_port_in_use_is_said_once() {
    let server = start_redis();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = forkbox(&[
        "worker",
        "--redis",
        &server.url(),
        "--queues",
        "portq",
        "--metrics-addr",
        &addr,
    ]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("binding the metrics listener on {addr}")),
        "{err}"
    );
    assert_eq!(err.matches("os error 98").count(), 1, "{err}");
}

#[test]
fn an_http_url_gets_a_clear_message() {
    for args in [
        &["stats", "--redis", "http://127.0.0.1:6379"][..],
        &["worker", "--redis", "http://127.0.0.1:6379"][..],
    ] {
        let out = forkbox(args);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(
            err.contains("the scheme http:// is not Redis's; use redis://"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("InvalidClientConfig"), "{args:?}: {err}");
    }
    let out = forkbox(&["stats", "--redis", "127.0.0.1:6379"]);
    assert!(
        text(&out.stderr).contains("is not a Redis URL; write redis://HOST:PORT"),
        "{}",
        text(&out.stderr)
    );
}

/// Colour codes belong on a terminal, not in a log file: the daemon, like the worker, writes
/// plain text when its stderr is a file.
#[test]
fn daemon_and_worker_logs_to_a_file_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("d.sock");
    let log = dir.path().join("daemon.log");
    let mut daemon = Command::new(BIN)
        .args(["daemon", "--slots", "1", "--socket", sock.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("listening")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    daemon.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("forkbox daemon listening"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in the log file: {text:?}"
    );

    let server = start_redis();
    let mut worker = WorkerProc::start(&server.url(), "plain-w", &["--queues", "plainq"]);
    worker.wait_ready();
    let wlog = worker.log();
    assert!(
        !wlog.contains('\u{1b}'),
        "colour codes in the worker log: {wlog:?}"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn up_takes_a_port_and_says_what_it_does_when_nothing_listens() {
    let (nobody, port) = (free_port(), free_port());
    let nowhere = format!("redis://127.0.0.1:{nobody}");
    let out = forkbox(&[
        "up",
        "--redis",
        &nowhere,
        "--port",
        &port.to_string(),
        "--demo",
        "--slots",
        "1",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "no Redis answers at {nowhere}; starting a private redis-server instead"
        )),
        "{stderr}"
    );
    assert!(
        // The private server's password is never shown, only where to read it.
        stdout.contains(&format!("redis:   redis://***@127.0.0.1:{port}/")),
        "{stdout}"
    );
}

/// The lines of the first fenced block tagged `tag` in docs/protocol.md.
fn protocol_block(tag: &str) -> String {
    let doc = std::fs::read_to_string(repo_file("docs/protocol.md")).unwrap();
    let start = doc
        .find(&format!("```{tag}\n"))
        .unwrap_or_else(|| panic!("no {tag} block"));
    let body = &doc[start + tag.len() + 4..];
    body[..body.find("\n```").unwrap()].to_owned() + "\n"
}

/// The Node example of "Waiting for many jobs", run as written with ioredis from npm against
/// a real worker: five jobs, one reply stream, one XREAD BLOCK loop.
#[test]
fn the_documented_node_reply_to_example_runs() {
    if !have("node") || !have("npm") {
        forkbox_testkit::skipped("node or npm is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let install = Command::new("npm")
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--silent",
            "ioredis@5",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    if !install.status.success() {
        forkbox_testkit::skipped(format!(
            "npm install ioredis@5 failed (is the registry reachable?): {}",
            text(&install.stderr)
        ));
        return;
    }
    std::fs::write(dir.path().join("wait-many.js"), protocol_block("js")).unwrap();
    let server = start_redis();
    let mut worker = WorkerProc::start(&server.url(), "node-w", &["--queues", "nodeq"]);
    worker.wait_ready();
    let out = Command::new("node")
        .arg("wait-many.js")
        .current_dir(dir.path())
        .env("FORKBOX_REDIS_URL", server.url())
        .env("FORKBOX_QUEUE", "nodeq")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    for (i, line) in lines.iter().enumerate() {
        assert!(line.ends_with(&format!("-{i} ok {i}")), "{line}");
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let left: Vec<String> = rt.block_on(async {
        let mut c = conn(&server.url()).await;
        forkbox_queue::redis::cmd("KEYS")
            .arg("forkbox:{nodeq}:replies:*")
            .query_async(&mut c)
            .await
            .unwrap()
    });
    assert!(
        left.is_empty(),
        "the example deletes its reply stream: {left:?}"
    );
}

/// The daemon session of docs/protocol.md, replayed against a real daemon: every documented
/// field of every response has the documented value.
#[test]
fn the_documented_daemon_session_replays() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("d.sock");
    let mut daemon = Command::new(BIN)
        .args(["daemon", "--slots", "2", "--socket", sock.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let stream = loop {
        match std::os::unix::net::UnixStream::connect(&sock) {
            Ok(s) => break s,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "no daemon: {e}");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    };
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    // (request, documented responses)
    let mut exchanges: Vec<(String, Vec<serde_json::Value>)> = Vec::new();
    for line in protocol_block("daemon").lines() {
        if let Some(req) = line.strip_prefix("> ") {
            exchanges.push((req.to_owned(), Vec::new()));
        } else if let Some(resp) = line.strip_prefix("< ") {
            let v = serde_json::from_str(resp).unwrap_or_else(|e| panic!("{resp}: {e}"));
            exchanges.last_mut().expect("a request first").1.push(v);
        }
    }
    assert_eq!(exchanges.len(), 5);
    for (req, want) in &exchanges {
        writeln!(writer, "{req}").unwrap();
        let mut got = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            let done = v.get("status").is_some();
            got.push(v);
            if done {
                break;
            }
        }
        assert_eq!(got.len(), want.len(), "{req}: {got:?}");
        let result = got.last().unwrap();
        assert!(result.get("finished_at_ms").is_some() || result["status"] == "invalid");
        for w in want {
            let found = got.iter().any(|g| {
                w.as_object()
                    .unwrap()
                    .iter()
                    .all(|(k, v)| g.get(k) == Some(v))
            });
            assert!(found, "{req}: documented {w} not among {got:?}");
        }
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    daemon.wait().unwrap();
}
