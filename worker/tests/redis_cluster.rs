//! Real `forkbox worker` processes and the client commands against a Redis Cluster of 3
//! primaries and 3 replicas the tests start and remove: jobs on queues served by different
//! shards each get one result, also when the primary holding a queue is SIGKILLed mid-run and
//! its replica promoted; every client command takes `--cluster` with seed URLs.

mod node_support;

use std::collections::{HashMap, HashSet};
use std::process::{Command, Output};
use std::time::Duration;

use forkbox_queue::redis::{self, AsyncCommands};
use forkbox_queue::{Broker, Endpoint, Job, Queue, QueueConfig};
use forkbox_testkit::{RedisCluster, RedisServer};
use node_support::*;

const LIMIT: Duration = Duration::from_secs(180);

fn slot_of(q: &Queue) -> u16 {
    redis::cluster_routing::get_slot(q.keys().jobs().as_bytes())
}

async fn broker(cluster: &RedisCluster) -> Broker {
    Broker::connect_to(&Endpoint::parse(&cluster.seeds(), true).unwrap())
        .await
        .unwrap()
}

/// Two queues whose slots are served by different primaries.
fn two_shards(cluster: &RedisCluster, broker: &Broker) -> (Queue, Queue) {
    let mut first: Option<(Queue, usize)> = None;
    for i in 0.. {
        let q = broker
            .queue(&format!("q{i}"), QueueConfig::default())
            .unwrap();
        let owner = cluster.primary_of(slot_of(&q)).unwrap();
        match &first {
            None => first = Some((q, owner)),
            Some((a, o)) if *o != owner => return (a.clone(), q),
            Some(_) => {}
        }
    }
    unreachable!()
}

fn jobs(prefix: &str, n: usize, job: Job) -> Vec<Job> {
    (0..n)
        .map(|i| Job {
            id: Some(format!("{prefix}-{i}")),
            ..job.clone()
        })
        .collect()
}

