//! Sessions at the engine level: real sandboxes running the session supervisor, no Redis.
//! Each test opens sessions, sends call frames and asserts what comes back: results, streamed
//! events, errors, and how a session ends.

mod sandbox_support;

use std::collections::BTreeMap;
use std::time::Duration;

use forkbox::sandbox::{EndReason, Engine, SandboxSession, SessionSpec};
use forkbox_queue::schema::{Job, Limits, Runtime, Status};
use sandbox_support::session::{assert_no_space, assert_unseen_by, call, run, warm_engine, zygote};
use serde_json::{json, Value};

fn engine() -> Engine {
    // The rootless re-run below names a copy of the binary that `nobody` can execute.
    warm_engine(&zygote("FORKBOX_SESSION_ZYGOTE"), 2)
}

fn spec() -> SessionSpec {
    SessionSpec {
        runtime: Some(Runtime::Python),
        ttl_ms: 120_000,
        ..SessionSpec::default()
    }
}

async fn open(engine: &Engine, spec: SessionSpec) -> SandboxSession {
    engine.open_session(spec).await.expect("session opens")
}

#[tokio::test(flavor = "multi_thread")]
async fn state_persists_across_run_code_calls() {
    let engine = engine();
    let mut s = open(&engine, spec()).await;
    assert_eq!(s.hello()["kind"], "ready");
    assert!(s.runtime().is_some_and(|r| r.warm), "{:?}", s.runtime());
    let r = run(&mut s, "import math\nx = 40\ndef f(y):\n    return y + 2").await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["execution_count"], 1);
    assert_eq!(r["text"], Value::Null);
    let r = run(&mut s, "f(x) + int(math.sqrt(0))").await;
    assert_eq!(r["text"], "42", "{r}");
    assert_eq!(r["data"]["text/plain"], "42");
    assert_eq!(r["execution_count"], 2);
    let end = s.kill().await;
    assert_eq!(end.reason, EndReason::Killed);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_last_expression_gives_its_text_and_its_html() {
    let engine = engine();
    let mut s = open(&engine, spec()).await;
    let r = run(
        &mut s,
        "class T:\n    def _repr_html_(self):\n        return '<b>t</b>'\n    def __repr__(self):\n        return 'T()'\nT()",
    )
    .await;
    assert_eq!(r["text"], "T()", "{r}");
    assert_eq!(r["data"]["text/plain"], "T()");
    assert_eq!(r["data"]["text/html"], "<b>t</b>");
    // A statement last gives no value; an expression that is None neither.
    let r = run(&mut s, "y = 1").await;
    assert_eq!(r["text"], Value::Null);
    let r = run(&mut s, "None").await;
    assert_eq!(r["text"], Value::Null);
    assert_eq!(
        run(&mut s, "_").await["text"],
        "T()",
        "`_` is the last value"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_traceback_names_the_cell_and_shows_its_line() {
    let engine = engine();
    let mut s = open(&engine, spec()).await;
    run(&mut s, "a = 1").await;
    let r = run(
        &mut s,
        "def g():\n    return 1 / 0  # the failing line\ng()",
    )
    .await;
    assert_eq!(r["ok"], false);
    let e = &r["exception"];
    assert_eq!(e["name"], "ZeroDivisionError", "{r}");
    assert_eq!(e["value"], "division by zero");
    let tb = e["traceback"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(tb.contains("File \"<cell 2>\", line 2, in g"), "{tb}");
    assert!(tb.contains("return 1 / 0  # the failing line"), "{tb}");
    assert!(
        !tb.contains("session_supervisor") && !tb.contains("run_cell"),
        "{tb}"
    );
    let r = run(&mut s, "def (:").await;
    assert_eq!(r["exception"]["name"], "SyntaxError", "{r}");
    assert_eq!(
        run(&mut s, "a").await["text"],
        "1",
        "an error keeps the state"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn output_is_streamed_as_it_comes_and_returned_whole() {
    let engine = engine();
    let mut s = open(&engine, spec()).await;
    let code = "import os, sys, time\nprint('first')\ntime.sleep(0.5)\nos.write(1, b'second\\n')\nprint('err', file=sys.stderr)";
    let a = call(&mut s, json!({"op": "run_code", "code": code})).await;
    let stdout_events = a.events.iter().filter(|e| e["kind"] == "stdout").count();
    assert!(stdout_events >= 2, "{:?}", a.events);
    assert_eq!(a.streamed("stdout"), "first\nsecond\n");
    assert_eq!(a.streamed("stderr"), "err\n");
    assert_eq!(a.result["stdout"], "first\nsecond\n");
    assert_eq!(a.result["stderr"], "err\n");
    // A subprocess of the cell writes to the same streams.
    let r = run(
        &mut s,
        "import subprocess\nsubprocess.run(['echo', 'child'])",
    )
    .await;
    assert_eq!(r["stdout"], "child\n", "{r}");
    // Past the call's output cap the rest is cut.
    let r = call(
        &mut s,
        json!({"op": "run_code", "code": "print('x' * 5000)", "output_bytes": 100}),
    )
    .await
    .result;
    assert_eq!(r["stdout"].as_str().unwrap().len(), 100, "{r}");
    assert_eq!(r["output_truncated"], true);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cell_past_its_timeout_is_interrupted_and_the_state_kept() {
    let engine = engine();
    let mut s = open(&engine, spec()).await;
    run(&mut s, "kept = 'yes'").await;
    let r = call(
        &mut s,
        json!({"op": "run_code", "code": "while True:\n    pass", "timeout_ms": 500}),
    )
    .await
    .result;
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(r["state_lost"], false);
    assert_eq!(r["exception"]["name"], "KeyboardInterrupt");
    assert_eq!(run(&mut s, "kept").await["text"], "'yes'");
    // A cell that ignores SIGINT is killed after the grace: a fresh interpreter.
    let r = call(
        &mut s,
        json!({"op": "run_code", "code": "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)", "timeout_ms": 300}),
    )
    .await
    .result;
    assert_eq!(
        (r["timed_out"].clone(), r["state_lost"].clone()),
        (json!(true), json!(true)),
        "{r}"
    );
    let r = run(&mut s, "kept").await;
    assert_eq!(r["exception"]["name"], "NameError", "{r}");
    assert_eq!(r["execution_count"], 1, "a fresh interpreter counts from 1");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupt_stops_the_cell_and_keeps_the_state() {
    let engine = engine();
    let mut s = open(&engine, spec()).await;
    run(&mut s, "kept = 7").await;
    let cell = json!({"id": "slow", "op": "run_code", "code": "import time\nprint('started', flush=True)\ntime.sleep(60)"});
    s.send(&serde_json::to_vec(&cell).unwrap()).await.unwrap();
    // Once the cell runs (its first output), interrupt it.
    let first: Value = serde_json::from_slice(&s.recv().await.unwrap()).unwrap();
    assert!(
        first["data"].as_str().unwrap().starts_with("started"),
        "{first}"
    );
    s.interrupt();
    let r = loop {
        let r: Value = tokio::time::timeout(Duration::from_secs(20), s.recv())
            .await
            .expect("the interrupt is served at once")
            .map(|f| serde_json::from_slice(&f).unwrap())
            .unwrap();
        if r["kind"] == "result" {
            break r;
        }
    };
    assert_eq!(r["interrupted"], true, "{r}");
    assert_eq!(r["exception"]["name"], "KeyboardInterrupt");
    assert_eq!(run(&mut s, "kept").await["text"], "7");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interpreter_that_dies_is_replaced_and_says_so() {
    let engine = engine();
    let mut s = open(&engine, spec()).await;
    run(&mut s, "before = 1").await;
    let r = run(&mut s, "import os\nos._exit(3)").await;
    assert_eq!(r["state_lost"], true, "{r}");
    assert!(r["error"].as_str().unwrap().contains("exit code 3"), "{r}");
    let r = run(&mut s, "before").await;
    assert_eq!(r["exception"]["name"], "NameError", "{r}");
    assert_eq!(run(&mut s, "1 + 1").await["text"], "2");
    // A segfault too.
    let r = run(&mut s, "import ctypes\nctypes.string_at(0)").await;
    assert_eq!(r["state_lost"], true, "{r}");
    assert!(r["error"].as_str().unwrap().contains("SIGSEGV"), "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn files_are_written_read_listed_and_removed_within_work() {
    let engine = engine();
    let mut s = open(&engine, spec()).await;
    let ok = |r: &Value| assert_eq!(r["ok"], true, "{r}");
    ok(&call(
        &mut s,
        json!({"op": "files_write", "path": "d/a.txt", "data": "hello"}),
    )
    .await
    .result);
    ok(&call(
        &mut s,
        json!({"op": "files_write", "path": "/work/b.bin", "data": {"b64": "AP8="}}),
    )
    .await
    .result);
    let r = call(&mut s, json!({"op": "files_read", "path": "d/a.txt"}))
        .await
        .result;
    assert_eq!(r["data"], "hello");
    let r = call(&mut s, json!({"op": "files_read", "path": "b.bin"}))
        .await
        .result;
    assert_eq!(r["data"], json!({"b64": "AP8="}));
    // The session's code sees the same disk.
    assert_eq!(
        run(&mut s, "open('d/a.txt').read()").await["text"],
        "'hello'"
    );
    let r = call(&mut s, json!({"op": "files_list"})).await.result;
    let names: Vec<_> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["type"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(names.contains(&("d".into(), "dir".into())), "{r}");
    assert!(names.contains(&("b.bin".into(), "file".into())), "{r}");
    ok(&call(&mut s, json!({"op": "files_remove", "path": "d"}))
        .await
        .result);
    let r = call(&mut s, json!({"op": "files_read", "path": "d/a.txt"}))
        .await
        .result;
    assert_eq!(r["ok"], false);
    assert!(r["error"].as_str().unwrap().contains("d/a.txt"), "{r}");
    for bad in ["../x", "/etc/passwd", "a/../../x"] {
        let r = call(&mut s, json!({"op": "files_read", "path": bad}))
            .await
            .result;
        assert_eq!(r["ok"], false, "{bad}: {r}");
        assert!(r["error"].as_str().unwrap().contains(bad), "{bad}: {r}");
    }
    // A symlink planted by the session's code does not lead out of /work.
    run(
        &mut s,
        "import os\nos.symlink('/etc', 'out')\nos.symlink('/etc/hostname', 'host')",
    )
    .await;
    for bad in ["out/hostname", "host"] {
        let r = call(&mut s, json!({"op": "files_read", "path": bad}))
            .await
            .result;
        assert_eq!(r["ok"], false, "{bad}: {r}");
    }
    let r = call(
        &mut s,
        json!({"op": "files_write", "path": "out/x", "data": "x"}),
    )
    .await
    .result;
    assert!(r["error"].as_str().unwrap().contains("symlink"), "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_runs_a_command_with_its_stdin_and_exit_code() {
    let engine = engine();
    let mut s = open(&engine, spec()).await;
    let a = call(
        &mut s,
        json!({"op": "exec", "cmd": "tr a-z A-Z; echo err >&2; exit 5", "stdin": "abc\n"}),
    )
    .await;
    assert_eq!(a.result["exit_code"], 5, "{}", a.result);
    assert_eq!(a.result["stdout"], "ABC\n");
    assert_eq!(a.result["stderr"], "err\n");
    assert_eq!(a.streamed("stdout"), "ABC\n");
    let r = call(&mut s, json!({"op": "exec", "argv": ["sh", "-c", "echo $X $PWD"], "env": {"X": "y"}, "cwd": "sub"})).await.result;
    assert!(r["ok"] == false || r["stdout"] == "y /work/sub\n", "{r}");
    run(&mut s, "import os\nos.makedirs('sub', exist_ok=True)").await;
    let r = call(&mut s, json!({"op": "exec", "argv": ["sh", "-c", "echo $X $PWD"], "env": {"X": "y"}, "cwd": "sub"})).await.result;
    assert_eq!(r["stdout"], "y /work/sub\n", "{r}");
    let r = call(
        &mut s,
        json!({"op": "exec", "argv": ["sh", "-c", "kill -9 $$"]}),
    )
    .await
    .result;
    assert_eq!(
        (r["signal"].clone(), r["exit_code"].clone()),
        (json!(9), json!(137)),
        "{r}"
    );
    let r = call(
        &mut s,
        json!({"op": "exec", "cmd": "sleep 30", "timeout_ms": 300}),
    )
    .await
    .result;
    assert_eq!(r["timed_out"], true, "{r}");
    let r = call(&mut s, json!({"op": "exec", "argv": ["no-such-program"]}))
        .await
        .result;
    assert_eq!(r["ok"], false);
    assert!(
        r["error"].as_str().unwrap().contains("no-such-program"),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_grown_over_calls_meets_the_session_limit() {
    let engine = engine();
    let mut s = open(
        &engine,
        SessionSpec {
            limits: Limits {
                memory_mb: Some(128),
                ..Limits::default()
            },
            ..spec()
        },
    )
    .await;
    run(&mut s, "hold = []").await;
    let mut ended = None;
    for i in 0..20 {
        let frame = json!({"id": format!("m{i}"), "op": "run_code", "code": "hold.append(bytearray(16 << 20))"});
        // A send fails when the session ended between two calls; `recv` then says how.
        let _ = s.send(&serde_json::to_vec(&frame).unwrap()).await;
        match s.recv().await {
            Ok(f) => {
                let r: Value = serde_json::from_slice(&f).unwrap();
                if r["exception"]["name"] == "MemoryError" {
                    // The interpreter's own allocation was refused (its data rlimit). The
                    // session answers on, unless its processes together are past the limit
                    // too, which its init sees at its next check: then it ends as its
                    // memory limit. Either is the limit holding; nothing else is.
                    let next = json!({"id": "after", "op": "run_code", "code": "len(hold) > 2"});
                    let _ = s.send(&serde_json::to_vec(&next).unwrap()).await;
                    ended = Some(loop {
                        match s.recv().await {
                            Ok(f) => {
                                let r: Value = serde_json::from_slice(&f).unwrap();
                                if r["kind"] == "result" {
                                    assert_eq!(r["text"], "True", "{r}");
                                    break "memory_error";
                                }
                            }
                            Err(end) => {
                                assert_eq!(end.reason, EndReason::MemoryLimit, "{}", end.message());
                                break "memory_error, then ended";
                            }
                        }
                    });
                    break;
                }
                assert_eq!(r["ok"], true, "{r}");
            }
            Err(end) => {
                assert_eq!(end.reason, EndReason::MemoryLimit, "{}", end.message());
                ended = Some("ended");
                break;
            }
        }
    }
    assert!(ended.is_some(), "20 × 16 MiB grew past 128 MiB unnoticed");
    println!("memory limit: {ended:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_disk_filled_over_calls_gives_enospc() {
    let engine = engine();
    let mut s = open(
        &engine,
        SessionSpec {
            limits: Limits {
                disk_mb: Some(4),
                ..Limits::default()
            },
            ..spec()
        },
    )
    .await;
    assert_eq!(s.disk_mb(), 4);
    let empty = s.usage().disk_bytes;
    assert!(empty < 1 << 20, "{:?}", s.usage());
    let chunk = "x".repeat(900 << 10);
    let mut refused = None;
    for i in 0..8 {
        let r = call(
            &mut s,
            json!({"op": "files_write", "path": format!("f{i}"), "data": chunk}),
        )
        .await
        .result;
        if r["ok"] == false {
            refused = Some((i, r["error"].as_str().unwrap().to_owned()));
            break;
        }
    }
    let (i, error) = refused.expect("4 MiB of disk took 7 MiB");
    assert!(i >= 3 && error.contains("No space left"), "{i}: {error}");
    // What the disk holds is read from outside: the files written, within its size.
    let full = s.usage().disk_bytes;
    assert!(
        (empty + (i as u64) * (900 << 10)..=4 << 20).contains(&full),
        "{i} files, {full} bytes"
    );
    let r = run(&mut s, "open('g', 'wb').write(b'y' * (3 << 20))").await;
    assert_no_space(&r);
}

#[tokio::test(flavor = "multi_thread")]
async fn processes_kept_over_calls_meet_the_session_pids_limit() {
    let engine = engine();
    let mut s = open(
        &engine,
        SessionSpec {
            limits: Limits {
                pids: Some(16),
                ..Limits::default()
            },
            ..spec()
        },
    )
    .await;
    run(&mut s, "import subprocess\nkept = []").await;
    let start4 =
        "for _ in range(4):\n    kept.append(subprocess.Popen(['sleep', '600']))\nlen(kept)";
    let mut refused = None;
    for i in 0..8 {
        let r = run(&mut s, start4).await;
        if r["exception"] != Value::Null {
            refused = Some((i, r));
            break;
        }
        assert_eq!(r["text"], format!("{}", 4 * (i + 1)), "{r}");
    }
    let (i, r) = refused.expect("32 processes kept under a limit of 16");
    assert!(i >= 2, "refused after {i} calls: {r}");
    assert_eq!(r["exception"]["name"], "BlockingIOError", "{r}");
    // The session answers on, and the room comes back as its processes end.
    let r = run(&mut s, "for p in kept: p.kill(); p.wait()\nkept.clear()").await;
    assert_eq!(r["exception"], Value::Null, "{r}");
    let r = run(&mut s, start4).await;
    assert_eq!(r["text"], "4", "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_sessions_see_neither_files_nor_processes_of_the_other() {
    let engine = engine();
    let mut a = open(&engine, spec()).await;
    let mut b = open(&engine, spec()).await;
    assert_unseen_by(&mut a, &mut b).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_holds_no_capability_and_reaches_nothing_of_the_host() {
    let engine = engine();
    let mut s = open(&engine, spec()).await;
    let r = call(&mut s, json!({"op": "exec", "cmd": "unshare -U true"}))
        .await
        .result;
    assert_ne!(r["exit_code"], 0, "{r}");
    let status = run(&mut s, "[l for l in open('/proc/self/status') if l.startswith(('CapEff', 'Seccomp:', 'NoNewPrivs'))]").await;
    let text = status["text"].as_str().unwrap();
    assert!(text.contains("CapEff:\\t0000000000000000"), "{text}");
    assert!(text.contains("Seccomp:\\t2"), "{text}");
    assert!(text.contains("NoNewPrivs:\\t1"), "{text}");
    let r = run(&mut s, "open('/etc/shadow').read()").await;
    assert_eq!(r["exception"]["name"], "PermissionError", "{r}");
    let r = run(&mut s, "open('/etc/passwd', 'a')").await;
    assert!(r["exception"]["name"] != Value::Null, "{r}");
}

/// The job battery's escape checks (`sandbox_support::escapes`), each run in a session as an
/// `exec` and as a `run_code` cell, in a session of each `network`.
#[tokio::test(flavor = "multi_thread")]
async fn the_escape_checks_hold_in_a_session_through_exec_and_run_code() {
    use forkbox_queue::schema::Network;
    use sandbox_support::escapes::escapes;

    let engine = engine();
    for network in [Network::None, Network::Loopback] {
        let mut s = open(
            &engine,
            SessionSpec {
                network: Some(network),
                ..spec()
            },
        )
        .await;
        for e in escapes(network) {
            let r = call(&mut s, json!({"op": "exec", "argv": e.argv()}))
                .await
                .result;
            assert_eq!(r["ok"], true, "{network:?} {} exec: {r}", e.name);
            let out = r["stdout"].as_str().unwrap_or_default();
            if let Err(why) = (e.check)(out) {
                panic!("{network:?}: {} through exec: {why}", e.name);
            }
            let r = run(&mut s, &e.cell()).await;
            assert_eq!(
                r["exception"],
                Value::Null,
                "{network:?} {} run_code: {r}",
                e.name
            );
            let out = r["stdout"].as_str().unwrap_or_default();
            if let Err(why) = (e.check)(out) {
                panic!("{network:?}: {} through run_code: {why}", e.name);
            }
        }
        // The session lived through every check.
        assert_eq!(run(&mut s, "6 * 7").await["text"], "42");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_ends_at_its_ttl_and_its_cpu_time_is_counted_across_calls() {
    let engine = engine();
    let s = open(
        &engine,
        SessionSpec {
            ttl_ms: 1500,
            ..spec()
        },
    )
    .await;
    let mut s = s;
    let end = tokio::time::timeout(Duration::from_secs(30), s.recv())
        .await
        .expect("the watchdog ends it")
        .expect_err("no frame comes");
    assert_eq!(end.reason, EndReason::Ttl, "{}", end.message());

    // The budget counts the whole sandbox, its start included (the supervisor and its
    // kernel), which costs several times more on a slow machine (the VM tier's emulated
    // guest): measured first on a session like it, so the spins get the same room anywhere.
    let mut probe = open(&engine, spec()).await;
    run(&mut probe, "1").await;
    let start_ms = probe.usage().cpu_ms;
    probe.kill().await;
    let budget_ms = 2 * start_ms + 1500;
    let mut s = open(
        &engine,
        SessionSpec {
            limits: Limits {
                cpu_ms: Some(budget_ms),
                ..Limits::default()
            },
            ..spec()
        },
    )
    .await;
    let spin =
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6:\n    pass";
    let mut end = None;
    let mut used_ms = 0;
    for i in 0..16 {
        let frame = json!({"id": format!("spin{i}"), "op": "run_code", "code": spin});
        // The budget can run out just after a call's result was sent (the watchdog samples
        // it), so the session may be gone before the next call: its end is read then.
        let sent = s.send(&serde_json::to_vec(&frame).unwrap()).await;
        let next = s.recv().await;
        if let (Err(why), Ok(f)) = (&sent, &next) {
            panic!("call {i} was not sent ({why}) yet a frame came: {f:?}");
        }
        match next {
            Ok(f) => {
                let r: Value = serde_json::from_slice(&f).unwrap();
                assert!(r["cpu_ms"].as_u64().unwrap() >= 500, "{r}");
                used_ms = s.usage().cpu_ms;
                assert!(used_ms >= 500 * (i + 1), "{:?}", s.usage());
            }
            Err(e) => {
                end = Some((i, e));
                break;
            }
        }
    }
    let (i, end) =
        end.unwrap_or_else(|| panic!("9.6 s of CPU went past a budget of {budget_ms} ms"));
    assert_eq!(end.reason, EndReason::CpuLimit, "{}", end.message());
    assert!(
        i >= 2,
        "ended after {i} calls, {used_ms} ms used, with a budget of {budget_ms} ms (a session's \
         start took {start_ms} ms)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_take_no_job_slot() {
    let engine = warm_engine(sandbox_support::BIN, 1);
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(open(&engine, spec()).await);
    }
    let job = Job::argv(["echo", "job"]);
    let outcome = tokio::time::timeout(Duration::from_secs(60), engine.run(&job))
        .await
        .expect("a job runs beside three sessions on one slot");
    assert_eq!(
        (outcome.status, outcome.stdout.as_str()),
        (Status::Ok, "job\n")
    );
    for s in &mut sessions {
        assert_eq!(run(s, "6 * 7").await["text"], "42");
        assert!(s.usage().memory_kb > 0);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cold_session_runs_python3_from_the_root() {
    let engine = engine();
    let mut s = open(
        &engine,
        SessionSpec {
            runtime: None,
            ..spec()
        },
    )
    .await;
    assert!(s.runtime().is_none());
    assert_eq!(
        run(&mut s, "import sys\nsys.version_info >= (3, 9)").await["text"],
        "True"
    );
}

/// The session's code tries to reach the supervisor's descriptors through `/proc` and write a
/// length past the bound on its frame pipe: either every descriptor is out of its reach, or
/// the node ends the session for the violation; either way the supervisor serves on or the
/// session ends with the reason. Nothing else may happen.
#[tokio::test(flavor = "multi_thread")]
async fn a_frame_over_the_bound_from_the_session_ends_it() {
    let engine = engine();
    for runtime in [Some(Runtime::Python), None] {
        let mut s = open(&engine, SessionSpec { runtime, ..spec() }).await;
        let code = "import os, struct\nsup = os.getppid()\nrefused = 0\nfor fd in os.listdir('/proc/%d/fd' % sup):\n    try:\n        w = os.open('/proc/%d/fd/%s' % (sup, fd), os.O_WRONLY)\n        os.write(w, struct.pack('>I', 2 << 20))\n    except PermissionError:\n        refused += 1\nrefused";
        let frame = json!({"id": "evil", "op": "run_code", "code": code});
        s.send(&serde_json::to_vec(&frame).unwrap()).await.unwrap();
        loop {
            match tokio::time::timeout(Duration::from_secs(30), s.recv())
                .await
                .expect("an answer")
            {
                Ok(f) => {
                    let r: Value = serde_json::from_slice(&f).unwrap();
                    if r["kind"] != "result" {
                        continue;
                    }
                    // The node's pipes are out of reach (created by the node, they are not
                    // the sandbox's to reopen); the kernel's own are not, and garbage there
                    // costs the session its interpreter, nothing more.
                    if r["state_lost"] == false {
                        let refused: u64 = r["text"].as_str().unwrap_or("0").parse().unwrap();
                        assert!(refused >= 3, "{runtime:?}: {r}");
                    }
                    assert_eq!(run(&mut s, "1").await["text"], "1", "{runtime:?}");
                    break;
                }
                Err(end) => {
                    assert!(
                        matches!(end.reason, EndReason::ProtocolViolation(_)),
                        "{runtime:?}: {}",
                        end.message()
                    );
                    break;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_specs_are_refused_with_the_reason() {
    let engine = engine();
    let err = engine
        .open_session(SessionSpec {
            limits: Limits {
                memory_mb: Some(1 << 30),
                ..Limits::default()
            },
            ..spec()
        })
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("limits.memory_mb"), "{err}");
    let _ = BTreeMap::<String, String>::new();
}

/// The isolation checks above, run again by `nobody`: a rootless node's sessions hold no
/// capability, reach nothing of the host and see nothing of each other either.
#[test]
fn a_rootless_nodes_sessions_hold_the_same_isolation() {
    sandbox_support::session::rerun_as_nobody(
        "session_engine",
        "FORKBOX_SESSION_ZYGOTE",
        &[],
        &[
            "a_session_holds_no_capability_and_reaches_nothing_of_the_host",
            "two_sessions_see_neither_files_nor_processes_of_the_other",
            "the_escape_checks_hold_in_a_session_through_exec_and_run_code",
            "a_disk_filled_over_calls_gives_enospc",
        ],
    );
}
