//! The connection to Redis and the per-queue handle.
//!
//! A [`Broker`] is one Redis server as seen by this process: a self-reconnecting
//! [`ConnectionManager`] for ordinary commands, a small pool of dedicated connections for
//! blocking commands (a blocking XREADGROUP or BLMOVE on the shared multiplexed connection would
//! stall every other command behind it), and the Lua scripts. A [`Queue`] is a cheap, clonable
//! handle on one named queue of a broker. The operations live in the sibling modules, one per
//! concern, as `impl Queue` blocks.

use std::sync::{Arc, LazyLock, Mutex};

use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::{Client, ErrorKind, FromRedisValue, Pipeline, RedisResult, Script};

use crate::error::QueueError;
use crate::keys::{Keys, GROUP};
use crate::schema::DEFAULT_MAX_JOB_BYTES;

/// Tunables of one queue. Per-job `max_attempts` and `result_ttl_s` override the defaults here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// An entry idle this long (its worker stopped refreshing it) may be reclaimed.
    pub visibility_timeout_ms: u64,
    /// Deliveries allowed before an entry is dead-lettered.
    pub max_attempts: u32,
    /// Lifetime of results, `done` lists, batch counters and idempotency markers.
    pub result_ttl_s: u64,
    /// Approximate cap (`MAXLEN ~`) of the results stream and of `reply_to` streams.
    pub results_maxlen: u64,
    /// Approximate cap of the dead-letter stream.
    pub dead_maxlen: u64,
    /// Payloads larger than this are dead-lettered unread.
    pub max_job_bytes: usize,
    /// Whether [`Queue::read`] drops fresh entries whose id already has a result (a client
    /// XADDed a finished id again, bypassing the idempotent enqueue). Costs one pipelined
    /// round trip per read that returned an entry the enqueue script did not vet (its
    /// `vetted` field), shared by all of them; without it such a job runs again and its
    /// second result is discarded (the first result wins).
    pub skip_completed_on_read: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            visibility_timeout_ms: 30_000,
            max_attempts: 3,
            result_ttl_s: 86_400,
            results_maxlen: 100_000,
            dead_maxlen: 100_000,
            max_job_bytes: DEFAULT_MAX_JOB_BYTES,
            skip_completed_on_read: true,
        }
    }
}

pub(crate) struct Scripts {
    pub enqueue: Script,
    pub complete: Script,
    pub refresh_claims: Script,
    pub remove_consumer: Script,
    pub dlq_requeue: Script,
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    enqueue: Script::new(include_str!("../lua/enqueue.lua")),
    complete: Script::new(include_str!("../lua/complete.lua")),
    refresh_claims: Script::new(include_str!("../lua/refresh_claims.lua")),
    remove_consumer: Script::new(include_str!("../lua/remove_consumer.lua")),
    dlq_requeue: Script::new(include_str!("../lua/dlq_requeue.lua")),
});

/// One Redis server: shared connection, blocking-connection pool, scripts.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<BrokerInner>,
}

struct BrokerInner {
    client: Client,
    conn: ConnectionManager,
    blocking: Mutex<Vec<MultiplexedConnection>>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("addr", &self.inner.client.get_connection_info().addr)
            .finish()
    }
}

impl Broker {
    /// Connects to `url` (`redis://host:port/db`, `redis+unix:///path`). The shared connection
    /// reconnects by itself after Redis restarts; calls made while it is down fail with an
    /// error for which [`QueueError::is_connection`] is true.
    pub async fn connect(url: &str) -> Result<Broker, QueueError> {
        let err = |source| QueueError::Connect {
            url: url.to_owned(),
            source,
        };
        let client = Client::open(url).map_err(err)?;
        let conn = ConnectionManager::new(client.clone()).await.map_err(err)?;
        Ok(Broker::from_parts(client, conn))
    }

