//! The broker's shared connection to Redis, replaced as soon as it looks dead.
//!
//! A [`Link`] holds one multiplexed connection that every clone shares. It reconnects on the
//! next call after a failure, once, within [`CONNECT_TIMEOUT`]: it never sleeps and never
//! retries by itself, so a call made while Redis is away fails in about a connect timeout and
//! the caller's own back-off decides when to try again (the node logs, counts and reports each
//! failure; hidden retries inside the client would hide an outage from it for minutes).
//! Every reply is awaited for at most [`RESPONSE_TIMEOUT`]: a connection whose peer vanished
//! without a FIN or RST (a network partition, a host gone) stops answering, and a timed-out
//! call drops it like any other I/O error, so the next call opens a fresh one. Blocking
//! commands go elsewhere (see [`Broker`](crate::Broker)): a reply may lawfully take as long as
//! their block time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// How long opening a connection (TCP, `HELLO`/`AUTH`/`SELECT`) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a non-blocking command's reply may take before the connection is deemed dead.
/// Far above any command the queue sends (the largest is a pipeline of a hundred scripts),
/// far below TCP's own retransmission give-up (minutes).
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A shared, self-replacing connection (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct Link {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: AsyncConnectionConfig,
    /// The live connection with its generation, so that a failure seen on an old one does not
    /// drop its replacement.
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// Serialises reconnects: concurrent callers wait for one attempt rather than each opening
    /// a connection.
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
    /// Connection attempts that failed, so that callers who waited for an attempt share its
    /// failure instead of each making one more (behind a partition each waits a connect
    /// timeout).
    failed_attempts: AtomicU64,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("addr", &self.inner.client.get_connection_info().addr)
            .finish()
    }
}

/// The connection settings of every connection the queue opens: bounded connect, and replies
/// awaited for at most `response` (`None`: no bound, for blocking commands, which are bounded
/// by their caller).
pub(crate) fn connection_config(response: Option<Duration>) -> AsyncConnectionConfig {
    let c = AsyncConnectionConfig::new().set_connection_timeout(CONNECT_TIMEOUT);
    match response {
        Some(t) => c.set_response_timeout(t),
        None => c,
    }
}

/// Whether a failed call means the connection it used is unusable (or was never made).
pub(crate) fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
}

impl Link {
    /// Opens the first connection; fails at once (within [`CONNECT_TIMEOUT`]) when Redis does
    /// not answer.
    pub async fn open(client: Client) -> RedisResult<Link> {
        let link = Link {
            inner: Arc::new(Inner {
                client,
                config: connection_config(Some(RESPONSE_TIMEOUT)),
                current: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                generation: AtomicU64::new(0),
                failed_attempts: AtomicU64::new(0),
            }),
        };
        link.get().await?;
        Ok(link)
    }

    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    fn live(&self) -> Option<(u64, MultiplexedConnection)> {
        self.inner.current.lock().expect("link lock").clone()
    }

    async fn get(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.live() {
            return Ok(c);
        }
        let failed_before = self.inner.failed_attempts.load(Ordering::Acquire);
        let _one = self.inner.connecting.lock().await;
        // Another caller may have connected, or failed to, while this one waited.
        if let Some(c) = self.live() {
            return Ok(c);
        }
        if self.inner.failed_attempts.load(Ordering::Acquire) != failed_before {
            return Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "Redis unreachable (a connection attempt just failed)",
            )));
        }
        let conn = match self
            .inner
            .client
            .get_multiplexed_async_connection_with_config(&self.inner.config)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                self.inner.failed_attempts.fetch_add(1, Ordering::AcqRel);
                return Err(e);
            }
        };
        let generation = self.inner.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *self.inner.current.lock().expect("link lock") = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    /// Drops connection `generation` after a connection-level failure on it.
    fn discard(&self, generation: u64) {
        let mut current = self.inner.current.lock().expect("link lock");
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }

    fn check<T>(&self, generation: u64, r: &RedisResult<T>) {
        if let Err(e) = r {
            if is_connection_error(e) {
                self.discard(generation);
            }
        }
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.get().await?;
            let r = conn.req_packed_command(cmd).await;
            self.check(generation, &r);
            r
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.get().await?;
            let r = conn.req_packed_commands(cmd, offset, count).await;
            self.check(generation, &r);
            r
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.client.get_connection_info().redis.db
    }
}
