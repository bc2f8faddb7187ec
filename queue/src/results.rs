//! Reading results.
//!
//! A result is a string key with a TTL; completion also pushes one element (the status) onto
//! the list `forkbox:{Q}:done:<id>`, so a client can block on it instead of polling. A plain
//! `BLPOP` consumes that element: fine for one waiter. [`Queue::wait_result`] is non-destructive
//! instead: it blocks with `BLMOVE done done RIGHT LEFT`, which rotates the one-element list
//! onto itself, so every waiter blocked on the same id is woken in turn and the list (and its
//! TTL) stays for later waiters.

use std::time::{Duration, Instant};

use crate::error::QueueError;
use crate::queue::Queue;
use crate::schema::JobResult;

/// Longest single block of [`Queue::wait_result`]. A waiter blocked while some other client's
/// BLPOP takes the element is not woken; it notices the result at the end of this slice.
const WAIT_SLICE: Duration = Duration::from_secs(2);

impl Queue {
    fn results_err(&self, source: redis::RedisError) -> QueueError {
        QueueError::Results {
            queue: self.name().to_owned(),
            source,
        }
    }

    /// The result of `id`, if stored and not expired.
    pub async fn result(&self, id: &str) -> Result<Option<JobResult>, QueueError> {
        let raw: Option<Vec<u8>> = redis::cmd("GET")
            .arg(self.keys.result(id))
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.results_err(e))?;
        raw.map(|r| {
            serde_json::from_slice(&r).map_err(|source| QueueError::CorruptResult {
                queue: self.name().to_owned(),
                id: id.to_owned(),
                source,
            })
        })
        .transpose()
    }

    /// Waits up to `timeout` for the result of `id`. Blocks on its own connection, without
    /// polling, and lets any number of waiters wait for the same id.
    pub async fn wait_result(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<Option<JobResult>, QueueError> {
        let deadline = Instant::now() + timeout;
        let done = self.keys.done(id);
        loop {
            if let Some(r) = self.result(id).await? {
                return Ok(Some(r));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // Redis takes fractional seconds; 0 would mean forever, so never send less than 1 ms.
            let block = left.min(WAIT_SLICE).as_secs_f64().max(0.001);
            let cmd = {
                let mut c = redis::cmd("BLMOVE");
                c.arg(&done)
                    .arg(&done)
                    .arg("RIGHT")
                    .arg("LEFT")
                    .arg(format!("{block:.3}"));
                c
            };
            let woke = self
                .run_read(&cmd, Some(Duration::from_secs_f64(block)))
                .await
                .map_err(|e| self.results_err(e))?;
            // The result is stored before the wake-up element, in one script: it is there now,
            // unless it expired meanwhile. A wake-up without one (a `done:` entry pushed by
            // some other client: a submitter's ACL role may write there to wait) is no
            // answer: wait on.
            if woke != redis::Value::Nil {
                if let Some(r) = self.result(id).await? {
                    return Ok(Some(r));
                }
            }
        }
    }
}
