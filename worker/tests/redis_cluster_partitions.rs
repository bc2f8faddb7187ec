//! A queue partitioned over the shards of a Redis Cluster (3 primaries and 3 replicas the test
//! starts and removes), served by real `forkbox worker --partitions 3` processes: 3,000 jobs
//! over two workers land on every primary and each gets exactly one result; the CLI submits
//! and reads results on the partitioned queue; a worker or client with another partition count
//! is refused with an error naming both.

mod node_support;

use std::collections::{BTreeSet, HashMap};
use std::process::{Command, Output};
use std::time::Duration;

use forkbox_queue::redis::{self, AsyncCommands};
use forkbox_queue::{Broker, Endpoint, Job, Partitioned, QueueConfig};
use forkbox_testkit::RedisCluster;
use node_support::*;

const LIMIT: Duration = Duration::from_secs(300);
const JOBS: usize = 3000;

fn forkbox(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("running forkbox")
}

/// Results-stream entries per id, over every partition.
async fn result_counts(broker: &Broker, q: &Partitioned) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    let mut conn = broker.connection();
    for part in q.partitions() {
        let stream: redis::streams::StreamRangeReply =
            conn.xrange_all(part.keys().results()).await.unwrap();
        for e in &stream.ids {
            let json: String = e.get("result").unwrap();
            let r: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert_eq!(r["status"], "ok", "{r}");
            *counts
                .entry(r["id"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_thousand_jobs_over_three_partitions_and_two_workers() {
    let cluster = RedisCluster::start_default().expect("start a 3+3 cluster");
    let seeds = cluster.seeds();
    let broker = Broker::connect_to(&Endpoint::parse(&seeds, true).unwrap())
        .await
        .unwrap();
    let q = broker
        .partitioned("parts", 3, QueueConfig::default())
        .unwrap();
    let owners: BTreeSet<usize> = q
        .partitions()
        .iter()
        .map(|p| {
            let slot = redis::cluster_routing::get_slot(p.keys().jobs().as_bytes());
            cluster.primary_of(slot).unwrap()
        })
        .collect();
    assert_eq!(owners.len(), 3, "each partition on its own primary");

    let args = [
        "--cluster",
        "--slots",
        "4",
        "--queues",
        "parts",
        "--partitions",
        "3",
    ];
    let mut w1 = WorkerProc::start(&seeds, "w1", &args);
    let mut w2 = WorkerProc::start(&seeds, "w2", &args);
    w1.wait_ready();
    w2.wait_ready();

    // A worker with another partition count is refused, naming both counts.
    let mut bad = WorkerProc::start(
        &seeds,
        "w-bad",
        &["--cluster", "--queues", "parts", "--partitions", "2"],
    );
    let status = bad.wait_exit(Duration::from_secs(60));
    assert!(!status.success());
    let log = bad.log();
    assert!(
        log.contains("3 partition(s)") && log.contains("--partitions 2"),
        "{log}"
    );

    let jobs: Vec<Job> = (0..JOBS)
        .map(|i| Job {
            id: Some(format!("p-{i}")),
            ..Job::argv(["/bin/true"])
        })
        .collect();
    q.enqueue_batch(&jobs, "big").await.unwrap();

    // The CLI on the partitioned queue: submit and wait, then look a result up by id.
    let out = forkbox(&[
        "submit",
        "--cluster",
        "--redis",
        &cluster.urls()[4],
        "-q",
        "parts",
        "--partitions",
        "3",
        "--id",
        "cli-p",
        "--wait",
        "--json",
        "--",
        "echo",
        "partitioned",
    ]);
    assert!(
        out.status.success(),
        "submit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["stdout"], "partitioned\n", "{r}");
    // A client with another partition count is refused.
    let out = forkbox(&[
        "submit",
        "--cluster",
        "--redis",
        &seeds,
        "-q",
        "parts",
        "--",
        "true",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("3 partition(s)") && err.contains("--partitions 1"),
        "{err}"
    );

    let deadline = std::time::Instant::now() + LIMIT;
    let status = loop {
        let s = q.batch_status("big").await.unwrap();
        if s.is_complete() || std::time::Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!((status.total, status.done), (JOBS as u64, JOBS as u64));
    let counts = result_counts(&broker, &q).await;
    let lost: Vec<_> = jobs
        .iter()
        .filter_map(|j| j.id.clone())
        .filter(|id| !counts.contains_key(id))
        .collect();
    let dup: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert_eq!(
        (lost.len(), dup.len()),
        (0, 0),
        "lost {lost:?}, dup {dup:?}"
    );
    // Both workers took part, on every partition.
    let mut conn = broker.connection();
    let mut workers = BTreeSet::new();
    for p in q.partitions() {
        let stream: redis::streams::StreamRangeReply =
            conn.xrange_all(p.keys().results()).await.unwrap();
        // Every primary held jobs: each partition's stream, on its own primary, ran a share.
        assert!(
            stream.ids.len() > 500,
            "{} ran {} jobs",
            p.keys().tag(),
            stream.ids.len()
        );
        for e in &stream.ids {
            let json: String = e.get("result").unwrap();
            let r: serde_json::Value = serde_json::from_str(&json).unwrap();
            workers.insert(r["worker"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(workers.len(), 2, "{workers:?}");

    // A client command on the partitioned queue, which must succeed; its standard output.
    let on_parts = |command: &str, rest: &[&str]| {
        let mut args = vec![command, "--cluster", "--redis", &seeds, "-q", "parts"];
        args.extend(["--partitions", "3", "--json"]);
        args.extend(rest);
        let out = forkbox(&args);
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let out = on_parts("result", &["p-1234"]);
    assert!(String::from_utf8_lossy(&out).contains("\"p-1234\""));
    let s: serde_json::Value = serde_json::from_slice(&on_parts("stats", &[])).unwrap();
    assert_eq!(s[0]["length"], 0, "{s}");
    w1.kill();
    w2.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_open_and_answer_on_every_partition_over_the_shards() {
    let cluster = RedisCluster::start_default().expect("start a 3+3 cluster");
    let seeds = cluster.seeds();
    let args = [
        "--cluster",
        "--slots",
        "2",
        "--queues",
        "sess",
        "--partitions",
        "3",
    ];
    let mut w = WorkerProc::start(&seeds, "w-sess", &args);
    w.wait_ready();
    let broker = Broker::connect_to(&Endpoint::parse(&seeds, true).unwrap())
        .await
        .unwrap();
    let q = broker
        .partitioned("sess", 3, QueueConfig::default())
        .unwrap();
    q.check_layout().await.unwrap();
    // The command line through one seed only: it follows the redirections to each shard.
    sessions_on_every_partition(&q, "w-sess", &["--cluster", "--redis", &cluster.urls()[4]]).await;
}
