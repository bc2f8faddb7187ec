//! Sessions served by real `forkbox worker` processes against a private redis-server: create,
//! calls and their events, state across calls, isolation, expiry, kill, capacity, a killed
//! node, a Redis outage, and the CLI.

mod node_support;

use std::time::{Duration, Instant};

use forkbox_queue::session::{Call, CallOp, ErrorReason, Event, SessionSpec};
use forkbox_queue::{redis, FileData, Job, Queue, Runtime, SessionError, SessionOpened, Status};
use forkbox_testkit::RedisServer;
use node_support::*;
use serde_json::Value;

fn create(ttl_s: u64, idle_s: u64) -> Job {
    Job {
        session: Some(SessionSpec {
            ttl_s: Some(ttl_s),
            idle_s: Some(idle_s),
        }),
        runtime: Some(Runtime::Python),
        ..Job::default()
    }
}

async fn open(q: &Queue, job: &Job) -> SessionOpened {
    q.open_session(job, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("session opens: {e}"))
}

/// Sends `call` and waits for its end: its output events and its terminal event.
async fn call(q: &Queue, call: Call) -> (Vec<Event>, Event) {
    let mut seen = Vec::new();
    let end = q
        .call_session(&call, Duration::from_secs(30), &mut |e| {
            seen.push(e.clone())
        })
        .await
        .unwrap_or_else(|e| panic!("call {:?}: {e}", call.op));
    seen.pop();
    (seen, end)
}

fn result(end: &Event) -> &serde_json::Map<String, Value> {
    match end {
        Event::Result(r) => r,
        other => panic!("not a result: {other:?}"),
    }
}

async fn run_code(q: &Queue, sid: &str, code: &str) -> serde_json::Map<String, Value> {
    let (_, end) = call(q, Call::run_code(sid, code)).await;
    result(&end).clone()
}

