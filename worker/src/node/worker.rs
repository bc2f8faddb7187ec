//! The node itself: connecting, starting its parts, and stopping them in order.
//!
//! [`Node::run`] opens the queues, starts the [`reader`](crate::node::reader), the dispatcher
//! and job tasks ([`job`](crate::node::job)), the outbox and upkeep, waits for the stop, and
//! drains: running jobs get the grace period and finished results are stored.
//!
//! Stopping ([`StopLevel`]): `Drain` stops reading and lets running jobs finish within the
//! grace period; `Kill` kills what still runs (those entries stay pending for the reclaimer).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkbox_queue::{Broker, Endpoint, QueueSet, RoundTrips};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::node::admission::SlotPool;
use crate::node::cancel::{self, CancelBoard};
use crate::node::config::NodeConfig;
use crate::node::error::NodeError;
use crate::node::health::{self, Backoff, RedisHealth};
use crate::node::held::Held;
use crate::node::job;
use crate::node::metrics::{self as m, NodeStatus};
use crate::node::outbox::{self, Completer, Outbox, ReadGate, ReadWith};
use crate::node::preflight;
use crate::node::reader::Reader;
use crate::node::seam::{JobQueue, Runner};
use crate::node::session::Sessions;
use crate::node::shared::{Intake, Lifetime, SandboxWatch, Shared};
use crate::node::stop::{StopHandle, StopLevel};
use crate::node::upkeep;
use crate::sandbox::Engine;

/// What a node did, returned when it stops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeReport {
    /// Jobs killed at the end of the grace period and left pending.
    pub abandoned: usize,
}

/// A worker node: one engine, one consumer name, a set of queues.
pub struct Node {
    config: NodeConfig,
    engine: Engine,
    trips: RoundTrips,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.config.name)
            .finish()
    }
}

impl Node {
    /// A node over a started engine (`Engine::start` blocks: call it before the runtime).
    pub fn new(config: NodeConfig, engine: Engine) -> Node {
        Node {
            config,
            engine,
            trips: RoundTrips::default(),
        }
    }

