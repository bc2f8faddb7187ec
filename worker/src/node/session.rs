//! Sessions on this node: opening them, routing their calls, ending them all at a stop.
//!
//! A session's create job, admitted by the reader as any job is, comes here instead of the
//! dispatcher ([`Sessions::open`]): it takes no engine slot, and its admission is given back
//! once the session is open (or refused). The session then lives in its own task
//! ([`session_task`](crate::node::session_task)), which owns its sandbox. One reader task per
//! queue partition ([`session_calls`](crate::node::session_calls)) reads `calls:<node>` from
//! the node's start and hands each call here, to be routed to its session's task.
//! docs/protocol.md ("Sessions") is the contract.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use forkbox_queue::schema::{EffectiveLimits, Runtime};
use forkbox_queue::session::{Call, ErrorReason, Event, SessionOpened};
use forkbox_queue::{Completion, Delivery, Job, JobResult, Outcome, Queue, QueueSet, Status};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::node::admission::Permits;
use crate::node::config::SessionSettings;
use crate::node::health::{Backoff, RedisHealth};
use crate::node::metrics as m;
use crate::node::outbox::Outbox;
use crate::node::session_calls::{self, Route};
use crate::node::session_fork::{branches_that_fit, ForkRights};
use crate::node::session_pool::SessionPool;
use crate::node::session_relay::capacity_refusal;
use crate::node::session_task::{BranchSeats, Cmd, SessionTask, TaskSetup};
use crate::node::shared::{Queued, SessionOpener, Shared};
use crate::node::stop::StopLevel;
use crate::sandbox::{Engine, OpenError, SandboxSession, SessionShape, SessionSpec};

/// How long a stopping node waits for its sessions to end and be recorded.
const STOP_WAIT: Duration = Duration::from_secs(15);

/// The node's sessions.
pub(crate) struct Sessions {
    name: String,
    engine: Engine,
    settings: SessionSettings,
    queues: QueueSet,
    health: Arc<RedisHealth>,
    live: Arc<Mutex<HashMap<String, Entry>>>,
    /// The longest `timeout_ms` a call may ask: the node's job maximum.
    max_call_timeout_ms: u64,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    stop_reading: watch::Sender<bool>,
    /// Session sandboxes opened ahead of demand.
    pool: Arc<SessionPool>,
}

/// One session: opening (no task yet) or live.
struct Entry {
    memory_mb: u64,
    to_task: Option<mpsc::UnboundedSender<Cmd>>,
}

impl Sessions {
    pub(crate) fn new(
        name: String,
        engine: Engine,
        settings: SessionSettings,
        queues: QueueSet,
        health: Arc<RedisHealth>,
        max_call_timeout_ms: u64,
        defaults: EffectiveLimits,
    ) -> Sessions {
        // The pool starts with the shape of a `python` session asking nothing of its own.
        let default = SessionShape {
            runtime: Some(Runtime::Python),
            ttl_ms: sandbox_ttl_ms(&settings, settings.ceilings.ttl_s),
            ..SessionShape::default()
        };
        let pool = SessionPool::new(engine.clone(), settings, (default, defaults.memory_mb));
        Sessions {
            pool: Arc::new(pool),
            name,
            engine,
            settings,
            queues,
            health,
            live: Arc::new(Mutex::new(HashMap::new())),
            max_call_timeout_ms,
            tasks: Mutex::new(Vec::new()),
            stop_reading: watch::channel(false).0,
        }
    }

    /// Starts the calls readers, one per queue partition, and the pool's filling. Returns
    /// once every reader has taken its start from Redis, so a call added to a session opened
    /// from then on is read ([`session_calls`](crate::node::session_calls)); waits while Redis
    /// is away, unless the node is asked to stop first.
    pub(crate) async fn start(self: &Arc<Self>, node_stop: &mut watch::Receiver<StopLevel>) {
        let me = self.clone();
        let route: Route = Arc::new(move |queue: &Queue, payload: &[u8]| {
            me.route(queue, payload, me.max_call_timeout_ms);
        });
        let readers = session_calls::start(
            &self.queues,
            &self.name,
            &self.health,
            node_stop,
            &self.stop_reading,
            route,
        )
        .await;
        let Some(readers) = readers else {
            return;
        };
        self.tasks.lock().expect("tasks lock").extend(readers);
        // After the readers: its first preparation must not hold up their start.
        let live = self.live.clone();
        let usage = Arc::new(move || {
            let l = live.lock().expect("live lock");
            (l.len(), l.values().map(|e| e.memory_mb).sum())
        });
        let task = tokio::spawn(self.pool.clone().run(usage));
        self.tasks.lock().expect("tasks lock").push(task);
    }

