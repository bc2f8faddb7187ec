//! The node itself: connecting, starting its parts, and stopping them in order.
//!
//! [`Node::run`] opens the queues, starts the [`reader`](crate::node::reader), the dispatcher
//! and job tasks ([`job`](crate::node::job)), the outbox and upkeep, waits for the stop, and
//! drains: running jobs get the grace period and finished results are stored.
//!
//! Stopping ([`StopLevel`]): `Drain` stops reading and lets running jobs finish within the
//! grace period; `Kill` kills what still runs (those entries stay pending for the reclaimer).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use forkbox_queue::{Broker, Endpoint, QueueSet};
use tokio::sync::{mpsc, watch};

use crate::node::admission::SlotPool;
use crate::node::cancel::{self, CancelBoard};
use crate::node::config::NodeConfig;
use crate::node::error::NodeError;
use crate::node::health::{self, Backoff, RedisHealth};
use crate::node::held::Held;
use crate::node::metrics::{self as m, NodeStatus};
use crate::node::outbox;
use crate::node::preflight;
use crate::node::shared::{Intake, Lifetime, SandboxWatch, Shared};
use crate::node::stop::{StopHandle, StopLevel};
use crate::node::upkeep;
use crate::sandbox::Engine;
use forkbox_queue::RoundTrips;

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
        on_ready: impl FnOnce(Option<std::net::SocketAddr>) + Send + 'static,
    ) -> Result<NodeReport, NodeError> {
        let config = self.config;
        config.validate()?;
        let mut stop_rx = stop.subscribe();
        let health = Arc::new(RedisHealth::default());
        let status = Arc::new(NodeStatus {
            draining: AtomicBool::new(false),
            redis: health.clone(),
            sandbox_alive: AtomicBool::new(true),
            resource_fault: Default::default(),
        });
        // A node whose zygote died can only fail jobs: report it unhealthy, stop reading, hand
        // back what it holds, and exit with an error so its supervisor restarts it.
        let sandbox = SandboxWatch {
            engine: self.engine.clone(),
            status: status.clone(),
            stop: stop.clone(),
            lost: Arc::new(AtomicBool::new(false)),
        };
        {
            let sandbox = sandbox.clone();
            tokio::spawn(async move {
                while sandbox.alive() {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            });
        }
        let mut background = Vec::new();
        let mut metrics_addr = None;
        if let Some(addr) = config.metrics_addr {
            let handle = m::install()?;
            m::register(&config.queues, config.slots);
            let (listener, local) = m::bind(addr).await?;
            tracing::info!("metrics on http://{local}/metrics (and /healthz)");
            metrics_addr = Some(local);
            background.push(tokio::spawn(m::serve(listener, handle, status.clone())));
        }

        let endpoint = config.endpoint().map_err(|e| NodeError::Setting {
            setting: "redis",
            message: e.to_string(),
        })?;
        let Some(broker) = connect(
            &endpoint,
            &config.redis_tls,
            &self.trips,
            &health,
            &mut stop_rx,
        )
        .await
        else {
            return Ok(NodeReport::default());
        };
        let config = preflight::check_redis(&broker, config).await?;
        let mut queues = Vec::new();
        for q in &config.queues {
            let open_err = |source| NodeError::OpenQueue {
                queue: q.clone(),
                source: Box::new(source),
            };
            let queue = broker
                .partitioned(q, config.partitions, config.queue.clone())
                .map_err(open_err)?;
            // Before reading anything: a worker with another partition count than the queue's
            // would leave partitions unread.
            queue.check_layout().await.map_err(open_err)?;
            // Before reading anything: a user without a right the node needs would fail at
            // the first job (its result unstored), or retry for ever.
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
        let set = QueueSet::of_partitioned(queues).map_err(|source| NodeError::OpenQueue {
            queue: config.queues.join(","),
            source: Box::new(source),
        })?;
        // One stream: completions read the next entries for the slots they free (several
        // streams are read by priority and in turn, which only the reader knows). On a
        // cluster the completion script itself reads, one completion at a time.
        let reads_with_completions = set.queues().len() == 1;
        let (busy, _) = watch::channel(0usize);
        let (queued, waiting) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            set: set.clone(),
            engine: self.engine,
            held: Arc::new(Held::default()),
            board: Arc::new(CancelBoard::default()),
            health: health.clone(),
            intake: Intake {
                slots: SlotPool::new(config.slots, config.prefetch),
                queued,
                next_reclaim: Mutex::new(Instant::now()),
                reads_with_completions,
            },
            life: Lifetime {
                stop: stop_rx.clone(),
                busy,
                abandoned: Default::default(),
                sandbox: sandbox.clone(),
            },
            config,
        });
        let config = &shared.config;
        tracing::info!(
            "worker {} reading {} ({} partition(s) each) with {} slot(s) and a prefetch of {} at {}",
            config.name,
            config.queues.join(","),
            config.partitions,
            config.slots,
            config.prefetch,
            endpoint,
        );

        for q in set.queues() {
            background.push(tokio::spawn(cancel::watch(
                q.clone(),
                shared.board.clone(),
                health.clone(),
                stop_rx.clone(),
            )));
        }
        background.push(tokio::spawn(health::probe(broker.clone(), health.clone())));
        // Probed beside serving: the runtimes are published once known.
        let runtimes = Arc::new(std::sync::OnceLock::new());
        background.push(tokio::spawn(crate::runtimes::probe::publish_when_probed(
            shared.engine.clone(),
            config.runtimes.clone(),
            runtimes.clone(),
        )));
        background.push(tokio::spawn(upkeep::run(
            set.clone(),
            config.name.clone(),
            shared.held.clone(),
            health.clone(),
            Duration::from_millis(config.queue.visibility_timeout_ms),
            config.lag_interval,
            runtimes,
        )));
        let refill = reads_with_completions.then(|| shared.clone() as Arc<dyn outbox::Refill>);
        let (outbox, mut outbox_task) = outbox::start(
            set.clone(),
            config.name.clone(),
            shared.held.clone(),
            health.clone(),
            refill,
        );

        background.push(tokio::spawn(shared.clone().dispatch(waiting)));
        let reader = tokio::spawn(
            shared
                .clone()
                .read_loop(outbox.clone(), on_ready, metrics_addr),
        );
        // Drain starts when asked, or when the reader gives up by itself.
        let _ = stop_rx.wait_for(|l| *l >= StopLevel::Drain).await;
        let drain_started = Instant::now();
        status.draining.store(true, Ordering::Relaxed);
        let _ = reader.await;
        drop(outbox);

        let mut busy = shared.life.busy.subscribe();
        let unfinished = *busy.borrow();
        if unfinished > 0 {
            tracing::info!("waiting for {unfinished} job(s) running or about to run");
        }
        let grace_left = config.grace.saturating_sub(drain_started.elapsed());
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

        // Every job task is done; their outbox handles are dropped with them. Storing what
        // finished gets what is left of the grace period (at least a second): a Redis that is
        // away does not hold the exit up past it.
        let flush_limit = config
            .grace
            .saturating_sub(drain_started.elapsed())
            .max(Duration::from_secs(1));
        let unflushed = match tokio::time::timeout(flush_limit, outbox_task.wait()).await {
            Ok(()) => Vec::new(),
            Err(_) => outbox_task.abort(),
        };
        for task in background {
            task.abort();
        }
        // Stopped: `stats` should not show this node alive until its heartbeat expires. A
        // Redis that is away leaves the keys to expire.
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            for q in set.queues() {
                let _ = q.remove_heartbeat(&config.name).await;
            }
        })
        .await;
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
        if sandbox.lost.load(Ordering::Relaxed) {
            return Err(NodeError::SandboxGone);
        }
        let abandoned = shared.life.abandoned.load(Ordering::Relaxed);
        tracing::info!("worker {} stopped", config.name);
        Ok(NodeReport { abandoned })
    }
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
