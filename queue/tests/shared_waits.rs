//! Shared waits against a real redis-server: many jobs in flight are waited for on a few
//! blocking connections, each gets its own result, a result stored before the wait is found,
//! a wait runs out, Redis losing its scripts and Redis going away.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{eventually, ok_result};
use forkbox_queue::redis;
use forkbox_queue::{Broker, Job, Partitioned, Queue, QueueConfig, QueueError, SharedWaits};
use forkbox_testkit::RedisServer;

fn job(id: &str) -> Job {
    Job {
        id: Some(id.to_owned()),
        ..Job::shell("true")
    }
}

async fn open(server: &RedisServer, partitions: usize) -> Partitioned {
    let q = Broker::connect(&server.url())
        .await
        .unwrap()
        .open_partitioned("shared", partitions, QueueConfig::default())
        .await
        .unwrap();
    for p in q.partitions() {
        p.ensure_group().await.unwrap();
    }
    q
}

/// Completes every job on `q`'s partitions with its own id as its output, until `n` are done.
async fn complete_all(q: &Partitioned, n: usize) {
    let mut done = 0;
    while done < n {
        for p in q.partitions() {
            for d in p.read("w", 64, 10).await.unwrap() {
                let id = d.id.clone();
                p.complete(&d, &ok_result(&d, &id, "w")).await.unwrap();
                done += 1;
            }
        }
    }
}

/// The blocked `XREAD`s Redis is serving now.
async fn blocked_reads(q: &Queue) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut q.broker().connection())
        .await
        .unwrap();
    list.lines().filter(|l| l.contains(" cmd=xread ")).count()
}

async fn stream_length(q: &Queue) -> usize {
    redis::cmd("XLEN")
        .arg(q.keys().jobs())
        .query_async(&mut q.broker().connection())
        .await
        .unwrap()
}

#[tokio::test]
async fn many_jobs_in_flight_are_waited_for_on_a_few_connections() {
    const N: usize = 48;
    let server = RedisServer::start().unwrap();
    let q = open(&server, 1).await;
    let waits = Arc::new(SharedWaits::new(&q));
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let waits = waits.clone();
            tokio::spawn(async move {
                let id = format!("job-{i}");
                let r = waits
                    .enqueue_and_wait(&job(&id), Duration::from_secs(60))
                    .await;
                (id, r)
            })
        })
        .collect();
    let first = q.first();
    // Every job is enqueued before any completes: they all wait at once.
    eventually(Duration::from_secs(30), "every job enqueued", || async {
        (stream_length(first).await == N).then_some(())
    })
    .await;
    let blocked = blocked_reads(first).await;
    // The lanes a partition keeps out, and the one the jobs that came after them share.
    assert!(
        (1..=forkbox_queue::shared_wait::LANES + 1).contains(&blocked),
        "{N} jobs in flight are read on {blocked} blocked connections"
    );
    complete_all(&q, N).await;
    for t in tasks {
        let (id, r) = t.await.unwrap();
        let r = r.unwrap().unwrap_or_else(|| panic!("no result for {id}"));
        assert_eq!(
            (r.id.as_str(), r.outcome.stdout.as_str()),
            (id.as_str(), id.as_str())
        );
    }
}

#[tokio::test]
async fn jobs_of_every_partition_get_their_results() {
    let server = RedisServer::start().unwrap();
    let q = open(&server, 3).await;
    let waits = Arc::new(SharedWaits::new(&q));
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let waits = waits.clone();
            tokio::spawn(async move {
                let id = format!("p-{i}");
                let r = waits
                    .enqueue_and_wait(&job(&id), Duration::from_secs(60))
                    .await;
                (id, r)
            })
        })
        .collect();
    complete_all(&q, 12).await;
    for t in tasks {
        let (id, r) = t.await.unwrap();
        assert_eq!(r.unwrap().unwrap().outcome.stdout, id);
    }
}

#[tokio::test]
async fn a_result_stored_before_the_wait_is_found_and_a_wait_runs_out() {
    let server = RedisServer::start().unwrap();
    let q = open(&server, 1).await;
    let waits = SharedWaits::new(&q);
    q.enqueue(&job("early")).await.unwrap();
    complete_all(&q, 1).await;
    let r = waits
        .wait_new("early", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the stored result");
    assert_eq!(r.outcome.stdout, "early");
    // Nothing comes for an id never enqueued.
    assert!(waits
        .wait_new("never", Duration::from_millis(50))
        .await
        .unwrap()
        .is_none());
    // An invalid job is refused before anything is sent.
    let bad = Job {
        id: Some("bad".into()),
        ..Job::default()
    };
    let e = waits
        .enqueue_and_wait(&bad, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(e, QueueError::InvalidJob(_)), "{e:?}");
}

#[tokio::test]
async fn a_redis_that_lost_its_scripts_gets_them_again() {
    let server = RedisServer::start().unwrap();
    let q = open(&server, 1).await;
    let waits = Arc::new(SharedWaits::new(&q));
    // A first job loads the scripts; then Redis forgets them.
    let w = waits.clone();
    let first = tokio::spawn(async move {
        w.enqueue_and_wait(&job("before"), Duration::from_secs(60))
            .await
    });
    complete_all(&q, 1).await;
    first.await.unwrap().unwrap().unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut q.first().broker().connection())
        .await
        .unwrap();
    let w = waits.clone();
    let after = tokio::spawn(async move {
        w.enqueue_and_wait(&job("after"), Duration::from_secs(60))
            .await
    });
    complete_all(&q, 1).await;
    let r = after.await.unwrap().unwrap().unwrap();
    assert_eq!(r.outcome.stdout, "after");
}

#[tokio::test]
async fn redis_gone_fails_the_enqueue() {
    let server = RedisServer::start().unwrap();
    let q = open(&server, 1).await;
    let waits = SharedWaits::new(&q);
    drop(server);
    let e = waits
        .enqueue_and_wait(&job("lost"), Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(
        matches!(e, QueueError::Enqueue { .. }) && e.is_connection(),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_queue_on_a_cluster_is_waited_for_shard_by_shard() {
    let cluster = forkbox_testkit::RedisCluster::start_default().expect("start a 3+3 cluster");
    let broker =
        Broker::connect_to(&forkbox_queue::Endpoint::parse(&cluster.seeds(), true).unwrap())
            .await
            .unwrap();
    let q = broker
        .open_partitioned("shared", 3, QueueConfig::default())
        .await
        .unwrap();
    for p in q.partitions() {
        p.ensure_group().await.unwrap();
    }
    let waits = Arc::new(SharedWaits::new(&q));
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let waits = waits.clone();
            tokio::spawn(async move {
                let id = format!("c-{i}");
                let r = waits
                    .enqueue_and_wait(&job(&id), Duration::from_secs(60))
                    .await;
                (id, r)
            })
        })
        .collect();
    complete_all(&q, 12).await;
    for t in tasks {
        let (id, r) = t.await.unwrap();
        assert_eq!(r.unwrap().unwrap().outcome.stdout, id);
    }
}