    async fn open_one(
        self: &Arc<Self>,
        shared: &Shared,
        d: Delivery,
        permits: Permits,
        outbox: Outbox,
    ) {
        let Permits { admission, hold } = permits;
        drop(admission);
        let Ok(job) = d.job.clone() else {
            return;
        };
        let refuse = |d: Delivery, status: Status, why: String, hold| {
            tracing::info!(queue = d.queue, "session {} not opened: {why}", d.id);
            let result = result_of(shared, &d, Outcome::not_run(status, why));
            outbox.complete(d, result, hold);
        };
        let spec = job.session.unwrap_or_default();
        let checked = shared
            .config
            .ceilings
            .check(&job)
            .and_then(|()| self.settings.ceilings.check(&spec));
        if let Err(e) = checked {
            return refuse(d, Status::Invalid, e.to_string(), hold);
        }
        let Some(queue) = self.queues.get(&d.queue, d.partition).cloned() else {
            return refuse(d, Status::Error, "not a queue of this node".into(), hold);
        };
        let defaults = shared
            .config
            .ceilings
            .clamp_defaults(&EffectiveLimits::default());
        let limits = job.limits.resolve(&defaults);
        let (ttl_s, idle_s) = self.settings.ceilings.resolve(&spec);
        let sandbox_spec = SessionSpec {
            limits: job.limits,
            env: job.env.clone(),
            files: job.files.clone(),
            network: job.network,
            runtime: job.runtime,
            ttl_ms: sandbox_ttl_ms(&self.settings, ttl_s),
        };
        let shape = SessionShape::of(&sandbox_spec);
        let prepared = shape.as_ref().and_then(|s| self.pool.take(s));
        if let Err(why) = self.reserve(&d.id, limits.memory_mb) {
            if let Some(p) = prepared {
                tokio::spawn(p.discard());
            }
            return refuse(d, Status::Error, why, hold);
        }
        let (opened, sandbox_deadline) = self.open_sandbox(&d.id, prepared, &sandbox_spec).await;
        if let Some(shape) = shape {
            self.pool.want(shape, limits.memory_mb);
        }
        let session = match opened {
            Ok(s) => s,
            Err(e) => {
                self.release(&d.id);
                let status = match e {
                    OpenError::Invalid(_) => Status::Invalid,
                    OpenError::Failed(_) => Status::Error,
                };
                return refuse(d, status, e.to_string(), hold);
            }
        };
        let open = Opening {
            job: &job,
            ttl_s,
            idle_s,
            output_bytes: limits.output_bytes,
            memory_mb: limits.memory_mb,
            sandbox_ttl_ms: sandbox_spec.ttl_ms,
            fork: (Arc::downgrade(self), sandbox_spec),
            sandbox_deadline,
        };
        // Calls may come as soon as the record is stored: they wait in the channel.
        let (tx, rx) = mpsc::unbounded_channel();
        if let Some(e) = self.live.lock().expect("live lock").get_mut(&d.id) {
            e.to_task = Some(tx);
        }
        match self.record(shared, &queue, &d, &session, &open).await {
            Some(setup) => {
                drop(hold);
                shared.held.remove(&d.queue, d.partition, &d.entry_id);
                self.go_live(queue, session, setup, rx);
            }
            None => {
                drop(hold);
                shared.held.remove(&d.queue, d.partition, &d.entry_id);
                let _ = session.kill().await;
                self.release(&d.id);
            }
        }
    }

