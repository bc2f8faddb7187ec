//! Cancellation.
//!
//! `cancel(id)` records the id in the sorted set `forkbox:{Q}:cancelled` (score: time in ms)
//! and publishes it on `forkbox:{Q}:cancel`. Workers keep a local set: a [`CancelWatcher`]
//! loads the sorted set after (re)subscribing, so an id cancelled while a worker was
//! disconnected is not missed, then yields each published id. A worker skips a pending job
//! whose id is in the set (completing it with status `cancelled`) and kills a running one.
//! Members older than the result TTL are trimmed at each cancel: by then the job either ran or
//! its result expired.

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ProtocolVersion, PushKind};
use tokio::sync::mpsc;

use crate::error::QueueError;
use crate::queue::{now_ms, Queue};
use crate::reply;

/// What a [`CancelWatcher`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelEvent {
    /// One id was cancelled just now.
    Cancelled(String),
    /// The watcher (re)subscribed; these are all currently cancelled ids. Replace or extend
    /// the local set with them.
    Resynced(Vec<String>),
}

impl Queue {
    fn cancel_err(&self, source: redis::RedisError) -> QueueError {
        QueueError::Cancel {
            queue: self.name().to_owned(),
            source,
        }
    }

    /// Cancels job `id`, pending or running. Returns how many workers heard it live (the
    /// others pick it up from the set when they next resync).
    pub async fn cancel(&self, id: &str) -> Result<u64, QueueError> {
        let now = now_ms();
        let horizon = now.saturating_sub(self.config.result_ttl_s.saturating_mul(1000));
        let (heard,): (u64,) = redis::pipe()
            .atomic()
            .zadd(self.keys.cancelled(), id, now)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(self.keys.cancelled())
            .arg("-inf")
            .arg(format!("({horizon}"))
            .ignore()
            .publish(self.keys.cancel_channel(), id)
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.cancel_err(e))?;
        Ok(heard)
    }

    /// Whether `id` is cancelled (one round trip; workers use their local set instead).
    pub async fn is_cancelled(&self, id: &str) -> Result<bool, QueueError> {
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(self.keys.cancelled())
            .arg(id)
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.cancel_err(e))?;
        Ok(score.is_some())
    }

    /// Every cancelled id still remembered.
    pub async fn load_cancelled(&self) -> Result<Vec<String>, QueueError> {
        Ok(self
            .cancelled_since(0)
            .await?
            .into_iter()
            .map(|(id, _)| id)
            .collect())
    }

    /// Ids cancelled at or after `since_ms` (Unix time in ms), with their cancel times.
    pub async fn cancelled_since(&self, since_ms: u64) -> Result<Vec<(String, u64)>, QueueError> {
        let v: Vec<(String, f64)> = redis::cmd("ZRANGEBYSCORE")
            .arg(self.keys.cancelled())
            .arg(since_ms)
            .arg("+inf")
            .arg("WITHSCORES")
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.cancel_err(e))?;
        Ok(v.into_iter().map(|(id, t)| (id, t as u64)).collect())
    }

    /// A watcher of this queue's cancellations. It connects on the first
    /// [`CancelWatcher::next`].
    pub fn watch_cancellations(&self) -> CancelWatcher {
        CancelWatcher {
            queue: self.clone(),
            link: None,
        }
    }
}

/// Follows a queue's cancel channel over its own RESP3 connection, reconnecting as needed.
#[derive(Debug)]
pub struct CancelWatcher {
    queue: Queue,
    link: Option<Link>,
}

#[derive(Debug)]
struct Link {
    // Kept alive for the subscription; pushes arrive on `rx`.
    _conn: MultiplexedConnection,
    rx: mpsc::UnboundedReceiver<redis::PushInfo>,
}

impl CancelWatcher {
    /// Waits for the next event. After a (re)connection the first event is
    /// [`CancelEvent::Resynced`] with the full set. On a connection error it returns the error;
    /// call `next` again (after a back-off) to reconnect.
    pub async fn next(&mut self) -> Result<CancelEvent, QueueError> {
        loop {
            let Some(link) = &mut self.link else {
                let link = self.connect().await?;
                self.link = Some(link);
                // Subscribed first, loaded second: an id cancelled in between is in both, never
                // in neither.
                return Ok(CancelEvent::Resynced(self.queue.load_cancelled().await?));
            };
            match link.rx.recv().await {
                Some(push) if push.kind == PushKind::Message => {
                    if let Some(id) = push.data.get(1).and_then(reply::string) {
                        return Ok(CancelEvent::Cancelled(id));
                    }
                }
                Some(push) if push.kind == PushKind::Disconnection => self.link = None,
                Some(_) => {}
                None => self.link = None,
            }
        }
    }

    async fn connect(&self) -> Result<Link, QueueError> {
        let err = |e| self.queue.cancel_err(e);
        let mut info = self.queue.broker.client().get_connection_info().clone();
        info.redis.protocol = ProtocolVersion::RESP3;
        let client = Client::open(info).map_err(err)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let mut conn = client
            .get_multiplexed_async_connection_with_config(
                &AsyncConnectionConfig::new().set_push_sender(tx),
            )
            .await
            .map_err(err)?;
        conn.subscribe(self.queue.keys.cancel_channel())
            .await
            .map_err(err)?;
        Ok(Link { _conn: conn, rx })
    }
}
