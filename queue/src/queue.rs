//! The connection to Redis and the per-queue handle.
//!
//! A [`Broker`] is one Redis deployment as seen by this process, a single server or a Redis
//! Cluster ([`Endpoint`]): one shared [`Connection`] for ordinary commands (a self-replacing
//! [`Link`] to a single server, or a cluster connection that follows `MOVED`/`ASK` and
//! refreshes its slot map after a failover), a small pool of dedicated connections for blocking
//! commands (a blocking XREADGROUP or XREAD on the shared multiplexed connection would stall
//! every other command behind it), and the Lua scripts. Every key of a queue carries its `{Q}`
//! hash tag, so each command, pipeline and script of the operations touches one slot and runs
//! unchanged on either kind of connection. No connection waits long for Redis: connecting is bounded
//! by [`CONNECT_TIMEOUT`](crate::CONNECT_TIMEOUT), a non-blocking reply by [`RESPONSE_TIMEOUT`], a blocking one by its
//! block time plus [`RESPONSE_TIMEOUT`], and nothing retries in the background; callers back
//! off and retry as they see fit. The cluster connection is the exception: following a
//! redirection or a promoted replica is a retry by nature, so it retries for a bounded time
//! (see [`CLUSTER_RETRIES`]) before the caller sees the error. A [`Queue`] is a cheap, clonable
//! handle on one named queue of a broker. The operations live in the sibling modules, one per
//! concern, as `impl Queue` blocks.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    Client, Cmd, ErrorKind, FromRedisValue, Pipeline, RedisFuture, RedisResult, Script, Value,
};

use crate::connect::{without_password, ConnectError, RedisTls};
use crate::error::QueueError;
use crate::keys::{Keys, GROUP};
use crate::link::{connection_config, Link, RESPONSE_TIMEOUT};
use crate::schema::{DEFAULT_MAX_JOB_BYTES, MAX_RESULT_TTL_S};

/// Default of [`QueueConfig::max_result_bytes`].
pub const DEFAULT_MAX_RESULT_BYTES: usize = 32 * 1024 * 1024;

/// Tunables of one queue. Per-job `max_attempts` and `result_ttl_s` override the defaults here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// An entry idle this long (its worker stopped refreshing it) may be reclaimed.
    pub visibility_timeout_ms: u64,
    /// Deliveries allowed before an entry is dead-lettered.
    pub max_attempts: u32,
    /// Lifetime of results, `done` lists, batch counters and idempotency markers (a `wake`
    /// stream lives at most [`WAKE_LINGER_MS`](crate::keys::WAKE_LINGER_MS)).
    pub result_ttl_s: u64,
    /// Approximate cap (`MAXLEN ~`) of the results stream and of `reply_to` streams.
    pub results_maxlen: u64,
    /// Approximate cap of the dead-letter stream.
    pub dead_maxlen: u64,
    /// Payloads larger than this are dead-lettered unread.
    pub max_job_bytes: usize,
    /// Longest result JSON stored; a longer one is cut (see [`JobResult::to_json_within`]).
    /// Keep it well below Redis' `proto-max-bulk-len` (512 MiB by default): the result is sent
    /// and stored once per stream it goes to.
    ///
    /// [`JobResult::to_json_within`]: crate::schema::JobResult::to_json_within
    pub max_result_bytes: usize,
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
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            skip_completed_on_read: true,
        }
    }
}

/// Where a broker's Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// One server (`redis://host:port/db`, `redis+unix:///path`): today's default.
    Single(String),
    /// A Redis Cluster, reached through one or more of its nodes; the client learns the rest.
    Cluster(Vec<String>),
}