    /// Stores the create job's result and the session's record; retried while Redis is away.
    /// `None` when the session must not go live (another delivery answered it first, or the
    /// node stops meanwhile).
    async fn record(
        &self,
        shared: &Shared,
        queue: &Queue,
        d: &Delivery,
        session: &SandboxSession,
        open: &Opening<'_>,
    ) -> Option<TaskSetup> {
        let created_ms = forkbox_queue::now_ms();
        let expires_ms = created_ms + open.ttl_s * 1000;
        let mut result = result_of(shared, d, ok_outcome(session));
        result.session = Some(SessionOpened {
            id: d.id.clone(),
            node: self.name.clone(),
            expires_ms,
            idle_s: open.idle_s,
            runtime: session.runtime().cloned(),
        });
        let mut spec = serde_json::to_value(open.job).unwrap_or_default();
        if let Some(o) = spec.as_object_mut() {
            o.remove("files");
        }
        let runtime = open.job.runtime.map(|r| r.as_str()).unwrap_or_default();
        let fields = [
            ("node", self.name.clone()),
            ("state", "live".to_owned()),
            ("created_ms", created_ms.to_string()),
            ("expires_ms", expires_ms.to_string()),
            ("idle_s", open.idle_s.to_string()),
            ("last_call_ms", created_ms.to_string()),
            ("spec", spec.to_string()),
            ("runtime", runtime.to_owned()),
            ("memory_mb", open.memory_mb.to_string()),
        ];
        let mut backoff = Backoff::default();
        loop {
            match queue
                .open_session_record(d, &result, expires_ms, &fields)
                .await
            {
                Ok(Completion::Stored) => break,
                Ok(other) => {
                    tracing::info!(
                        queue = d.queue,
                        "session {}: its create job was answered already ({other:?})",
                        d.id
                    );
                    return None;
                }
                Err(e) if e.is_connection() => {
                    self.health.failed("opening a session", &e);
                    if !shared.pause(backoff.next_delay()).await {
                        return None;
                    }
                }
                Err(e) => {
                    tracing::error!(queue = d.queue, "session {}: {e}", d.id);
                    return None;
                }
            }
        }
        self.health.ok();
        let (sessions, sandbox_spec) = open.fork.clone();
        let rights = Arc::new(ForkRights {
            sessions,
            engine: self.engine.clone(),
            spec: sandbox_spec,
            spec_json: spec.to_string(),
            ttl_s: open.ttl_s,
            sandbox_ttl_ms: open.sandbox_ttl_ms,
        });
        Some(TaskSetup {
            sid: d.id.clone(),
            parent: None,
            fork: Some(rights.clone()),
            checkpointer: Some(rights),
            made_by: None,
            from_checkpoint: None,
            max_checkpoints: self.settings.max_checkpoints,
            node: self.name.clone(),
            created_ms,
            expires_ms,
            idle_s: open.idle_s,
            output_bytes: open.output_bytes,
            memory_mb: open.memory_mb,
            runtime: runtime.to_owned(),
            sandbox_deadline: open.sandbox_deadline,
            ceilings: self.settings.ceilings,
            health: self.health.clone(),
        })
    }

    /// Starts the session's task and routes its calls to it.
    fn go_live(
        &self,
        queue: Queue,
        session: SandboxSession,
        setup: TaskSetup,
        rx: mpsc::UnboundedReceiver<Cmd>,
    ) {
        let sid = setup.sid.clone();
        ::metrics::counter!(m::SESSIONS_CREATED).increment(1);
        tracing::info!(queue = queue.name(), "session {sid} open");
        let task = SessionTask::new(setup, queue, session, rx);
        let live = self.live_handle();
        let handle = tokio::spawn(async move {
            let reason = task.run(|| live(&sid)).await;
            ::metrics::counter!(m::SESSIONS_ENDED, "reason" => reason.as_str()).increment(1);
        });
        self.tasks.lock().expect("tasks lock").push(handle);
    }

