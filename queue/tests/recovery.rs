//! At-least-once delivery against a real redis-server: reclaiming a dead worker's entries,
//! exhausted attempts, claim refreshes, own-pending drain, and Redis restarts with AOF.

mod common;

use std::time::Duration;

use common::{conn, eventually, ok_result, server_and_queue};
use forkbox_queue::redis::{self, AsyncCommands};
use forkbox_queue::{Broker, CancelEvent, Completion, Job, QueueConfig, RECLAIM_PAGE};
use forkbox_testkit::RedisServer;

#[tokio::test]
async fn a_dead_consumers_entries_are_reclaimed_by_another() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    for i in 0..3 {
        q.enqueue(&Job {
            id: Some(format!("r{i}")),
            ..Job::shell("true")
        })
        .await
        .unwrap();
    }
    // "dead" reads and never completes.
    let taken = q.read("dead", 3, 100).await.unwrap();
    assert_eq!(taken.len(), 3);
    // One of them has a result already (another copy of the same id ran elsewhere).
    let dup = &taken[2];
    let mut c = conn(&q).await;
    let _: () = c
        .set(
            q.keys().result(&dup.id),
            serde_json::to_string(&ok_result(dup, "", "someone")).unwrap(),
        )
        .await
        .unwrap();

    let got = q.reclaim("alive", 0, 10).await.unwrap();
    let ids: Vec<&str> = got.deliveries.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["r0", "r1"]);
    assert!(got.deliveries.iter().all(|d| d.deliveries == 2));
    assert_eq!(got.duplicates, 1);
    assert!(got.dead_lettered.is_empty());
    let s = q.stats().await.unwrap();
    let alive = s.consumers.iter().find(|c| c.name == "alive").unwrap();
    assert_eq!(alive.pending, 2);
    let dead = s.consumers.iter().find(|c| c.name == "dead").unwrap();
    assert_eq!(dead.pending, 0);
    // The dead consumer can go now that its entries were claimed.
    assert_eq!(q.remove_dead_consumers().await.unwrap(), ["dead"]);
    for d in &got.deliveries {
        let r = ok_result(d, "", "alive");
        assert_eq!(r.attempt, 2);
        assert_eq!(q.complete(d, &r).await.unwrap(), Completion::Stored);
    }
    assert_eq!(q.stats().await.unwrap().pending, 0);
}

#[tokio::test]
async fn entries_past_max_attempts_go_to_the_dead_stream() {
    let config = QueueConfig {
        max_attempts: 2,
        ..QueueConfig::default()
    };
    let (_srv, q) = server_and_queue(config).await;
    let id = q.enqueue(&Job::shell("crash the worker")).await.unwrap();
    let own = Job {
        id: Some("patient".into()),
        max_attempts: Some(5),
        ..Job::shell("true")
    };
    q.enqueue(&own).await.unwrap();
    assert_eq!(q.read("w1", 10, 100).await.unwrap().len(), 2); // delivery 1
    let r = q.reclaim("w2", 0, 10).await.unwrap(); // delivery 2
    assert_eq!(r.deliveries.len(), 2);
    let r = q.reclaim("w3", 0, 10).await.unwrap(); // would be delivery 3
    assert_eq!(r.dead_lettered.len(), 1);
    assert_eq!(r.deliveries.len(), 1, "the job's own max_attempts applies");
    assert_eq!(r.deliveries[0].id, "patient");

    let dead = q.dlq_list(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, id);
    assert_eq!(dead[0].reason, "exceeded max_attempts (2 deliveries)");
    assert_eq!(dead[0].deliveries, 2);
    assert_eq!(dead[0].worker, "w3");
    let res = q.result(&id).await.unwrap().unwrap();
    assert_eq!(res.outcome.status, forkbox_queue::Status::Error);
    assert_eq!(res.attempt, 2);
    assert_eq!(q.stats().await.unwrap().pending, 1);
}

#[tokio::test]
async fn reclaim_follows_the_cursor_past_one_page() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    let n = RECLAIM_PAGE * 2 + 50;
    let jobs: Vec<Job> = (0..n).map(|_| Job::shell("true")).collect();
    q.enqueue_batch(&jobs, "many").await.unwrap();
    assert_eq!(q.read("dead", n, 100).await.unwrap().len(), n);
    let got = q.reclaim("alive", 0, usize::MAX).await.unwrap();
    assert_eq!(got.deliveries.len(), n);
    // A limit stops early and leaves the rest pending with the old owner.
    for d in got.deliveries.iter().take(10) {
        q.complete(d, &ok_result(d, "", "alive")).await.unwrap();
    }
    let limited = q.reclaim("third", 0, 7).await.unwrap();
    assert_eq!(limited.deliveries.len(), 7);
    let s = q.stats().await.unwrap();
    let third = s.consumers.iter().find(|c| c.name == "third").unwrap();
    assert_eq!(third.pending, 7);
    assert_eq!(s.pending as usize, n - 10);
}

#[tokio::test]
async fn reclaim_reports_entries_deleted_while_pending() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    q.enqueue(&Job::shell("true")).await.unwrap();
    let d = q.read("dead", 1, 100).await.unwrap().remove(0);
    let mut c = conn(&q).await;
    let _: i64 = c.xdel(q.keys().jobs(), &[&d.entry_id]).await.unwrap();
    let got = q.reclaim("alive", 0, 10).await.unwrap();
    assert!(got.deliveries.is_empty());
    assert_eq!(got.deleted, std::slice::from_ref(&d.entry_id));
    assert_eq!(q.stats().await.unwrap().pending, 0);
}