fn worker(server: &RedisServer, name: &str, args: &[&str]) -> WorkerProc {
    let mut w = WorkerProc::start(&server.url(), name, &[&["--slots", "2"], args].concat());
    w.wait_ready();
    w
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_keeps_its_state_streams_its_output_and_keeps_its_files_apart() {
    let server = start_redis();
    let _w = worker(&server, "s-node-1", &[]);
    let q = queue(&server.url(), "default").await;
    let a = open(&q, &create(120, 60)).await;
    assert_eq!(a.node, "s-node-1");
    let r = run_code(&q, &a.id, "x = 41").await;
    assert_eq!(r["ok"], true, "{r:?}");
    let r = run_code(&q, &a.id, "x + 1").await;
    assert_eq!(r["text"], "42", "{r:?}");
    assert_eq!(r["execution_count"], 2);

    // An exec's output comes as it is written: several events before the result.
    let exec = Call::exec_shell(&a.id, "for i in 1 2 3; do echo $i; sleep 0.3; done; exit 3");
    let (events, end) = call(&q, exec).await;
    let out: String = events
        .iter()
        .filter_map(|e| match e {
            Event::Stdout { data } => Some(data.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(out, "1\n2\n3\n");
    assert!(events.len() >= 2, "{events:?}");
    assert_eq!(result(&end)["exit_code"], 3, "{end:?}");

    // Files persist in one session and are not seen by another.
    let b = open(&q, &create(120, 60)).await;
    let write = Call {
        data: Some(FileData::Text("only a".into())),
        ..Call::files(&a.id, CallOp::FilesWrite, "notes/a.txt")
    };
    let (_, end) = call(&q, write).await;
    assert_eq!(result(&end)["ok"], true, "{end:?}");
    let (_, end) = call(
        &q,
        Call::files(&a.id, CallOp::FilesRead, "/work/notes/a.txt"),
    )
    .await;
    assert_eq!(result(&end)["data"], "only a", "{end:?}");
    let (_, end) = call(&q, Call::files(&b.id, CallOp::FilesRead, "notes/a.txt")).await;
    assert_eq!(result(&end)["ok"], false, "{end:?}");
    let r = run_code(&q, &b.id, "'x' in globals()").await;
    assert_eq!(r["text"], "False", "{r:?}");

    // info is answered by the node; a call to an unknown session is refused.
    let (_, end) = call(&q, Call::new(&a.id, CallOp::Info)).await;
    let info = &result(&end)["info"];
    assert_eq!(info["node"], "s-node-1");
    assert!(info["calls_served"].as_u64().unwrap() >= 5, "{info}");
    let unknown = q.send_call(&Call::run_code("no-such-session", "1")).await;
    assert!(
        matches!(unknown, Err(SessionError::Unknown { .. })),
        "{unknown:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_end_at_ttl_idle_and_kill_and_later_calls_say_why() {
    let server = start_redis();
    let _w = worker(&server, "s-node-2", &["--max-sessions", "3"]);
    let q = queue(&server.url(), "default").await;
    let ttl = open(&q, &create(2, 60)).await;
    let idle = open(&q, &create(60, 1)).await;
    let killed = open(&q, &create(60, 60)).await;
    // A fourth is past --max-sessions: its create ends with an error naming the limit.
    let refused = q
        .open_session(&create(60, 60), Duration::from_secs(60))
        .await;
    match refused {
        Err(SessionError::NotOpened { status, error, .. }) => {
            assert_eq!(status, Status::Error);
            assert!(error.contains("--max-sessions"), "{error}");
            assert!(error.contains("3 of 3"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    let (_, end) = call(&q, Call::new(&killed.id, CallOp::Kill)).await;
    assert_eq!(result(&end)["ok"], true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (sid, reason) in [(&ttl.id, "ttl"), (&idle.id, "idle"), (&killed.id, "killed")] {
        let r = q.send_call(&Call::run_code(sid, "1")).await;
        match r {
            Err(SessionError::Ended { message, .. }) => {
                assert_eq!(message, format!("session ended: {reason}"), "{sid}")
            }
            other => panic!("{sid}: {other:?}"),
        }
    }
    // Capacity came back: a new session opens.
    open(&q, &create(60, 60)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kill_answered_has_given_the_sessions_room_back() {
    let server = start_redis();
    let _w = worker(&server, "s-node-kill", &["--max-sessions", "1"]);
    let q = queue(&server.url(), "default").await;
    // Each create is sent as soon as the kill before it is answered, with room for one
    // session: an answer that came before the room was given back refuses the create.
    let mut s = open(&q, &create(60, 60)).await;
    for _ in 0..5 {
        let (_, end) = call(&q, Call::new(&s.id, CallOp::Kill)).await;
        assert_eq!(result(&end)["ok"], true);
        s = open(&q, &create(60, 60)).await;
        assert_eq!(run_code(&q, &s.id, "6 * 7").await["text"], "42");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_node_is_reported_lost_within_seconds() {
    let server = start_redis();
    let mut w = worker(&server, "s-node-3", &["--visibility-timeout-ms", "3000"]);
    let q = queue(&server.url(), "default").await;
    let s = open(&q, &create(300, 300)).await;
    let long = Call {
        timeout_ms: Some(120_000),
        ..Call::run_code(&s.id, "import time; time.sleep(100)")
    };
    let node = q.send_call(&long).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.kill();
    let started = Instant::now();
    let waited = q
        .wait_call(&s.id, &node, &long.id, Duration::from_secs(60), &mut |_| {})
        .await;
    assert!(
        matches!(waited, Err(SessionError::Lost { .. })),
        "{waited:?}"
    );
    // Within the heartbeat's TTL (3 s here) and a slice, not the call's two minutes.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let again = q.send_call(&Call::run_code(&s.id, "1")).await;
    match again {
        Err(SessionError::Ended { message, .. }) => assert_eq!(message, "session ended: lost"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_answers_after_a_redis_restart() {
    let mut server = RedisServer::start_persistent().expect("redis-server");
    let _w = worker(&server, "s-node-4", &[]);
    let q = queue(&server.url(), "default").await;
    let s = open(&q, &create(300, 300)).await;
    run_code(&q, &s.id, "y = 7").await;
    server.restart().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let q = queue(&server.url(), "default").await;
        let c = Call {
            timeout_ms: Some(5000),
            ..Call::run_code(&s.id, "y * 6")
        };
        match q
            .call_session(&c, Duration::from_secs(5), &mut |_| {})
            .await
        {
            Ok(end) => {
                assert_eq!(result(&end)["text"], "42", "{end:?}");
                break;
            }
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "no answer after the restart: {e}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clean_stop_ends_every_session_as_node_stopped() {
    let server = start_redis();
    let mut w = worker(&server, "s-node-5", &[]);
    let q = queue(&server.url(), "default").await;
    let s = open(&q, &create(300, 300)).await;
    let long = Call {
        timeout_ms: Some(60_000),
        ..Call::run_code(&s.id, "import time; time.sleep(50)")
    };
    let node = q.send_call(&long).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.signal(nix::sys::signal::Signal::SIGTERM);
    let end = q
        .wait_call(&s.id, &node, &long.id, Duration::from_secs(60), &mut |_| {})
        .await
        .unwrap();
    match end {
        Event::Error { reason, error } => {
            assert_eq!(reason, ErrorReason::SessionEnded);
            assert!(error.starts_with("session ended: node_stopped"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    w.wait_exit(Duration::from_secs(60));
    let info = q.session_info(&s.id).await.unwrap().unwrap();
    assert_eq!(info.reason.as_deref(), Some("node_stopped"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_creates_calls_and_ends_a_session() {
    let server = start_redis();
    let _w = worker(&server, "s-node-6", &[]);
    let url = server.url();
    let (code, out, err) =
        forkbox_cli_with(&url, &["session", "create", "--runtime", "python"], "");
    assert_eq!(code, 0, "{err}");
    let sid = out.trim().to_owned();
    let (code, out, err) = forkbox_cli_with(
        &url,
        &["session", "run-code", &sid, "-"],
        "print('a')\nv = 6\nv * 7",
    );
    assert_eq!((code, out.as_str()), (0, "a\n42\n"), "{err}");
    let (code, _, err) = forkbox_cli_with(&url, &["session", "run-code", &sid, "1/0"], "");
    assert_eq!(code, 1);
    assert!(err.contains("ZeroDivisionError"), "{err}");
    let (code, out, err) = forkbox_cli_with(
        &url,
        &[
            "session",
            "exec",
            &sid,
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ],
        "",
    );
    assert_eq!((code, out.as_str(), err.as_str()), (7, "out\n", "err\n"));
    let (code, _, err) = forkbox_cli_with(
        &url,
        &["session", "files", &sid, "write", "d/x.txt"],
        "hello",
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = forkbox_cli_with(
        &url,
        &["run", "--session", &sid, "--", "cat", "d/x.txt"],
        "",
    );
    assert_eq!((code, out.as_str()), (0, "hello"));
    let (code, out, _) = forkbox_cli_with(
        &url,
        &["session", "files", &sid, "read", "/work/d/x.txt"],
        "",
    );
    assert_eq!((code, out.as_str()), (0, "hello"));
    let (code, out, _) = forkbox_cli_with(&url, &["session", "list"], "");
    assert!(code == 0 && out.contains(&sid), "{out}");
    let (code, _, _) = forkbox_cli_with(&url, &["session", "kill", &sid], "");
    assert_eq!(code, 0);
    let (code, _, err) = forkbox_cli_with(&url, &["session", "run-code", &sid, "1"], "");
    assert_eq!(code, 125);
    assert!(err.contains("session ended: killed"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupt_and_set_timeout_are_served_while_a_call_runs() {
    let server = start_redis();
    let _w = worker(&server, "s-node-7", &["--max-session-ttl", "100"]);
    let q = queue(&server.url(), "default").await;
    let s = open(&q, &create(60, 60)).await;
    run_code(&q, &s.id, "n = 5").await;
    let long = Call {
        timeout_ms: Some(60_000),
        ..Call::run_code(&s.id, "import time\nfor i in range(600): time.sleep(0.1)")
    };
    let node = q.send_call(&long).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Served at once, not behind the running call.
    let (_, end) = call(
        &q,
        Call {
            ttl_s: Some(90),
            ..Call::new(&s.id, CallOp::SetTimeout)
        },
    )
    .await;
    assert_eq!(result(&end)["ok"], true, "{end:?}");
    let over = Call {
        ttl_s: Some(101),
        ..Call::new(&s.id, CallOp::SetTimeout)
    };
    let (_, end) = call(&q, over).await;
    let r = result(&end);
    assert_eq!(r["ok"], false, "{r:?}");
    assert!(
        r["error"].as_str().unwrap().starts_with("ttl_s: 101"),
        "{r:?}"
    );
    call(&q, Call::new(&s.id, CallOp::Interrupt)).await;
    let end = q
        .wait_call(&s.id, &node, &long.id, Duration::from_secs(30), &mut |_| {})
        .await
        .unwrap();
    let r = result(&end);
    assert_eq!(r["interrupted"], true, "{r:?}");
    assert_eq!(r["exception"]["name"], "KeyboardInterrupt", "{r:?}");
    // The state stayed.
    assert_eq!(run_code(&q, &s.id, "n").await["text"], "5");
    let info = q.session_info(&s.id).await.unwrap().unwrap();
    assert!(info.expires_ms > s.expires_ms + 20_000, "{info:?} {s:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_that_dies_ends_its_session_as_crashed_with_the_reason() {
    let server = start_redis();
    let _w = worker(&server, "s-node-8", &[]);
    let q = queue(&server.url(), "default").await;
    let s = open(&q, &create(60, 60)).await;
    // The exec's parent is the session's supervisor: killing it ends the sandbox.
    let mut seen = Vec::new();
    let end = q
        .call_session(
            &Call::exec_shell(&s.id, "kill -9 $PPID; sleep 5"),
            Duration::from_secs(30),
            &mut |e| seen.push(e.clone()),
        )
        .await
        .unwrap();
    match end {
        Event::Error { reason, error } => {
            assert_eq!(reason, ErrorReason::SessionEnded);
            assert!(error.starts_with("session ended: crashed ("), "{error}");
            assert!(error.contains("signal 9"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    let again = q.send_call(&Call::run_code(&s.id, "1")).await;
    match again {
        Err(SessionError::Ended { message, .. }) => assert_eq!(message, "session ended: crashed"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_restarted_under_its_name_ends_the_sessions_of_its_previous_life() {
    let server = start_redis();
    let mut w = worker(&server, "s-node-9", &[]);
    let q = queue(&server.url(), "default").await;
    let s = open(&q, &create(300, 300)).await;
    w.kill();
    // Back at once, before its heartbeat lapsed: the session's record still says live.
    let _w = worker(&server, "s-node-9", &[]);
    let (_, end) = call(&q, Call::run_code(&s.id, "1")).await;
    assert!(
        matches!(
            &end,
            Event::Error {
                reason: ErrorReason::SessionEnded,
                ..
            }
        ),
        "{end:?}"
    );
    let info = q.session_info(&s.id).await.unwrap().unwrap();
    assert_eq!(
        (info.state.as_str(), info.reason.as_deref()),
        ("ended", Some("lost"))
    );
}

/// A node killed and back under its name before its heartbeat lapsed: the calls its previous
/// life was sent and did not answer (one running when it died, one sent while it was down)
/// are answered `session lost` by the new life, not waited out to their timeouts; a call it
/// answered gets nothing more.
#[tokio::test(flavor = "multi_thread")]
async fn calls_a_previous_life_left_unanswered_are_answered_lost_after_its_restart() {
    let server = start_redis();
    // A heartbeat that outlives the restart: the callers' checks find the node alive.
    let args = ["--visibility-timeout-ms", "120000"];
    let mut w = worker(&server, "s-node-10", &args);
    let q = queue(&server.url(), "default").await;
    let s = open(&q, &create(300, 300)).await;
    let answered = Call::run_code(&s.id, "1");
    let (_, end) = call(&q, answered.clone()).await;
    assert_eq!(result(&end)["text"], "1");
    let running = Call {
        timeout_ms: Some(120_000),
        ..Call::run_code(
            &s.id,
            "print('started', flush=True); import time; time.sleep(100)",
        )
    };
    let node = q.send_call(&running).await.unwrap();
    let key = q.keys().call(&running.id);
    poll(Duration::from_secs(30), "the long call runs", || {
        let url = server.url();
        let key = key.clone();
        async move {
            let n: usize = redis::cmd("XLEN")
                .arg(&key)
                .query_async(&mut conn(&url).await)
                .await
                .unwrap();
            (n > 0).then_some(())
        }
    })
    .await;
    w.kill();
    let sent_while_down = Call {
        timeout_ms: Some(120_000),
        ..Call::run_code(&s.id, "2")
    };
    assert_eq!(q.send_call(&sent_while_down).await.unwrap(), node);
    let _w = worker(&server, "s-node-10", &args);
    for c in [&running, &sent_while_down] {
        // Well short of the calls' 120 s: without an answer this ends in a timeout.
        let waited = q
            .wait_call(&s.id, &node, &c.id, Duration::from_secs(60), &mut |_| {})
            .await;
        match waited {
            Ok(Event::Error {
                reason: ErrorReason::SessionLost,
                error,
            }) => assert_eq!(error, "session lost: node s-node-10 stopped answering"),
            other => panic!("call {}: {other:?}", c.id),
        }
    }
    let events: Vec<redis::Value> = redis::cmd("XRANGE")
        .arg(q.keys().call(&answered.id))
        .arg("-")
        .arg("+")
        .query_async(&mut conn(&server.url()).await)
        .await
        .unwrap();
    assert_eq!(events.len(), 1, "the answered call keeps its one result");
    let info = q.session_info(&s.id).await.unwrap().unwrap();
    assert_eq!(
        (info.state.as_str(), info.reason.as_deref()),
        ("ended", Some("lost"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_past_the_waiting_ones_is_busy_and_the_running_call_is_intact() {
    let server = start_redis();
    let _w = worker(&server, "s-node-10", &[]);
    let url = server.url();
    let q = queue(&url, "default").await;
    let s = open(&q, &create(120, 60)).await;
    let first = Call {
        timeout_ms: Some(60_000),
        ..Call::run_code(
            &s.id,
            "import time\nprint('started', flush=True)\ntime.sleep(10)\nprint('finished')\n'done'",
        )
    };
    let node = q.send_call(&first).await.unwrap();
    // The first call runs (its output came) before the others are sent.
    let mut started = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !started && Instant::now() < deadline {
        let _ = q
            .wait_call(
                &s.id,
                &node,
                &first.id,
                Duration::from_millis(300),
                &mut |e| {
                    started |= matches!(e, Event::Stdout { .. });
                },
            )
            .await;
    }
    assert!(started, "the first call never wrote its output");
    let waiting: Vec<Call> = (0..forkbox_queue::session::CALL_QUEUE_LEN)
        .map(|i| Call::run_code(&s.id, format!("{i}")))
        .collect();
    for c in &waiting {
        q.send_call(c).await.unwrap();
    }
    // One call more than may wait: busy, through Redis.
    let over = Call::run_code(&s.id, "'never runs'");
    let (_, end) = call(&q, over).await;
    match &end {
        Event::Error { reason, error } => {
            assert_eq!(*reason, ErrorReason::Busy, "{end:?}");
            assert!(error.starts_with("session busy"), "{error}");
        }
        other => panic!("not busy: {other:?}"),
    }
    // The command line says so too, and exits 125.
    let (code, out, err) = forkbox_cli_with(&url, &["session", "run-code", &s.id, "'never'"], "");
    assert_eq!((code, out.as_str()), (125, ""), "{err}");
    assert!(err.contains("session busy"), "{err}");

    // The running call ends as it would have alone; the waiting ones run after it, in order,
    // and the refused ones never ran (the execution count skips them).
    let end = q
        .wait_call(
            &s.id,
            &node,
            &first.id,
            Duration::from_secs(60),
            &mut |_| {},
        )
        .await
        .unwrap();
    let r = result(&end);
    assert_eq!(r["ok"], true, "{r:?}");
    assert_eq!(r["text"], "'done'", "{r:?}");
    assert_eq!(r["stdout"], "started\nfinished\n", "{r:?}");
    assert_eq!(r["execution_count"], 1, "{r:?}");
    let last = waiting.last().unwrap();
    let end = q
        .wait_call(&s.id, &node, &last.id, Duration::from_secs(60), &mut |_| {})
        .await
        .unwrap();
    let r = result(&end);
    assert_eq!(r["text"], "63", "{r:?}");
    assert_eq!(r["execution_count"], 65, "{r:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn info_reports_the_disk_a_session_uses_beside_its_size() {
    let server = start_redis();
    let _w = worker(&server, "s-node-11", &[]);
    let url = server.url();
    let q = queue(&url, "default").await;
    let mut job = create(120, 60);
    job.limits.disk_mb = Some(24);
    let s = open(&q, &job).await;
    const MIB: u64 = 1 << 20;
    let disk = |end: &Event| {
        let info = &result(end)["info"];
        assert_eq!(info["disk_mb"], 24, "{info}");
        info["disk_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("{info}"))
    };
    let (_, end) = call(&q, Call::new(&s.id, CallOp::Info)).await;
    let before = disk(&end);
    assert!(before < MIB, "{before}");

    // /work and /tmp are one disk: both count.
    let fill = "head -c 5242880 /dev/zero > big.bin && head -c 1048576 /dev/zero > /tmp/t.bin";
    let (_, end) = call(&q, Call::exec_shell(&s.id, fill)).await;
    assert_eq!(result(&end)["exit_code"], 0, "{end:?}");
    let (_, end) = call(&q, Call::new(&s.id, CallOp::Info)).await;
    let full = disk(&end);
    assert!(
        (before + 6 * MIB..before + 7 * MIB).contains(&full),
        "{before} then {full}"
    );
    let (code, out, err) = forkbox_cli_with(&url, &["session", "info", &s.id], "");
    assert_eq!(code, 0, "{err}");
    let shown: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(shown["disk_mb"], 24, "{shown}");
    assert!(
        shown["disk_bytes"].as_u64().unwrap() >= before + 6 * MIB,
        "{shown}"
    );

    let (_, end) = call(&q, Call::exec_shell(&s.id, "rm big.bin /tmp/t.bin")).await;
    assert_eq!(result(&end)["exit_code"], 0, "{end:?}");
    let (_, end) = call(&q, Call::new(&s.id, CallOp::Info)).await;
    assert!(disk(&end) < before + MIB, "{end:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_open_and_answer_on_every_partition_of_a_partitioned_queue() {
    let server = start_redis();
    let _w = worker(
        &server,
        "s-node-12",
        &["--queues", "sess", "--partitions", "3"],
    );
    let url = server.url();
    let broker = forkbox_queue::Broker::connect(&url).await.unwrap();
    let q = broker
        .partitioned("sess", 3, forkbox_queue::QueueConfig::default())
        .unwrap();
    q.check_layout().await.unwrap();
    sessions_on_every_partition(&q, "s-node-12", &["--redis", &url]).await;
}
