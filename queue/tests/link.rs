//! The broker's connections against a real redis-server that goes away: calls fail promptly
//! instead of hanging in hidden retries, and the same broker works again once Redis is back.

use std::time::{Duration, Instant};

use forkbox_queue::{Broker, Job, QueueConfig, QueueError};
use forkbox_testkit::RedisServer;

/// An acceptance bound, far above what the calls take and far below the minutes that
/// unbounded reconnect back-offs took.
const PROMPTLY: Duration = Duration::from_secs(10);

#[tokio::test]
async fn connecting_where_nothing_listens_fails_promptly() {
    let mut server = RedisServer::start().expect("redis-server");
    let url = server.url();
    server.kill().unwrap();
    let r = tokio::time::timeout(PROMPTLY, Broker::connect(&url))
        .await
        .expect("Broker::connect returned instead of retrying on its own");
    let e = r.expect_err("nothing listens there");
    assert!(e.is_connection(), "{e}");
    assert!(matches!(e, QueueError::Connect { .. }), "{e}");
}

#[tokio::test]
async fn calls_fail_promptly_while_redis_is_away_and_work_once_it_is_back() {
    let mut server = RedisServer::start_persistent().expect("redis-server");
    let q = Broker::connect(&server.url())
        .await
        .unwrap()
        .queue("default", QueueConfig::default())
        .unwrap();
    q.ensure_group().await.unwrap();
    server.kill().unwrap();
    for _ in 0..3 {
        let r = tokio::time::timeout(PROMPTLY, q.stats())
            .await
            .expect("a call while Redis is away returns");
        assert!(r.expect_err("Redis is away").is_connection());
    }
    server.restart().unwrap();
    // The first call after the restart may still see the dead connection; the next ones
    // reconnect, without any pause of the broker's own.
    let deadline = Instant::now() + PROMPTLY;
    let id = loop {
        match q.enqueue(&Job::shell("true")).await {
            Ok(id) => break id,
            Err(e) => {
                assert!(e.is_connection(), "{e}");
                assert!(Instant::now() < deadline, "never reconnected: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(!id.is_empty());
    // Blocking reads reconnect too.
    let read = tokio::time::timeout(PROMPTLY, q.read("w", 1, 100))
        .await
        .expect("a blocking read returns");
    assert_eq!(read.unwrap().len(), 1);
}
