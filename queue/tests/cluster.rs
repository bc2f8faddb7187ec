//! Queue operations against a real Redis Cluster (3 primaries, 3 replicas) the tests start
//! and remove themselves: every operation through the cluster connection, queues on different
//! shards, cancellation over sharded pub/sub, and a primary SIGKILLed mid-run.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::{eventually, ok_result};
use forkbox_queue::redis::{self, AsyncCommands};
use forkbox_queue::{
    Broker, CancelEvent, Completion, DlqSelection, Endpoint, Job, Queue, QueueConfig, QueueError,
    QueueSet,
};
use forkbox_testkit::{RedisCluster, RedisServer};

const LIMIT: Duration = Duration::from_secs(60);

fn slot_of(q: &Queue) -> u16 {
    redis::cluster_routing::get_slot(q.keys().jobs().as_bytes())
}

async fn cluster_broker(cluster: &RedisCluster) -> Broker {
    Broker::connect_to(&Endpoint::parse(&cluster.seeds(), true).unwrap())
        .await
        .expect("connect to the cluster")
}

/// Queue names whose slots are served by `n` different primaries.
fn queues_on_distinct_primaries(cluster: &RedisCluster, broker: &Broker, n: usize) -> Vec<Queue> {
    let mut owners = HashSet::new();
    let mut out = Vec::new();
    for i in 0.. {
        let q = broker
            .queue(&format!("shard-{i}"), QueueConfig::default())
            .unwrap();
        if owners.insert(cluster.primary_of(slot_of(&q)).unwrap()) {
            out.push(q);
        }
        if out.len() == n {
            break;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_queue_operation_runs_unchanged_through_a_cluster() {
    let cluster = RedisCluster::start_default().expect("start a 3+3 cluster");
    let broker = cluster_broker(&cluster).await;
    assert!(broker.is_cluster());
    let qs = queues_on_distinct_primaries(&cluster, &broker, 3);
    for q in &qs {
        q.ensure_group().await.unwrap();
    }

    // Enqueue, read, complete, one result per id, on every shard.
    for q in &qs {
        let id = q.enqueue(&Job::shell("echo hi")).await.unwrap();
        let again = q
            .enqueue_idempotent(&Job {
                id: Some(id.clone()),
                ..Job::shell("echo hi")
            })
            .await
            .unwrap();
        assert!(!again.new, "idempotent enqueue on {}", q.name());
        let got = q.read("w1", 10, 1_000).await.unwrap();
        assert_eq!(got.len(), 1, "queue {}", q.name());
        let r = ok_result(&got[0], "hi\n", "w1");
        assert_eq!(q.complete(&got[0], &r).await.unwrap(), Completion::Stored);
        assert_eq!(
            q.complete(&got[0], &r).await.unwrap(),
            Completion::Duplicate
        );
        assert_eq!(q.result(&id).await.unwrap(), Some(r.clone()));
        assert_eq!(
            q.wait_result(&id, Duration::from_secs(1)).await.unwrap(),
            Some(r)
        );
        let stats = q.stats().await.unwrap();
        assert_eq!(
            (stats.length, stats.pending),
            (0, 0),
            "{}: {stats:?}",
            q.name()
        );
    }
    // Heartbeats are found by a SCAN on the queue's own shard, whichever it is.
    for q in &qs {
        assert_eq!(q.live_workers().await.unwrap(), 0, "{}", q.name());
        q.heartbeat("w1", Duration::from_secs(30)).await.unwrap();
        assert_eq!(q.live_workers().await.unwrap(), 1, "{}", q.name());
    }
    // The keys of each queue live on the primary that serves its slot.
    let mut conn = broker.connection();
    for q in &qs {
        let owner = &cluster.nodes()[cluster.primary_of(slot_of(q)).unwrap()];
        let mut direct = redis::Client::open(owner.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let n: u64 = direct.xlen(q.keys().results()).await.unwrap();
        assert_eq!(n, 1, "results of {} on port {}", q.name(), owner.port());
        let via_cluster: u64 = conn.xlen(q.keys().results()).await.unwrap();
        assert_eq!(via_cluster, 1);
    }

    // A waiter blocked on its own connection wakes when the result arrives.
    let q = &qs[0];
    let id = q.enqueue(&Job::shell("true")).await.unwrap();
    let waiter = {
        let (q, id) = (q.clone(), id.clone());
        tokio::spawn(async move { q.wait_result(&id, LIMIT).await })
    };
    let d = q.read("w1", 1, 1_000).await.unwrap().remove(0);
    q.complete(&d, &ok_result(&d, "", "w1")).await.unwrap();
    assert_eq!(waiter.await.unwrap().unwrap().unwrap().id, id);

    // Batches: counters summed by the script, in the queue's slot.
    let jobs: Vec<Job> = (0..5).map(|i| Job::shell(format!("echo {i}"))).collect();
    qs[1].enqueue_batch(&jobs, "b1").await.unwrap();
    let got = qs[1].read("w1", 10, 1_000).await.unwrap();
    assert_eq!(got.len(), 5);
    let results: Vec<_> = got.iter().map(|d| ok_result(d, "", "w1")).collect();
    let pairs: Vec<_> = got.iter().zip(&results).collect();
    qs[1].complete_many(&pairs).await.unwrap();
    let status = qs[1].batch_status("b1").await.unwrap();
    assert_eq!((status.total, status.done), (5, 5));
    assert!(status.is_complete());

    // Dead letters: list, requeue, purge.
    qs[2].enqueue_raw(b"not json").await.unwrap();
    let bad = qs[2].read("w1", 10, 1_000).await.unwrap();
    assert_eq!(bad.len(), 1);
    assert!(bad[0].job.is_err());
    qs[2].dead_letter(&bad[0], "invalid", "w1").await.unwrap();
    assert_eq!(qs[2].dlq_list(10).await.unwrap().len(), 1);
    assert_eq!(qs[2].dlq_requeue(DlqSelection::All).await.unwrap(), 1);
    assert_eq!(qs[2].stats().await.unwrap().length, 1);
    let bad = qs[2].read("w1", 10, 1_000).await.unwrap();
    qs[2].dead_letter(&bad[0], "invalid", "w1").await.unwrap();
    assert_eq!(qs[2].dlq_purge().await.unwrap(), 1);

    // Reclaim: w1 reads and dies; w2 takes the entry over.
    let id = qs[0].enqueue(&Job::shell("sleep 1")).await.unwrap();
    let taken = qs[0].read("w1", 1, 1_000).await.unwrap();
    assert_eq!(taken[0].id, id);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let reclaimed = qs[0].reclaim("w2", 10, 10).await.unwrap();
    assert_eq!(reclaimed.deliveries.len(), 1);
    assert_eq!(reclaimed.deliveries[0].deliveries, 2);
    let d = &reclaimed.deliveries[0];
    qs[0].complete(d, &ok_result(d, "", "w2")).await.unwrap();

    // Cancellation over sharded pub/sub: the watcher hears it live, on each shard.
    for q in &qs {
        let mut watcher = q.watch_cancellations();
        let first = tokio::time::timeout(LIMIT, watcher.next())
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(first, CancelEvent::Resynced(_)), "{first:?}");
        let heard = q.cancel("job-to-cancel").await.unwrap();
        assert_eq!(heard, 1, "one watcher subscribed on {}", q.name());
        let ev = tokio::time::timeout(LIMIT, watcher.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ev, CancelEvent::Cancelled("job-to-cancel".into()));
        assert!(q.is_cancelled("job-to-cancel").await.unwrap());
    }

    // Priorities across shards: the blocking step waits on each queue and wakes on the first
    // job, whichever shard it lands on.
    let set = QueueSet::new(qs.clone()).unwrap();
    let reader = {
        let set = set.clone();
        tokio::spawn(async move { set.read("w3", 4, 20_000).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let id = qs[2].enqueue(&Job::shell("true")).await.unwrap();
    let got = tokio::time::timeout(LIMIT, reader)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].queue.as_str(), got[0].id.as_str()),
        (qs[2].name(), id.as_str())
    );
    // Non-blocking reads still go highest first.
    let low = qs[2].enqueue(&Job::shell("true")).await.unwrap();
    let high = qs[0].enqueue(&Job::shell("true")).await.unwrap();
    let got = set.read("w3", 1, 1_000).await.unwrap();
    assert_eq!(got[0].id, high);
    let got = set.read("w3", 1, 1_000).await.unwrap();
    assert_eq!(got[0].id, low);

    // A completion reads the next entries in the same request: the completion script reads
    // after it, so the entries are never hidden behind a refused command.
    let q = &qs[1];
    for id in ["next-a", "next-b", "next-c", "next-d"] {
        q.enqueue(&Job {
            id: Some(id.into()),
            ..Job::shell("true")
        })
        .await
        .unwrap();
    }
    let first = q.read("w4", 1, 0).await.unwrap().pop().unwrap();
    let trips = broker.round_trips();
    let before = trips.get();
    let (done, read) = q
        .complete_many_and_read(&[(&first, &ok_result(&first, "", "w4"))], "w4", 2)
        .await;
    assert_eq!(
        trips.get() - before,
        1,
        "one request for the completion and the read"
    );
    assert_eq!(done.unwrap(), vec![Completion::Stored]);
    let ids: Vec<String> = read.unwrap().into_iter().map(|d| d.id).collect();
    assert_eq!(ids, ["next-b", "next-c"]);
    // A repeated completion stores nothing and still reads.
    let (done, read) = q
        .complete_many_and_read(&[(&first, &ok_result(&first, "", "w4"))], "w4", 2)
        .await;
    assert_eq!(done.unwrap(), vec![Completion::Duplicate]);
    let ids: Vec<String> = read.unwrap().into_iter().map(|d| d.id).collect();
    assert_eq!(ids, ["next-d"]);
    // A refused completion reads nothing: no entry is taken that the caller does not see.
    let refused = ids_delivery(q, "next-b").await;
    let mut conn = broker.connection();
    let _: () = conn
        .set(q.keys().done("next-b"), "not a list")
        .await
        .unwrap();
    q.enqueue(&Job {
        id: Some("next-e".into()),
        ..Job::shell("true")
    })
    .await
    .unwrap();
    let (done, read) = q
        .complete_many_and_read(&[(&refused, &ok_result(&refused, "", "w4"))], "w4", 2)
        .await;
    assert!(done.unwrap_err().is_refused());
    assert!(read.unwrap().is_empty());
    assert_eq!(q.read("w4", 5, 0).await.unwrap()[0].id, "next-e");
}

/// The pending delivery of `id` for consumer w4, as a reclaim hands it over.
async fn ids_delivery(q: &Queue, id: &str) -> forkbox_queue::Delivery {
    let pending = q.read_own_pending("w4", 10).await.unwrap();
    pending
        .into_iter()
        .find(|d| d.id == id)
        .unwrap_or_else(|| panic!("{id} is not pending for w4"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_to_stream_shares_the_queue_slot_and_gets_one_copy() {
    let cluster = RedisCluster::start_default().expect("start a 3+3 cluster");
    let broker = cluster_broker(&cluster).await;
    let q = broker.queue("replies", QueueConfig::default()).unwrap();
    q.ensure_group().await.unwrap();
    // The only streams a job may name are the queue's replies streams: same hash tag, same
    // slot, so the completion script appends the copy atomically in a cluster too.
    let reply_to = q.keys().replies("client-1");
    assert_eq!(
        redis::cluster_routing::get_slot(reply_to.as_bytes()),
        slot_of(&q)
    );
    let id = q
        .enqueue(&Job {
            reply_to: Some(reply_to.clone()),
            ..Job::shell("true")
        })
        .await
        .unwrap();
    let d = q.read("w1", 1, 1_000).await.unwrap().remove(0);
    let r = ok_result(&d, "", "w1");
    assert_eq!(q.complete(&d, &r).await.unwrap(), Completion::Stored);
    assert_eq!(q.complete(&d, &r).await.unwrap(), Completion::Duplicate);
    let mut conn = broker.connection();
    let copies: redis::streams::StreamRangeReply = conn.xrange_all(&reply_to).await.unwrap();
    assert_eq!(copies.ids.len(), 1, "one copy in {reply_to}");
    let json: String = copies.ids[0].get("result").unwrap();
    assert!(json.contains(&id), "{json}");
}

#[tokio::test]
async fn seeds_that_are_not_cluster_nodes_are_refused_clearly() {
    let single = RedisServer::start().expect("start redis-server");
    let err = Broker::connect_to(&Endpoint::parse(&single.url(), true).unwrap())
        .await
        .expect_err("a plain server is not a cluster");
    assert!(matches!(err, QueueError::ConnectCluster { .. }), "{err:?}");
    assert!(
        !err.is_connection(),
        "a configuration error, not a retry: {err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&single.url()) && text.contains("cluster"),
        "{text}"
    );

    let err = Endpoint::parse("redis://a:1,redis://b:2", false).unwrap_err();
    assert!(err.to_string().contains("--cluster"), "{err}");
    let err = Endpoint::parse("redis://a:1,,redis://b:2", true).unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
    let err = Endpoint::parse("redis://:secret@a:1,redis://b:2", false).unwrap_err();
    assert!(!err.to_string().contains("secret"), "{err}");
    assert_eq!(
        Endpoint::parse("redis://a:1, redis://b:2", true).unwrap(),
        Endpoint::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
    );
    assert_eq!(
        Endpoint::parse("redis://a:1", false).unwrap(),
        Endpoint::Single("redis://a:1".into())
    );
}

/// Jobs enqueued and replicated before the kill; consumers draining while the primary of the
/// queue's slot is SIGKILLed and its replica promoted. What the docs promise
/// (docs/operations.md, "Failover"): replicated jobs are never lost, a result is stored once,
/// and a completion acknowledged just before the kill may be undone, so that job runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_mid_run_loses_no_replicated_job_and_stores_each_result_once() {
    const JOBS: usize = 400;
    let mut cluster = RedisCluster::start_default().expect("start a 3+3 cluster");
    let broker = cluster_broker(&cluster).await;
    let config = QueueConfig {
        visibility_timeout_ms: 1_000,
        max_attempts: 50,
        ..QueueConfig::default()
    };
    let q = broker.queue("failover", config).unwrap();
    q.ensure_group().await.unwrap();
    let jobs: Vec<Job> = (0..JOBS).map(|i| Job::shell(format!("echo {i}"))).collect();
    let ids: Vec<String> = q
        .enqueue_batch(&jobs, "run")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    // The replica has every job before anything is killed.
    let synced: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5_000)
        .query_async(&mut broker.connection())
        .await
        .unwrap();
    assert_eq!(synced, 1, "WAIT: one replica acknowledged");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut consumers = Vec::new();
    for name in ["c1", "c2"] {
        let (q, mut stop) = (q.clone(), stop_rx.clone());
        consumers.push(tokio::spawn(async move {
            let (mut runs, mut stored, mut duplicates, mut errors) = (0u64, 0u64, 0u64, 0u64);
            while !*stop.borrow() {
                let mut batch = match q.read(name, 8, 200).await {
                    Ok(b) => b,
                    Err(e) if e.is_connection() => {
                        errors += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                    Err(e) => panic!("read: {e}"),
                };
                if let Ok(r) = q.reclaim(name, 1_000, 8).await {
                    batch.extend(r.deliveries);
                }
                for d in &batch {
                    runs += 1;
                    match q.complete(d, &ok_result(d, "", name)).await {
                        Ok(Completion::Stored) => stored += 1,
                        // Lost: the entry went with a failover; the final count tells.
                        Ok(Completion::Duplicate | Completion::Lost) => duplicates += 1,
                        Err(e) if e.is_connection() => errors += 1,
                        Err(e) => panic!("complete: {e}"),
                    }
                }
                tokio::select! {
                    _ = stop.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                }
            }
            (runs, stored, duplicates, errors)
        }));
    }

    // Mid-run: a quarter of the batch done.
    eventually(LIMIT, "a quarter of the jobs done", || async {
        let s = q.batch_status("run").await.ok()?;
        (s.done as usize >= JOBS / 4).then_some(())
    })
    .await;
    let killed = cluster.kill_primary_of(slot_of(&q)).unwrap();
    let promoted = tokio::task::block_in_place(|| cluster.wait_failed_over(slot_of(&q))).unwrap();
    assert_ne!(killed, promoted);

    let results = eventually(Duration::from_secs(120), "every job done", || async {
        let mut conn = q.broker().connection();
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.exists(q.keys().result(id));
        }
        let have: Vec<bool> = pipe.query_async(&mut conn).await.ok()?;
        have.iter().all(|&h| h).then_some(have)
    })
    .await;
    stop_tx.send(true).unwrap();
    let mut totals = (0, 0, 0, 0);
    for c in consumers {
        let (runs, stored, duplicates, errors) = c.await.unwrap();
        totals = (
            totals.0 + runs,
            totals.1 + stored,
            totals.2 + duplicates,
            totals.3 + errors,
        );
    }
    let (runs, stored, duplicates, errors) = totals;
    // One result per id: the results stream holds each id once.
    let mut conn = broker.connection();
    let stream: redis::streams::StreamRangeReply =
        conn.xrange_all(q.keys().results()).await.unwrap();
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for e in &stream.ids {
        let json: String = e.get("result").unwrap();
        let r: forkbox_queue::JobResult = serde_json::from_str(&json).unwrap();
        *per_id.entry(r.id).or_default() += 1;
    }
    let lost = results.iter().filter(|&&h| !h).count();
    let duplicated = per_id.values().filter(|&&n| n > 1).count();
    println!(
        "failover: {JOBS} jobs, {runs} runs, {stored} stored, {duplicates} duplicate \
         completions, {errors} errors seen by consumers, {lost} lost, {duplicated} duplicated \
         results, {} undone by the failover",
        stored as usize - JOBS.min(stored as usize)
    );
    assert_eq!(lost, 0, "a replicated job is never lost");
    assert_eq!(duplicated, 0, "one result per id");
    assert_eq!(per_id.len(), JOBS, "every id has its result in the stream");
    let stats = q.stats().await.unwrap();
    assert_eq!((stats.length, stats.pending), (0, 0), "{stats:?}");
    let status = q.batch_status("run").await.unwrap();
    assert_eq!(status.done as usize, JOBS, "{status:?}");
}

/// A blocking read over several shards blocks on each at once. When jobs land on several
/// shards together, every entry Redis handed to one of those reads comes back to the caller:
/// none is left pending on the consumer unseen (a worker would never run it, and it would
/// wait a whole visibility timeout for a reclaim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_read_over_shards_returns_every_entry_redis_handed_out() {
    const ROUNDS: usize = 40;
    const PARTS: usize = 3;
    let cluster = RedisCluster::start(3, 0).expect("start a 3-primary cluster");
    let broker = cluster_broker(&cluster).await;
    let queue = broker
        .open_partitioned("strand", PARTS, QueueConfig::default())
        .await
        .unwrap();
    let set = QueueSet::of_partitioned(vec![queue.clone()]).unwrap();
    set.ensure_groups().await.unwrap();
    let mut next_id = 0usize;
    let mut id_on = |p: usize| loop {
        next_id += 1;
        let id = format!("strand-{next_id}");
        if forkbox_queue::keys::partition_of(&id, PARTS) == p {
            return id;
        }
    };
    let mut returned = HashSet::new();
    for _ in 0..ROUNDS {
        let reader = {
            let set = set.clone();
            tokio::spawn(async move { set.read("w", 2 * PARTS, 10_000).await })
        };
        // Let the reads block, then give every shard a job at the same instant.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let jobs: Vec<Job> = (0..PARTS)
            .map(|p| Job {
                id: Some(id_on(p)),
                ..Job::shell("true")
            })
            .collect();
        let (a, b, c) = tokio::join!(
            queue.enqueue(&jobs[0]),
            queue.enqueue(&jobs[1]),
            queue.enqueue(&jobs[2])
        );
        for r in [a, b, c] {
            r.unwrap();
        }
        let got = tokio::time::timeout(LIMIT, reader)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(!got.is_empty());
        returned.extend(got.into_iter().map(|d| d.id));
        // What the blocking read did not take is still new: a plain read takes it.
        loop {
            let more = set.read("w", 2 * PARTS, 0).await.unwrap();
            if more.is_empty() {
                break;
            }
            returned.extend(more.into_iter().map(|d| d.id));
        }
    }
    assert_eq!(returned.len(), ROUNDS * PARTS, "every job read once");
    // Nothing was acknowledged: every entry handed to "w" is pending on it, and each one
    // pending was returned.
    let mut pending = 0u64;
    for q in queue.partitions() {
        let (n,): (u64,) = redis::pipe()
            .cmd("XPENDING")
            .arg(q.keys().jobs())
            .arg("workers")
            .query_async::<(redis::Value,)>(&mut broker.connection())
            .await
            .map(|(v,)| match v {
                redis::Value::Array(items) => match items.first() {
                    Some(redis::Value::Int(n)) => (*n as u64,),
                    other => panic!("XPENDING summary: {other:?}"),
                },
                other => panic!("XPENDING summary: {other:?}"),
            })
            .unwrap();
        pending += n;
    }
    assert_eq!(
        pending,
        returned.len() as u64,
        "entries handed out but never returned by a read"
    );
}

/// A client given one URL, that of the primary serving its queue, learns the whole cluster
/// through it: once that primary is SIGKILLed and its replica promoted, every operation, a
/// blocking read on a new connection and the cancellation subscription go on through the
/// nodes alive (the client kept reconnecting to the dead address before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_given_one_url_outlives_that_node() {
    let mut cluster = RedisCluster::start_with(3, 1, 2_000).expect("start a 3+3 cluster");
    let all = cluster_broker(&cluster).await;
    let probe = all.queue("named", QueueConfig::default()).unwrap();
    let named = cluster.primary_of(slot_of(&probe)).unwrap();
    let url = cluster.nodes()[named].url();
    let broker = Broker::connect_to(&Endpoint::parse(&url, true).unwrap())
        .await
        .expect("connect through one node");
    let q = broker.queue("named", QueueConfig::default()).unwrap();
    q.ensure_group().await.unwrap();
    let mut watcher = q.watch_cancellations();
    let first = tokio::time::timeout(LIMIT, watcher.next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(first, CancelEvent::Resynced(_)), "{first:?}");
    // A blocking read's connection, pooled: the kill leaves it dead, and a new one is opened.
    assert!(q.read("w", 1, 100).await.unwrap().is_empty());

    cluster.kill_primary_of(slot_of(&q)).unwrap();
    cluster.wait_failed_over(slot_of(&q)).unwrap();

    // The cancellation follower subscribes again through a live node.
    eventually(LIMIT, "a cancel after the failover", || {
        let probe = probe.clone();
        async move { probe.cancel("after-failover").await.ok() }
    })
    .await;
    let heard = tokio::time::timeout(LIMIT, async {
        loop {
            match watcher.next().await {
                Ok(CancelEvent::Cancelled(id)) if id == "after-failover" => return true,
                Ok(CancelEvent::Resynced(ids)) if ids.iter().any(|i| i == "after-failover") => {
                    return true
                }
                _ => {}
            }
        }
    })
    .await
    .expect("the watcher hears of the cancel");
    assert!(heard);
    // Enqueue, a blocking read on a connection opened after the kill, completion.
    let id = eventually(LIMIT, "an enqueue after the failover", || {
        let q = q.clone();
        async move { q.enqueue(&Job::shell("true")).await.ok() }
    })
    .await;
    let got = eventually(LIMIT, "a blocking read after the failover", || {
        let q = q.clone();
        async move { q.read("w", 1, 500).await.ok().filter(|d| !d.is_empty()) }
    })
    .await;
    assert_eq!(got[0].id, id);
    q.complete(&got[0], &ok_result(&got[0], "", "w"))
        .await
        .unwrap();
    assert!(q.result(&id).await.unwrap().is_some());
}
