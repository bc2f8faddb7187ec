//! Partitioned queues against a real Redis (a private server; one test on a local cluster):
//! jobs spread by id, idempotency per partition, summed counters, reads over every partition,
//! and the refusal of a partition count the queue was not created with.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::ok_result;
use forkbox_queue::{Broker, Job, QueueConfig, QueueError, QueueSet};
use forkbox_testkit::RedisServer;

fn job(id: &str) -> Job {
    Job {
        id: Some(id.to_owned()),
        ..Job::shell("true")
    }
}

#[tokio::test]
async fn another_partition_count_is_refused_naming_both() {
    let server = RedisServer::start().unwrap();
    let broker = Broker::connect(&server.url()).await.unwrap();
    broker
        .open_partitioned("evals", 3, QueueConfig::default())
        .await
        .unwrap();
    for n in [1, 2, 4] {
        let err = broker
            .open_partitioned("evals", n, QueueConfig::default())
            .await
            .unwrap_err();
        assert!(
            matches!(err, QueueError::PartitionsMismatch { configured, ref live, .. }
                if configured == n && live == "3"),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("3 partition(s)") && text.contains(&format!("--partitions {n}")),
            "{text}"
        );
        // A read-only check is refused just the same.
        let q = broker
            .partitioned("evals", n, QueueConfig::default())
            .unwrap();
        assert!(q.verify_layout().await.is_err());
    }
    // The same count is accepted again; a fresh queue is not fixed by a read-only check.
    broker
        .open_partitioned("evals", 3, QueueConfig::default())
        .await
        .unwrap();
    let fresh = broker
        .partitioned("fresh", 2, QueueConfig::default())
        .unwrap();
    fresh.verify_layout().await.unwrap();
    broker
        .open_partitioned("fresh", 5, QueueConfig::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn one_partition_keeps_the_v1_keys() {
    let server = RedisServer::start().unwrap();
    let broker = Broker::connect(&server.url()).await.unwrap();
    let q = broker
        .open_partitioned("default", 1, QueueConfig::default())
        .await
        .unwrap();
    q.enqueue(&job("v1-a")).await.unwrap();
    let plain = broker.queue("default", QueueConfig::default()).unwrap();
    assert_eq!(plain.stats().await.unwrap().length, 1);
    assert_eq!(q.partitions()[0].keys().jobs(), "forkbox:{default}:jobs");
}

#[tokio::test]
async fn jobs_spread_by_id_and_every_partition_is_read() {
    let server = RedisServer::start().unwrap();
    let broker = Broker::connect(&server.url()).await.unwrap();
    let q = broker
        .open_partitioned("spread", 3, QueueConfig::default())
        .await
        .unwrap();
    let jobs: Vec<Job> = (0..300).map(|i| job(&format!("j-{i}"))).collect();
    let enq = q.enqueue_batch(&jobs, "b1").await.unwrap();
    assert!(enq.iter().all(|e| e.new));
    assert_eq!(
        enq.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        jobs.iter()
            .map(|j| j.id.clone().unwrap())
            .collect::<Vec<_>>(),
        "results in input order"
    );
    // Each partition holds its ids' jobs, and only those.
    for (p, part) in q.partitions().iter().enumerate() {
        let want = (0..300)
            .filter(|i| forkbox_queue::keys::partition_of(&format!("j-{i}"), 3) == p)
            .count() as u64;
        assert!(want > 50, "partition {p}: {want}");
        assert_eq!(part.stats().await.unwrap().length, want, "partition {p}");
    }
    // An idempotent re-enqueue finds the first copy on the same partition.
    let again = q.enqueue_idempotent(&job("j-7")).await.unwrap();
    assert!(!again.new);
    assert_eq!(q.stats().await.unwrap().length, 300);
    assert_eq!(q.batch_status("b1").await.unwrap().total, 300);

    // One reader over every partition, a few slots at a time, in turn.
    let set = QueueSet::of_partitioned(vec![q.clone()]).unwrap();
    let mut first_partitions = Vec::new();
    let mut seen = BTreeMap::new();
    loop {
        let ds = set.read("w1", 4, 100).await.unwrap();
        if ds.is_empty() {
            break;
        }
        first_partitions.push(ds[0].partition);
        for d in ds {
            let part = set.get(&d.queue, d.partition).unwrap();
            part.complete(&d, &ok_result(&d, "", "w1")).await.unwrap();
            assert!(seen.insert(d.id.clone(), d.partition).is_none(), "{}", d.id);
        }
    }
    assert_eq!(seen.len(), 300);
    // The partition read first turns: the first reads start on all three.
    let starts: BTreeSet<usize> = first_partitions.iter().take(3).copied().collect();
    assert_eq!(starts.len(), 3, "{first_partitions:?}");
    let status = q.batch_status("b1").await.unwrap();
    assert_eq!((status.total, status.done), (300, 300));
    assert!(status.is_complete());
    // Results are found from the id alone.
    let ids: Vec<String> = (0..300).map(|i| format!("j-{i}")).collect();
    let results = q.results_of(&ids).await.unwrap();
    assert!(results
        .iter()
        .zip(&ids)
        .all(|(r, id)| r.as_ref().map(|r| &r.id) == Some(id)));
    assert!(q
        .wait_result("j-5", Duration::from_secs(1))
        .await
        .unwrap()
        .is_some());
    assert_eq!(q.stats().await.unwrap().length, 0);
}

#[tokio::test]
async fn a_reply_to_must_name_the_jobs_own_partition() {
    let server = RedisServer::start().unwrap();
    let broker = Broker::connect(&server.url()).await.unwrap();
    let q = broker
        .open_partitioned("rq", 3, QueueConfig::default())
        .await
        .unwrap();
    let id = (0..)
        .map(|i| format!("r-{i}"))
        .find(|id| forkbox_queue::keys::partition_of(id, 3) == 2)
        .unwrap();
    let own = q.partitions()[2].keys().replies("agent");
    let other = q.partitions()[0].keys().replies("agent");
    let err = q
        .enqueue(&Job {
            reply_to: Some(other),
            ..job(&id)
        })
        .await
        .unwrap_err();
    let own_prefix = own.trim_end_matches("agent");
    assert!(err.to_string().contains(own_prefix), "{err}");
    q.enqueue(&Job {
        reply_to: Some(own),
        ..job(&id)
    })
    .await
    .unwrap();
}