impl Endpoint {
    /// The endpoint named by a `--redis` value and the `--cluster` flag: one URL, or with
    /// `cluster` one or more comma-separated seed URLs (`redis://h1:7000,redis://h2:7000`).
    pub fn parse(redis: &str, cluster: bool) -> Result<Endpoint, QueueError> {
        let urls: Vec<String> = redis.split(',').map(str::trim).map(str::to_owned).collect();
        let bad = |reason: &'static str| QueueError::BadEndpoint {
            redis: redact_all(redis),
            reason,
        };
        if urls.iter().any(String::is_empty) {
            return Err(bad("an empty URL in the list"));
        }
        if cluster {
            if urls.iter().any(|u| u.starts_with("redis+unix:")) {
                return Err(bad(
                    "a cluster is reached over TCP: redis+unix URLs are not seeds",
                ));
            }
            Ok(Endpoint::Cluster(urls))
        } else if urls.len() > 1 {
            Err(bad(
                "several URLs name a cluster's seed nodes: add --cluster",
            ))
        } else {
            Ok(Endpoint::Single(
                urls.into_iter().next().unwrap_or_default(),
            ))
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Endpoint::Cluster(_))
    }
}

impl std::fmt::Display for Endpoint {
    /// The URLs without their passwords.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Single(url) => f.write_str(&without_password(url)),
            Endpoint::Cluster(seeds) => {
                let seeds: Vec<String> = seeds.iter().map(|s| without_password(s)).collect();
                write!(f, "cluster {}", seeds.join(","))
            }
        }
    }
}

fn redact_all(list: &str) -> String {
    list.split(',')
        .map(without_password)
        .collect::<Vec<_>>()
        .join(",")
}

/// The shared connection of a broker: a [`Link`] to one server, or a cluster connection. Commands this crate does
/// not wrap run on it through redis-rs's [`ConnectionLike`] as on any connection; in a cluster
/// each is routed by its first key (keyless ones to any node).
// Short-lived clones on the stack; boxing the larger variant would cost an allocation per call.
/// It counts what it sends ([`Connection::round_trips`]): every command or pipeline is one
/// request to Redis.
#[derive(Clone)]
pub struct Connection {
    link: Kind,
    trips: RoundTrips,
}

#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Kind {
    Single(Link),
    Cluster(ClusterConnection),
}

/// Requests sent to Redis (a pipeline counts once), shared by a broker's connections and its
/// blocking reads.
#[derive(Debug, Clone, Default)]
pub struct RoundTrips(Arc<std::sync::atomic::AtomicU64>);