    /// A function that forgets a session once its task ended (its capacity released).
    fn live_handle(&self) -> impl Fn(&str) + Send + 'static {
        let (live, pool) = (self.live.clone(), self.pool.clone());
        move |sid: &str| {
            let mut l = live.lock().expect("live lock");
            l.remove(sid);
            ::metrics::gauge!(m::SESSIONS_LIVE).set(l.len() as f64);
            drop(l);
            pool.notify();
        }
    }

    /// Opens the session's sandbox, from `prepared` when there is one (fresh when its
    /// hand-over fails), and says when its watchdog ends it at the latest.
    async fn open_sandbox(
        &self,
        sid: &str,
        prepared: Option<crate::sandbox::PreparedSession>,
        spec: &SessionSpec,
    ) -> (Result<SandboxSession, OpenError>, Instant) {
        if let Some(p) = prepared {
            let deadline = p.deadline();
            match p.hand_over(&self.engine, spec).await {
                Ok(s) => {
                    ::metrics::counter!(m::SESSIONS_FROM_POOL).increment(1);
                    return (Ok(s), deadline);
                }
                Err(e) => tracing::info!("session {sid}: opened fresh: {e}"),
            }
        }
        let deadline = Instant::now() + Duration::from_millis(spec.ttl_ms);
        (self.engine.open_session(spec.clone()).await, deadline)
    }

    /// Reserves room for a session of `memory_mb`, or says which limit refuses it; prepared
    /// sandboxes give up the room it needs.
    fn reserve(&self, sid: &str, memory_mb: u64) -> Result<(), String> {
        let mut live = self.live.lock().expect("live lock");
        let used: u64 = live.values().map(|e| e.memory_mb).sum();
        if let Some(why) = capacity_refusal(&self.settings, &self.name, live.len(), used, memory_mb)
        {
            return Err(why);
        }
        self.pool.make_room(live.len() + 1, used + memory_mb);
        live.insert(
            sid.to_owned(),
            Entry {
                memory_mb,
                to_task: None,
            },
        );
        ::metrics::gauge!(m::SESSIONS_LIVE).set(live.len() as f64);
        Ok(())
    }

    fn release(&self, sid: &str) {
        let mut live = self.live.lock().expect("live lock");
        live.remove(sid);
        ::metrics::gauge!(m::SESSIONS_LIVE).set(live.len() as f64);
        drop(live);
        self.pool.notify();
    }

    /// Hands one call to its session's task, or answers it at once when it cannot run.
    fn route(&self, queue: &Queue, payload: &[u8], max_timeout_ms: u64) {
        let call = match Call::parse(payload, max_timeout_ms) {
            Ok(call) => call,
            Err(e) => {
                match lenient_id(payload) {
                    Some(cid) => spawn_reply(
                        queue,
                        cid,
                        Event::error(ErrorReason::Invalid, e.to_string()),
                    ),
                    None => tracing::warn!(
                        queue = queue.name(),
                        "a session call without a usable id: {e}"
                    ),
                }
                return;
            }
        };
        ::metrics::counter!(m::SESSION_CALLS, "op" => call.op().as_str()).increment(1);
        let to = self
            .live
            .lock()
            .expect("live lock")
            .get(&call.session)
            .and_then(|e| e.to_task.clone());
        let refused = match to {
            Some(to) => to
                .send(Cmd::Call(Box::new(call), Instant::now()))
                .err()
                .map(|e| match e.0 {
                    Cmd::Call(c, _) => *c,
                    Cmd::Stop(..) => unreachable!("only calls are sent here"),
                }),
            None => Some(call),
        };
        if let Some(call) = refused {
            let why = format!(
                "session ended: session {} is not live on node {}",
                call.session, self.name
            );
            // A record that still says live here is a previous life's of this node name (a
            // restart within the heartbeat's TTL): it is ended as lost, so later calls say so.
            let event = Event::error(ErrorReason::SessionEnded, why);
            let (queue, node) = (queue.clone(), self.name.clone());
            tokio::spawn(async move {
                let ended = queue
                    .end_session_record(
                        &call.session,
                        &node,
                        forkbox_queue::EndReason::Lost,
                        std::slice::from_ref(&call.id),
                        &event,
                    )
                    .await;
                if let Err(e) = ended {
                    tracing::warn!("answering call {}: {e}", call.id);
                }
            });
        }
    }

    /// Ends every session (`node_stopped`) and waits for their records, before the node
    /// removes its heartbeat.
    pub(crate) async fn stop_all(&self) {
        let _ = self.stop_reading.send(true);
        self.pool.stop().await;
        let tasks: Vec<_> = {
            let live = self.live.lock().expect("live lock");
            for e in live.values() {
                if let Some(to) = &e.to_task {
                    let _ = to.send(Cmd::Stop(
                        forkbox_queue::EndReason::NodeStopped,
                        "the node stopped".into(),
                    ));
                }
            }
            std::mem::take(&mut *self.tasks.lock().expect("tasks lock"))
        };
        let n = self.live.lock().expect("live lock").len();
        if n > 0 {
            tracing::info!("ending {n} session(s): the node stops");
        }
        let _ = tokio::time::timeout(STOP_WAIT, futures_join(tasks)).await;
    }
}