/// Makes an entry look idle for `ms` without changing its owner or delivery count, as if its
/// worker had stalled that long.
async fn age(q: &forkbox_queue::Queue, owner: &str, entry: &str, ms: u64) {
    let mut c = conn(q).await;
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg(q.keys().jobs())
        .arg("workers")
        .arg(owner)
        .arg(0)
        .arg(entry)
        .arg("IDLE")
        .arg(ms)
        .arg("JUSTID")
        .query_async(&mut c)
        .await
        .unwrap();
}

async fn pending_rows(q: &forkbox_queue::Queue) -> Vec<(String, String, u64, u64)> {
    let mut c = conn(q).await;
    let rows: redis::Value = redis::cmd("XPENDING")
        .arg(q.keys().jobs())
        .arg("workers")
        .arg("-")
        .arg("+")
        .arg(100)
        .query_async(&mut c)
        .await
        .unwrap();
    redis::from_redis_value(&rows).expect("xpending rows")
}

#[tokio::test]
async fn refreshed_claims_stay_with_their_worker() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    q.enqueue(&Job::shell("sleep 100")).await.unwrap();
    q.enqueue(&Job::shell("sleep 100")).await.unwrap();
    let mine = q.read("runner", 2, 100).await.unwrap();
    let (kept, stalled) = (&mine[0].entry_id, &mine[1].entry_id);
    age(&q, "runner", kept, 100_000).await;
    age(&q, "runner", stalled, 100_000).await;

    // The runner refreshes one entry: its idle time resets, its delivery count stays 1.
    let lost = q
        .refresh_claims("runner", std::slice::from_ref(kept))
        .await
        .unwrap();
    assert!(lost.is_empty());
    let got = q.reclaim("thief", 50_000, 10).await.unwrap();
    let taken: Vec<&str> = got.deliveries.iter().map(|d| d.entry_id.as_str()).collect();
    assert_eq!(
        taken,
        [stalled.as_str()],
        "only the unrefreshed entry is reclaimed"
    );
    let rows = pending_rows(&q).await;
    let row = rows.iter().find(|r| &r.0 == kept).unwrap();
    assert_eq!((row.1.as_str(), row.3), ("runner", 1));
    assert!(row.2 < 50_000, "idle {}", row.2);

    // Refreshing an entry another worker took does not steal it back.
    let lost = q
        .refresh_claims("runner", &[kept.clone(), stalled.clone()])
        .await
        .unwrap();
    assert_eq!(lost, std::slice::from_ref(stalled));
    let rows = pending_rows(&q).await;
    let row = rows.iter().find(|r| &r.0 == stalled).unwrap();
    assert_eq!((row.1.as_str(), row.3), ("thief", 2));
}

#[tokio::test]
async fn a_restarted_worker_drains_its_own_pending_entries() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    for i in 0..4 {
        q.enqueue(&Job {
            id: Some(format!("p{i}")),
            ..Job::shell("true")
        })
        .await
        .unwrap();
    }
    let first = q.read("node-a", 4, 100).await.unwrap();
    // Before the crash: p0 got a result from a duplicate run, p1 was completed, p3's entry was
    // deleted from the stream. Only p2 is left to run.
    q.complete(&first[1], &ok_result(&first[1], "", "node-a"))
        .await
        .unwrap();
    let mut c = conn(&q).await;
    let _: () = c
        .set(
            q.keys().result("p0"),
            serde_json::to_string(&ok_result(&first[0], "", "node-a")).unwrap(),
        )
        .await
        .unwrap();
    let _: i64 = c
        .xdel(q.keys().jobs(), &[&first[3].entry_id])
        .await
        .unwrap();
    let again = q.read_own_pending("node-a", 10).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, "p2");
    assert!(again[0].deliveries >= 1);
    assert_eq!(
        q.stats().await.unwrap().pending,
        1,
        "p0 and p3 were acknowledged"
    );
}

#[tokio::test]
async fn the_stream_survives_a_redis_crash_with_aof() {
    let mut server = RedisServer::start_persistent().unwrap();
    let broker = Broker::connect(&server.url()).await.unwrap();
    let q = broker.queue("default", QueueConfig::default()).unwrap();
    q.ensure_group().await.unwrap();
    let ids: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..20 {
            v.push(q.enqueue(&Job::shell("true")).await.unwrap());
        }
        v
    };
    let held = q.read("w", 5, 100).await.unwrap();
    let mut w = q.watch_cancellations();
    assert!(matches!(w.next().await.unwrap(), CancelEvent::Resynced(_)));
    let port = server.port();

    server.kill().unwrap();
    assert!(q.stats().await.is_err_and(|e| e.is_connection()));
    server.restart().unwrap();
    assert_eq!(server.port(), port);

    // The shared connection reconnects by itself; scripts are reloaded on NOSCRIPT.
    let stats = eventually(Duration::from_secs(20), "reconnect", || {
        let q = q.clone();
        async move { q.stats().await.ok() }
    })
    .await;
    assert_eq!(stats.length, 20);
    assert_eq!(stats.pending, 5, "the group and its pending list survived");
    for d in &held {
        q.complete(d, &ok_result(d, "", "w")).await.unwrap();
    }
    let rest = q.read("w", 100, 100).await.unwrap();
    assert_eq!(rest.len(), 15);
    for d in &rest {
        q.complete(d, &ok_result(d, "", "w")).await.unwrap();
    }
    for id in &ids {
        assert!(q.result(id).await.unwrap().is_some(), "{id}");
    }
    // The cancel watcher notices the drop, reconnects and resyncs.
    q.cancel("after-restart").await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let ev = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "watcher never resynced"
        );
        match tokio::time::timeout(Duration::from_secs(5), w.next()).await {
            Ok(Ok(CancelEvent::Resynced(ids))) => break ids,
            // A connection error: call next again, as a worker would after its back-off.
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    assert_eq!(ev, ["after-restart"]);
}
