//! What another local user of the node's host can do to its endpoints: the metrics port,
//! flooded with requests that never finish their head, against a real worker whose
//! descriptors are few.

mod node_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use forkbox_queue::{Job, Status};
use node_support::*;

/// Open descriptors of process `pid`.
fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn half_sent_requests_on_the_metrics_port_cost_no_job() {
    if !have("/usr/bin/prlimit") {
        forkbox_testkit::skipped("no prlimit (util-linux) to give the worker few descriptors");
        return;
    }
    // Room for this test's own connections, whatever the worker gets.
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    const LIMIT: usize = 256;
    let server = start_redis();
    let url = server.url();
    let queue_name = format!("flood-{}", std::process::id());
    let mut w = WorkerProc::start_under(
        &["prlimit", &format!("--nofile={LIMIT}:{LIMIT}"), "--"],
        &url,
        "flooded",
        &["--queues", &queue_name, "--slots", "2"],
    );
    let metrics = w.metrics_addr();
    w.wait_ready();
    let q = queue(&url, &queue_name).await;

    // Twice the worker's whole limit, each with a request head that never ends.
    let mut flood = Vec::new();
    for _ in 0..2 * LIMIT {
        let mut s = TcpStream::connect(metrics).unwrap();
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
        flood.push(s);
    }
    let held = open_fds(w.pid());
    assert!(
        held < LIMIT - 64,
        "the worker holds {held} of its {LIMIT} descriptors under the flood"
    );

    // A job still runs, and more than one (each set-up takes a handful of descriptors).
    for i in 0..4 {
        let id = format!("under-flood-{i}");
        q.enqueue(&Job {
            id: Some(id.clone()),
            ..Job::shell("echo ran")
        })
        .await
        .unwrap();
        let r = q
            .wait_result(&id, Duration::from_secs(60))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no result for {id}; log:\n{}", w.log()));
        assert_eq!(r.outcome.status, Status::Ok, "{:?}", r.outcome.error);
        assert_eq!(r.outcome.stdout, "ran\n");
        assert_eq!(r.attempt, 1);
    }

    // Every flooding connection is closed by the worker: the ones over the limit at once
    // (answered 503, or reset since their request was left unread), the ones it held once
    // their time for the head ran out (no answer). None got the page.
    let deadline = Instant::now() + Duration::from_secs(120);
    for mut s in flood {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "a half-sent request is still open");
        s.set_read_timeout(Some(left)).unwrap();
        let mut got = Vec::new();
        match s.read_to_end(&mut got) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("a half-sent request was not closed: {e}"),
        }
        assert!(
            got.is_empty() || got.starts_with(b"HTTP/1.1 503"),
            "{}",
            String::from_utf8_lossy(&got)
        );
    }

    // Once the flood is gone the node is healthy and the port serves again.
    let (code, body) = http_get(metrics, "/healthz");
    assert_eq!((code, body.as_str()), (200, "ok\n"));
}

#[test]
fn healthz_fails_while_the_node_is_short_of_descriptors() {
    if !have("/usr/bin/prlimit") {
        forkbox_testkit::skipped("no prlimit (util-linux) to give the worker few descriptors");
        return;
    }
    // 80 descriptors: the node starts and serves, but has fewer than the 64 it keeps free
    // for setting up jobs.
    let server = start_redis();
    let mut w = WorkerProc::start_under(
        &["prlimit", "--nofile=80:80", "--"],
        &server.url(),
        "short",
        &[
            "--queues",
            &format!("short-{}", std::process::id()),
            "--slots",
            "1",
        ],
    );
    let metrics = w.metrics_addr();
    w.wait_ready();
    let (code, body) = http_get(metrics, "/healthz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.starts_with("out of descriptors: ")
            && body.contains(" of 80 open, fewer than 64 left"),
        "{body}"
    );
}