    /// A broker over an existing connection manager. `client` must point at the same server:
    /// blocking commands and the cancellation subscription open their own connections from it.
    pub fn from_parts(client: Client, conn: ConnectionManager) -> Broker {
        Broker {
            inner: Arc::new(BrokerInner {
                client,
                conn,
                blocking: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A handle on queue `name`.
    pub fn queue(&self, name: &str, config: QueueConfig) -> Result<Queue, QueueError> {
        Ok(Queue {
            broker: self.clone(),
            keys: Keys::new(name)?,
            config: Arc::new(config),
        })
    }

    /// The shared, self-reconnecting connection (for commands this crate does not wrap).
    /// Never send a blocking command (BLPOP, XREADGROUP BLOCK) on it: every other user of the
    /// broker would wait behind it.
    pub fn connection(&self) -> ConnectionManager {
        self.inner.conn.clone()
    }

    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    pub(crate) fn same_as(&self, other: &Broker) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Runs one blocking command on a connection no one else sends commands on, taken from
    /// the pool or opened. A pooled connection may have died while idle (Redis restarted): on
    /// a connection error the command is sent once more on a fresh connection. The pool holds
    /// only idle connections: one whose command future is dropped mid-way is dropped with it.
    pub(crate) async fn query_blocking(&self, cmd: &redis::Cmd) -> RedisResult<redis::Value> {
        let pooled = self.inner.blocking.lock().expect("pool lock").pop();
        if let Some(mut conn) = pooled {
            match cmd.query_async(&mut conn).await {
                Err(e) if is_connection_error(&e) => {}
                r => {
                    self.give_back(conn);
                    return r;
                }
            }
        }
        let mut conn = self.inner.client.get_multiplexed_async_connection().await?;
        let r = cmd.query_async(&mut conn).await;
        if !matches!(&r, Err(e) if is_connection_error(e)) {
            self.give_back(conn);
        }
        r
    }

    fn give_back(&self, conn: MultiplexedConnection) {
        let mut pool = self.inner.blocking.lock().expect("pool lock");
        if pool.len() < 16 {
            pool.push(conn);
        }
    }

    /// Runs a pipeline of EVALSHA calls; after a Redis restart (NOSCRIPT: nothing ran), loads
    /// the scripts and runs it again.
    pub(crate) async fn query_scripted<T: FromRedisValue>(
        &self,
        pipe: &Pipeline,
        scripts: &[&Script],
    ) -> RedisResult<T> {
        let mut conn = self.connection();
        match pipe.query_async(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::NoScriptError => {
                for s in scripts {
                    s.prepare_invoke().load_async(&mut conn).await?;
                }
                pipe.query_async(&mut conn).await
            }
            r => r,
        }
    }
}

/// A handle on one queue. Clones share the broker's connections.
#[derive(Clone, Debug)]
pub struct Queue {
    pub(crate) broker: Broker,
    pub(crate) keys: Keys,
    pub(crate) config: Arc<QueueConfig>,
}

impl Queue {
    /// Connects a new broker and returns a handle on queue `name`.
    pub async fn connect(url: &str, name: &str, config: QueueConfig) -> Result<Queue, QueueError> {
        Broker::connect(url).await?.queue(name, config)
    }

    /// A handle on queue `name` over an existing connection manager; see [`Broker::from_parts`].
    pub fn with_manager(
        client: Client,
        conn: ConnectionManager,
        name: &str,
        config: QueueConfig,
    ) -> Result<Queue, QueueError> {
        Broker::from_parts(client, conn).queue(name, config)
    }

    pub fn name(&self) -> &str {
        self.keys.queue()
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    pub(crate) fn conn(&self) -> ConnectionManager {
        self.broker.connection()
    }

    /// Creates the job stream and the consumer group `workers` if missing. Idempotent.
    /// New groups start at `0`, so entries added before any worker existed are delivered.
    pub async fn ensure_group(&self) -> Result<(), QueueError> {
        let r: RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(self.keys.jobs())
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.conn())
            .await;
        match r {
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            r => r.map_err(|source| QueueError::EnsureGroup {
                queue: self.name().to_owned(),
                source,
            }),
        }
    }

    /// TTL of a job's result: the job's `result_ttl_s`, else the queue's.
    pub(crate) fn ttl_for(&self, job_ttl: Option<u64>) -> u64 {
        job_ttl.unwrap_or(self.config.result_ttl_s).max(1)
    }
}

pub(crate) fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
