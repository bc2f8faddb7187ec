//! Several real `forkbox worker` processes on one Redis: every job gets exactly one result when
//! the load is shared, when a worker is SIGKILLed mid-run, and when Redis itself is killed and
//! restarted (AOF on) under the workers' feet.

mod node_support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use forkbox_queue::{redis, Job, Queue};
use forkbox_testkit::RedisServer;
use node_support::*;

fn jobs(prefix: &str, n: usize, job: Job) -> Vec<Job> {
    (0..n)
        .map(|i| Job {
            id: Some(format!("{prefix}-{i}")),
            ..job.clone()
        })
        .collect()
}

async fn enqueue_all(q: &Queue, jobs: &[Job]) {
    for chunk in jobs.chunks(500) {
        let mut pipe = redis::pipe();
        for j in chunk {
            pipe.cmd("XADD")
                .arg(q.keys().jobs())
                .arg("*")
                .arg("job")
                .arg(serde_json::to_string(j).unwrap())
                .ignore();
        }
        let _: () = pipe
            .query_async(&mut q.broker().connection())
            .await
            .unwrap();
    }
}

/// Results-stream entries per id.
async fn result_counts(url: &str, queue: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for (_, r) in results_stream(url, queue).await {
        *counts
            .entry(r["id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    counts
}

async fn xlen(url: &str, key: &str) -> u64 {
    let mut c = conn(url).await;
    redis::cmd("XLEN")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap()
}

/// Waits until the results stream holds `n` entries; returns lost and duplicated ids.
async fn settle(url: &str, ids: &[String], limit: Duration) -> (Vec<String>, Vec<String>) {
    let u = url.to_owned();
    let n = ids.len() as u64;
    // At most one entry per id can exist (the completion script), so a full stream means done;
    // on timeout the counts below say what is missing.
    let deadline = std::time::Instant::now() + limit;
    while xlen(&u, "forkbox:{default}:results").await < n && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let counts = result_counts(url, "default").await;
    let lost = ids
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .cloned()
        .collect();
    let dup = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| id.clone())
        .collect();
    (lost, dup)
}

#[tokio::test(flavor = "multi_thread")]
async fn two_thousand_jobs_over_two_workers_get_one_result_each() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "default").await;
    let all = jobs("t", 2000, Job::argv(["/bin/true"]));
    let ids: Vec<String> = all.iter().map(|j| j.id.clone().unwrap()).collect();
    let mut a = WorkerProc::start(&url, "w-a", &["--slots", "2"]);
    let mut b = WorkerProc::start(&url, "w-b", &["--slots", "2"]);
    a.wait_ready();
    b.wait_ready();
    enqueue_all(&q, &all).await;
    let (lost, dup) = settle(&url, &ids, Duration::from_secs(300)).await;
    assert_eq!(
        (lost.len(), dup.len()),
        (0, 0),
        "lost {lost:?}, duplicated {dup:?}"
    );
    assert_eq!(xlen(&url, "forkbox:{default}:results").await, 2000);
    // Each id has its stored result, and both workers took part.
    let mut by_worker: HashMap<String, usize> = HashMap::new();
    for (_, r) in results_stream(&url, "default").await {
        assert_eq!(r["status"], "ok", "{r}");
        *by_worker
            .entry(r["worker"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(by_worker.len(), 2, "{by_worker:?}");
    let stored = q
        .has_results(&ids.iter().map(String::as_str).collect::<Vec<_>>())
        .await
        .unwrap();
    assert!(stored.iter().all(|s| *s));
    // Acknowledged entries are deleted: nothing left in the job stream.
    assert_eq!(xlen(&url, "forkbox:{default}:jobs").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sigkilled_worker_loses_nothing_and_duplicates_nothing() {
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "default").await;
    let args = ["--slots", "4", "--visibility-timeout-ms", "2000"];
    let mut victim = WorkerProc::start(&url, "victim", &args);
    let mut survivor = WorkerProc::start(&url, "survivor", &args);
    victim.wait_ready();
    survivor.wait_ready();
    let all = jobs("k", 200, Job::shell("sleep 0.2"));
    let ids: Vec<String> = all.iter().map(|j| j.id.clone().unwrap()).collect();
    enqueue_all(&q, &all).await;
    // Kill the victim while it holds entries.
    let qc = q.clone();
    poll(
        Duration::from_secs(60),
        "the victim holds running jobs",
        || {
            let q = qc.clone();
            async move {
                let s = q.stats().await.unwrap();
                s.consumers
                    .iter()
                    .any(|c| c.name == "victim" && c.pending > 0)
                    .then_some(())
            }
        },
    )
    .await;
    victim.kill();
    let held = q
        .stats()
        .await
        .unwrap()
        .consumers
        .iter()
        .find(|c| c.name == "victim")
        .map_or(0, |c| c.pending);
    let (lost, dup) = settle(&url, &ids, Duration::from_secs(120)).await;
    assert_eq!(
        (lost.len(), dup.len()),
        (0, 0),
        "lost {lost:?}, duplicated {dup:?} (victim held {held} at death)"
    );
    // The survivor took over what the victim held.
    let reclaimed: HashSet<String> = results_stream(&url, "default")
        .await
        .into_iter()
        .filter(|(_, r)| r["attempt"].as_u64() > Some(1))
        .map(|(_, r)| r["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        held == 0 || !reclaimed.is_empty(),
        "the victim held {held} entries but none was reclaimed"
    );
    assert!(survivor.try_wait().is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_ride_out_a_redis_restart() {
    let mut server = RedisServer::start_persistent().unwrap();
    let url = server.url();
    let q = queue(&url, "default").await;
    let mut a = WorkerProc::start(&url, "r-a", &["--slots", "2"]);
    let mut b = WorkerProc::start(&url, "r-b", &["--slots", "2"]);
    let metrics_a = a.metrics_addr();
    let metrics_b = b.metrics_addr();
    a.wait_ready();
    b.wait_ready();
    let all = jobs("r", 300, Job::shell("sleep 0.05"));
    let ids: Vec<String> = all.iter().map(|j| j.id.clone().unwrap()).collect();
    enqueue_all(&q, &all).await;
    // Restart once about a third has finished.
    let u = url.clone();
    poll(Duration::from_secs(120), "a third of the jobs done", || {
        let u = u.clone();
        async move { (xlen(&u, "forkbox:{default}:results").await >= 100).then_some(()) }
    })
    .await;
    drop(q);
    server.restart().unwrap();
    let (lost, dup) = settle(&url, &ids, Duration::from_secs(180)).await;
    assert_eq!(
        (lost.len(), dup.len()),
        (0, 0),
        "lost {lost:?}, duplicated {dup:?}\n--- r-a ---\n{}\n--- r-b ---\n{}",
        a.log(),
        b.log()
    );
    // The workers noticed and counted the outage, and came back by themselves.
    let errors: f64 = [metrics_a, metrics_b]
        .iter()
        .map(|m| {
            metric(
                &http_get(*m, "/metrics").1,
                "forkbox_redis_errors_total",
                &[],
            )
            .unwrap()
        })
        .sum();
    assert!(errors > 0.0, "no Redis error counted");
    assert!(a.try_wait().is_none() && b.try_wait().is_none());
    let q = queue(&url, "default").await;
    let id = q.enqueue(&Job::shell("echo again")).await.unwrap();
    let r = q.wait_result(&id, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        r.expect("a result after the restart").outcome.stdout,
        "again\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_draining_a_backlog_reads_its_next_jobs_with_its_completions() {
    const JOBS: usize = 300;
    if !have("redis-cli") {
        eprintln!("skipped: redis-cli is not installed");
        return;
    }
    let server = start_redis();
    let url = server.url();
    let q = queue(&url, "default").await;
    let all = jobs("b", JOBS, Job::argv(["/bin/true"]));
    let ids: Vec<String> = all.iter().map(|j| j.id.clone().unwrap()).collect();
    q.enqueue_batch(&all, "backlog").await.unwrap();
    // Every command Redis runs, with its arguments, one a line.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("monitor.log");
    let mut monitor = std::process::Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), "monitor"])
        .stdout(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    poll(Duration::from_secs(30), "MONITOR attached", || {
        let log = log.clone();
        async move { (std::fs::read_to_string(&log).ok()? == "OK\n").then_some(()) }
    })
    .await;
    let mut w = WorkerProc::start(&url, "w", &["--slots", "2"]);
    w.wait_ready();
    let (lost, dup) = settle(&url, &ids, Duration::from_secs(300)).await;
    monitor.kill().unwrap();
    monitor.wait().unwrap();
    assert_eq!(
        (lost.len(), dup.len()),
        (0, 0),
        "lost {lost:?}, duplicated {dup:?}"
    );
    assert_eq!(xlen(&url, "forkbox:{default}:jobs").await, 0);
    let status = q.batch_status("backlog").await.unwrap();
    assert_eq!((status.total, status.done), (JOBS as u64, JOBS as u64));
    // The reader's blocking reads were one per job (each freed slot read on its own); now the
    // completion that frees a slot reads the next entry without BLOCK, and the reader's own
    // reads are the few left: at start, after a reclaim, at the end.
    let commands = std::fs::read_to_string(&log).unwrap();
    let reads = |blocking: bool| {
        commands
            .lines()
            .filter(|l| l.contains("\"XREADGROUP\"") && l.contains("\"BLOCK\"") == blocking)
            .count()
    };
    let (blocking, with_completions) = (reads(true), reads(false));
    assert!(
        blocking < JOBS / 10 && with_completions > JOBS / 2,
        "{blocking} blocking reads and {with_completions} with completions for {JOBS} jobs\n{}",
        w.log()
    );
}
