//! A worker's life: graceful shutdown (jobs finish within the grace period; past it they are
//! killed and left pending), cancellation of a pending and of a running job, the idempotent
//! enqueue, and priority order across queues.

mod node_support;

use std::time::Duration;

use forkbox_queue::{Job, Status};
use nix::sys::signal::Signal;
use node_support::*;

fn with_id(id: &str, job: Job) -> Job {
    Job {
        id: Some(id.to_owned()),
        ..job
    }
}

/// Waits until `/metrics` reports `n` busy slots.
async fn busy(metrics: std::net::SocketAddr, n: f64) {
    slots_busy(metrics, n, Duration::from_secs(60), "slots busy").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_running_jobs_finish_then_exits_zero() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "default").await;
    let mut w = WorkerProc::start(&url, "graceful", &["--slots", "2", "--grace", "30"]);
    let metrics = w.metrics_addr();
    for i in 0..2 {
        q.enqueue(&with_id(
            &format!("g-{i}"),
            Job::shell("sleep 1; echo finished"),
        ))
        .await
        .unwrap();
    }
    busy(metrics, 2.0).await;
    w.signal(Signal::SIGTERM);
    let status = w.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "{status}; log:\n{}", w.log());
    for i in 0..2 {
        let r = q
            .result(&format!("g-{i}"))
            .await
            .unwrap()
            .expect("stored before exit");
        assert_eq!(r.outcome.status, Status::Ok);
        assert_eq!(r.outcome.stdout, "finished\n");
    }
    assert_eq!(q.stats().await.unwrap().pending, 0);
    // A clean stop is not shown alive until the heartbeat would have expired.
    assert!(
        !q.is_alive(&w.name).await.unwrap(),
        "heartbeat left after a clean stop"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_grace_period_jobs_are_killed_and_left_pending() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "default").await;
    let mut w = WorkerProc::start(&url, "impatient", &["--slots", "1", "--grace", "0.5"]);
    let metrics = w.metrics_addr();
    q.enqueue(&with_id("long", Job::shell("sleep 60")))
        .await
        .unwrap();
    busy(metrics, 1.0).await;
    w.signal(Signal::SIGTERM);
    let status = w.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status}; log:\n{}", w.log());
    assert!(
        q.result("long").await.unwrap().is_none(),
        "no result for a killed job"
    );
    let s = q.stats().await.unwrap();
    assert_eq!(s.pending, 1, "left pending for the reclaimer: {s:?}");
    // Another worker takes it over once it is idle past the visibility timeout.
    let mut next = WorkerProc::start(
        &url,
        "next",
        &["--slots", "1", "--visibility-timeout-ms", "500"],
    );
    next.wait_ready();
    q.cancel("long").await.unwrap();
    let r = q
        .wait_result("long", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("reclaimed and finished");
    assert_eq!(r.outcome.status, Status::Cancelled);
    assert_eq!(r.attempt, 2);
}

