//! The wire protocol against a real `forkbox worker`: the docs/protocol.md example run verbatim
//! in redis-cli, the same job enqueued from redis-py, and every kind of malformed entry landing
//! in the dead-letter stream while the worker stays healthy.

mod node_support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use forkbox_queue::redis;
use node_support::*;

fn doc() -> String {
    std::fs::read_to_string(repo_file("docs/protocol.md")).expect("docs/protocol.md")
}

/// The lines of the fenced blocks tagged `tag`.
fn block_lines(text: &str, tag: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        match (inside, line.trim_start()) {
            (false, l) if l == format!("```{tag}") => inside = true,
            (true, "```") => inside = false,
            (true, l) if !l.is_empty() => out.push(l.to_owned()),
            _ => {}
        }
    }
    out
}

fn check_hello(json: &str) {
    let r: serde_json::Value = serde_json::from_str(json).expect("result JSON");
    // The result example is the document's `json` block with an `id` (the other is a job).
    let lines = block_lines(&doc(), "json").join("\n");
    let documented: serde_json::Value = serde_json::Deserializer::from_str(&lines)
        .into_iter::<serde_json::Value>()
        .map(|v| v.expect("the json blocks are JSON"))
        .find(|v| v.get("id").is_some())
        .expect("a documented result");
    // Every documented field is present; the stable ones have the documented values.
    for key in documented.as_object().unwrap().keys() {
        assert!(r.get(key).is_some(), "field {key} missing from {r}");
    }
    for key in [
        "id",
        "status",
        "exit_code",
        "stdout",
        "stderr",
        "timed_out",
        "attempt",
    ] {
        assert_eq!(r[key], documented[key], "{key} in {r}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_documented_redis_cli_example_runs_verbatim() {
    if !have("redis-cli") {
        forkbox_queue::skip::skipped("redis-cli is not installed");
        return;
    }
    let server = start_redis();
    let mut worker = WorkerProc::start(&server.url(), "doc-worker", &["--slots", "2"]);
    worker.wait_ready();
    let lines = block_lines(&doc(), "redis-cli");
    assert_eq!(lines.len(), 3, "{lines:?}");
    let script = lines.join("\n") + "\n";
    let run = |script: String| {
        let port = server.port().to_string();
        let mut child = Command::new("redis-cli")
            .args(["-p", &port])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap()
    };
    let out = run(script);
    let out: Vec<&str> = out.lines().collect();
    assert_eq!(out.len(), 4, "{out:?}");
    assert!(out[0].contains('-'), "an entry id: {out:?}");
    assert_eq!(out[1], "forkbox:{default}:done:hello-1");
    assert_eq!(out[2], "ok");
    check_hello(out[3]);

    // Again, as the document says: a second entry with the same id is acknowledged without
    // running, and GET gives the first result (BLPOP would wait out its timeout: left out).
    let again = format!("{}\n", lines[0]);
    let entry = run(again);
    let url = server.url();
    poll(
        Duration::from_secs(30),
        "the second entry acknowledged",
        || {
            let url = url.clone();
            async move {
                let mut c = conn(&url).await;
                let len: u64 = redis::cmd("XLEN")
                    .arg("forkbox:{default}:jobs")
                    .query_async(&mut c)
                    .await
                    .unwrap();
                (len == 0).then_some(())
            }
        },
    )
    .await;
    let get = run(format!("{}\n", lines[2]));
    assert_eq!(
        get.trim(),
        out[3],
        "second entry {entry} changed the result"
    );
    let results = results_stream(&url, "default").await;
    assert_eq!(results.len(), 1, "one result for hello-1: {results:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redis_py_enqueue_works_the_same() {
    let python = std::env::var("FORKBOX_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python).args(["-c", "import redis"]).output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            forkbox_queue::skip::skipped(format!(
                "{python} cannot import redis ({}); the Makefile's venv provides it, \
                 or point FORKBOX_PYTHON at an interpreter that has it",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ));
            return;
        }
        Err(e) => {
            forkbox_queue::skip::skipped(format!("cannot run {python}: {e}"));
            return;
        }
    }
    let server = start_redis();
    let mut worker = WorkerProc::start(&server.url(), "py-worker", &["--slots", "1"]);
    worker.wait_ready();
    let script = r#"
import json, sys, redis
r = redis.Redis.from_url(sys.argv[1])
r.xadd("forkbox:{default}:jobs", {"job": json.dumps({"id": "hello-1", "cmd": "echo hello"})})
assert r.blpop("forkbox:{default}:done:hello-1", 30) is not None, "no result within 30 s"
print(r.get("forkbox:{default}:result:hello-1").decode())
"#;
    let out = Command::new(&python)
        .args(["-c", script, &server.url()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_hello(String::from_utf8(out.stdout).unwrap().trim());
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_entries_are_dead_lettered_with_their_reason() {
    let server = start_redis();
    let url = server.url();
    let mut worker = WorkerProc::start(
        &url,
        "dlq-worker",
        &["--slots", "2", "--max-job-bytes", "4096"],
    );
    let metrics = worker.metrics_addr();
    worker.wait_ready();
    let mut c = conn(&url).await;
    let big = format!(r#"{{"id":"big","cmd":"echo {}"}}"#, "x".repeat(5000));
    // (payload or none, expected reason fragment)
    let cases: Vec<(Option<Vec<u8>>, &str)> = vec![
        (Some(b"this is not json".to_vec()), "not valid JSON"),
        (Some(vec![b'{', 0xff, 0xfe, b'}']), "not UTF-8"),
        (None, "no `job` field"),
        (
            Some(br#"{"id":"m-1","env":{}}"#.to_vec()),
            "cmd: a job needs",
        ),
        (
            Some(br#"{"id":"m-2","cmd":"true","timeout_ms":"soon"}"#.to_vec()),
            "timeout_ms: invalid type",
        ),
        (
            Some(br#"{"id":"m-3","cmd":"true","colour":"red"}"#.to_vec()),
            "unknown field `colour`",
        ),
        (
            Some(br#"{"id":"m-4","cmd":"true","network":"host"}"#.to_vec()),
            "network: unknown variant `host`",
        ),
        (Some(big.into_bytes()), "4096"),
    ];
    let mut entries = Vec::new();
    for (payload, _) in &cases {
        let mut cmd = redis::cmd("XADD");
        cmd.arg("forkbox:{default}:jobs").arg("*");
        match payload {
            Some(p) => cmd.arg("job").arg(p.as_slice()),
            None => cmd.arg("payload").arg("{}"),
        };
        let entry: String = cmd.query_async(&mut c).await.unwrap();
        entries.push(entry);
    }
    let q = queue(&url, "default").await;
    let letters = poll(
        Duration::from_secs(30),
        "every malformed entry dead-lettered",
        || {
            let q = q.clone();
            let n = cases.len();
            async move {
                let l = q.dlq_list(100).await.unwrap();
                (l.len() == n).then_some(l)
            }
        },
    )
    .await;
    for ((payload, reason), entry) in cases.iter().zip(&entries) {
        let letter = letters
            .iter()
            .find(|l| &l.entry_id == entry)
            .expect("a dead letter per entry");
        assert!(
            letter.reason.contains(reason),
            "expected {reason:?} in {:?}",
            letter.reason
        );
        assert_eq!(&letter.job, payload.as_ref().unwrap_or(&Vec::new()));
        // Waiters wake up: a result with status invalid under the job's id or its entry id.
        let r = q.result(&letter.id).await.unwrap().expect("a result");
        assert_eq!(r.outcome.status, forkbox_queue::Status::Invalid);
    }
    assert!(letters
        .iter()
        .any(|l| l.id == "m-1" && l.entry_id == entries[3]));
    // Still healthy, and the next good job runs.
    let (code, body) = http_get(metrics, "/healthz");
    assert_eq!(code, 200, "{body}");
    let id = q
        .enqueue(&forkbox_queue::Job::shell("echo after"))
        .await
        .unwrap();
    let r = q
        .wait_result(&id, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the good job ran");
    assert_eq!(r.outcome.stdout, "after\n");
    let n = cases.len() as f64;
    metric_reaches(
        metrics,
        "forkbox_dead_letter_total",
        &[("queue", "default")],
        n,
    );
    let invalid = [("queue", "default"), ("status", "invalid")];
    metric_reaches(metrics, "forkbox_jobs_total", &invalid, n);
    assert!(worker.try_wait().is_none(), "the worker is still running");
}

/// A job has no network unless it asks for one, and one that asks for loopback gets it, from a
/// node whose ready sandboxes are built for the default.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_gets_a_loopback_network_only_when_it_asks_for_one() {
    let server = start_redis();
    let url = server.url();
    let mut worker = WorkerProc::start(&url, "net-worker", &["--slots", "2"]);
    worker.wait_ready();
    let q = queue(&url, "default").await;
    let program = "import socket\n\
        try:\n    s = socket.create_server(('127.0.0.1', 0)); print('served')\n\
        except OSError as e:\n    print('errno', e.errno)";
    let job = |network| forkbox_queue::Job {
        network,
        ..forkbox_queue::Job::argv(["python3", "-c", program])
    };
    for (network, want) in [
        (None, format!("errno {}\n", libc::EAFNOSUPPORT)),
        (
            Some(forkbox_queue::Network::Loopback),
            "served\n".to_owned(),
        ),
        (
            Some(forkbox_queue::Network::None),
            format!("errno {}\n", libc::EAFNOSUPPORT),
        ),
    ] {
        let id = q.enqueue(&job(network)).await.unwrap();
        let r = q
            .wait_result(&id, Duration::from_secs(60))
            .await
            .unwrap()
            .expect("a result");
        assert_eq!(r.outcome.status, forkbox_queue::Status::Ok, "{network:?}");
        assert_eq!(r.outcome.stdout, want, "{network:?}: {}", r.outcome.stderr);
    }
}
