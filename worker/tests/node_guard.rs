//! What a node does with jobs that would hurt it or others, through real `forkbox worker`
//! processes and a private redis-server: values Redis would refuse, `reply_to` outside the
//! queue's replies namespace, limits over the node's maximums, commands the kernel would
//! refuse, bad collect patterns, entries with several `job` fields, completions Redis refuses,
//! results too large to store, a Redis that evicts, and what a node that cannot store says
//! at exit. Each bad job is dead-lettered as `invalid` (or `error`) with a reason naming the
//! field, and the node goes on serving.

mod node_support;

use std::time::Duration;

use forkbox_queue::{redis, Job, JobResult, Queue, Status};
use nix::sys::signal::Signal;
use node_support::*;

const WAIT: Duration = Duration::from_secs(60);

async fn result_of(q: &Queue, id: &str) -> JobResult {
    q.wait_result(id, WAIT)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no result for {id} within {WAIT:?}"))
}

/// The reason of the dead letter stored for `id`.
async fn dead_reason(q: &Queue, id: &str) -> String {
    let letters = q.dlq_list(10_000).await.unwrap();
    letters
        .iter()
        .find(|l| l.id == id)
        .unwrap_or_else(|| panic!("no dead letter for {id}: {letters:?}"))
        .reason
        .clone()
}

/// Asserts that `id` got an `invalid` result naming `field`, and a dead letter.
async fn assert_invalid(q: &Queue, id: &str, field: &str) {
    let r = result_of(q, id).await;
    let error = r.outcome.error.clone().unwrap_or_default();
    assert_eq!(r.outcome.status, Status::Invalid, "{id}: {error}");
    assert!(
        error.contains(field),
        "{id}: {error:?} does not name {field}"
    );
    let reason = dead_reason(q, id).await;
    assert!(reason.contains(field), "{id}: dead letter {reason:?}");
}