/// Enqueues two jobs, then starts a worker with one slot and a prefetch of one (so its first
/// read takes both at once) and waits until it runs the first and holds both.
async fn one_running_one_read_ahead(
    url: &str,
    q: &forkbox_queue::Queue,
    jobs: [(&str, &str); 2],
    extra: &[&str],
) -> WorkerProc {
    for (id, script) in jobs {
        q.enqueue(&with_id(id, Job::shell(script))).await.unwrap();
    }
    let args = [&["--slots", "1", "--prefetch", "1"], extra].concat();
    let mut w = WorkerProc::start(url, "ahead", &args);
    busy(w.metrics_addr(), 1.0).await;
    poll(
        Duration::from_secs(30),
        "both entries held",
        || async move { (q.stats().await.unwrap().pending == 2).then_some(()) },
    )
    .await;
    w
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prefetched_job_is_held_until_a_slot_frees_and_runs_in_order() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "default").await;
    // Each prints the clock: the first as it ends, the second as it starts.
    let jobs = [("first", "sleep 1; date +%s%N"), ("second", "date +%s%N")];
    let w = one_running_one_read_ahead(&url, &q, jobs, &[]).await;
    assert!(q.result("second").await.unwrap().is_none(), "{}", w.log());
    let mut clock = Vec::new();
    for id in ["first", "second"] {
        let r = q
            .wait_result(id, Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no result for {id}"));
        assert_eq!(r.outcome.status, Status::Ok, "{id}: {r:?}");
        clock.push(r.outcome.stdout.trim().parse::<u128>().unwrap());
    }
    assert!(
        clock[1] >= clock[0],
        "the prefetched job started before the slot was free: {clock:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_grace_period_a_prefetched_job_is_left_pending_unrun() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "default").await;
    let jobs = [("long", "sleep 60"), ("waiting", "echo ran")];
    let mut w = one_running_one_read_ahead(&url, &q, jobs, &["--grace", "0.5"]).await;
    w.signal(Signal::SIGTERM);
    let status = w.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status}; log:\n{}", w.log());
    for id in ["long", "waiting"] {
        assert!(q.result(id).await.unwrap().is_none(), "a result for {id}");
    }
    let s = q.stats().await.unwrap();
    assert_eq!(s.pending, 2, "both left pending for the reclaimer: {s:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_pending_and_a_running_job() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "default").await;
    // One slot: the second job stays in the stream while the first runs.
    let mut w = WorkerProc::start(&url, "canceller", &["--slots", "1"]);
    let metrics = w.metrics_addr();
    q.enqueue(&with_id("running", Job::shell("exec sleep 60.4242")))
        .await
        .unwrap();
    q.enqueue(&with_id("pending", Job::shell("echo should not run")))
        .await
        .unwrap();
    busy(metrics, 1.0).await;
    // A busy slot may still be handing its job over: the cancel must find it running.
    poll(Duration::from_secs(60), "the job's program", || async {
        let running = std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
            std::fs::read(p.path().join("cmdline")).is_ok_and(|c| c == b"sleep\x0060.4242\x00")
        });
        running.then_some(())
    })
    .await;
    let s = q.stats().await.unwrap();
    assert_eq!(
        (s.length, s.pending),
        (2, 1),
        "one held, one waiting: {s:?}"
    );
    q.cancel("pending").await.unwrap();
    q.cancel("running").await.unwrap();
    let running = q
        .wait_result("running", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("killed");
    assert_eq!(running.outcome.status, Status::Cancelled);
    assert!(running.outcome.spawn_us > 0, "it had started: {running:?}");
    let pending = q
        .wait_result("pending", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("skipped");
    assert_eq!(pending.outcome.status, Status::Cancelled);
    assert_eq!(pending.outcome.stdout, "");
    assert_eq!(pending.outcome.spawn_us, 0, "never ran: {pending:?}");
    assert!(w.try_wait().is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_idempotent_enqueue_does_not_run_a_job_twice() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "default").await;
    let job = with_id("once", Job::shell("sleep 0.3; echo ran"));
    // Twice while pending (no worker yet), once more after the result.
    assert!(q.enqueue_idempotent(&job).await.unwrap().new);
    assert!(!q.enqueue_idempotent(&job).await.unwrap().new);
    let mut w = WorkerProc::start(&url, "idem", &["--slots", "2"]);
    w.wait_ready();
    let r = q
        .wait_result("once", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("ran");
    assert_eq!(r.attempt, 1);
    assert!(!q.enqueue_idempotent(&job).await.unwrap().new);
    // A raw XADD of the finished id bypasses the check; the worker acknowledges it unrun.
    q.enqueue_raw(serde_json::to_string(&job).unwrap().as_bytes())
        .await
        .unwrap();
    poll(
        Duration::from_secs(30),
        "the raw duplicate acknowledged",
        || {
            let q = q.clone();
            async move { (q.stats().await.unwrap().length == 0).then_some(()) }
        },
    )
    .await;
    // One execution: one entry in the results stream, and the first result kept.
    let runs: Vec<_> = results_stream(&url, "default")
        .await
        .into_iter()
        .filter(|(_, r)| r["id"] == "once")
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(q.result("once").await.unwrap().unwrap(), r);
}

#[tokio::test(flavor = "multi_thread")]
async fn priorities_are_read_in_order() {
    let server = start_redis();
    let url = server.url();
    let high = queue(&url, "high").await;
    let low = queue(&url, "low").await;
    for i in 0..5 {
        low.enqueue(&with_id(&format!("low-{i}"), Job::argv(["/bin/true"])))
            .await
            .unwrap();
    }
    for i in 0..5 {
        high.enqueue(&with_id(&format!("high-{i}"), Job::argv(["/bin/true"])))
            .await
            .unwrap();
    }
    let mut w = WorkerProc::start(&url, "prio", &["--slots", "1", "--queues", "high,low"]);
    w.wait_ready();
    for i in 0..5 {
        low.wait_result(&format!("low-{i}"), Duration::from_secs(30))
            .await
            .unwrap()
            .expect("low ran");
    }
    // Results-stream entry ids are server timestamps: every high one precedes every low one.
    let entry_ms = |e: &str| -> (u64, u64) {
        let (ms, seq) = e.split_once('-').unwrap();
        (ms.parse().unwrap(), seq.parse().unwrap())
    };
    let highs: Vec<_> = results_stream(&url, "high").await;
    let lows: Vec<_> = results_stream(&url, "low").await;
    assert_eq!((highs.len(), lows.len()), (5, 5));
    let last_high = highs.iter().map(|(e, _)| entry_ms(e)).max().unwrap();
    let first_low = lows.iter().map(|(e, _)| entry_ms(e)).min().unwrap();
    assert!(last_high < first_low, "high {highs:?}\nlow {lows:?}");
}
