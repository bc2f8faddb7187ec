//! Completions fenced by delivery, and entries handed back by a worker that cannot run them,
//! against a real redis-server.

mod common;

use std::time::Duration;

use common::{eventually, ok_result, server_and_queue};
use forkbox_queue::redis;
use forkbox_queue::{Completion, Job, QueueConfig};

async fn results_entries(q: &forkbox_queue::Queue) -> usize {
    let mut c = q.broker().connection();
    redis::cmd("XLEN")
        .arg(q.keys().results())
        .query_async(&mut c)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_late_completion_after_the_first_result_expired_stores_nothing() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    q.enqueue(&Job {
        id: Some("late".into()),
        result_ttl_s: Some(1),
        ..Job::shell("true")
    })
    .await
    .unwrap();
    // Worker A takes the job and stalls past the visibility timeout.
    let a = q.read("a", 1, 0).await.unwrap().pop().expect("one entry");
    // Worker B reclaims it, reruns it and stores the result.
    let b = q
        .reclaim("b", 0, 1)
        .await
        .unwrap()
        .deliveries
        .pop()
        .unwrap();
    assert_eq!(b.entry_id, a.entry_id);
    assert_eq!(
        q.complete(&b, &ok_result(&b, "from b", "b")).await.unwrap(),
        Completion::Stored
    );
    // The result expires.
    eventually(Duration::from_secs(10), "the result expiring", || async {
        q.result("late").await.unwrap().is_none().then_some(())
    })
    .await;
    // A wakes up and completes its stale delivery: nothing stored, and since no result is
    // left for the id, it is reported as an entry whose result is nowhere (as after Redis lost
    // it), not as a duplicate of a live result.
    assert_eq!(
        q.complete(&a, &ok_result(&a, "from a", "a")).await.unwrap(),
        Completion::Lost
    );
    assert_eq!(results_entries(&q).await, 1, "one result for one entry");
    assert!(
        q.result("late").await.unwrap().is_none(),
        "nothing stored again"
    );
    assert_eq!(q.stats().await.unwrap().pending, 0);
}

#[tokio::test]
async fn the_first_of_two_live_deliveries_to_finish_stores_the_other_does_not() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    q.enqueue(&Job {
        id: Some("race".into()),
        ..Job::shell("true")
    })
    .await
    .unwrap();
    let a = q.read("a", 1, 0).await.unwrap().pop().unwrap();
    let b = q
        .reclaim("b", 0, 1)
        .await
        .unwrap()
        .deliveries
        .pop()
        .unwrap();
    // The stalled worker finishes first, while the entry is pending with B: its result counts.
    assert_eq!(
        q.complete(&a, &ok_result(&a, "a", "a")).await.unwrap(),
        Completion::Stored
    );
    assert_eq!(
        q.complete(&b, &ok_result(&b, "b", "b")).await.unwrap(),
        Completion::Duplicate
    );
    assert_eq!(results_entries(&q).await, 1);
    assert_eq!(q.result("race").await.unwrap().unwrap().worker, "a");
}

#[tokio::test]
async fn handed_back_entries_are_reclaimed_at_once_with_no_attempt_charged() {
    let config = QueueConfig {
        visibility_timeout_ms: 60_000,
        ..QueueConfig::default()
    };
    let (_srv, q) = server_and_queue(config).await;
    for i in 0..3 {
        q.enqueue(&Job {
            id: Some(format!("h{i}")),
            ..Job::shell("true")
        })
        .await
        .unwrap();
    }
    let held = q.read("sick", 3, 0).await.unwrap();
    assert_eq!(held.len(), 3);
    // Not idle yet: nobody may take them.
    assert!(q
        .reclaim("healthy", 60_000, 10)
        .await
        .unwrap()
        .deliveries
        .is_empty());
    // Another worker has meanwhile taken the third one: it is not the sick worker's to give.
    let stolen = &held[2];
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg(q.keys().jobs())
        .arg("workers")
        .arg("other")
        .arg(0)
        .arg(&stolen.entry_id)
        .query_async(&mut q.broker().connection())
        .await
        .unwrap();
    let entries: Vec<(&str, u64)> = held
        .iter()
        .map(|d| (d.entry_id.as_str(), d.deliveries))
        .collect();
    assert_eq!(q.hand_back("sick", &entries).await.unwrap(), 2);
    let got = q.reclaim("healthy", 60_000, 10).await.unwrap();
    let ids: Vec<&str> = got.deliveries.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["h0", "h1"], "handed back, taken at once");
    assert!(
        got.deliveries.iter().all(|d| d.deliveries == 1),
        "the sick worker's delivery is not counted: {:?}",
        got.deliveries
            .iter()
            .map(|d| d.deliveries)
            .collect::<Vec<_>>()
    );
    let s = q.stats().await.unwrap();
    let owner = |name: &str| s.consumers.iter().find(|c| c.name == name).unwrap().pending;
    assert_eq!((owner("sick"), owner("healthy"), owner("other")), (0, 2, 1));
}

#[tokio::test]
async fn a_reclaim_stopped_by_its_limit_says_more_are_waiting() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    for i in 0..5 {
        q.enqueue(&Job {
            id: Some(format!("m{i}")),
            ..Job::shell("true")
        })
        .await
        .unwrap();
    }
    assert_eq!(q.read("dead", 5, 0).await.unwrap().len(), 5);
    let first = q.reclaim("alive", 0, 2).await.unwrap();
    assert_eq!((first.deliveries.len(), first.more), (2, true));
    let rest = q.reclaim("alive2", 0, 10).await.unwrap();
    // The scan starts over: the first two (now alive's, idle 0 ms) are taken too at min idle 0.
    assert!(!rest.more);
    assert!(rest.deliveries.len() >= 3);
}
