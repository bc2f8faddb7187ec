//! Recovery of real worker processes: a short Redis outage costs seconds, a worker started
//! while Redis is down says so and starts serving when it appears, and a worker whose zygote
//! died hands its entries back instead of swallowing the backlog.
//!
//! The bounds below (10 s after Redis is back, and so on) are acceptance bounds polled for,
//! generous for a loaded machine; they tell seconds from the minutes the failures took.

mod node_support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use forkbox_queue::{Job, Queue, Status};
use forkbox_testkit::RedisServer;
use nix::sys::signal::Signal;
use node_support::*;

fn job(id: &str, cmd: &str) -> Job {
    Job {
        id: Some(id.to_owned()),
        ..Job::shell(cmd)
    }
}

/// A queue handle on a fresh connection, or `None` while Redis does not answer.
async fn fresh_queue(url: &str) -> Option<Queue> {
    let broker = forkbox_queue::Broker::connect(url).await.ok()?;
    broker
        .queue("default", forkbox_queue::QueueConfig::default())
        .ok()
}

async fn result_status(url: &str, id: &str) -> Option<Status> {
    let q = fresh_queue(url).await?;
    q.result(id).await.ok()?.map(|r| r.outcome.status)
}

fn healthz(addr: std::net::SocketAddr) -> String {
    http_get(addr, "/healthz").1
}

fn redis_errors(addr: std::net::SocketAddr) -> f64 {
    let page = http_get(addr, "/metrics").1;
    metric(&page, "forkbox_redis_errors_total", &[]).unwrap_or(0.0)
}

