//! Reading results.
//!
//! A result is a string key with a TTL; completion also adds one entry (field `status`) to the
//! stream `forkbox:{Q}:wake:<id>`, which lives a few seconds, so a client can block on it
//! instead of polling. [`Queue::wait_result`] reads the result, and while there is none blocks
//! with `XREAD BLOCK <ms> STREAMS wake:<id> <last seen>`: a read-only command, so a waiter needs
//! no write right (the submitter's ACL role has none near results), any number of waiters wake
//! at once, and none takes anything from the others. The `done:<id>` list (for `BLPOP`) is
//! still pushed, for clients that wait with it.

use std::time::{Duration, Instant};

use crate::error::QueueError;
use crate::queue::Queue;
use crate::schema::JobResult;

/// Longest single block of [`Queue::wait_result`]. A waiter that started its block after the
/// wake stream expired (it found no result, and the completion and the stream's
/// [`WAKE_LINGER_MS`](crate::keys::WAKE_LINGER_MS) both passed before its `XREAD` arrived) is
/// not woken; it finds the result at the end of this slice.
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
        let wake = self.keys.wake(id);
        // Entries after this id wake the waiter: from the start, then after the last one seen,
        // so an entry that woke it once without a result (one deleted since) does not again.
        let mut after = "0-0".to_owned();
        loop {
            if let Some(r) = self.result(id).await? {
                return Ok(Some(r));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // BLOCK takes milliseconds; 0 would mean forever, so never send less than 1.
            let block = left.min(WAIT_SLICE).as_millis().max(1) as u64;
            let cmd = {
                let mut c = redis::cmd("XREAD");
                c.arg("COUNT")
                    .arg(1)
                    .arg("BLOCK")
                    .arg(block)
                    .arg("STREAMS")
                    .arg(&wake)
                    .arg(&after);
                c
            };
            let woke = self
                .run_read(&cmd, Some(Duration::from_millis(block)))
                .await
                .map_err(|e| self.results_err(e))?;
            // The result is stored with the wake-up entry, in one script: it is there now,
            // unless it expired or was deleted meanwhile (then wait on past that entry).
            if woke != redis::Value::Nil {
                if let Some(last) = crate::reply::xread(&woke)
                    .into_iter()
                    .flat_map(|(_, entries)| entries)
                    .next_back()
                {
                    after = last.id;
                }
            }
        }
    }
}
