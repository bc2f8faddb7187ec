//! Cancellation.
//!
//! `cancel(id)` records the id in the sorted set `forkbox:{Q}:cancelled` (score: time in ms)
//! and publishes it on `forkbox:{Q}:cancel`. Workers keep a local set: a [`CancelWatcher`]
//! loads the sorted set after (re)subscribing, so an id cancelled while a worker was
//! disconnected is not missed, then yields each published id. A worker skips a pending job
//! whose id is in the set (completing it with status `cancelled`) and kills a running one.
//! Members older than the result TTL are trimmed at each cancel: by then the job either ran or
//! its result expired.
//!
//! In a Redis Cluster the channel is a sharded one (`SPUBLISH`/`SSUBSCRIBE`): it lives in the
//! slot of the queue's `{Q}` hash tag, so the message is handled by the shard that holds the
//! queue instead of being broadcast to every node. The watcher subscribes on the primary
//! serving that slot (following the `MOVED` reply of whichever node it asks first); when the
//! slot moves or its primary dies, the node drops the subscription or the connection, and the
//! watcher subscribes again where the slot now is and resyncs from the sorted set.

use crate::scripts::CheckedCall;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{Client, ConnectionInfo, ProtocolVersion, PushKind};
use tokio::sync::mpsc;

use crate::error::QueueError;
use crate::keys::GROUP;
use crate::link::{connection_config, RESPONSE_TIMEOUT};
use crate::queue::{now_ms, Opener, Queue};
use crate::reply;
use crate::scripts::SCRIPTS;

/// What a [`CancelWatcher`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelEvent {
    /// One id was cancelled just now.
    Cancelled(String),
    /// The watcher (re)subscribed; these are all currently cancelled ids. Replace or extend
    /// the local set with them.
    Resynced(Vec<String>),
}

/// Where a job is, as [`Queue::job_state`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// In the stream, not yet delivered to a worker.
    Queued,
    /// Delivered to this consumer and not yet acknowledged (a consumer that died holds its
    /// entries until they are reclaimed).
    Running { worker: String },
    /// Its result exists, with this status.
    Finished { status: String },
    /// No job with this id: never submitted, its result expired, or added with a raw `XADD`
    /// under an id of its own (the enqueue script's marker is what finds a job).
    Unknown,
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobState::Queued => f.write_str("queued"),
            JobState::Running { worker } => write!(f, "running on {worker}"),
            JobState::Finished { status } => write!(f, "finished ({status})"),
            JobState::Unknown => f.write_str("unknown"),
        }
    }
}

impl JobState {
    /// Whether a cancel can still stop it.
    pub fn cancellable(&self) -> bool {
        matches!(self, JobState::Queued | JobState::Running { .. })
    }
}

/// The longest a cancel made ahead of its job may wait for it.
pub const MAX_CANCEL_AHEAD_S: u64 = crate::schema::MAX_RESULT_TTL_S;