/// Waits up to `limit` for `/healthz` to report Redis unreachable, then checks that it does not
/// claim `ok` and that the failure was counted.
async fn outage_reported(metrics: std::net::SocketAddr, limit: Duration, what: &str) {
    let body = poll(limit, what, || async move {
        let body = healthz(metrics);
        body.contains("Redis unreachable").then_some(body)
    })
    .await;
    assert!(!body.starts_with("ok"), "{body}");
    assert!(redis_errors(metrics) >= 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_short_redis_outage_costs_seconds_not_minutes() {
    let mut server = RedisServer::start_persistent().expect("redis-server");
    let url = server.url();
    let q = queue(&url, "default").await;
    let mut w = WorkerProc::start(&url, "outage", &["--slots", "2", "--grace", "5"]);
    let metrics = w.metrics_addr();
    w.wait_ready();
    for i in 0..6 {
        q.enqueue(&job(&format!("busy-{i}"), "sleep 1"))
            .await
            .unwrap();
    }
    slots_busy(metrics, 2.0, Duration::from_secs(60), "both slots busy").await;

    server.kill().unwrap();
    // The node notices, logs, counts, and says so on /healthz.
    outage_reported(
        metrics,
        Duration::from_secs(10),
        "/healthz reporting the outage",
    )
    .await;
    assert!(w.log().contains("Redis unreachable while"), "{}", w.log());
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.restart().unwrap();
    let back = Instant::now();
    let u = url.as_str();

    let enqueued = poll(
        Duration::from_secs(10),
        "enqueueing after the restart",
        || {
            let url = url.clone();
            async move {
                let q = fresh_queue(&url).await?;
                q.enqueue(&job("after", "echo after")).await.ok()
            }
        },
    )
    .await;
    assert!(!enqueued.is_empty());
    let status = poll(
        Duration::from_secs(10).saturating_sub(back.elapsed()),
        "the job enqueued after the outage getting its result within 10 s of Redis being back",
        || result_status(u, "after"),
    )
    .await;
    assert_eq!(status, Status::Ok);
    let stored_after = back.elapsed();
    poll(
        Duration::from_secs(10),
        "/healthz ok again",
        || async move { (healthz(metrics) == "ok\n").then_some(()) },
    )
    .await;
    eprintln!(
        "measured: result of the job enqueued after the restart within {:.2} s of it; \
         /healthz ok within {:.2} s",
        stored_after.as_secs_f64(),
        back.elapsed().as_secs_f64()
    );
    for i in 0..6 {
        let id = format!("busy-{i}");
        let idr = id.as_str();
        let s = poll(Duration::from_secs(30), "every busy job done", || {
            result_status(u, idr)
        })
        .await;
        assert_eq!(s, Status::Ok, "{id}");
    }

    // Told to stop while Redis is away, with both slots busy (one job finishing within the
    // grace period, its result unstorable, one running past it), the node keeps to its grace
    // period.
    let q = fresh_queue(&url).await.unwrap();
    q.enqueue(&job("short", "sleep 2")).await.unwrap();
    q.enqueue(&job("long", "sleep 60")).await.unwrap();
    slots_busy(
        metrics,
        2.0,
        Duration::from_secs(60),
        "both slots busy again",
    )
    .await;
    server.kill().unwrap();
    poll(
        Duration::from_secs(10),
        "the second outage noticed",
        || async move { healthz(metrics).contains("Redis unreachable").then_some(()) },
    )
    .await;
    let asked = Instant::now();
    w.signal(Signal::SIGTERM);
    let status = w.wait_exit(Duration::from_secs(5 + 5));
    eprintln!(
        "measured: SIGTERM with --grace 5 during an outage, both slots busy: exited {status} \
         after {:.2} s",
        asked.elapsed().as_secs_f64()
    );
    // The result of `short` could not be stored: the node says which, and fails.
    assert!(!status.success(), "{status}");
    assert!(w.log().contains("default/short"), "{}", w.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_started_while_redis_is_down_says_so_and_serves_when_it_appears() {
    // A port where nothing listens: a server started and stopped, to be started again there.
    let mut server = RedisServer::start().expect("redis-server");
    let url = server.url();
    server.kill().unwrap();
    let mut w = WorkerProc::start(&url, "early", &["--slots", "1"]);
    let metrics = w.metrics_addr();
    let wr = &w;
    poll(
        Duration::from_secs(10),
        "a log line about Redis",
        || async move {
            wr.log()
                .contains("Redis unreachable while connecting")
                .then_some(())
        },
    )
    .await;
    outage_reported(metrics, Duration::from_secs(10), "/healthz reporting it").await;

    server.restart().unwrap();
    let appeared = Instant::now();
    w.wait_ready();
    let q = queue(&url, "default").await;
    q.enqueue(&job("first", "echo hi")).await.unwrap();
    let r = q
        .wait_result("first", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("served once Redis appeared");
    assert_eq!(r.outcome.status, Status::Ok);
    eprintln!(
        "measured: first job served {:.2} s after Redis appeared",
        appeared.elapsed().as_secs_f64()
    );
    assert_eq!(healthz(metrics), "ok\n");
}

fn zygote_of(worker: i32) -> Option<i32> {
    let children =
        std::fs::read_to_string(format!("/proc/{worker}/task/{worker}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|pid: &i32| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains("forkbox\0__zygote"))
                .unwrap_or(false)
        })
}

/// Pending entries of one consumer.
async fn pending_of(url: &str, consumer: &str) -> u64 {
    let q = queue(url, "default").await;
    let s = q.stats().await.unwrap();
    s.consumers
        .iter()
        .find(|c| c.name == consumer)
        .map(|c| c.pending)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_whose_zygote_died_hands_back_what_it_holds_and_the_fleet_drains_it() {
    zygote_death_hands_back(300, 0).await;
}

/// The same with jobs read ahead: what the dying node holds is at most its slots plus its
/// prefetch, and all of it is handed back.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_with_prefetch_whose_zygote_died_leaves_at_most_slots_plus_prefetch() {
    zygote_death_hands_back(100, 3).await;
}

async fn zygote_death_hands_back(jobs_n: usize, prefetch: u64) {
    const SLOTS: u64 = 2;
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "default").await;
    let prefetch_arg = prefetch.to_string();
    let args = [
        "--slots",
        "2",
        "--visibility-timeout-ms",
        "3000",
        "--prefetch",
        &prefetch_arg,
    ];
    let mut a = WorkerProc::start(&url, "zyg-a", &args);
    a.wait_ready();
    let zygote = zygote_of(a.pid()).expect("worker A runs a zygote");
    let jobs: Vec<Job> = (0..jobs_n)
        .map(|i| job(&format!("j{i}"), "sleep 0.05"))
        .collect();
    for j in &jobs {
        q.enqueue(j).await.unwrap();
    }
    // A is busy with the backlog when its zygote dies.
    let u = url.as_str();
    poll(Duration::from_secs(60), "A running jobs", || async move {
        (!results_stream(u, "default").await.is_empty()).then_some(())
    })
    .await;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(zygote), Signal::SIGKILL).unwrap();
    let killed = Instant::now();
    let status = a.wait_exit(Duration::from_secs(30));
    assert!(!status.success(), "{status}");
    let left = pending_of(&url, "zyg-a").await;
    assert!(
        left <= SLOTS + prefetch,
        "the dying node left {left} entries pending (at most its {SLOTS} slots plus its \
         prefetch {prefetch}); log:\n{}",
        a.log()
    );

    let done_by_a = results_stream(u, "default").await.len();
    let _b = WorkerProc::start(&url, "zyg-b", &args);
    let results = results_at_least(
        u,
        "default",
        jobs_n,
        Duration::from_secs(120),
        "every job done via B",
    )
    .await;
    eprintln!(
        "measured: prefetch {prefetch}: A did {done_by_a} jobs and left {left} pending; all \
         {jobs_n} done {:.1} s after the zygote was killed",
        killed.elapsed().as_secs_f64()
    );
    let mut by_id: HashMap<String, Vec<serde_json::Value>> = HashMap::new();
    for (_, r) in results {
        by_id
            .entry(r["id"].as_str().unwrap().to_owned())
            .or_default()
            .push(r);
    }
    assert_eq!(by_id.len(), jobs_n, "every job has a result");
    for (id, rs) in &by_id {
        assert_eq!(rs.len(), 1, "{id} has {} results: {rs:?}", rs.len());
        let r = &rs[0];
        assert_eq!(r["status"], "ok", "{id} failed for the node's fault: {r}");
        assert_eq!(r["attempt"], 1, "{id} was charged an attempt: {r}");
    }
    assert_eq!(q.stats().await.unwrap().pending, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_large_abandoned_backlog_drains_at_the_reclaimers_speed() {
    const JOBS: usize = 200;
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "default").await;
    q.ensure_group().await.unwrap();
    for i in 0..JOBS {
        q.enqueue(&job(&format!("a{i}"), "true")).await.unwrap();
    }
    // A consumer that took everything and died.
    assert_eq!(q.read("gone", JOBS, 0).await.unwrap().len(), JOBS);
    // One reclaim pass per half visibility timeout, two slots each, would take 100 s.
    let started = Instant::now();
    let _b = WorkerProc::start(
        &url,
        "heir",
        &["--slots", "2", "--visibility-timeout-ms", "2000"],
    );
    let u = url.as_str();
    let results = results_at_least(
        u,
        "default",
        JOBS,
        Duration::from_secs(30),
        "the abandoned backlog drained",
    )
    .await;
    eprintln!(
        "measured: {JOBS} abandoned entries drained {:.1} s after the worker started",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(results.len(), JOBS);
    assert!(results.iter().all(|(_, r)| r["status"] == "ok"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_busy_with_a_backlog_still_reclaims_on_time() {
    // At least 7.5 s of work for one slot; the orphan is idle past the timeout after 3 s.
    const JOBS: usize = 150;
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "default").await;
    q.ensure_group().await.unwrap();
    q.enqueue(&job("orphan", "true")).await.unwrap();
    // A consumer that took it and died.
    assert_eq!(q.read("gone", 1, 0).await.unwrap().len(), 1);
    for i in 0..JOBS {
        q.enqueue(&job(&format!("busy{i}"), "sleep 0.05"))
            .await
            .unwrap();
    }
    // One slot, and each completion could read the next backlog entry: the orphan must still
    // be reclaimed once it is idle past the visibility timeout, not after the backlog.
    let _w = WorkerProc::start(
        &url,
        "heir",
        &["--slots", "1", "--visibility-timeout-ms", "3000"],
    );
    let u = url.as_str();
    poll(
        Duration::from_secs(120),
        "the orphan's result",
        || async move { result_status(u, "orphan").await },
    )
    .await;
    let done = results_stream(&url, "default").await.len();
    assert!(
        done < JOBS,
        "the orphan was reclaimed only after the backlog ({done} results)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redis_that_stops_answering_is_noticed_and_its_return_too() {
    // A stopped redis-server keeps its connections open and answers nothing, as a peer behind
    // a network partition does.
    let server = start_redis();
    let url = server.url();
    let redis_pid = nix::unistd::Pid::from_raw(server.pid().expect("running") as i32);
    let mut w = WorkerProc::start(&url, "frozen", &["--slots", "1"]);
    let metrics = w.metrics_addr();
    w.wait_ready();
    assert_eq!(healthz(metrics), "ok\n");
    nix::sys::signal::kill(redis_pid, Signal::SIGSTOP).unwrap();
    let frozen = Instant::now();
    outage_reported(
        metrics,
        Duration::from_secs(15),
        "/healthz reporting the silent Redis",
    )
    .await;
    let noticed = frozen.elapsed();
    nix::sys::signal::kill(redis_pid, Signal::SIGCONT).unwrap();
    assert!(w.log().contains("Redis unreachable while"), "{}", w.log());
    let back = Instant::now();
    poll(
        Duration::from_secs(10),
        "/healthz ok again",
        || async move { (healthz(metrics) == "ok\n").then_some(()) },
    )
    .await;
    eprintln!(
        "measured: a silent Redis noticed after {:.1} s; ok again {:.2} s after it answered",
        noticed.as_secs_f64(),
        back.elapsed().as_secs_f64()
    );
    let q = queue(&url, "default").await;
    q.enqueue(&job("thawed", "echo ok")).await.unwrap();
    let r = q
        .wait_result("thawed", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("served after the freeze");
    assert_eq!(r.outcome.status, Status::Ok);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_late_completion_after_the_first_result_expired_stores_nothing() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "default").await;
    let args = ["--slots", "1", "--visibility-timeout-ms", "2000"];
    let mut a = WorkerProc::start(&url, "late-a", &args);
    let a_metrics = a.metrics_addr();
    a.wait_ready();
    q.enqueue(&Job {
        result_ttl_s: Some(3),
        ..job("late", "sleep 3; echo done")
    })
    .await
    .unwrap();
    slots_busy(a_metrics, 1.0, Duration::from_secs(60), "A running the job").await;
    // A stalls past the visibility timeout; its sandbox runs on.
    a.signal(Signal::SIGSTOP);
    let mut b = WorkerProc::start(&url, "late-b", &args);
    b.wait_ready();
    let first = q
        .wait_result("late", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("B reran and stored it");
    assert_eq!(first.worker, "late-b");
    drop(b);
    let u = url.as_str();
    poll(
        Duration::from_secs(30),
        "the result expiring",
        || async move { result_status(u, "late").await.is_none().then_some(()) },
    )
    .await;
    a.signal(Signal::SIGCONT);
    // A finishes its copy (its job ended while A was stopped) and tries to store it.
    slots_busy(
        a_metrics,
        0.0,
        Duration::from_secs(30),
        "A done with its copy",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let results = results_stream(&url, "default").await;
    assert_eq!(
        results.len(),
        1,
        "one result entry for one job: {results:?}; A's log:\n{}",
        a.log()
    );
    assert!(
        q.result("late").await.unwrap().is_none(),
        "nothing stored again"
    );
}

/// An entry Redis handed to the node's consumer whose read reply never reached the node (its
/// connection failed or timed out after the hand-out, or a cluster connection sent the read
/// again) runs within seconds, not after the visibility timeout (ten minutes here); the entry
/// the node is running meanwhile is not taken for a stranded one and runs once.
#[tokio::test(flavor = "multi_thread")]
async fn an_entry_whose_read_reply_was_lost_runs_without_waiting_for_the_reclaimer() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "default").await;
    let mut w = WorkerProc::start(
        &url,
        "lost-reply",
        &["--slots", "2", "--visibility-timeout-ms", "600000"],
    );
    let metrics = w.metrics_addr();
    w.wait_ready();
    // Held by the node longer than the recovery's idle bound.
    q.enqueue(&job("held-long", "sleep 12")).await.unwrap();
    slots_busy(
        metrics,
        1.0,
        Duration::from_secs(60),
        "the long job running",
    )
    .await;
    // The lost read: added and handed to the node's consumer in one transaction, so the
    // node's own blocking read cannot take it first.
    let payload = serde_json::to_string(&job("stranded", "echo ran")).unwrap();
    let mut c = conn(&url).await;
    let _: () = forkbox_queue::redis::pipe()
        .atomic()
        .cmd("XADD")
        .arg(q.keys().jobs())
        .arg("*")
        .arg("job")
        .arg(&payload)
        .ignore()
        .cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("lost-reply")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg(q.keys().jobs())
        .arg(">")
        .ignore()
        .query_async(&mut c)
        .await
        .unwrap();
    let status = poll(Duration::from_secs(60), "the stranded job's result", || {
        let url = url.clone();
        async move { result_status(&url, "stranded").await }
    })
    .await;
    assert_eq!(status, Status::Ok);
    let r = q.result("stranded").await.unwrap().unwrap();
    assert_eq!(r.outcome.stdout, "ran\n");
    assert_eq!(r.attempt, 1, "the lost delivery charged no attempt");
    let long = poll(Duration::from_secs(60), "the long job's result", || {
        let q = q.clone();
        async move { q.result("held-long").await.ok().flatten() }
    })
    .await;
    assert_eq!(long.attempt, 1);
    let results = results_stream(&url, "default").await;
    let ran: Vec<&str> = results
        .iter()
        .filter_map(|(_, r)| r["id"].as_str())
        .collect();
    assert_eq!(ran.iter().filter(|id| **id == "held-long").count(), 1);
    assert_eq!(ran.iter().filter(|id| **id == "stranded").count(), 1);
    assert_eq!(
        metric(
            &http_get(metrics, "/metrics").1,
            "forkbox_recovered_total",
            &[("queue", "default")]
        ),
        Some(1.0)
    );
    assert!(
        w.log().contains("a read was handed but never received"),
        "{}",
        w.log()
    );
    w.kill();
}