    /// The node's count of requests sent to Redis (see [`RoundTrips`]).
    pub fn round_trips(&self) -> RoundTrips {
        self.trips.clone()
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Runs until `stop` reaches [`StopLevel::Drain`], then drains: running jobs get the grace
    /// period, finished results are stored, and the node returns. `on_ready` is called with
    /// the metrics address (if any) once the node reads its queues.
    pub async fn run(
        self,
        stop: StopHandle,
        on_ready: impl FnOnce(Option<SocketAddr>) + Send + 'static,
    ) -> Result<NodeReport, NodeError> {
        let Node {
            config,
            engine,
            trips,
        } = self;
        config.validate()?;
        let mut stop_rx = stop.subscribe();
        let health = Arc::new(RedisHealth::default());
        // Probed beside serving, in sandboxes of the engine's own, without taking job slots.
        let prober = engine.clone();
        let session_engine = engine.clone();
        let runner: Arc<dyn Runner> = Arc::new(engine);
        let (status, sandbox) = watch_sandbox(&runner, &health, &stop);
        let mut background = Vec::new();
        let metrics_addr = serve_metrics(&config, &status, &mut background).await?;
        let endpoint = config.endpoint().map_err(|e| NodeError::Setting {
            setting: "redis",
            message: e.to_string(),
        })?;
        let Some(broker) =
            connect(&endpoint, &config.redis_tls, &trips, &health, &mut stop_rx).await
        else {
            return Ok(NodeReport::default());
        };
        let config = preflight::check_redis(&broker, config).await?;
        let set = open_queues(&broker, &config).await?;
        tracing::info!(
            "worker {} reading {} ({} partition(s) each) with {} slot(s) and a prefetch of {} at {}",
            config.name,
            config.queues.join(","),
            config.partitions,
            config.slots,
            config.prefetch,
            endpoint,
        );
        // One stream: completions read the next entries for the slots they free (several
        // streams are read by priority and in turn, which only the reader knows). On a
        // cluster the completion script itself reads, one completion at a time.
        let reads_with_completions = set.queues().len() == 1;
        let queue: Arc<dyn JobQueue> = Arc::new(set.clone());
        let path = (queue, runner, reads_with_completions);
        let parts = Parts::new(config, path, health.clone(), &stop_rx, sandbox);
        let sessions = Arc::new(Sessions::new(
            parts.shared.name.clone(),
            session_engine,
            parts.shared.config.sessions,
            set.clone(),
            health.clone(),
            parts.shared.config.ceilings.timeout_ms,
            parts
                .shared
                .config
                .ceilings
                .clamp_defaults(&forkbox_queue::schema::EffectiveLimits::default()),
        ));
        // Before the job's path and the heartbeat: no session of this node exists yet.
        sessions.start(&mut stop_rx).await;
        let opener: Arc<dyn crate::node::shared::SessionOpener> = sessions.clone();
        let _ = parts.shared.sessions.set(opener);
        start_beside(&parts.shared, &set, &broker, prober, &mut background);
        let on_ready = move || on_ready(metrics_addr);
        let (shared, outbox, completer, stopped_reading) =
            parts.start_path(on_ready, &mut background);
        // Drain starts when asked, or when the reader gives up by itself.
        let _ = stop_rx.wait_for(|l| *l >= StopLevel::Drain).await;
        let drain_started = Instant::now();
        status.draining.store(true, Ordering::Relaxed);
        let _ = stopped_reading.await;
        drop(outbox);
        wait_for_jobs(&shared, &stop, drain_started).await;
        let unflushed = flush(&shared.config, completer, drain_started).await;
        // Sessions end before the heartbeat goes: their callers learn `node_stopped`, not
        // `session lost`.
        sessions.stop_all().await;
        for task in background {
            task.abort();
        }
        leave(&set, &shared.config.name).await;
        if !unflushed.is_empty() {
            return Err(NodeError::Unflushed {
                count: unflushed.len(),
                jobs: unflushed
                    .iter()
                    .map(|(q, id)| format!("{q}/{id}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        if shared.life.sandbox.lost.load(Ordering::Relaxed) {
            return Err(NodeError::SandboxGone);
        }
        let abandoned = shared.life.abandoned.load(Ordering::Relaxed);
        tracing::info!("worker {} stopped", shared.config.name);
        Ok(NodeReport { abandoned })
    }
}

/// The node's health as `/healthz` tells it, and the watch that stops the node once its
/// zygote is gone: a node whose zygote died can only fail jobs, so it reports itself
/// unhealthy, stops reading, hands back what it holds, and exits with an error so its
/// supervisor restarts it.
fn watch_sandbox(
    runner: &Arc<dyn Runner>,
    health: &Arc<RedisHealth>,
    stop: &StopHandle,
) -> (Arc<NodeStatus>, SandboxWatch) {
    let status = Arc::new(NodeStatus {
        draining: AtomicBool::new(false),
        redis: health.clone(),
        sandbox_alive: AtomicBool::new(true),
        resource_fault: Default::default(),
    });
    let sandbox = SandboxWatch {
        runner: runner.clone(),
        status: status.clone(),
        stop: stop.clone(),
        lost: Arc::new(AtomicBool::new(false)),
    };
    let watch = sandbox.clone();
    tokio::spawn(async move {
        while watch.alive() {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    (status, sandbox)
}

/// Serves `/metrics` and `/healthz` when the node has a metrics address; returns the address
/// it listens on.
async fn serve_metrics(
    config: &NodeConfig,
    status: &Arc<NodeStatus>,
    background: &mut Vec<JoinHandle<()>>,
) -> Result<Option<SocketAddr>, NodeError> {
    let Some(addr) = config.metrics_addr else {
        return Ok(None);
    };
    let handle = m::install()?;
    m::register(&config.queues, config.slots);
    let (listener, local) = m::bind(addr).await?;
    tracing::info!("metrics on http://{local}/metrics (and /healthz)");
    background.push(tokio::spawn(m::serve(listener, handle, status.clone())));
    Ok(Some(local))
}

/// Opens the node's queues, checking before anything is read that their layout matches the
/// node's and that Redis grants the node every right it needs.
async fn open_queues(broker: &Broker, config: &NodeConfig) -> Result<QueueSet, NodeError> {
    let mut queues = Vec::new();
    for q in &config.queues {
        let open_err = |source| NodeError::OpenQueue {
            queue: q.clone(),
            source: Box::new(source),
        };
        let queue = broker
            .partitioned(q, config.partitions, config.queue.clone())
            .map_err(open_err)?;
        // A worker with another partition count than the queue's would leave partitions
        // unread.
        queue.check_layout().await.map_err(open_err)?;
        // A user without a right the node needs would fail at the first job (its result
        // unstored), or retry for ever.
        for partition in queue.partitions() {
            let missing = partition
                .missing_worker_right(&config.name)
                .await
                .map_err(open_err)?;
            if let Some(missing) = missing {
                return Err(NodeError::MissingRight {
                    queue: q.clone(),
                    missing,
                });
            }
        }
        queues.push(queue);
    }
    QueueSet::of_partitioned(queues).map_err(|source| NodeError::OpenQueue {
        queue: config.queues.join(","),
        source: Box::new(source),
    })
}

/// The parts of a job's path, built and not yet started.
pub(crate) struct Parts {
    pub(crate) shared: Arc<Shared>,
    /// The dispatcher's end of the admitted deliveries.
    waiting: mpsc::UnboundedReceiver<crate::node::shared::Queued>,
}

impl Parts {
    /// The state the parts share.
    /// `path` is the node's queues, its runner and whether completions read.
    pub(crate) fn new(
        config: NodeConfig,
        path: (Arc<dyn JobQueue>, Arc<dyn Runner>, bool),
        health: Arc<RedisHealth>,
        stop: &watch::Receiver<StopLevel>,
        sandbox: SandboxWatch,
    ) -> Parts {
        let (queue, runner, reads_with_completions) = path;
        let (busy, _) = watch::channel(0usize);
        let (queued, waiting) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            queue,
            runner,
            held: Arc::new(Held::default()),
            board: Arc::new(CancelBoard::default()),
            health,
            sessions: std::sync::OnceLock::new(),
            intake: Intake {
                slots: SlotPool::new(config.slots, config.prefetch),
                queued,
                gate: Arc::new(ReadGate::new(stop.clone())),
                reads_with_completions,
            },
            life: Lifetime {
                stop: stop.clone(),
                busy,
                abandoned: Default::default(),
                sandbox,
            },
            config,
        });
        Parts { shared, waiting }
    }

    /// Starts the job's path: the outbox, the dispatcher and the reader. Returns the, the node's outbox handle, the completer, and word of the reader once
    /// it reads no more.
    pub(crate) fn start_path(
        self,
        on_ready: impl FnOnce() + Send + 'static,
        background: &mut Vec<JoinHandle<()>>,
    ) -> (Arc<Shared>, Outbox, Completer, oneshot::Receiver<()>) {
        let Parts { shared, waiting } = self;
        let (read_back_tx, read_back) = mpsc::unbounded_channel();
        let read_with = shared.intake.reads_with_completions.then(|| ReadWith {
            gate: shared.intake.gate.clone(),
            slots: shared.intake.slots.clone(),
            to: read_back_tx,
        });
        let (outbox, completer) = outbox::start(
            shared.queue.clone(),
            shared.name.clone(),
            shared.held.clone(),
            shared.health.clone(),
            read_with,
        );
        background.push(tokio::spawn(job::dispatch(shared.clone(), waiting)));
        let (stopped_tx, stopped) = oneshot::channel();
        let reader = Reader::new(shared.clone(), outbox.clone(), read_back);
        background.push(tokio::spawn(reader.run(on_ready, stopped_tx)));
        (shared, outbox, completer, stopped)
    }
}

/// Starts what runs beside the job's path: the cancellation watchers, the Redis health probe
/// and upkeep.
fn start_beside(
    shared: &Arc<Shared>,
    set: &QueueSet,
    broker: &Broker,
    prober: Engine,
    background: &mut Vec<JoinHandle<()>>,
) {
    for q in set.queues() {
        background.push(tokio::spawn(cancel::watch(
            q.clone(),
            shared.board.clone(),
            shared.health.clone(),
            shared.life.stop.clone(),
        )));
    }
    background.push(tokio::spawn(health::probe(
        broker.clone(),
        shared.health.clone(),
    )));
    // The runtimes are published with the heartbeat once known.
    let runtimes = Arc::new(std::sync::OnceLock::new());
    background.push(tokio::spawn(crate::runtimes::probe::publish_when_probed(
        prober,
        shared.config.runtimes.clone(),
        runtimes.clone(),
    )));
    background.push(tokio::spawn(upkeep::run(
        set.clone(),
        shared.name.clone(),
        shared.held.clone(),
        shared.health.clone(),
        Duration::from_millis(shared.config.queue.visibility_timeout_ms),
        shared.config.lag_interval,
        runtimes,
    )));
}

/// Waits for the job tasks within what is left of the grace period, then kills what still
/// runs and waits for those.
pub(crate) async fn wait_for_jobs(shared: &Shared, stop: &StopHandle, drain_started: Instant) {
    let mut stop_rx = shared.life.stop.clone();
    let mut busy = shared.life.busy.subscribe();
    let unfinished = *busy.borrow();
    if unfinished > 0 {
        tracing::info!("waiting for {unfinished} job(s) running or about to run");
    }
    let grace_left = shared.config.grace.saturating_sub(drain_started.elapsed());
    let finished = tokio::select! {
        r = tokio::time::timeout(grace_left, busy.wait_for(|n| *n == 0)) => r.is_ok(),
        _ = stop_rx.wait_for(|l| *l >= StopLevel::Kill) => false,
    };
    if !finished {
        let left = *busy.borrow();
        if left > 0 {
            tracing::warn!(
                "grace period over: killing {left} running job(s); their entries stay \
                 pending for the reclaimer"
            );
        }
        stop.raise(StopLevel::Kill);
        let _ = busy.wait_for(|n| *n == 0).await;
    }
}

/// Stores what finished, within what is left of the grace period (at least a second): a Redis
/// that is away does not hold the exit up past it. Every job task is done by now, their outbox
/// handles dropped with them. Returns the `(queue, job id)` of what was not stored.
pub(crate) async fn flush(
    config: &NodeConfig,
    mut completer: Completer,
    drain_started: Instant,
) -> Vec<(String, String)> {
    let flush_limit = config
        .grace
        .saturating_sub(drain_started.elapsed())
        .max(Duration::from_secs(1));
    match tokio::time::timeout(flush_limit, completer.wait()).await {
        Ok(()) => Vec::new(),
        Err(_) => completer.abort(),
    }
}

/// Stopped: `stats` should not show this node alive until its heartbeat expires. A Redis that
/// is away leaves the keys to expire.
async fn leave(set: &QueueSet, name: &str) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        for q in set.queues() {
            let _ = q.remove_heartbeat(name).await;
        }
    })
    .await;
}

/// Connects, retrying with back-off until Redis answers or the node is told to stop.
async fn connect(
    endpoint: &Endpoint,
    tls: &forkbox_queue::RedisTls,
    trips: &RoundTrips,
    health: &RedisHealth,
    stop: &mut watch::Receiver<StopLevel>,
) -> Option<Broker> {
    let mut backoff = Backoff::default();
    loop {
        if *stop.borrow() >= StopLevel::Drain {
            return None;
        }
        let attempt = tokio::select! {
            r = Broker::connect_counted(endpoint, tls, trips.clone()) => r,
            _ = stop.wait_for(|l| *l >= StopLevel::Drain) => return None,
        };
        match attempt {
            Ok(b) => {
                health.ok();
                return Some(b);
            }
            Err(e) => {
                health.failed("connecting", &e);
                let pause = backoff.next_delay();
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stop.wait_for(|l| *l >= StopLevel::Drain) => return None,
                }
            }
        }
    }
}
