//! The node's main loop: reading deliveries into slots and running them.
//!
//! The reader takes every free admission of the [`SlotPool`] before it reads, asks Redis for
//! at most that many entries, and gives each delivery one [`Hold`]. Admissions number the
//! slots plus the prefetch, and one returns as soon as its job's run is over, so the next
//! read overlaps the storing of the result rather than waiting for it; a job waits for one
//! of the engine's slots before it runs. The hold's second permit returns only when the
//! result is stored (see [`outbox`](crate::node::outbox)), which caps the entries a node holds
//! at twice its slots plus the prefetch however slowly results are stored. At start the
//! reader drains the node's own pending entries; every half visibility timeout it reclaims
//! idle entries of dead workers with the admissions it has.
//!
//! A job task runs one delivery in the engine and decides what becomes of it:
//!
//! - a malformed entry, or one the engine rejects as `invalid`: dead-lettered with the reason;
//! - a sandbox set-up fault (`error`): left pending for the reclaimer, so it is retried, and
//!   dead-lettered with the fault's text on its last allowed delivery;
//! - a job killed because the grace period ran out: left pending, untouched;
//! - anything else (`ok`, `failed`, `timeout`, `cancelled`, ...): a result.
//!
//! Stopping ([`StopLevel`]): `Drain` stops reading and lets running jobs finish within the
//! grace period; `Kill` kills what still runs (those entries stay pending for the reclaimer).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use forkbox_queue::{Broker, Delivery, JobResult, Outcome, QueueSet, Status};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use crate::node::cancel::{self, CancelBoard, Start};
use crate::node::config::NodeConfig;
use crate::node::error::NodeError;
use crate::node::health::{Backoff, RedisHealth, RoundTrips};
use crate::node::metrics::{self as m, NodeStatus};
use crate::node::outbox::{self, Outbox};
use crate::node::upkeep;
use crate::sandbox::Engine;

/// How far a node has been asked to stop. Levels only go up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StopLevel {
    Running,
    /// Stop reading; let running jobs finish.
    Drain,
    /// Kill running jobs now and leave their entries pending.
    Kill,
}

/// Asks a running node to stop; clones share one state.
#[derive(Debug, Clone)]
pub struct StopHandle {
    tx: Arc<watch::Sender<StopLevel>>,
}

impl Default for StopHandle {
    fn default() -> Self {
        StopHandle {
            tx: Arc::new(watch::channel(StopLevel::Running).0),
        }
    }
}

impl StopHandle {
    /// Raises the stop level (never lowers it).
    pub fn raise(&self, level: StopLevel) {
        self.tx.send_if_modified(|l| {
            let raise = level > *l;
            if raise {
                *l = level;
            }
            raise
        });
    }

    /// One step up: Running → Drain → Kill (a second Ctrl-C skips the grace period).
    pub fn escalate(&self) -> StopLevel {
        let next = match *self.tx.borrow() {
            StopLevel::Running => StopLevel::Drain,
            _ => StopLevel::Kill,
        };
        self.raise(next);
        next
    }

    pub fn level(&self) -> StopLevel {
        *self.tx.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<StopLevel> {
        self.tx.subscribe()
    }

    /// Escalates on every SIGINT and SIGTERM, logging what happens.
    pub fn on_signals(&self, grace: Duration) -> Result<(), NodeError> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt()).map_err(|source| NodeError::Signal {
            signal: "SIGINT",
            source,
        })?;
        let mut term = signal(SignalKind::terminate()).map_err(|source| NodeError::Signal {
            signal: "SIGTERM",
            source,
        })?;
        let stop = self.clone();
        tokio::spawn(async move {
            loop {
                let name = tokio::select! {
                    _ = int.recv() => "SIGINT",
                    _ = term.recv() => "SIGTERM",
                };
                match stop.escalate() {
                    StopLevel::Drain => tracing::info!(
                        "{name}: no new jobs; waiting up to {:.0} s for running jobs \
                         (again to kill them)",
                        grace.as_secs_f64()
                    ),
                    _ => tracing::warn!("{name} again: killing running jobs"),
                }
            }
        });
        Ok(())
    }
}