/// Results-stream entries per id, over the queues.
async fn result_counts(broker: &Broker, queues: &[&Queue]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    let mut conn = broker.connection();
    for q in queues {
        let stream: redis::streams::StreamRangeReply =
            conn.xrange_all(q.keys().results()).await.unwrap();
        for e in &stream.ids {
            let json: String = e.get("result").unwrap();
            let r: serde_json::Value = serde_json::from_str(&json).unwrap();
            *counts
                .entry(r["id"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    counts
}

/// Waits until every id has a result (or the limit); returns lost and duplicated ids.
async fn settle(broker: &Broker, queues: &[&Queue], ids: &[String]) -> (Vec<String>, Vec<String>) {
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let counts = result_counts(broker, queues).await;
        let lost: Vec<String> = ids
            .iter()
            .filter(|id| !counts.contains_key(*id))
            .cloned()
            .collect();
        if lost.is_empty() || std::time::Instant::now() >= deadline {
            let dup = counts
                .iter()
                .filter(|(_, n)| **n > 1)
                .map(|(id, _)| id.clone())
                .collect();
            return (lost, dup);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn forkbox(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("running forkbox")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_drain_queues_on_two_shards_and_the_client_commands_take_the_cluster() {
    let cluster = RedisCluster::start_default().expect("start a 3+3 cluster");
    let seeds = cluster.seeds();
    let broker = broker(&cluster).await;
    let (a, b) = two_shards(&cluster, &broker);
    let queues = format!("{},{}", a.name(), b.name());
    let args = ["--cluster", "--slots", "2", "--queues", &queues];
    let mut w1 = WorkerProc::start(&seeds, "w1", &args);
    let mut w2 = WorkerProc::start(&seeds, "w2", &args);
    w1.wait_ready();
    w2.wait_ready();

    let on_a = jobs("a", 100, Job::argv(["/bin/true"]));
    let on_b = jobs("b", 100, Job::argv(["/bin/true"]));
    a.enqueue_batch(&on_a, "ba").await.unwrap();
    b.enqueue_batch(&on_b, "bb").await.unwrap();
    // The CLI submits through one seed only; the client finds the rest.
    let one_seed = cluster.urls()[5].clone();
    let out = forkbox(&[
        "submit",
        "--cluster",
        "--redis",
        &one_seed,
        "-q",
        a.name(),
        "--id",
        "cli-1",
        "--wait",
        "--json",
        "--",
        "echo",
        "through the cluster",
    ]);
    assert!(out.status.success(), "submit: {}", stderr(&out));
    let r: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(r["id"], "cli-1");
    assert_eq!(r["stdout"], "through the cluster\n", "{r}");

    let mut ids: Vec<String> = on_a
        .iter()
        .chain(&on_b)
        .map(|j| j.id.clone().unwrap())
        .collect();
    ids.push("cli-1".into());
    let (lost, dup) = settle(&broker, &[&a, &b], &ids).await;
    assert_eq!(
        (lost.len(), dup.len()),
        (0, 0),
        "lost {lost:?}, duplicated {dup:?}"
    );
    let workers: HashSet<String> = {
        let mut conn = broker.connection();
        let mut seen = HashSet::new();
        for q in [&a, &b] {
            let stream: redis::streams::StreamRangeReply =
                conn.xrange_all(q.keys().results()).await.unwrap();
            for e in &stream.ids {
                let json: String = e.get("result").unwrap();
                let r: serde_json::Value = serde_json::from_str(&json).unwrap();
                assert_eq!(r["status"], "ok", "{r}");
                seen.insert(r["worker"].as_str().unwrap().to_owned());
            }
        }
        seen
    };
    assert_eq!(workers.len(), 2, "both workers took part: {workers:?}");

    // result, batch wait, stats, cancel, dlq through the cluster.
    let out = forkbox(&[
        "result",
        "--cluster",
        "--redis",
        &seeds,
        "-q",
        b.name(),
        "b-7",
        "--json",
    ]);
    assert!(out.status.success(), "result: {}", stderr(&out));
    assert!(stdout(&out).contains("\"b-7\""), "{}", stdout(&out));
    let out = forkbox(&[
        "batch",
        "wait",
        "--cluster",
        "--redis",
        &seeds,
        "-q",
        a.name(),
        "ba",
        "--json",
    ]);
    assert!(out.status.success(), "batch wait: {}", stderr(&out));
    let counters: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        (counters["total"].as_u64(), counters["done"].as_u64()),
        (Some(100), Some(100)),
        "{counters}"
    );
    let out = forkbox(&[
        "stats",
        "--cluster",
        "--redis",
        &seeds,
        "-q",
        &queues,
        "--json",
    ]);
    assert!(out.status.success(), "stats: {}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains(a.name()) && text.contains(b.name()), "{text}");
    let out = forkbox(&[
        "cancel",
        "--cluster",
        "--redis",
        &seeds,
        "-q",
        b.name(),
        "--ahead",
        "never-ran",
    ]);
    assert!(out.status.success(), "cancel: {}", stderr(&out));
    // The job submitted later is cancelled as it is added (SPUBLISH from the enqueue script).
    b.enqueue(&Job {
        id: Some("never-ran".into()),
        ..Job::shell("true")
    })
    .await
    .unwrap();
    assert!(b.is_cancelled("never-ran").await.unwrap());
    let out = forkbox(&[
        "dlq",
        "list",
        "--cluster",
        "--redis",
        &seeds,
        "-q",
        a.name(),
    ]);
    assert!(out.status.success(), "dlq list: {}", stderr(&out));

    // A batch file through the cluster.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.jsonl");
    std::fs::write(&file, "{\"cmd\":\"echo 1\"}\n{\"cmd\":\"echo 2\"}\n").unwrap();
    let out = forkbox(&[
        "batch",
        "submit",
        "--cluster",
        "--redis",
        &seeds,
        "-q",
        b.name(),
        file.to_str().unwrap(),
        "--batch",
        "file-batch",
    ]);
    assert!(out.status.success(), "batch submit: {}", stderr(&out));
    let out = forkbox(&[
        "batch",
        "wait",
        "--cluster",
        "--redis",
        &seeds,
        "-q",
        b.name(),
        "file-batch",
        "--timeout",
        "120",
    ]);
    assert!(
        out.status.success(),
        "batch wait: {} {}",
        stdout(&out),
        stderr(&out)
    );
}

#[tokio::test]
async fn the_client_commands_say_clearly_when_the_seeds_are_not_a_cluster() {
    let single = RedisServer::start().expect("start redis-server");
    let out = forkbox(&["stats", "--cluster", "--redis", &single.url()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("Redis Cluster") && err.contains(&single.url()),
        "{err}"
    );
    let list = format!("{},{}", single.url(), single.url());
    let out = forkbox(&["stats", "--redis", &list]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--cluster"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_carry_on_when_the_primary_of_their_queue_is_killed() {
    let mut cluster = RedisCluster::start_default().expect("start a 3+3 cluster");
    let seeds = cluster.seeds();
    let broker = broker(&cluster).await;
    let q = broker.queue("failover", QueueConfig::default()).unwrap();
    let args = [
        "--cluster",
        "--slots",
        "2",
        "--queues",
        "failover",
        "--visibility-timeout-ms",
        "2000",
    ];
    let mut w1 = WorkerProc::start(&seeds, "w1", &args);
    let mut w2 = WorkerProc::start(&seeds, "w2", &args);
    w1.wait_ready();
    w2.wait_ready();
    let all = jobs("f", 150, Job::shell("sleep 0.05"));
    let ids: Vec<String> = all.iter().map(|j| j.id.clone().unwrap()).collect();
    q.enqueue_batch(&all, "run").await.unwrap();
    // Replicated before the kill: what the docs promise is never lost.
    let synced: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5_000)
        .query_async(&mut broker.connection())
        .await
        .unwrap();
    assert_eq!(synced, 1);
    poll(
        Duration::from_secs(120),
        "a quarter of the jobs done",
        || {
            let q = q.clone();
            async move {
                let s = q.batch_status("run").await.ok()?;
                (s.done >= 150 / 4).then_some(())
            }
        },
    )
    .await;
    let slot = slot_of(&q);
    let killed = cluster.kill_primary_of(slot).unwrap();
    let promoted = tokio::task::block_in_place(|| cluster.wait_failed_over(slot)).unwrap();
    assert_ne!(killed, promoted);
    let (lost, dup) = settle(&broker, &[&q], &ids).await;
    println!(
        "worker failover: {} jobs, {} lost, {} duplicated results",
        ids.len(),
        lost.len(),
        dup.len()
    );
    assert_eq!(
        (lost.len(), dup.len()),
        (0, 0),
        "lost {lost:?}, duplicated {dup:?}"
    );
    assert!(
        w1.try_wait().is_none() && w2.try_wait().is_none(),
        "both workers still run"
    );
}
