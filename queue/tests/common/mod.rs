//! Shared set-up: a private redis-server per test and a queue on it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use forkbox_queue::{Broker, Delivery, JobResult, Outcome, Queue, QueueConfig, Status};
use forkbox_testkit::RedisServer;

pub async fn server_and_queue(config: QueueConfig) -> (RedisServer, Queue) {
    let server = RedisServer::start().expect("start redis-server");
    let queue = Broker::connect(&server.url())
        .await
        .expect("connect")
        .queue("default", config)
        .expect("queue");
    queue.ensure_group().await.expect("group");
    (server, queue)
}

pub fn ok_result(d: &Delivery, stdout: &str, worker: &str) -> JobResult {
    let mut outcome = Outcome::not_run(Status::Ok, "");
    outcome.exit_code = 0;
    outcome.error = None;
    outcome.stdout = stdout.to_owned();
    JobResult {
        batch: d.job.as_ref().ok().and_then(|j| j.batch.clone()),
        ..JobResult::new(
            d.id.clone(),
            outcome,
            d.deliveries as u32,
            worker.to_owned(),
        )
    }
}

pub async fn conn(q: &Queue) -> forkbox_queue::Connection {
    q.broker().connection()
}

/// Runs `f` until it returns `Some`, or panics after `limit` (a generous bound, not a timing
/// assertion).
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