async fn assert_serves(q: &Queue, id: &str) {
    q.enqueue(&Job {
        id: Some(id.into()),
        ..Job::shell("echo still-serving")
    })
    .await
    .unwrap();
    let r = result_of(q, id).await;
    assert_eq!(r.outcome.status, Status::Ok, "{r:?}");
    assert_eq!(r.outcome.stdout, "still-serving\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn jobs_with_values_redis_or_the_node_would_refuse_are_invalid_and_the_node_serves_on() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "guard").await;
    // One slot: a job that held its slot for ever would stop everything after it.
    let _w = WorkerProc::start(&url, "guard-1", &["--queues", "guard", "--slots", "1"]);
    let big_arg = "a".repeat(200 * 1024);
    let cases: Vec<(String, String, &str)> = vec![
        (
            "ttl".into(),
            r#"{"id":"ttl","cmd":"true","result_ttl_s":9999999999999999}"#.into(),
            "result_ttl_s",
        ),
        (
            "ttl-node".into(),
            r#"{"id":"ttl-node","cmd":"true","result_ttl_s":31536000}"#.into(),
            "result_ttl_s",
        ),
        (
            "attempts".into(),
            r#"{"id":"attempts","cmd":"true","max_attempts":1000000}"#.into(),
            "max_attempts",
        ),
        (
            "attempts-node".into(),
            r#"{"id":"attempts-node","cmd":"true","max_attempts":500}"#.into(),
            "max_attempts",
        ),
        (
            "disk".into(),
            r#"{"id":"disk","cmd":"true","limits":{"disk_mb":1048576}}"#.into(),
            "limits.disk_mb",
        ),
        (
            "output".into(),
            r#"{"id":"output","cmd":"true","limits":{"output_bytes":1099511627776}}"#.into(),
            "limits.output_bytes",
        ),
        (
            "pids".into(),
            r#"{"id":"pids","cmd":"true","limits":{"pids":65536}}"#.into(),
            "limits.pids",
        ),
        (
            "memory".into(),
            r#"{"id":"memory","cmd":"true","limits":{"memory_mb":1048576}}"#.into(),
            "limits.memory_mb",
        ),
        (
            "timeout".into(),
            r#"{"id":"timeout","cmd":"true","timeout_ms":86400000}"#.into(),
            "timeout_ms",
        ),
        (
            "reply-empty".into(),
            r#"{"id":"reply-empty","cmd":"true","reply_to":""}"#.into(),
            "reply_to",
        ),
        (
            "reply-result".into(),
            r#"{"id":"reply-result","cmd":"true","reply_to":"forkbox:{guard}:result:victim"}"#
                .into(),
            "reply_to",
        ),
        (
            "reply-done".into(),
            r#"{"id":"reply-done","cmd":"true","reply_to":"forkbox:{guard}:done:victim"}"#.into(),
            "reply_to",
        ),
        (
            "reply-jobs".into(),
            r#"{"id":"reply-jobs","cmd":"true","reply_to":"forkbox:{other}:jobs"}"#.into(),
            "reply_to",
        ),
        (
            "reply-results".into(),
            r#"{"id":"reply-results","cmd":"true","reply_to":"forkbox:{other}:results"}"#.into(),
            "reply_to",
        ),
        (
            "reply-other-queue".into(),
            r#"{"id":"reply-other-queue","cmd":"true","reply_to":"forkbox:{other}:replies:x"}"#
                .into(),
            "reply_to",
        ),
        (
            "reply-slot".into(),
            r#"{"id":"reply-slot","cmd":"true","reply_to":"anything-in-another-slot"}"#.into(),
            "reply_to",
        ),
        (
            "batch-empty".into(),
            r#"{"id":"batch-empty","cmd":"true","batch":""}"#.into(),
            "batch",
        ),
        (
            "collect".into(),
            r#"{"id":"collect","cmd":"true","collect":["["]}"#.into(),
            "collect[0]",
        ),
        (
            "cmd-5mb".into(),
            format!(
                r#"{{"id":"cmd-5mb","cmd":"echo {}"}}"#,
                "x".repeat(5 * 1024 * 1024)
            ),
            "cmd",
        ),
        (
            "argv-200k".into(),
            format!(r#"{{"id":"argv-200k","argv":["echo","{big_arg}"]}}"#),
            "argv[1]",
        ),
        (
            "argv-total".into(),
            format!(
                r#"{{"id":"argv-total","argv":["echo"{}]}}"#,
                format!(",\"{}\"", "b".repeat(100_000)).repeat(12)
            ),
            "argv",
        ),
        (
            "env-200k".into(),
            format!(r#"{{"id":"env-200k","cmd":"true","env":{{"BIG":"{big_arg}"}}}}"#),
            "env.BIG",
        ),
    ];
    for (_, payload, _) in &cases {
        q.enqueue_raw(payload.as_bytes()).await.unwrap();
    }
    for (id, _, field) in &cases {
        assert_invalid(&q, id, field).await;
    }
    assert_serves(&q, "after-bad-values").await;
    // The replies namespace itself works, and nothing was written where the bad ones pointed.
    let reply = "forkbox:{guard}:replies:agent";
    q.enqueue_raw(format!(r#"{{"id":"replied","cmd":"echo r","reply_to":"{reply}"}}"#).as_bytes())
        .await
        .unwrap();
    assert_eq!(result_of(&q, "replied").await.outcome.status, Status::Ok);
    let mut c = conn(&url).await;
    let replies: usize = redis::cmd("XLEN")
        .arg(reply)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(replies, 1);
    for key in [
        "forkbox:{guard}:result:victim",
        "forkbox:{guard}:done:victim",
        "forkbox:{other}:jobs",
        "forkbox:{other}:results",
        "forkbox:{other}:replies:x",
        "anything-in-another-slot",
        "",
    ] {
        let exists: bool = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(!exists, "{key:?} was written");
    }
    assert_eq!(q.stats().await.unwrap().pending, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_entry_with_two_job_fields_is_invalid_and_neither_runs() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "twice").await;
    let _w = WorkerProc::start(&url, "twice-1", &["--queues", "twice", "--slots", "1"]);
    let mut c = conn(&url).await;
    let entry: String = redis::cmd("XADD")
        .arg("forkbox:{twice}:jobs")
        .arg("*")
        .arg("job")
        .arg(r#"{"id":"first","cmd":"echo first"}"#)
        .arg("job")
        .arg(r#"{"id":"second","cmd":"echo second"}"#)
        .query_async(&mut c)
        .await
        .unwrap();
    let r = result_of(&q, "first").await;
    assert_eq!(r.outcome.status, Status::Invalid, "{r:?}");
    let error = r.outcome.error.unwrap();
    assert!(error.contains("2 `job` fields"), "{error}");
    let letters = q.dlq_list(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].entry_id, entry);
    assert!(letters[0].reason.contains("exactly one job"));
    assert!(q.result("second").await.unwrap().is_none());
    assert_serves(&q, "after-two-fields").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_at_fault_is_dead_lettered_as_invalid_not_error() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "fault").await;
    let _w = WorkerProc::start(&url, "fault-1", &["--queues", "fault", "--slots", "1"]);
    let big = "x".repeat(2 * 1024 * 1024);
    let cases = [
        (
            "files-over-disk",
            format!(
                r#"{{"id":"files-over-disk","cmd":"true","limits":{{"disk_mb":1}},"files":{{"f":"{big}"}}}}"#
            ),
            "disk",
        ),
        (
            "cwd-file",
            r#"{"id":"cwd-file","cmd":"true","cwd":"/etc/passwd"}"#.to_owned(),
            "passwd",
        ),
    ];
    for (_, payload, _) in &cases {
        q.enqueue_raw(payload.as_bytes()).await.unwrap();
    }
    for (id, _, word) in &cases {
        assert_invalid(&q, id, word).await;
    }
    assert_serves(&q, "after-fault").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn operators_set_the_maximums_by_flag_and_by_file() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "ceil").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("worker.toml");
    std::fs::write(
        &file,
        "max_pids = 32\nmax_job_attempts = 4\nmax_result_ttl_s = 600\nmax_disk_mb = 512\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    // The flag wins over the file for disk; the file gives the rest.
    let _w = WorkerProc::start(
        &url,
        "ceil-1",
        &[
            "--queues",
            "ceil",
            "--slots",
            "1",
            "--config",
            file,
            "--max-disk-mb",
            "128",
            "--max-output-bytes",
            "4096",
        ],
    );
    let cases = [
        (
            "disk",
            r#"{"id":"disk","cmd":"true","limits":{"disk_mb":256}}"#,
            "limits.disk_mb: 256 is over this node's maximum of 128",
        ),
        (
            "pids",
            r#"{"id":"pids","cmd":"true","limits":{"pids":48}}"#,
            "limits.pids: 48 is over this node's maximum of 32",
        ),
        (
            "attempts",
            r#"{"id":"attempts","cmd":"true","max_attempts":5}"#,
            "max_attempts: 5 is over this node's maximum of 4",
        ),
        (
            "ttl",
            r#"{"id":"ttl","cmd":"true","result_ttl_s":601}"#,
            "result_ttl_s: 601 is over this node's maximum of 600",
        ),
        (
            "output",
            r#"{"id":"output","cmd":"true","limits":{"output_bytes":4097}}"#,
            "limits.output_bytes: 4097 is over this node's maximum of 4096",
        ),
    ];
    for (_, payload, _) in &cases {
        q.enqueue_raw(payload.as_bytes()).await.unwrap();
    }
    for (id, _, message) in &cases {
        let r = result_of(&q, id).await;
        assert_eq!(r.outcome.status, Status::Invalid, "{id}: {r:?}");
        assert_eq!(r.outcome.error.as_deref(), Some(*message), "{id}");
        assert_eq!(dead_reason(&q, id).await, *message);
    }
    // At the maximums, jobs run.
    q.enqueue_raw(
        br#"{"id":"at-max","cmd":"echo fine","limits":{"disk_mb":128,"pids":32,"output_bytes":4096},"max_attempts":4,"result_ttl_s":600}"#,
    )
    .await
    .unwrap();
    let r = result_of(&q, "at-max").await;
    assert_eq!(r.outcome.status, Status::Ok, "{r:?}");
    assert_eq!(r.outcome.stdout, "fine\n");
}

#[test]
fn a_maximum_below_a_default_lowers_the_default() {
    // The built-in default disk is 64 MiB; with a maximum of 8 a job that sets none gets 8.
    let out = std::process::Command::new(BIN)
        .args(["run", "--max-disk-mb", "8", "--", "sh", "-c"])
        .arg("df -k /tmp | tail -1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let df = String::from_utf8_lossy(&out.stdout);
    let size: u64 = df.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(size, 8 * 1024, "{df}");
}

#[test]
fn forkbox_run_applies_the_maximums() {
    let out = std::process::Command::new(BIN)
        .args(["run", "--max-pids", "100", "--pids", "200", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("limits.pids: 200 is over this node's maximum of 100"),
        "{err}"
    );
    let out = std::process::Command::new(BIN)
        .args(["run", "--max-pids", "100", "--pids", "100", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn results_over_the_size_maximum_are_stored_cut_with_the_flag_set() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "big").await;
    let _w = WorkerProc::start(
        &url,
        "big-1",
        &[
            "--queues",
            "big",
            "--slots",
            "1",
            "--max-result-bytes",
            "100000",
        ],
    );
    q.enqueue_raw(
        br#"{"id":"big","cmd":"head -c 300000 /dev/zero | tr '\\0' o; echo err >&2","limits":{"output_bytes":1000000}}"#,
    )
    .await
    .unwrap();
    let mut c = conn(&url).await;
    let r = result_of(&q, "big").await;
    assert_eq!(r.outcome.status, Status::Ok, "{:?}", r.outcome.error);
    assert!(r.outcome.stdout_truncated);
    assert!(r.outcome.stdout.len() < 100_000 && r.outcome.stdout.len() > 90_000);
    assert!(r.outcome.stdout.bytes().all(|b| b == b'o'));
    assert_eq!(r.outcome.stderr, "err\n");
    assert!(!r.outcome.stderr_truncated);
    let stored: usize = redis::cmd("STRLEN")
        .arg("forkbox:{big}:result:big")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(stored <= 100_000, "{stored}");
}

#[tokio::test(flavor = "multi_thread")]
async fn results_over_what_redis_takes_in_one_value_are_stored_cut() {
    let server = start_redis();
    let url = server.url();
    let mut c = conn(&url).await;
    // The smallest bulk Redis allows: a 2 MiB result would break the connection on every try.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("proto-max-bulk-len")
        .arg("1048576")
        .query_async(&mut c)
        .await
        .unwrap();
    let q = queue(&url, "bulk").await;
    let _w = WorkerProc::start(&url, "bulk-1", &["--queues", "bulk", "--slots", "1"]);
    q.enqueue_raw(
        br#"{"id":"huge","cmd":"head -c 2097152 /dev/zero | tr '\\0' h","limits":{"output_bytes":4194304}}"#,
    )
    .await
    .unwrap();
    let r = result_of(&q, "huge").await;
    assert_eq!(r.outcome.status, Status::Ok, "{:?}", r.outcome.error);
    assert!(r.outcome.stdout_truncated);
    assert!(
        r.outcome.stdout.len() <= 768 * 1024,
        "{}",
        r.outcome.stdout.len()
    );
    assert!(
        r.outcome.stdout.len() > 700 * 1024,
        "{}",
        r.outcome.stdout.len()
    );
    assert_serves(&q, "after-huge").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_completion_redis_refuses_retires_that_job_and_never_stalls_the_others() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "refuse").await;
    let mut c = conn(&url).await;
    // A client wrote into the key layout: these ids' `done` lists are strings, so Redis
    // refuses their completion script (WRONGTYPE) however often it is sent.
    for id in ["p1", "p2"] {
        let _: () = redis::cmd("SET")
            .arg(format!("forkbox:{{refuse}}:done:{id}"))
            .arg("not a list")
            .query_async(&mut c)
            .await
            .unwrap();
    }
    // One slot holds at most two entries whose results are unstored: two such jobs would
    // stop a node that retried them for ever.
    let _w = WorkerProc::start(&url, "refuse-1", &["--queues", "refuse", "--slots", "1"]);
    for id in ["p1", "p2"] {
        q.enqueue(&Job {
            id: Some(id.into()),
            ..Job::shell("echo poisoned")
        })
        .await
        .unwrap();
    }
    assert_serves(&q, "after-refusal").await;
    for id in ["p1", "p2"] {
        let l = poll(WAIT, "the refused job's dead letter", || {
            let q = q.clone();
            async move {
                q.dlq_list(100)
                    .await
                    .unwrap()
                    .into_iter()
                    .find(|l| l.id == id)
            }
        })
        .await;
        assert!(!l.result_stored, "{l:?}");
        assert!(l.reason.contains("WRONGTYPE"), "{l:?}");
        assert!(l.reason.contains("refused"), "{l:?}");
        assert!(q.result(id).await.unwrap().is_none(), "{id}: half-stored");
    }
    assert_eq!(q.stats().await.unwrap().pending, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redis_that_evicts_is_refused_unless_allowed() {
    let server = start_redis();
    let url = server.url();
    let mut c = conn(&url).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut c)
        .await
        .unwrap();
    let mut w = WorkerProc::start(&url, "evict-1", &["--queues", "evict"]);
    let status = w.wait_exit(WAIT);
    assert!(!status.success());
    let log = w.log();
    assert!(
        log.contains("maxmemory-policy allkeys-lru") && log.contains("--allow-eviction"),
        "{log}"
    );
    let q = queue(&url, "evict").await;
    let mut w = WorkerProc::start(&url, "evict-2", &["--queues", "evict", "--allow-eviction"]);
    w.wait_ready();
    assert_serves(&q, "evicting-but-allowed").await;
    assert!(w.log().contains("jobs are lost"), "{}", w.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn results_left_unstored_at_exit_are_named() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "freeze").await;
    let mut w = WorkerProc::start(
        &url,
        "freeze-1",
        // One slot: while the job runs the reader waits for a slot, not on Redis.
        &["--queues", "freeze", "--slots", "1", "--grace", "5"],
    );
    let metrics = w.metrics_addr();
    q.enqueue(&Job {
        id: Some("stored-first".into()),
        ..Job::shell("true")
    })
    .await
    .unwrap();
    assert_eq!(
        result_of(&q, "stored-first").await.outcome.status,
        Status::Ok
    );
    q.enqueue(&Job {
        id: Some("frozen-out".into()),
        ..Job::shell("sleep 2")
    })
    .await
    .unwrap();
    slots_busy(metrics, 1.0, WAIT, "the job running").await;
    let pid = nix::unistd::Pid::from_raw(server.pid().unwrap() as i32);
    nix::sys::signal::kill(pid, Signal::SIGSTOP).unwrap();
    w.signal(Signal::SIGTERM);
    let status = w.wait_exit(WAIT);
    nix::sys::signal::kill(pid, Signal::SIGCONT).unwrap();
    assert!(!status.success());
    let log = w.log();
    let line = log
        .lines()
        .find(|l| l.contains("could not be stored"))
        .unwrap_or_else(|| panic!("no unstored report; log:\n{log}"));
    assert!(line.contains("1 finished result(s)"), "{line}");
    assert!(line.contains("freeze/frozen-out"), "{line}");
    assert!(!line.contains("stored-first"), "{line}");
    drop(server);
}

#[tokio::test(flavor = "multi_thread")]
async fn one_refused_completion_does_not_fail_the_results_finished_with_it() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "batchref").await;
    let mut c = conn(&url).await;
    let _: () = redis::cmd("SET")
        .arg("forkbox:{batchref}:done:bad")
        .arg("not a list")
        .query_async(&mut c)
        .await
        .unwrap();
    let mut w = WorkerProc::start(
        &url,
        "batchref-1",
        &["--queues", "batchref", "--slots", "4"],
    );
    let metrics = w.metrics_addr();
    let busy = |n: f64| slots_busy(metrics, n, WAIT, "slots busy");
    let ids = ["good-1", "good-2", "good-3", "bad"];
    let jobs: Vec<Job> = ids
        .iter()
        .map(|id| Job {
            id: Some((*id).into()),
            // `bad` finishes last, so it is never the first result stored alone.
            ..Job::shell(if *id == "bad" {
                "sleep 1; echo done"
            } else {
                "sleep 0.5; echo done"
            })
        })
        .collect();
    q.enqueue_batch(&jobs, "together").await.unwrap();
    busy(4.0).await;
    // Redis frozen while they finish: the results pile up in the outbox and go out together,
    // in one pipelined completion that Redis refuses as a whole for `bad`'s sake.
    let pid = nix::unistd::Pid::from_raw(server.pid().unwrap() as i32);
    nix::sys::signal::kill(pid, Signal::SIGSTOP).unwrap();
    busy(0.0).await;
    nix::sys::signal::kill(pid, Signal::SIGCONT).unwrap();
    for id in &ids[..3] {
        let r = result_of(&q, id).await;
        assert_eq!(r.outcome.status, Status::Ok, "{r:?}");
        assert_eq!(r.outcome.stdout, "done\n");
    }
    let l = poll(WAIT, "bad's dead letter", || {
        let q = q.clone();
        async move {
            q.dlq_list(100)
                .await
                .unwrap()
                .into_iter()
                .find(|l| l.id == "bad")
        }
    })
    .await;
    assert!(!l.result_stored && l.reason.contains("WRONGTYPE"), "{l:?}");
    // Refused before anything changed: no half-stored result, no element on the string.
    assert!(q.result("bad").await.unwrap().is_none());
    let done: String = redis::cmd("GET")
        .arg("forkbox:{batchref}:done:bad")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(done, "not a list");
    let stats = poll(WAIT, "nothing pending", || {
        let q = q.clone();
        async move { q.stats().await.ok().filter(|s| s.pending == 0) }
    })
    .await;
    assert_eq!(stats.pending, 0);
    assert_serves(&q, "after-batch-refusal").await;
    let log = w.log();
    assert!(log.contains("storing them one by one"), "{log}");
}
