//! A node whose sandbox zygote dies reports itself unhealthy and exits with an error, so that
//! its supervisor restarts it, instead of failing every job it reads.

mod node_support;

use std::time::{Duration, Instant};

use node_support::*;

fn zygote_of(worker: i32) -> Option<i32> {
    let children =
        std::fs::read_to_string(format!("/proc/{worker}/task/{worker}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|pid: &i32| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains("__zygote"))
                .unwrap_or(false)
        })
}

#[test]
fn losing_the_zygote_stops_the_node_with_an_error() {
    let server = start_redis();
    let mut w = WorkerProc::start(&server.url(), "lossy", &["--slots", "1"]);
    w.wait_ready();
    let addr = w.metrics_addr();
    assert_eq!(http_get(addr, "/healthz").0, 200);
    let zygote = zygote_of(w.pid()).expect("the worker runs a zygote");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(zygote),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = w.try_wait() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the node kept running without a zygote:\n{}",
            w.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "{status}");
    let log = w.log();
    assert!(log.contains("the sandbox zygote exited"), "{log}");
}