impl BranchSeats for Sessions {
    fn reserve_branches(&self, sids: &[String], memory_mb: u64) -> Result<(), usize> {
        let mut live = self.live.lock().expect("live lock");
        let used: u64 = live.values().map(|e| e.memory_mb).sum();
        let fit = branches_that_fit(&self.settings, live.len(), used, memory_mb, sids.len());
        if fit < sids.len() {
            return Err(fit);
        }
        for sid in sids {
            let entry = Entry {
                memory_mb,
                to_task: None,
            };
            live.insert(sid.clone(), entry);
        }
        ::metrics::gauge!(m::SESSIONS_LIVE).set(live.len() as f64);
        Ok(())
    }

    fn release_branch(&self, sid: &str) {
        self.release(sid);
    }

    fn start_branch(&self, queue: Queue, session: SandboxSession, setup: TaskSetup) {
        let (tx, rx) = mpsc::unbounded_channel();
        if let Some(e) = self.live.lock().expect("live lock").get_mut(&setup.sid) {
            e.to_task = Some(tx);
        }
        self.go_live(queue, session, setup, rx);
    }
}

async fn futures_join(tasks: Vec<JoinHandle<()>>) {
    for t in tasks {
        let _ = t.await;
    }
}

impl SessionOpener for Sessions {
    /// Opens the session the create job creates, in a task of its own; its admission is given
    /// back once it is open or refused.
    fn open(self: Arc<Self>, shared: Arc<Shared>, queued: Queued) {
        let Queued {
            d,
            permits,
            outbox,
            unfinished,
        } = queued;
        tokio::spawn(async move {
            self.open_one(&shared, d, permits, outbox).await;
            drop(unfinished);
        });
    }
}

/// What a session is opened with, beside its sandbox.
struct Opening<'a> {
    job: &'a Job,
    ttl_s: u64,
    idle_s: u64,
    output_bytes: u64,
    memory_mb: u64,
    /// The sandbox's own deadline from its start, in ms (a branch's counts from its fork).
    sandbox_ttl_ms: u64,
    /// What the session's task needs to fork it.
    fork: (std::sync::Weak<Sessions>, SessionSpec),
    /// When the sandbox's watchdog ends it at the latest.
    sandbox_deadline: Instant,
}

/// The deadline of a session's sandbox: its ttl's ceiling twice, so that `set_timeout` can
/// move the session's end later, and a prepared sandbox that waited up to the ceiling still
/// outlives any session's ttl.
fn sandbox_ttl_ms(settings: &SessionSettings, ttl_s: u64) -> u64 {
    (settings.ceilings.ttl_s * 2_000)
        .max(ttl_s * 1000)
        .min(forkbox_queue::schema::MAX_TIMEOUT_MS)
}

/// A create job's `ok` outcome: nothing ran but the session's sandbox.
fn ok_outcome(session: &SandboxSession) -> Outcome {
    let mut outcome = Outcome::not_run(Status::Ok, "");
    outcome.exit_code = 0;
    outcome.error = None;
    outcome.runtime = session.runtime().cloned();
    outcome
}

fn result_of(shared: &Shared, d: &Delivery, outcome: Outcome) -> JobResult {
    JobResult {
        enqueued_at_ms: d.enqueued_at_ms(),
        finished_at_ms: Some(forkbox_queue::now_ms()),
        ..JobResult::new(
            d.id.clone(),
            outcome,
            u32::try_from(d.deliveries).unwrap_or(u32::MAX),
            shared.name.clone(),
        )
    }
}

/// The `id` of a call that did not parse, when it is a usable one.
fn lenient_id(payload: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    let id = v.get("id")?.as_str()?;
    let ok = !id.is_empty()
        && id.len() <= forkbox_queue::schema::MAX_ID_LEN
        && id.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| id.to_owned())
}

/// Writes one terminal event for call `cid`, in the background (a few tries).
fn spawn_reply(queue: &Queue, cid: String, event: Event) {
    let queue = queue.clone();
    tokio::spawn(async move {
        let mut backoff = Backoff::default();
        for _ in 0..20 {
            match queue.push_events(&cid, std::slice::from_ref(&event)).await {
                Ok(()) => return,
                Err(e) if e.is_connection() => tokio::time::sleep(backoff.next_delay()).await,
                Err(e) => {
                    tracing::warn!("answering call {cid}: {e}");
                    return;
                }
            }
        }
    });
}