/// Stream entries this node holds (delivered, not yet completed), per queue, so their claims
/// can be refreshed.
#[derive(Debug, Default)]
pub struct Held {
    entries: Mutex<HashMap<String, HashSet<String>>>,
}

impl Held {
    pub fn add(&self, queue: &str, entry_id: &str) {
        self.entries
            .lock()
            .expect("held lock")
            .entry(queue.to_owned())
            .or_default()
            .insert(entry_id.to_owned());
    }

    pub fn remove(&self, queue: &str, entry_id: &str) {
        if let Some(set) = self.entries.lock().expect("held lock").get_mut(queue) {
            set.remove(entry_id);
        }
    }

    /// The held entry ids of `queue`.
    pub fn of(&self, queue: &str) -> Vec<String> {
        self.entries
            .lock()
            .expect("held lock")
            .get(queue)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .expect("held lock")
            .values()
            .map(HashSet::len)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a node may hold: admissions (entries read and not yet run to the end: the slots plus
/// the prefetch) and holds (entries whose result is not yet stored).
#[derive(Debug, Clone)]
pub struct SlotPool {
    admissions: Arc<Semaphore>,
    holds: Arc<Semaphore>,
}

/// The two permits of one delivery: the admission returns when its run is over, the hold
/// when its result is stored.
#[derive(Debug)]
pub struct Hold {
    admission: OwnedSemaphorePermit,
    stored: OwnedSemaphorePermit,
}

impl SlotPool {
    fn new(slots: usize, prefetch: usize) -> SlotPool {
        SlotPool {
            admissions: Arc::new(Semaphore::new(slots + prefetch)),
            holds: Arc::new(Semaphore::new(2 * slots + prefetch)),
        }
    }

    /// Waits for one free admission, takes every other free one too, and a hold for each
    /// (waiting while earlier results are still being stored).
    async fn take_free(&self) -> Vec<Hold> {
        let first = self
            .admissions
            .clone()
            .acquire_owned()
            .await
            .expect("the slot pool is never closed");
        let mut admissions = vec![first];
        while let Ok(p) = self.admissions.clone().try_acquire_owned() {
            admissions.push(p);
        }
        let mut out = Vec::with_capacity(admissions.len());
        for admission in admissions {
            let stored = self
                .holds
                .clone()
                .acquire_owned()
                .await
                .expect("the slot pool is never closed");
            out.push(Hold { admission, stored });
        }
        out
    }
}

/// Counts one job task in `Shared::busy` for as long as it lives, panics included, so a drain
/// never waits for a task that is gone.
struct Unfinished(watch::Sender<usize>);

impl Unfinished {
    fn count(shared: &Shared) -> Unfinished {
        shared.busy.send_modify(|n| *n += 1);
        Unfinished(shared.busy.clone())
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// A delivery read and waiting for an engine slot.
pub(crate) struct Queued {
    d: Delivery,
    hold: Hold,
    outbox: Outbox,
    unfinished: Unfinished,
}

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

/// State shared by the reader, the job tasks, the outbox and upkeep.
pub(crate) struct Shared {
    pub name: String,
    pub set: QueueSet,
    pub engine: Engine,
    pub config: NodeConfig,
    pub slots: SlotPool,
    /// One permit per engine slot: a job runs only with one.
    pub running: Arc<Semaphore>,
    /// Deliveries in read order, waiting for a slot (see [`Shared::dispatch`]).
    pub queued: mpsc::UnboundedSender<Queued>,
    pub held: Arc<Held>,
    pub board: Arc<CancelBoard>,
    pub health: Arc<RedisHealth>,
    pub busy: watch::Sender<usize>,
    pub stop: watch::Receiver<StopLevel>,
    pub abandoned: std::sync::atomic::AtomicUsize,
    pub trips: RoundTrips,
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
        });
        // A node whose zygote died can only fail jobs: report it unhealthy, stop reading, and
        // exit with an error so its supervisor restarts it. Its entries are reclaimed.
        let sandbox_lost = Arc::new(AtomicBool::new(false));
        {
            let (engine, status, stop, lost) = (
                self.engine.clone(),
                status.clone(),
                stop.clone(),
                sandbox_lost.clone(),
            );
            tokio::spawn(async move {
                while engine.is_alive() {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                status.sandbox_alive.store(false, Ordering::Relaxed);
                if stop.level() == StopLevel::Running {
                    tracing::error!("the sandbox zygote exited; stopping the node");
                    lost.store(true, Ordering::Relaxed);
                    stop.raise(StopLevel::Drain);
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

        let Some(broker) = connect(&config.redis_url, &health, &mut stop_rx).await else {
            return Ok(NodeReport::default());
        };
        let mut queues = Vec::new();
        for q in &config.queues {
            queues.push(broker.queue(q, config.queue.clone()).map_err(|source| {
                NodeError::OpenQueue {
                    queue: q.clone(),
                    source: Box::new(source),
                }
            })?);
        }
        let set = QueueSet::new(queues).map_err(|source| NodeError::OpenQueue {
            queue: config.queues.join(","),
            source: Box::new(source),
        })?;
        let (busy, _) = watch::channel(0usize);
        let (queued, waiting) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            set: set.clone(),
            engine: self.engine,
            slots: SlotPool::new(config.slots, config.prefetch),
            running: Arc::new(Semaphore::new(config.slots)),
            queued,
            held: Arc::new(Held::default()),
            board: Arc::new(CancelBoard::default()),
            health: health.clone(),
            busy,
            stop: stop_rx.clone(),
            abandoned: Default::default(),
            trips: self.trips.clone(),
            config,
        });
        let config = &shared.config;
        tracing::info!(
            "worker {} reading {} with {} slot(s) and a prefetch of {} at {}",
            config.name,
            config.queues.join(","),
            config.slots,
            config.prefetch,
            redact(&config.redis_url),
        );

        for q in set.queues() {
            background.push(tokio::spawn(cancel::watch(
                q.clone(),
                shared.board.clone(),
                health.clone(),
                stop_rx.clone(),
            )));
        }
        background.push(tokio::spawn(upkeep::run(
            set.clone(),
            config.name.clone(),
            shared.held.clone(),
            health.clone(),
            Duration::from_millis(config.queue.visibility_timeout_ms),
            config.lag_interval,
            shared.trips.clone(),
        )));
        let (outbox, mut outbox_task) = outbox::start(
            set.clone(),
            config.name.clone(),
            shared.held.clone(),
            health.clone(),
            shared.trips.clone(),
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

        let mut busy = shared.busy.subscribe();
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

        // Every job task is done; their outbox handles are dropped with them.
        let flush_limit = config.grace.max(Duration::from_secs(10));
        let unflushed = match tokio::time::timeout(flush_limit, outbox_task.wait()).await {
            Ok(()) => 0,
            Err(_) => outbox_task.abort(),
        };
        for task in background {
            task.abort();
        }
        if unflushed > 0 {
            return Err(NodeError::Unflushed { count: unflushed });
        }
        if sandbox_lost.load(Ordering::Relaxed) {
            return Err(NodeError::SandboxGone);
        }
        let abandoned = shared.abandoned.load(Ordering::Relaxed);
        tracing::info!("worker {} stopped", config.name);
        Ok(NodeReport { abandoned })
    }
}

/// The URL without its password, for logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_owned(),
    }
}

/// Connects, retrying with back-off until Redis answers or the node is told to stop.
async fn connect(
    url: &str,
    health: &RedisHealth,
    stop: &mut watch::Receiver<StopLevel>,
) -> Option<Broker> {
    let mut backoff = Backoff::default();
    loop {
        if *stop.borrow() >= StopLevel::Drain {
            return None;
        }
        let attempt = tokio::select! {
            r = Broker::connect(url) => r,
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

impl Shared {
    fn stopping(&self) -> bool {
        *self.stop.borrow() >= StopLevel::Drain
    }

    /// Sleeps `d`, or less when a stop is requested. Returns false when stopping.
    async fn pause(&self, d: Duration) -> bool {
        let mut stop = self.stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(d) => !self.stopping(),
            _ = stop.wait_for(|l| *l >= StopLevel::Drain) => false,
        }
    }

    async fn read_loop(
        self: Arc<Self>,
        outbox: Outbox,
        on_ready: impl FnOnce(Option<std::net::SocketAddr>),
        metrics_addr: Option<std::net::SocketAddr>,
    ) {
        let vis = Duration::from_millis(self.config.queue.visibility_timeout_ms);
        let mut backoff = Backoff::default();
        // Groups first (a fresh Redis has none), then what a previous life of this consumer
        // name left pending.
        while let Err(e) = self.set.ensure_groups().await {
            self.health.failed("creating consumer groups", &e);
            if !self.pause(backoff.next_delay()).await {
                return;
            }
        }
        self.health.ok();
        for q in self.set.queues() {
            loop {
                let mut permits = self.slots.take_free().await;
                match q.read_own_pending(&self.name, permits.len()).await {
                    Ok(ds) => {
                        if !ds.is_empty() {
                            tracing::info!(
                                queue = q.name(),
                                "resuming {} entr(ies) this worker name held before",
                                ds.len()
                            );
                        }
                        for d in ds {
                            let p = permits.pop().expect("at most one delivery per permit");
                            self.clone().spawn_job(d, p, &outbox);
                        }
                        break;
                    }
                    Err(e) => {
                        drop(permits);
                        self.health.failed("reading own pending entries", &e);
                        if !self.pause(backoff.next_delay()).await {
                            return;
                        }
                    }
                }
            }
        }
        on_ready(metrics_addr);
        // Reclaim at once: jobs of workers that died while none was running wait no longer.
        let reclaim_every = (vis / 2).max(Duration::from_millis(100));
        let mut next_reclaim = Instant::now();
        let mut stop = self.stop.clone();
        loop {
            let mut permits = tokio::select! {
                p = self.slots.take_free() => p,
                _ = stop.wait_for(|l| *l >= StopLevel::Drain) => return,
            };
            if self.stopping() {
                return;
            }
            if Instant::now() >= next_reclaim {
                next_reclaim = Instant::now() + reclaim_every;
                self.reclaim(&mut permits, vis, &outbox).await;
                if permits.is_empty() {
                    continue;
                }
            }
            let block = (next_reclaim
                .saturating_duration_since(Instant::now())
                .as_millis() as u64)
                .clamp(1, self.config.block_ms);
            // The read is not cancelled on stop: entries it took must reach a job task.
            match self.set.read(&self.name, permits.len(), block).await {
                Ok(ds) => {
                    // One XREADGROUP per queue, plus the pipelined result check when it
                    // returned an entry the enqueue script did not vet (exact for one queue
                    // unless that entry was a duplicate it dropped; a lower bound otherwise).
                    let checked =
                        self.config.queue.skip_completed_on_read && ds.iter().any(|d| !d.vetted);
                    self.trips
                        .add(self.set.queues().len() as u64 + u64::from(checked));
                    backoff.reset();
                    self.health.ok();
                    for d in ds {
                        let p = permits.pop().expect("at most one delivery per permit");
                        self.clone().spawn_job(d, p, &outbox);
                    }
                }
                Err(e) => {
                    drop(permits);
                    self.health.failed("reading jobs", &e);
                    if !self.pause(backoff.next_delay()).await {
                        return;
                    }
                }
            }
        }
    }

    /// Takes over entries idle past the visibility timeout, at most one per free permit.
    async fn reclaim(self: &Arc<Self>, permits: &mut Vec<Hold>, vis: Duration, outbox: &Outbox) {
        for q in self.set.queues() {
            if permits.is_empty() {
                return;
            }
            self.trips.add(1);
            match q
                .reclaim(&self.name, vis.as_millis() as u64, permits.len())
                .await
            {
                Ok(r) => {
                    if !r.deliveries.is_empty() {
                        tracing::info!(
                            queue = q.name(),
                            "reclaimed {} entr(ies) idle past the visibility timeout",
                            r.deliveries.len()
                        );
                    }
                    if !r.dead_lettered.is_empty() {
                        tracing::warn!(
                            queue = q.name(),
                            "dead-lettered {} entr(ies) that exceeded max_attempts",
                            r.dead_lettered.len()
                        );
                        let n = r.dead_lettered.len() as u64;
                        ::metrics::counter!(m::DEAD_LETTERS).increment(n);
                        ::metrics::counter!(m::JOBS, "queue" => q.name().to_owned(),
                            "status" => Status::Error.as_str())
                        .increment(n);
                    }
                    ::metrics::counter!(m::RECLAIMED).increment(r.deliveries.len() as u64);
                    for d in r.deliveries {
                        let p = permits
                            .pop()
                            .expect("reclaim is limited to the free permits");
                        self.clone().spawn_job(d, p, outbox);
                    }
                }
                Err(e) => self.health.failed("reclaiming idle entries", &e),
            }
        }
    }

    fn spawn_job(self: Arc<Self>, d: Delivery, hold: Hold, outbox: &Outbox) {
        self.held.add(&d.queue, &d.entry_id);
        let queued = Queued {
            unfinished: Unfinished::count(&self),
            d,
            hold,
            outbox: outbox.clone(),
        };
        if let Err(mpsc::error::SendError(q)) = self.queued.send(queued) {
            // Only once the node is over: the entry stays pending for the reclaimer.
            self.leave_pending(&q.d);
        }
    }

    /// Starts the read deliveries in the order they were read (priorities and stream order
    /// hold even for entries read ahead), each once an engine slot is free. Past the grace
    /// period, what still waits is left pending unrun.
    async fn dispatch(self: Arc<Self>, mut waiting: mpsc::UnboundedReceiver<Queued>) {
        let mut stop = self.stop.clone();
        while let Some(q) = waiting.recv().await {
            let slot = tokio::select! {
                biased;
                _ = stop.wait_for(|l| *l >= StopLevel::Kill) => None,
                slot = self.running.clone().acquire_owned() => {
                    Some(slot.expect("the run semaphore is never closed"))
                }
            };
            let Some(slot) = slot else {
                self.abandoned.fetch_add(1, Ordering::Relaxed);
                self.leave_pending(&q.d);
                continue;
            };
            let node = self.clone();
            tokio::spawn(async move {
                node.run_job(q.d, q.hold, slot, q.outbox).await;
                drop(q.unfinished);
            });
        }
    }

    /// Leaves an entry pending, unrefreshed: the reclaimer hands it out again after the
    /// visibility timeout (or this worker name's next life resumes it).
    fn leave_pending(&self, d: &Delivery) {
        self.held.remove(&d.queue, &d.entry_id);
    }

    async fn run_job(
        self: Arc<Self>,
        d: Delivery,
        hold: Hold,
        slot: OwnedSemaphorePermit,
        outbox: Outbox,
    ) {
        let Hold { admission, stored } = hold;
        let job = match &d.job {
            Ok(job) => job,
            Err(e) => {
                let reason = e.to_string();
                tracing::warn!(
                    queue = d.queue,
                    entry = d.entry_id,
                    "malformed job: {reason}"
                );
                drop((slot, admission));
                outbox.dead_letter(d, reason, stored);
                return;
            }
        };
        let notify = match self.board.start(&d.queue, &d.id) {
            Start::Cancelled => {
                tracing::info!(queue = d.queue, "job {} was cancelled before it ran", d.id);
                let outcome = Outcome::not_run(Status::Cancelled, "cancelled before it started");
                let result = self.result_of(&d, outcome);
                drop((slot, admission));
                outbox.complete(d, result, stored);
                return;
            }
            Start::Run(n) => n,
        };
        ::metrics::gauge!(m::SLOTS_BUSY).increment(1.0);
        let killed = AtomicBool::new(false);
        let outcome = {
            let mut stop = self.stop.clone();
            let killed = &killed;
            let cancel = async move {
                tokio::select! {
                    _ = notify.notified() => {}
                    reached = async { stop.wait_for(|l| *l >= StopLevel::Kill).await.is_ok() } => {
                        if reached {
                            killed.store(true, Ordering::Relaxed);
                        } else {
                            std::future::pending::<()>().await;
                        }
                    }
                }
            };
            self.engine.run_cancellable(job, cancel).await
        };
        // The slot and the admission go back now: the next job may start, and the reader may
        // read, while this result is stored.
        ::metrics::gauge!(m::SLOTS_BUSY).decrement(1.0);
        drop((slot, admission));
        self.board.finish(&d.queue, &d.id);
        record_run(&outcome);
        if killed.load(Ordering::Relaxed) && outcome.status == Status::Cancelled {
            self.abandoned.fetch_add(1, Ordering::Relaxed);
            self.leave_pending(&d);
            return;
        }
        match outcome.status {
            Status::Error => {
                let fault = outcome.error.clone().unwrap_or_default();
                let max = d.max_attempts(self.config.queue.max_attempts);
                if d.deliveries >= u64::from(max) {
                    let reason = format!(
                        "sandbox set-up failed on all {} deliveries; last: {fault}",
                        d.deliveries
                    );
                    tracing::error!(queue = d.queue, "job {}: {reason}", d.id);
                    outbox.dead_letter(d, reason, stored);
                } else {
                    tracing::warn!(
                        queue = d.queue,
                        "job {}: sandbox set-up failed (delivery {} of {max}): {fault}; \
                         left pending for a retry",
                        d.id,
                        d.deliveries
                    );
                    self.leave_pending(&d);
                }
            }
            Status::Invalid => {
                let reason = outcome
                    .error
                    .clone()
                    .unwrap_or_else(|| "invalid job".into());
                outbox.dead_letter(d, reason, stored);
            }
            _ => {
                let result = self.result_of(&d, outcome);
                outbox.complete(d, result, stored);
            }
        }
    }

    fn result_of(&self, d: &Delivery, outcome: Outcome) -> JobResult {
        JobResult {
            id: d.id.clone(),
            outcome,
            attempt: u32::try_from(d.deliveries).unwrap_or(u32::MAX),
            worker: self.name.clone(),
            batch: d.batch(),
        }
    }
}

/// Histograms of a job that reached the sandbox.
fn record_run(outcome: &Outcome) {
    if outcome.spawn_us > 0 {
        ::metrics::histogram!(m::SPAWN).record(outcome.spawn_us as f64 / 1e6);
        ::metrics::histogram!(m::JOB_DURATION).record(outcome.duration_ms / 1e3);
    }
    if let Some(us) = outcome.watchdog_overshoot_us {
        ::metrics::histogram!(m::WATCHDOG_OVERSHOOT).record(us.max(0) as f64 / 1e6);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_levels_only_go_up() {
        let s = StopHandle::default();
        assert_eq!(s.escalate(), StopLevel::Drain);
        s.raise(StopLevel::Running);
        assert_eq!(s.level(), StopLevel::Drain);
        assert_eq!(s.escalate(), StopLevel::Kill);
    }

    #[test]
    fn redact_hides_the_password() {
        assert_eq!(redact("redis://:pw@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn held_entries_are_tracked_per_queue() {
        let h = Held::default();
        h.add("a", "1-0");
        h.add("a", "2-0");
        h.add("b", "1-0");
        h.remove("a", "1-0");
        assert_eq!(h.of("a"), ["2-0"]);
        assert_eq!(h.len(), 2);
    }
}
