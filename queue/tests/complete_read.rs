//! Completions that read the next entries on the same round trip
//! (`Queue::complete_many_and_read`), against a real redis-server.

mod common;

use common::{ok_result, server_and_queue};
use forkbox_queue::redis;
use forkbox_queue::{Completion, Job, QueueConfig};

async fn pending(q: &forkbox_queue::Queue) -> u64 {
    let mut c = q.broker().connection();
    let summary: (u64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
        .arg(q.keys().jobs())
        .arg("workers")
        .query_async(&mut c)
        .await
        .unwrap();
    summary.0
}

async fn enqueue(q: &forkbox_queue::Queue, ids: &[&str]) {
    for id in ids {
        q.enqueue(&Job {
            id: Some((*id).into()),
            ..Job::shell("true")
        })
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn a_completion_stores_and_reads_the_next_entries_in_stream_order() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    enqueue(&q, &["a", "b", "c", "d"]).await;
    let a = q.read("w", 1, 0).await.unwrap().pop().unwrap();
    let (done, read) = q
        .complete_many_and_read(&[(&a, &ok_result(&a, "x", "w"))], "w", 2)
        .await;
    assert_eq!(done.unwrap(), vec![Completion::Stored]);
    let read = read.unwrap();
    let ids: Vec<&str> = read.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["b", "c"]);
    assert!(read.iter().all(|d| d.deliveries == 1 && d.job.is_ok()));
    assert_eq!(q.result("a").await.unwrap().unwrap().outcome.stdout, "x");
    // a is acknowledged and gone; b and c are pending for w; d waits.
    assert_eq!(pending(&q).await, 2);
    let rest = q.read("w", 10, 0).await.unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].id, "d");
}

#[tokio::test]
async fn an_empty_queue_reads_nothing_without_blocking() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    enqueue(&q, &["only"]).await;
    let d = q.read("w", 1, 0).await.unwrap().pop().unwrap();
    let (done, read) = q
        .complete_many_and_read(&[(&d, &ok_result(&d, "", "w"))], "w", 4)
        .await;
    assert_eq!(done.unwrap(), vec![Completion::Stored]);
    assert!(read.unwrap().is_empty());
    assert_eq!(pending(&q).await, 0);
}

#[tokio::test]
async fn entries_read_beside_a_refused_completion_are_still_returned() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    enqueue(&q, &["good", "bad", "next"]).await;
    let taken = q.read("w", 2, 0).await.unwrap();
    let (good, bad) = (&taken[0], &taken[1]);
    // A key of the wrong type where bad's result list goes: Redis refuses its completion.
    let mut c = q.broker().connection();
    let _: () = redis::cmd("SET")
        .arg(q.keys().done("bad"))
        .arg("not a list")
        .query_async(&mut c)
        .await
        .unwrap();
    let (done, read) = q
        .complete_many_and_read(
            &[
                (good, &ok_result(good, "", "w")),
                (bad, &ok_result(bad, "", "w")),
            ],
            "w",
            2,
        )
        .await;
    let err = done.unwrap_err();
    assert!(err.is_refused(), "{err}");
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    // The read still reached the caller: nothing Redis delivered is left unaccounted for.
    let read = read.unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].id, "next");
    // good was stored (its own call succeeded), bad is still pending, next is pending.
    assert!(q.result("good").await.unwrap().is_some());
    assert!(q.result("bad").await.unwrap().is_none());
    assert_eq!(pending(&q).await, 2);
}

#[tokio::test]
async fn a_redis_that_lost_its_scripts_completes_once_and_reads_once() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    enqueue(&q, &["zeroth", "first", "second", "third"]).await;
    // The broker has loaded the completion script...
    let z = q.read("w", 1, 0).await.unwrap().pop().unwrap();
    let (done, read) = q
        .complete_many_and_read(&[(&z, &ok_result(&z, "", "w"))], "w", 1)
        .await;
    assert_eq!(done.unwrap(), vec![Completion::Stored]);
    let d = read.unwrap().pop().unwrap();
    assert_eq!(d.id, "first");
    // ... and Redis loses it (a restart, a failover).
    let mut c = q.broker().connection();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut c)
        .await
        .unwrap();
    let (done, read) = q
        .complete_many_and_read(&[(&d, &ok_result(&d, "", "w"))], "w", 1)
        .await;
    assert_eq!(done.unwrap(), vec![Completion::Stored]);
    let read = read.unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].id, "second");
    assert!(q.result("first").await.unwrap().is_some());
    // One entry read, not two: third is still new.
    assert_eq!(pending(&q).await, 1);
    assert_eq!(q.read("w", 5, 0).await.unwrap()[0].id, "third");
}

#[tokio::test]
async fn raw_entries_read_with_a_completion_are_checked_for_a_result() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    enqueue(&q, &["done-before"]).await;
    let d = q.read("w", 1, 0).await.unwrap().pop().unwrap();
    // A raw XADD of an id that has a result by the time it is read: it must not run again.
    q.enqueue_raw(br#"{"id": "done-before", "cmd": "true"}"#)
        .await
        .unwrap();
    q.enqueue_raw(br#"{"id": "fresh", "cmd": "true"}"#)
        .await
        .unwrap();
    let (done, read) = q
        .complete_many_and_read(&[(&d, &ok_result(&d, "", "w"))], "w", 2)
        .await;
    assert_eq!(done.unwrap(), vec![Completion::Stored]);
    let ids: Vec<String> = read.unwrap().into_iter().map(|d| d.id).collect();
    assert_eq!(ids, ["fresh"]);
    assert_eq!(pending(&q).await, 1);
}