impl RoundTrips {
    fn add(&self, n: u64) {
        self.0.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Requests sent so far.
    pub fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Connection {
    /// A connection to one server.
    pub fn single(link: Link) -> Connection {
        Connection {
            link: Kind::Single(link),
            trips: RoundTrips::default(),
        }
    }

    /// A Redis Cluster connection.
    pub fn cluster(conn: ClusterConnection) -> Connection {
        Connection {
            link: Kind::Cluster(conn),
            trips: RoundTrips::default(),
        }
    }

    /// What this connection (and every clone of it) has sent.
    pub fn round_trips(&self) -> RoundTrips {
        self.trips.clone()
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.trips.add(1);
        match &mut self.link {
            Kind::Single(c) => c.req_packed_command(cmd),
            Kind::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.trips.add(1);
        match &mut self.link {
            Kind::Single(c) => c.req_packed_commands(cmd, offset, count),
            Kind::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.link {
            Kind::Single(c) => c.get_db(),
            Kind::Cluster(c) => c.get_db(),
        }
    }
}

impl Connection {
    /// Runs a keyless command (SCAN) where `key` lives: in a cluster, on the primary serving
    /// `key`'s slot (a keyless command would go to any node, and SCAN would walk the wrong
    /// node's keys); on a single server, as any command.
    pub async fn query_in_slot_of<T: FromRedisValue>(
        &mut self,
        key: &str,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        let Kind::Cluster(c) = &mut self.link else {
            return cmd.query_async(self).await;
        };
        self.trips.add(1);
        use redis::cluster_routing::{
            get_slot, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
        };
        let route = Route::new(get_slot(key.as_bytes()), SlotAddr::Master);
        let v = c
            .route_command(
                cmd,
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
            )
            .await?;
        redis::from_owned_redis_value(v)
    }
}

/// A connection only blocking commands are sent on, one at a time.
enum Dedicated {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// What is sent on a [`Dedicated`] connection: one command, or a pipeline whose first command
/// blocks (the others run once it answers, and their replies come back with its reply).
#[derive(Clone, Copy)]
enum Blocking<'a> {
    Cmd(&'a Cmd),
    Pipe(&'a Pipeline),
}

impl Dedicated {
    async fn query(&mut self, req: Blocking<'_>) -> RedisResult<Value> {
        match (self, req) {
            (Dedicated::Single(c), Blocking::Cmd(cmd)) => cmd.query_async(c).await,
            (Dedicated::Cluster(c), Blocking::Cmd(cmd)) => cmd.query_async(c).await,
            (Dedicated::Single(c), Blocking::Pipe(pipe)) => pipe.query_async(c).await,
            (Dedicated::Cluster(c), Blocking::Pipe(pipe)) => pipe.query_async(c).await,
        }
    }

    /// The id Redis gives this connection on the node serving `key` (what `CLIENT UNBLOCK`
    /// names). In a cluster the connection is one per node: the one a command on `key` uses.
    async fn client_id(&mut self, key: &str) -> RedisResult<i64> {
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("ID");
        match self {
            Dedicated::Single(c) => cmd.query_async(c).await,
            Dedicated::Cluster(c) => {
                use redis::cluster_routing::{
                    get_slot, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
                };
                let route = Route::new(get_slot(key.as_bytes()), SlotAddr::Master);
                let v = c
                    .route_command(
                        &cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await?;
                redis::from_owned_redis_value(v)
            }
        }
    }
}

/// Resolves once `wake` is true (or its sender is gone: no one will wake it then).
async fn woken(wake: &mut tokio::sync::watch::Receiver<bool>) {
    // A watch guard is not Send: keep it out of the caller's future.
    let _ = wake.wait_for(|w| *w).await.map(|_| ());
}

/// How soon a `CLIENT UNBLOCK` that found nothing blocked is sent again.
const UNBLOCK_RETRY: Duration = Duration::from_millis(20);

/// What new connections are opened from.
#[derive(Clone)]
pub(crate) enum Opener {
    Single(Client),
    Cluster {
        /// For the dedicated blocking connections: a response may take as long as the block.
        blocking: ClusterClient,
        /// The seeds, then every other node learnt at connect time.
        seeds: Vec<String>,
        tls: RedisTls,
    },
}

/// Retries of a cluster command after a redirection, a lost node or `CLUSTERDOWN`, with
/// jittered exponential back-off between [`CLUSTER_RETRY_MIN_MS`] and [`CLUSTER_RETRY_MAX_MS`]:
/// about fifteen seconds in all, enough for a failover with a short node timeout; past that the
/// caller sees an error for which [`QueueError::is_connection`] is true and backs off itself.
/// (redis-rs's defaults wait up to minutes per retry.)
const CLUSTER_RETRIES: u32 = 10;
const CLUSTER_RETRY_MIN_MS: u64 = 100;
const CLUSTER_RETRY_MAX_MS: u64 = 2_000;
/// The reply bound of the dedicated cluster connections: blocking commands are bounded by
/// their caller (block time plus [`RESPONSE_TIMEOUT`]); this only has to exceed that.
const CLUSTER_BLOCKING_RESPONSE_TIMEOUT: Duration = Duration::from_secs(3600);

fn cluster_client(
    seeds: &[String],
    tls: &RedisTls,
    response_timeout: Duration,
) -> Result<ClusterClient, ConnectError> {
    crate::connect::cluster_client(seeds, tls, |b| {
        b.retries(CLUSTER_RETRIES)
            .min_retry_wait(CLUSTER_RETRY_MIN_MS)
            .max_retry_wait(CLUSTER_RETRY_MAX_MS)
            .retry_wait_formula(100, 2)
            .connection_timeout(crate::link::CONNECT_TIMEOUT)
            .response_timeout(response_timeout)
    })
}

/// One Redis deployment: shared connection, blocking-connection pool, scripts.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<BrokerInner>,
}

struct BrokerInner {
    opener: Opener,
    conn: Connection,
    blocking: Mutex<Vec<Dedicated>>,
    /// Hashes of the scripts this broker has loaded (see [`Broker::query_scripted`]).
    loaded: Mutex<std::collections::HashSet<String>>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner.opener {
            Opener::Single(client) => f
                .debug_struct("Broker")
                .field("addr", &client.get_connection_info().addr)
                .finish(),
            Opener::Cluster { seeds, .. } => f
                .debug_struct("Broker")
                .field("cluster", &redact_all(&seeds.join(",")))
                .finish(),
        }
    }
}

impl Broker {
    /// Connects to `url` (`redis://host:port/db`, `rediss://` with the system's TLS roots,
    /// `redis+unix:///path`); see [`Broker::connect_with`].
    pub async fn connect(url: &str) -> Result<Broker, QueueError> {
        Broker::connect_with(url, &RedisTls::default()).await
    }

    /// Connects to `url` with the TLS settings `tls` (for `rediss://`). Fails at once (within
    /// [`CONNECT_TIMEOUT`](crate::CONNECT_TIMEOUT)) when Redis does not answer. The shared
    /// connection is replaced on the first call after Redis comes back; calls made while it is
    /// away fail with an error for which [`QueueError::is_connection`] is true.
    pub async fn connect_with(url: &str, tls: &RedisTls) -> Result<Broker, QueueError> {
        let client = crate::connect::redis_client(url, tls)?;
        let conn = Link::open(client.clone())
            .await
            .map_err(|source| QueueError::Connect {
                url: without_password(url),
                source,
            })?;
        Ok(Broker::from_parts(client, conn))
    }

    fn from_parts(client: Client, conn: Link) -> Broker {
        Broker {
            inner: Arc::new(BrokerInner {
                opener: Opener::Single(client),
                conn: Connection::single(conn),
                blocking: Mutex::new(Vec::new()),
                loaded: Mutex::default(),
            }),
        }
    }

    /// Connects to a Redis Cluster through `seeds` (any of its nodes; the first that answers
    /// gives the slot map), with the TLS settings `tls` for `rediss://` seeds. The connection
    /// follows `MOVED` and `ASK` redirections and, when a node fails or a replica is promoted,
    /// reconnects and refreshes the slot map, retrying the command with back-off for a bounded
    /// time; calls made while no node serves a slot fail with an error for which
    /// [`QueueError::is_connection`] is true. Every node the cluster names at connect time is
    /// kept beside the seeds ([`crate::topology::learn`]): new connections, blocking reads and
    /// the cancellation subscription open through any of them that is alive, so the death of
    /// the node a seed names (its replica promoted) stops nothing.
    pub async fn connect_cluster(seeds: &[String], tls: &RedisTls) -> Result<Broker, QueueError> {
        let nodes = crate::topology::learn(seeds, tls).await;
        let client = cluster_client(&nodes, tls, RESPONSE_TIMEOUT)?;
        let blocking = cluster_client(&nodes, tls, CLUSTER_BLOCKING_RESPONSE_TIMEOUT)?;
        let conn =
            client
                .get_async_connection()
                .await
                .map_err(|source| QueueError::ConnectCluster {
                    seeds: redact_all(&seeds.join(",")),
                    source,
                })?;
        Ok(Broker {
            inner: Arc::new(BrokerInner {
                opener: Opener::Cluster {
                    blocking,
                    seeds: nodes,
                    tls: tls.clone(),
                },
                conn: Connection::cluster(conn),
                blocking: Mutex::new(Vec::new()),
                loaded: Mutex::default(),
            }),
        })
    }

    /// Connects to `endpoint` with the system's TLS roots: [`Broker::connect_to_with`].
    pub async fn connect_to(endpoint: &Endpoint) -> Result<Broker, QueueError> {
        Broker::connect_to_with(endpoint, &RedisTls::default()).await
    }

    /// Connects to `endpoint` with the TLS settings `tls`: [`Broker::connect_with`] or
    /// [`Broker::connect_cluster`].
    pub async fn connect_to_with(
        endpoint: &Endpoint,
        tls: &RedisTls,
    ) -> Result<Broker, QueueError> {
        match endpoint {
            Endpoint::Single(url) => Broker::connect_with(url, tls).await,
            Endpoint::Cluster(seeds) => Broker::connect_cluster(seeds, tls).await,
        }
    }

    /// [`Broker::connect_to_with`], counting its requests into `trips` (a counter the caller
    /// made before the broker existed, such as a node's; see [`Broker::round_trips`]).
    pub async fn connect_counted(
        endpoint: &Endpoint,
        tls: &RedisTls,
        trips: RoundTrips,
    ) -> Result<Broker, QueueError> {
        let mut broker = Broker::connect_to_with(endpoint, tls).await?;
        Arc::get_mut(&mut broker.inner)
            .expect("a broker just made is not shared")
            .conn
            .trips = trips;
        Ok(broker)
    }

    /// A handle on queue `name`.
    pub fn queue(&self, name: &str, config: QueueConfig) -> Result<Queue, QueueError> {
        Ok(Queue {
            broker: self.clone(),
            keys: Keys::new(name)?,
            config: Arc::new(config),
            groups_recreated: Arc::default(),
        })
    }

    /// The shared, self-replacing connection (for commands this crate does not wrap). Never
    /// send a blocking command (BLPOP, XREADGROUP BLOCK) on it: every other user of the broker
    /// would wait behind it, and a reply later than [`RESPONSE_TIMEOUT`] fails.
    pub fn connection(&self) -> Connection {
        self.inner.conn.clone()
    }

    /// Requests this broker has sent to Redis, blocking reads included (a pipeline or a
    /// script call counts once).
    pub fn round_trips(&self) -> RoundTrips {
        self.inner.conn.round_trips()
    }

    /// Whether the broker talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.opener, Opener::Cluster { .. })
    }

    /// The `run_id` of `INFO server`: a new one means the server restarted (or another took
    /// its place), and may have lost data. `None` on a Redis Cluster, where it is one of many.
    pub async fn run_id(&self) -> RedisResult<Option<String>> {
        if self.is_cluster() {
            return Ok(None);
        }
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut self.connection())
            .await?;
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|id| id.trim().to_owned()))
    }

    pub(crate) fn opener(&self) -> &Opener {
        &self.inner.opener
    }

    pub(crate) fn same_as(&self, other: &Broker) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Runs one blocking command that blocks for at most `block` on a connection no one else
    /// sends commands on, taken from the pool or opened. A pooled connection may have died
    /// while idle (Redis restarted): on a connection error the command is sent once more on a
    /// fresh connection. A reply later than `block` plus [`RESPONSE_TIMEOUT`] means the
    /// connection is dead (a half-open TCP connection never answers): it is dropped and the
    /// call fails with a timeout. The pool holds only idle connections: one whose command
    /// future is dropped mid-way is dropped with it.
    pub(crate) async fn query_blocking(
        &self,
        cmd: &redis::Cmd,
        block: Duration,
    ) -> RedisResult<redis::Value> {
        self.blocking(Blocking::Cmd(cmd), block).await
    }

    /// [`Broker::query_blocking`] for a pipeline whose first command blocks for at most
    /// `block` (all its keys in one slot); the replies in order, in one round trip.
    pub(crate) async fn query_blocking_pipe(
        &self,
        pipe: &Pipeline,
        block: Duration,
    ) -> RedisResult<redis::Value> {
        self.blocking(Blocking::Pipe(pipe), block).await
    }

    async fn blocking(&self, req: Blocking<'_>, block: Duration) -> RedisResult<redis::Value> {
        let limit = block + RESPONSE_TIMEOUT;
        self.inner.conn.trips.add(1);
        let pooled = self.inner.blocking.lock().expect("pool lock").pop();
        if let Some(mut conn) = pooled {
            match bounded(limit, conn.query(req)).await {
                Err(e) if is_connection_error(&e) => {}
                r => {
                    self.give_back(conn);
                    return r;
                }
            }
        }
        let mut conn = self.open_dedicated().await?;
        let r = bounded(limit, conn.query(req)).await;
        if !matches!(&r, Err(e) if is_connection_error(e)) {
            self.give_back(conn);
        }
        r
    }

    /// [`Broker::query_blocking`] for a command on `key`'s slot that the caller may want back
    /// early: once `wake` turns true the command is ended with `CLIENT UNBLOCK` (it answers
    /// as if its block time had run out) and its reply is still awaited. A blocking read's
    /// reply is never dropped this way: whatever Redis handed out before the unblock comes
    /// back to the caller, where dropping the future would leave it pending on the consumer
    /// with no one to run it.
    pub(crate) async fn query_blocking_wakeable(
        &self,
        cmd: &redis::Cmd,
        block: Duration,
        key: &str,
        wake: &mut tokio::sync::watch::Receiver<bool>,
    ) -> RedisResult<redis::Value> {
        let limit = block + RESPONSE_TIMEOUT;
        self.inner.conn.trips.add(1);
        let pooled = self.inner.blocking.lock().expect("pool lock").pop();
        let (mut conn, id) = match pooled {
            Some(mut conn) => match conn.client_id(key).await {
                Err(e) if is_connection_error(&e) => {
                    let mut conn = self.open_dedicated().await?;
                    let id = conn.client_id(key).await;
                    (conn, id)
                }
                id => (conn, id),
            },
            None => {
                let mut conn = self.open_dedicated().await?;
                let id = conn.client_id(key).await;
                (conn, id)
            }
        };
        // A user whose ACL refuses `CLIENT ID` or `CLIENT UNBLOCK` still reads: its reads are
        // not woken, only awaited to the end of their block time.
        let id = match id {
            Ok(id) => Some(id),
            Err(e) if is_connection_error(&e) => return Err(e),
            Err(_) => None,
        };
        let r = {
            let read = bounded(limit, conn.query(Blocking::Cmd(cmd)));
            tokio::pin!(read);
            tokio::select! {
                r = &mut read => r,
                () = woken(wake) => match id {
                    Some(id) => self.unblock(id, key, read).await,
                    None => read.await,
                },
            }
        };
        if !matches!(&r, Err(e) if is_connection_error(e)) {
            self.give_back(conn);
        }
        r
    }

    /// Ends client `id`'s blocking command on `key`'s node and awaits its reply. An unblock
    /// that finds nothing blocked (the command is still on its way, or already answered) is
    /// sent again shortly, until the reply is in.
    async fn unblock(
        &self,
        id: i64,
        key: &str,
        mut read: std::pin::Pin<&mut impl std::future::Future<Output = RedisResult<Value>>>,
    ) -> RedisResult<Value> {
        let mut unblock = redis::cmd("CLIENT");
        unblock.arg("UNBLOCK").arg(id);
        loop {
            let ended: RedisResult<i64> = self.connection().query_in_slot_of(key, &unblock).await;
            // Ended, or refused for good (an ACL without `CLIENT UNBLOCK`): await the reply.
            if matches!(&ended, Ok(1)) || matches!(&ended, Err(e) if !is_connection_error(e)) {
                return read.await;
            }
            tokio::select! {
                r = &mut read => return r,
                _ = tokio::time::sleep(UNBLOCK_RETRY) => {}
            }
        }
    }

    async fn open_dedicated(&self) -> RedisResult<Dedicated> {
        Ok(match &self.inner.opener {
            Opener::Single(client) => Dedicated::Single(
                client
                    .get_multiplexed_async_connection_with_config(&connection_config(None))
                    .await?,
            ),
            Opener::Cluster { blocking, .. } => {
                Dedicated::Cluster(blocking.get_async_connection().await?)
            }
        })
    }

    fn give_back(&self, conn: Dedicated) {
        let mut pool = self.inner.blocking.lock().expect("pool lock");
        if pool.len() < 16 {
            pool.push(conn);
        }
    }

    /// Runs a pipeline of EVALSHA calls; after a Redis restart or a failover (NOSCRIPT: the
    /// node's script cache is empty, nothing ran), loads the scripts (on every node of a
    /// cluster) and runs it again.
    pub(crate) async fn query_scripted<T: FromRedisValue>(
        &self,
        pipe: &Pipeline,
        scripts: &[&Script],
    ) -> RedisResult<T> {
        #[cfg(debug_assertions)]
        if let Err(e) = crate::scripts::check_calls(pipe) {
            panic!("{e}");
        }
        let mut conn = self.connection();
        // A pipeline sent to a Redis that lacks a script fails in every call and is sent
        // again: for a large one (a batch enqueue), load the scripts first, once per broker.
        if pipe.cmd_iter().nth(1).is_some() {
            self.ensure_loaded(scripts).await?;
        }
        match pipe.query_async(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::NoScriptError => {
                for s in scripts {
                    s.prepare_invoke().load_async(&mut conn).await?;
                    self.mark_loaded(s);
                }
                pipe.query_async(&mut conn).await
            }
            r => r,
        }
    }

    /// Loads the scripts this broker has not loaded yet (one round trip each, once). A Redis
    /// that loses them later (a restart) answers NOSCRIPT, which [`Broker::query_scripted`]
    /// handles.
    pub(crate) async fn ensure_loaded(&self, scripts: &[&Script]) -> RedisResult<()> {
        for s in scripts {
            if !self.is_loaded(s) {
                s.prepare_invoke()
                    .load_async(&mut self.connection())
                    .await?;
                self.mark_loaded(s);
            }
        }
        Ok(())
    }

    fn is_loaded(&self, script: &Script) -> bool {
        let loaded = self.inner.loaded.lock().expect("loaded lock");
        loaded.contains(script.get_hash())
    }

    fn mark_loaded(&self, script: &Script) {
        let mut loaded = self.inner.loaded.lock().expect("loaded lock");
        loaded.insert(script.get_hash().to_owned());
    }
}

/// A handle on one queue. Clones share the broker's connections.
#[derive(Clone, Debug)]
pub struct Queue {
    pub(crate) broker: Broker,
    pub(crate) keys: Keys,
    pub(crate) config: Arc<QueueConfig>,
    /// Times this handle (or a clone) found the consumer group gone and made it again.
    pub(crate) groups_recreated: Arc<std::sync::atomic::AtomicU64>,
}

impl Queue {
    /// Connects a new broker and returns a handle on queue `name`.
    pub async fn connect(url: &str, name: &str, config: QueueConfig) -> Result<Queue, QueueError> {
        Broker::connect(url).await?.queue(name, config)
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

    pub(crate) fn conn(&self) -> Connection {
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
        // Within what Redis accepts as an expire time whatever the job or the config says, so
        // a completion is never refused for its TTL.
        job_ttl
            .unwrap_or(self.config.result_ttl_s)
            .clamp(1, MAX_RESULT_TTL_S)
    }
}

pub(crate) use crate::link::is_connection_error;

/// `fut`, failing with an I/O timeout after `limit`.
async fn bounded<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no reply within {:.1} s", limit.as_secs_f64()),
        ))),
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn connect_errors_do_not_name_the_password() {
        assert_eq!(
            super::without_password("redis://:pw@h:1/0"),
            "redis://***@h:1/0"
        );
        assert_eq!(super::without_password("redis://h:1"), "redis://h:1");
    }
}