impl Queue {
    /// The publish command of this broker's cancel channel (sharded in a Redis Cluster).
    pub(crate) fn publish_command(&self) -> &'static str {
        if self.broker.is_cluster() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    /// Where job `id` is: queued, running, finished or unknown (one round trip, read-only).
    pub async fn job_state(&self, id: &str) -> Result<JobState, QueueError> {
        let (state, detail): (String, String) = SCRIPTS
            .job_state
            .key(self.keys.idem(id))
            .key(self.keys.jobs())
            .arg(id)
            .arg(GROUP)
            .arg(self.keys.result(id))
            .arg(self.keys.done(id))
            .checked()
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| self.cancel_err(e))?;
        Ok(match state.as_str() {
            "queued" => JobState::Queued,
            "running" => JobState::Running { worker: detail },
            "finished" => JobState::Finished { status: detail },
            _ => JobState::Unknown,
        })
    }

    /// Cancels `id` ahead of its job: a job enqueued with this id (through the enqueue script)
    /// within `lifetime_s` is cancelled as it is added; after that the cancel lapses. For a
    /// job that exists already use [`Queue::cancel`].
    pub async fn cancel_ahead(&self, id: &str, lifetime_s: u64) -> Result<(), QueueError> {
        let now = now_ms();
        let lapses = now.saturating_add(lifetime_s.min(MAX_CANCEL_AHEAD_S).saturating_mul(1000));
        redis::pipe()
            .atomic()
            .cmd("ZREMRANGEBYSCORE")
            .arg(self.keys.cancel_ahead())
            .arg("-inf")
            .arg(now)
            .ignore()
            .zadd(self.keys.cancel_ahead(), id, lapses)
            .ignore()
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(|e| self.cancel_err(e))
    }

    fn cancel_err(&self, source: redis::RedisError) -> QueueError {
        QueueError::Cancel {
            queue: self.name().to_owned(),
            source,
        }
    }

    /// Cancels job `id`, pending or running, whatever [`Queue::job_state`] says (an id not yet
    /// submitted is cancelled too, for as long as the set remembers it: see
    /// [`Queue::cancel_ahead`] for a cancel of a job to come). Returns how many workers heard
    /// it live (the others pick it up from the set when they next resync).
    pub async fn cancel(&self, id: &str) -> Result<u64, QueueError> {
        let now = now_ms();
        let horizon = now.saturating_sub(self.config.result_ttl_s.saturating_mul(1000));
        let publish = self.publish_command();
        let (heard,): (u64,) = redis::pipe()
            .atomic()
            .zadd(self.keys.cancelled(), id, now)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(self.keys.cancelled())
            .arg("-inf")
            .arg(format!("({horizon}"))
            .ignore()
            .cmd(publish)
            .arg(self.keys.cancel_channel())
            .arg(id)
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

/// How often an idle subscription is checked with a PING: a subscribed connection only
/// receives, so without it a half-open connection (a network partition) would go unnoticed
/// and cancellations would be missed silently.
pub const SUBSCRIPTION_PING: Duration = Duration::from_secs(5);

/// Follows a queue's cancel channel over its own RESP3 connection, reconnecting as needed.
#[derive(Debug)]
pub struct CancelWatcher {
    queue: Queue,
    link: Option<Subscription>,
}

#[derive(Debug)]
struct Subscription {
    // Kept for the subscription and its PINGs; pushes arrive on `rx`.
    conn: MultiplexedConnection,
    rx: mpsc::UnboundedReceiver<redis::PushInfo>,
}

impl CancelWatcher {
    /// Waits for the next event. After a (re)connection the first event is
    /// [`CancelEvent::Resynced`] with the full set. On a connection error (including a PING
    /// unanswered within [`RESPONSE_TIMEOUT`] every [`SUBSCRIPTION_PING`]) it returns the
    /// error; call `next` again (after a back-off) to reconnect.
    pub async fn next(&mut self) -> Result<CancelEvent, QueueError> {
        loop {
            let Some(link) = &mut self.link else {
                let link = self.connect().await?;
                self.link = Some(link);
                // Subscribed first, loaded second: an id cancelled in between is in both, never
                // in neither.
                return Ok(CancelEvent::Resynced(self.queue.load_cancelled().await?));
            };
            let push = tokio::select! {
                push = link.rx.recv() => push,
                _ = tokio::time::sleep(SUBSCRIPTION_PING) => {
                    let pong: redis::RedisResult<String> =
                        redis::cmd("PING").query_async(&mut link.conn).await;
                    if let Err(e) = pong {
                        self.link = None;
                        return Err(self.queue.cancel_err(e));
                    }
                    continue;
                }
            };
            match push {
                Some(push) if matches!(push.kind, PushKind::Message | PushKind::SMessage) => {
                    if let Some(id) = push.data.get(1).and_then(reply::string) {
                        return Ok(CancelEvent::Cancelled(id));
                    }
                }
                // A node that stops serving the slot (failover, resharding) drops the sharded
                // subscription: subscribe again where the slot is now.
                Some(push)
                    if matches!(push.kind, PushKind::Disconnection | PushKind::SUnsubscribe) =>
                {
                    self.link = None
                }
                Some(_) => {}
                None => self.link = None,
            }
        }
    }

    async fn connect(&self) -> Result<Subscription, QueueError> {
        let err = |e| self.queue.cancel_err(e);
        let channel = self.queue.keys.cancel_channel();
        match self.queue.broker.opener() {
            Opener::Single(client) => {
                let (mut conn, rx) = resp3_connection(client.get_connection_info().clone())
                    .await
                    .map_err(err)?;
                conn.subscribe(&channel).await.map_err(err)?;
                Ok(Subscription { conn, rx })
            }
            Opener::Cluster { seeds, tls, .. } => {
                let mut last = None;
                for seed in seeds {
                    match ssubscribe_following_moved(seed, tls, &channel).await {
                        Ok(sub) => return Ok(sub),
                        Err(e) => last = Some(e),
                    }
                }
                Err(err(last.unwrap_or_else(|| {
                    redis::RedisError::from((redis::ErrorKind::ClientError, "no seed nodes"))
                })))
            }
        }
    }
}

/// A RESP3 connection whose pushes arrive on the returned receiver.
async fn resp3_connection(
    mut info: ConnectionInfo,
) -> redis::RedisResult<(
    MultiplexedConnection,
    mpsc::UnboundedReceiver<redis::PushInfo>,
)> {
    info.redis.protocol = ProtocolVersion::RESP3;
    let client = Client::open(info)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let conn = client
        .get_multiplexed_async_connection_with_config(
            &connection_config(Some(RESPONSE_TIMEOUT)).set_push_sender(tx),
        )
        .await?;
    Ok((conn, rx))
}

/// Subscribes to sharded `channel` on the node serving its slot: asks `seed`, and on a
/// `MOVED` reply the node it names (a couple of hops at most, while a failover settles).
async fn ssubscribe_following_moved(
    seed: &str,
    tls: &crate::RedisTls,
    channel: &str,
) -> redis::RedisResult<Subscription> {
    let mut info = crate::connect::redis_client(seed, tls)
        .map_err(|e| {
            redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "seed URL",
                e.to_string(),
            ))
        })?
        .get_connection_info()
        .clone();
    for _ in 0..3 {
        let (mut conn, rx) = resp3_connection(info.clone()).await?;
        match redis::cmd("SSUBSCRIBE")
            .arg(channel)
            .exec_async(&mut conn)
            .await
        {
            Ok(()) => return Ok(Subscription { conn, rx }),
            Err(e) => {
                let target = e
                    .redirect_node()
                    .and_then(|(addr, _)| addr.rsplit_once(':'))
                    .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)));
                match target {
                    Some((host, port)) => info = crate::connect::redirect(&info, host, port),
                    None => return Err(e),
                }
            }
        }
    }
    Err(redis::RedisError::from((
        redis::ErrorKind::ClientError,
        "SSUBSCRIBE redirected too many times",
    )))
}
