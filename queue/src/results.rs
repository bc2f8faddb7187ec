//! Reading results.
//!
//! A result is a string key with a TTL; completion also adds one entry (field `status`) to the
//! stream `forkbox:{Q}:wake:<id>`, which lives a few seconds, so a client can block on it
//! instead of polling. [`Queue::wait_result`] reads the result, and while there is none blocks
//! with `XREAD BLOCK <ms> STREAMS wake:<id> <last seen>` pipelined with the `GET` of the result
//! (which Redis runs once the read answers, so a woken waiter has the result in the same round
//! trip): read-only commands, so a waiter needs no write right (the submitter's ACL role has
//! none near results), any number of waiters wake at once, and none takes anything from the
//! others. The `done:<id>` list (for `BLPOP`) is
//! still pushed, for clients that wait with it.

use std::time::{Duration, Instant};

use crate::error::QueueError;
use crate::queue::Queue;
use crate::schema::JobResult;

/// Longest single block of [`Queue::wait_result`]. A waiter that started its block after the
/// wake stream expired (it found no result, and the completion and the stream's
/// [`WAKE_LINGER_MS`](crate::keys::WAKE_LINGER_MS) both passed before its `XREAD` arrived) is
/// not woken; it finds the result at the end of this slice.
pub(crate) const WAIT_SLICE: Duration = Duration::from_secs(2);

impl Queue {
    fn results_err(&self, source: redis::RedisError) -> QueueError {
        QueueError::Results {
            queue: self.name().to_owned(),
            source,
        }
    }

    /// The result of `id`, if stored and not expired.
    pub async fn result(&self, id: &str) -> Result<Option<JobResult>, QueueError> {
        let raw: redis::Value = redis::cmd("GET")
            .arg(self.keys.result(id))
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.results_err(e))?;
        self.parse_result(id, raw)
    }

    /// A `GET` of `id`'s result key, parsed.
    fn parse_result(&self, id: &str, raw: redis::Value) -> Result<Option<JobResult>, QueueError> {
        let raw: Option<Vec<u8>> =
            redis::from_owned_redis_value(raw).map_err(|e| self.results_err(e))?;
        raw.map(|r| {
            JobResult::from_slice(&r).map_err(|source| QueueError::CorruptResult {
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
        self.wait(id, timeout, true).await
    }

    /// [`Queue::wait_result`] for a job the caller has just enqueued: its result cannot be
    /// older than its wake-up entry, which lingers [`WAKE_LINGER_MS`](crate::keys::WAKE_LINGER_MS)
    /// after the completion, so the wait starts with the blocking read rather than a `GET`
    /// (one round trip less). A wait that starts later than that after the completion still
    /// finds the result, at the end of its first block (at most 2 s).
    pub async fn wait_new_result(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<Option<JobResult>, QueueError> {
        self.wait(id, timeout, false).await
    }

    async fn wait(
        &self,
        id: &str,
        timeout: Duration,
        look_first: bool,
    ) -> Result<Option<JobResult>, QueueError> {
        let deadline = Instant::now() + timeout;
        let wake = self.keys.wake(id);
        let key = self.keys.result(id);
        if look_first {
            if let Some(r) = self.result(id).await? {
                return Ok(Some(r));
            }
        }
        // Entries after this id wake the waiter: from the start, then after the last one seen,
        // so an entry that woke it once without a result (one deleted since) does not again.
        let mut after = "0-0".to_owned();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // BLOCK takes milliseconds; 0 would mean forever, so never send less than 1.
            let block = left.min(WAIT_SLICE).as_millis().max(1) as u64;
            // The GET waits behind the XREAD on the same connection and answers with it: the
            // result is stored with the wake-up entry, in one script, so a waiter woken by the
            // entry reads the result in the same round trip; one whose block ran out reads it
            // too (it may have come without waking it: the entry expired, or was read past).
            let mut pipe = redis::pipe();
            pipe.cmd("XREAD")
                .arg("COUNT")
                .arg(1)
                .arg("BLOCK")
                .arg(block)
                .arg("STREAMS")
                .arg(&wake)
                .arg(&after)
                .cmd("GET")
                .arg(&key);
            let replies = self
                .broker
                .query_blocking_pipe(&pipe, Duration::from_millis(block))
                .await
                .map_err(|e| self.results_err(e))?;
            let (woke, raw) = match replies {
                redis::Value::Array(mut v) if v.len() == 2 => {
                    let raw = v.pop().unwrap_or(redis::Value::Nil);
                    (v.pop().unwrap_or(redis::Value::Nil), raw)
                }
                other => {
                    return Err(self.results_err(redis::RedisError::from((
                        redis::ErrorKind::TypeError,
                        "a wait's XREAD and GET",
                        format!("two replies expected, got {other:?}"),
                    ))))
                }
            };
            if let Some(r) = self.parse_result(id, raw)? {
                return Ok(Some(r));
            }
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
