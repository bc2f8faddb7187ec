//! One live session: the task that owns its sandbox, runs its calls one at a time in arrival
//! order, serves `interrupt`, `kill`, `info` and `set_timeout` at once, relays the
//! supervisor's frames as the call's events (checked: see
//! [`parse_frame`](forkbox_queue::session::parse_frame)), and ends the session at its ttl, its
//! idle timeout, a kill, a dead or unresponsive sandbox, or the node's stop. What goes to Redis
//! goes through the session's writer, in order, retried while Redis is away, so the task never
//! waits on Redis.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkbox_queue::session::{
    parse_frame, Call, CallOp, EndReason, ErrorReason, Event, SessionCeilings, BACKSTOP_GRACE_MS,
    CALL_QUEUE_LEN,
};
use forkbox_queue::Queue;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::node::health::{Backoff, RedisHealth};
use crate::node::metrics as m;
use crate::node::seam::Boxed;
use crate::node::session_relay::{CallOutput, Clocks};
use crate::sandbox::{EndReason as SandboxEnd, SandboxSession, SessionCheckpoint, SessionEnd};

/// What the node's call readers and its stop send a session's task.
pub(crate) enum Cmd {
    /// A call, and when the node read it.
    Call(Box<Call>, Instant),
    /// End the session.
    Stop(EndReason, String),
}

/// What a session's task starts from, beside its sandbox.
#[derive(Clone)]
pub(crate) struct TaskSetup {
    pub(crate) sid: String,
    /// The session it was forked from.
    pub(crate) parent: Option<String>,
    /// What serves a `fork` call (`None`: this session cannot be forked here).
    pub(crate) fork: Option<Arc<dyn Forker>>,
    /// What serves `checkpoint` and `restore` (`None`: not here).
    pub(crate) checkpointer: Option<Arc<dyn Checkpointer>>,
    /// How a session with a parent was made (`fork`, `restore`), and the checkpoint restored.
    pub(crate) made_by: Option<&'static str>,
    pub(crate) from_checkpoint: Option<String>,
    /// The most checkpoints the session may hold at once.
    pub(crate) max_checkpoints: usize,
    pub(crate) node: String,
    pub(crate) created_ms: u64,
    pub(crate) expires_ms: u64,
    pub(crate) idle_s: u64,
    pub(crate) output_bytes: u64,
    pub(crate) memory_mb: u64,
    pub(crate) runtime: String,
    /// The sandbox's own deadline: `set_timeout` cannot move the end past it.
    pub(crate) sandbox_deadline: Instant,
    pub(crate) ceilings: SessionCeilings,
    pub(crate) health: Arc<RedisHealth>,
}

/// A session's fork, as its task sees it (the node's side is `node::session_fork`): the
/// fields of the `fork` call's result.
pub(crate) trait Forker: Send + Sync {
    fn fork<'a>(
        &'a self,
        parent: &'a mut SandboxSession,
        setup: &'a TaskSetup,
        queue: &'a Queue,
        n: usize,
    ) -> Boxed<'a, Map<String, Value>>;
}

/// A session's checkpoints, as its task sees them (the node's side is
/// `node::session_checkpoint`).
pub(crate) trait Checkpointer: Send + Sync {
    /// Takes a checkpoint of the session; the error names why not.
    fn checkpoint<'a>(
        &'a self,
        session: &'a mut SandboxSession,
    ) -> Boxed<'a, Result<SessionCheckpoint, String>>;
    /// Restores `cp` (of id `id`) as a new session, reserved, recorded and started: the
    /// fields of the `restore` call's result.
    fn restore<'a>(
        &'a self,
        cp: &'a mut SessionCheckpoint,
        id: &'a str,
        setup: &'a TaskSetup,
        queue: &'a Queue,
    ) -> Boxed<'a, Map<String, Value>>;
}

/// A checkpoint the session holds.
struct Held {
    id: String,
    created_ms: u64,
    expires_ms: u64,
    expires: Instant,
    cp: SessionCheckpoint,
}

/// The node's session capacity and tasks, as a fork's branches need them (`node::session`).
pub(crate) trait BranchSeats: Send + Sync {
    /// Reserves room for the branches `sids`, all or none; `Err(k)`: only `k` fit.
    fn reserve_branches(&self, sids: &[String], memory_mb: u64) -> Result<(), usize>;
    fn release_branch(&self, sid: &str);
    /// Starts the task of a branch, reserved and recorded already.
    fn start_branch(&self, queue: Queue, session: SandboxSession, setup: TaskSetup);
}

/// The call running in the sandbox.
struct Running {
    call: Call,
    read_at: Instant,
    output: CallOutput,
}

pub(crate) struct SessionTask {
    setup: TaskSetup,
    session: SandboxSession,
    calls: mpsc::UnboundedReceiver<Cmd>,
    clocks: Clocks,
    waiting: VecDeque<(Call, Instant)>,
    running: Option<Running>,
    out: mpsc::UnboundedSender<Out>,
    writer: tokio::task::JoinHandle<()>,
    served: u64,
    execution_count: u64,
    /// The sessions forked from this one, oldest first.
    children: Vec<String>,
    /// Its live checkpoints, oldest first.
    checkpoints: Vec<Held>,
    /// The answer to the `kill` call that ends it: sent once the session's room on the node
    /// is given back, so that a create sent on that answer finds it.
    kill_answer: Option<(String, Event)>,
    queue: Queue,
}

/// Why a session ends, and the words for it.
type Ending = (EndReason, String);

impl SessionTask {
    pub(crate) fn new(
        setup: TaskSetup,
        queue: Queue,
        session: SandboxSession,
        calls: mpsc::UnboundedReceiver<Cmd>,
    ) -> SessionTask {
        let now = Instant::now();
        let ttl_left = setup.expires_ms.saturating_sub(forkbox_queue::now_ms());
        let clocks = Clocks {
            expires: now + Duration::from_millis(ttl_left),
            idle: Duration::from_secs(setup.idle_s),
            last_activity: now,
            backstop: None,
        };
        let (out, rx) = mpsc::unbounded_channel();
        let writer = tokio::spawn(write(
            queue.clone(),
            setup.sid.clone(),
            setup.node.clone(),
            rx,
            setup.health.clone(),
        ));
        SessionTask {
            setup,
            session,
            calls,
            clocks,
            waiting: VecDeque::new(),
            running: None,
            out,
            writer,
            served: 0,
            execution_count: 0,
            children: Vec::new(),
            checkpoints: Vec::new(),
            kill_answer: None,
            queue,
        }
    }

    /// Serves the session until it ends; returns why it ended.
    /// Serves the session until it ends; `release` gives its room on the node back, once its
    /// sandbox is killed and before its end is told to anyone.
    pub(crate) async fn run(mut self, release: impl FnOnce()) -> EndReason {
        let ending = self.serve().await;
        self.end(ending, release).await
    }

    async fn serve(&mut self) -> Ending {
        loop {
            if let Err(ending) = self.start_next().await {
                return ending;
            }
            let busy = self.running.is_some() || !self.waiting.is_empty();
            if let Some(ending) = self.clocks.due(Instant::now(), busy) {
                return ending;
            }
            let next = self.clocks.next(busy);
            let next = self
                .checkpoints
                .iter()
                .map(|h| h.expires)
                .fold(next, Instant::min);
            let wake = tokio::time::Instant::from_std(next);
            let step = tokio::select! {
                cmd = self.calls.recv() => match cmd {
                    Some(Cmd::Call(call, at)) => self.take(*call, at),
                    Some(Cmd::Stop(reason, why)) => Err((reason, why)),
                    None => Err((EndReason::NodeStopped, "the node stopped".into())),
                },
                frame = self.session.recv() => match frame {
                    Ok(frame) => self.frame(&frame),
                    Err(end) => Err(ending_of(&end)),
                },
                _ = tokio::time::sleep_until(wake) => Ok(()),
            };
            if let Err(ending) = step {
                return ending;
            }
            self.expire_checkpoints();
        }
    }

    /// Takes one call: served now when it is immediate, else queued behind the running one.
    fn take(&mut self, call: Call, at: Instant) -> Result<(), Ending> {
        self.clocks.last_activity = Instant::now();
        self.touch(
            vec![("last_call_ms", forkbox_queue::now_ms().to_string())],
            None,
        );
        let op = call.op();
        match op {
            CallOp::Interrupt => {
                self.session.interrupt();
                self.answer(&call, at, Map::new());
            }
            CallOp::Kill => {
                let answer = self.answer_event(&call, at, Map::new());
                self.kill_answer = Some((call.id.clone(), answer));
                return Err((EndReason::Killed, "killed by a kill call".into()));
            }
            CallOp::Info => {
                let info = self.info();
                self.answer(&call, at, Map::from_iter([("info".to_owned(), info)]));
            }
            CallOp::SetTimeout => self.set_timeout(&call, at),
            _ if self.waiting.len() >= CALL_QUEUE_LEN => {
                let why = format!("session busy: {CALL_QUEUE_LEN} calls wait already");
                self.emit(&call.id, Event::error(ErrorReason::Busy, why));
            }
            _ => self.waiting.push_back((call, at)),
        }
        Ok(())
    }

    /// Sends the next waiting call to the supervisor when none runs.
    async fn start_next(&mut self) -> Result<(), Ending> {
        if self.running.is_some() {
            return Ok(());
        }
        let Some((call, read_at)) = self.waiting.pop_front() else {
            return Ok(());
        };
        if matches!(
            call.op(),
            CallOp::Checkpoint | CallOp::Restore | CallOp::DropCheckpoint
        ) {
            let fields = self.checkpoint_call(&call).await;
            self.answer(&call, read_at, fields);
            return Ok(());
        }
        if call.op() == CallOp::Fork {
            // Served by the node between the interpreter's cells (its frames are the node's).
            let n = call.n.unwrap_or(1) as usize;
            let fields = match self.setup.fork.clone() {
                Some(forker) => {
                    forker
                        .fork(&mut self.session, &self.setup, &self.queue, n)
                        .await
                }
                None => Map::from_iter([
                    ("ok".to_owned(), json!(false)),
                    ("error".to_owned(), json!("this session cannot be forked")),
                ]),
            };
            if let Some(ids) = fields.get("children").and_then(Value::as_array) {
                let ids = ids.iter().filter_map(|v| v.as_str().map(str::to_owned));
                self.children.extend(ids);
            }
            self.answer(&call, read_at, fields);
            return Ok(());
        }
        let timeout_ms = call.timeout_ms(u64::MAX);
        let mut frame = serde_json::to_value(&call).expect("a call serializes");
        frame["timeout_ms"] = json!(timeout_ms);
        let bytes = frame.to_string();
        self.clocks.backstop =
            Some(Instant::now() + Duration::from_millis(timeout_ms + BACKSTOP_GRACE_MS));
        self.running = Some(Running {
            call,
            read_at,
            output: CallOutput::new(self.setup.output_bytes),
        });
        // A supervisor gone makes its end come out of `recv` next.
        let _ = self.session.send(bytes.as_bytes()).await;
        Ok(())
    }

    /// Serves `checkpoint`, `restore` and `drop_checkpoint` between the interpreter's cells:
    /// the fields of the call's result.
    async fn checkpoint_call(&mut self, call: &Call) -> Map<String, Value> {
        let failed = |why: String| {
            Map::from_iter([
                ("ok".to_owned(), json!(false)),
                ("error".to_owned(), json!(why)),
            ])
        };
        let Some(checkpointer) = self.setup.checkpointer.clone() else {
            return failed("this session cannot be checkpointed".into());
        };
        let wanted = call.checkpoint.as_deref().unwrap_or_default();
        let unknown = || {
            failed(format!(
                "checkpoint {wanted} is unknown: it expired, was dropped, or was never this \
                 session's"
            ))
        };
        match call.op() {
            CallOp::Restore => {
                let Some(held) = self.checkpoints.iter_mut().find(|h| h.id == wanted) else {
                    return unknown();
                };
                let fields = checkpointer
                    .restore(&mut held.cp, &held.id, &self.setup, &self.queue)
                    .await;
                if let Some(id) = fields.get("id").and_then(Value::as_str) {
                    self.children.push(id.to_owned());
                }
                fields
            }
            CallOp::DropCheckpoint => {
                let before = self.checkpoints.len();
                self.checkpoints.retain(|h| h.id != wanted);
                if self.checkpoints.len() == before {
                    return unknown();
                }
                self.list_checkpoints();
                Map::new()
            }
            _ => {
                let max = self.setup.max_checkpoints;
                if self.checkpoints.len() >= max {
                    return failed(format!(
                        "the session holds {max} checkpoints, this node's most \
                         (--max-session-checkpoints): drop one first"
                    ));
                }
                let ttl = call
                    .ttl_s
                    .unwrap_or(forkbox_queue::session::DEFAULT_CHECKPOINT_TTL_S)
                    .min(self.setup.ceilings.ttl_s);
                if call.ttl_s.is_some_and(|t| t > self.setup.ceilings.ttl_s) {
                    return failed(format!(
                        "ttl_s: {} is over this node's maximum of {}",
                        call.ttl_s.unwrap_or_default(),
                        self.setup.ceilings.ttl_s
                    ));
                }
                let cp = match checkpointer.checkpoint(&mut self.session).await {
                    Ok(cp) => cp,
                    Err(why) => return failed(why),
                };
                let created_ms = forkbox_queue::now_ms();
                let held = Held {
                    id: forkbox_queue::session::new_checkpoint_id(&self.setup.sid),
                    created_ms,
                    expires_ms: created_ms + ttl * 1000,
                    expires: Instant::now() + Duration::from_secs(ttl),
                    cp,
                };
                let info = json!({
                    "id": held.id,
                    "created_ms": held.created_ms,
                    "expires_ms": held.expires_ms,
                    "disk_bytes": held.cp.disk.bytes,
                });
                self.checkpoints.push(held);
                self.list_checkpoints();
                Map::from_iter([("checkpoint".to_owned(), info)])
            }
        }
    }

    /// Ends the checkpoints past their ttl.
    fn expire_checkpoints(&mut self) {
        let now = Instant::now();
        let before = self.checkpoints.len();
        self.checkpoints.retain(|h| h.expires > now);
        if self.checkpoints.len() != before {
            self.list_checkpoints();
        }
    }

    /// The live checkpoints, as `info` and the session's hash list them.
    fn checkpoint_list(&self) -> Value {
        let list = self
            .checkpoints
            .iter()
            .map(|h| json!({"id": h.id, "created_ms": h.created_ms, "expires_ms": h.expires_ms}));
        Value::Array(list.collect())
    }

    fn list_checkpoints(&self) {
        self.touch(
            vec![("checkpoints", self.checkpoint_list().to_string())],
            None,
        );
    }

    /// Relays one frame of the supervisor as an event of the running call.
    fn frame(&mut self, frame: &[u8]) -> Result<(), Ending> {
        let violation = |why: String| (EndReason::Crashed, format!("protocol violation: {why}"));
        let Some(running) = self.running.as_mut() else {
            return Err(violation("a frame while no call runs".into()));
        };
        let event = parse_frame(frame, &running.call.id).map_err(violation)?;
        let Some(event) = running.output.pass(event) else {
            return Ok(());
        };
        let terminal = event.is_terminal();
        if let Event::Result(r) = &event {
            if let Some(n) = r.get("execution_count").and_then(Value::as_u64) {
                self.execution_count = n;
            }
        }
        let cid = running.call.id.clone();
        if terminal {
            let running = self.running.take().expect("checked above");
            record(running.call.op(), running.read_at);
            self.clocks.backstop = None;
            self.clocks.last_activity = Instant::now();
            self.served += 1;
        }
        self.emit(&cid, event);
        Ok(())
    }

    /// Answers an immediate call with a `result` made by the node.
    fn answer(&mut self, call: &Call, at: Instant, fields: Map<String, Value>) {
        let event = self.answer_event(call, at, fields);
        self.emit(&call.id, event);
    }

    /// The `result` the node makes for an immediate call, counted as served.
    fn answer_event(&mut self, call: &Call, at: Instant, fields: Map<String, Value>) -> Event {
        let usage = self.session.usage();
        let mut r = Map::from_iter([
            ("ok".to_owned(), json!(true)),
            ("error".to_owned(), Value::Null),
            ("wall_ms".to_owned(), json!(at.elapsed().as_millis() as u64)),
            ("cpu_ms".to_owned(), json!(0)),
            ("session_memory_kb".to_owned(), json!(usage.memory_kb)),
        ]);
        r.extend(fields);
        record(call.op(), at);
        self.served += 1;
        Event::Result(r)
    }

    fn set_timeout(&mut self, call: &Call, at: Instant) {
        if let Err(e) = self.setup.ceilings.check_call(call) {
            let r = Map::from_iter([
                ("ok".to_owned(), json!(false)),
                ("error".to_owned(), json!(e.to_string())),
            ]);
            return self.answer(call, at, r);
        }
        let mut expires_ms = None;
        if let Some(ttl) = call.ttl_s {
            let until = Instant::now() + Duration::from_secs(ttl);
            if until > self.setup.sandbox_deadline {
                let why = format!(
                    "ttl_s: {ttl} s from now is past this session's longest life (its sandbox \
                     ends in {} s)",
                    self.setup
                        .sandbox_deadline
                        .saturating_duration_since(Instant::now())
                        .as_secs()
                );
                let r = Map::from_iter([
                    ("ok".to_owned(), json!(false)),
                    ("error".to_owned(), json!(why)),
                ]);
                return self.answer(call, at, r);
            }
            self.clocks.expires = until;
            let ms = forkbox_queue::now_ms() + ttl * 1000;
            self.setup.expires_ms = ms;
            expires_ms = Some(ms);
        }
        let mut fields = Vec::new();
        if let Some(idle) = call.idle_s {
            self.clocks.idle = Duration::from_secs(idle);
            self.setup.idle_s = idle;
            fields.push(("idle_s", idle.to_string()));
        }
        self.touch(fields, expires_ms);
        let r = Map::from_iter([
            ("expires_ms".to_owned(), json!(self.setup.expires_ms)),
            ("idle_s".to_owned(), json!(self.setup.idle_s)),
        ]);
        self.answer(call, at, r);
    }

    /// The session's record and usage, as the `info` op reports it.
    fn info(&self) -> Value {
        let usage = self.session.usage();
        json!({
            "id": self.setup.sid,
            "node": self.setup.node,
            "state": "live",
            "created_ms": self.setup.created_ms,
            "expires_ms": self.setup.expires_ms,
            "idle_s": self.setup.idle_s,
            "runtime": self.setup.runtime,
            "memory_mb": self.setup.memory_mb,
            "memory_kb": usage.memory_kb,
            "cpu_ms": usage.cpu_ms,
            "disk_bytes": usage.disk_bytes,
            "disk_mb": self.session.disk_mb(),
            "calls_served": self.served,
            "calls_waiting": self.waiting.len() + usize::from(self.running.is_some()),
            "execution_count": self.execution_count,
            "parent": self.setup.parent,
            "made_by": self.setup.made_by,
            "checkpoint": self.setup.from_checkpoint,
            "children": self.children,
            "checkpoints": self.checkpoint_list(),
        })
    }

    fn emit(&self, cid: &str, event: Event) {
        let _ = self.out.send(Out::Event(cid.to_owned(), event));
    }

    fn touch(&self, fields: Vec<(&'static str, String)>, expires_ms: Option<u64>) {
        let _ = self.out.send(Out::Touch(fields, expires_ms));
    }

    /// Kills the sandbox, gives its room back (`release`), then records the end, ends every
    /// call in flight or waiting and answers the `kill` call that ended it, if one did.
    async fn end(mut self, (reason, why): Ending, release: impl FnOnce()) -> EndReason {
        if !self.checkpoints.is_empty() {
            // They live in the session's sandbox: they end with it.
            self.checkpoints.clear();
            self.list_checkpoints();
        }
        let SessionTask {
            setup,
            session,
            waiting,
            running,
            out,
            writer,
            kill_answer,
            ..
        } = self;
        let _ = session.kill().await;
        release();
        tracing::info!("session {} ended: {} ({why})", setup.sid, reason.as_str());
        let calls: Vec<String> = running
            .map(|r| r.call.id)
            .into_iter()
            .chain(waiting.into_iter().map(|(c, _)| c.id))
            .collect();
        let message = format!("session ended: {} ({why})", reason.as_str());
        let event = Event::error(ErrorReason::SessionEnded, message);
        let _ = out.send(Out::End(reason, calls, event));
        if let Some((cid, answer)) = kill_answer {
            let _ = out.send(Out::Event(cid, answer));
        }
        drop(out);
        let _ = writer.await;
        reason
    }
}

/// Why a session whose sandbox ended by itself is over.
fn ending_of(end: &SessionEnd) -> Ending {
    match &end.reason {
        SandboxEnd::Ttl => (EndReason::Ttl, end.message()),
        _ => (EndReason::Crashed, end.message()),
    }
}

fn record(op: CallOp, read_at: Instant) {
    ::metrics::histogram!(m::SESSION_CALL_DURATION, "op" => op.as_str())
        .record(read_at.elapsed().as_secs_f64());
}

/// What a session's writer sends to Redis, in order.
enum Out {
    Event(String, Event),
    Touch(Vec<(&'static str, String)>, Option<u64>),
    End(EndReason, Vec<String>, Event),
}

/// How long the writer keeps trying one write while Redis is away.
const WRITE_PATIENCE: Duration = Duration::from_secs(60);

/// Writes a session's events and record changes in order; the events of one call that queue
/// up while a write is on its way go together in the next one.
async fn write(
    queue: Queue,
    sid: String,
    node: String,
    mut rx: mpsc::UnboundedReceiver<Out>,
    health: Arc<RedisHealth>,
) {
    let mut next = rx.recv().await;
    while let Some(out) = next.take() {
        let out = match out {
            Out::Event(cid, first) => {
                let mut events = vec![first];
                while let Ok(more) = rx.try_recv() {
                    match more {
                        Out::Event(c, e) if c == cid => events.push(e),
                        other => {
                            next = Some(other);
                            break;
                        }
                    }
                }
                Batch::Events(cid, events)
            }
            Out::Touch(fields, expires) => Batch::Touch(fields, expires),
            Out::End(reason, calls, event) => Batch::End(reason, calls, event),
        };
        let started = Instant::now();
        let mut backoff = Backoff::default();
        loop {
            let r = match &out {
                Batch::Events(cid, events) => queue.push_events(cid, events).await,
                Batch::Touch(fields, expires) => {
                    queue.update_session_record(&sid, fields, *expires).await
                }
                Batch::End(reason, calls, event) => queue
                    .end_session_record(&sid, &node, *reason, calls, event)
                    .await
                    .map(|_| ()),
            };
            match r {
                Ok(()) => break,
                Err(e) if e.is_connection() && started.elapsed() < WRITE_PATIENCE => {
                    health.failed("writing a session's events", &e);
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                Err(e) => {
                    tracing::warn!("session {sid}: a write to Redis was given up: {e}");
                    break;
                }
            }
        }
        if next.is_none() {
            next = rx.recv().await;
        }
    }
}

enum Batch {
    Events(String, Vec<forkbox_queue::Event>),
    Touch(Vec<(&'static str, String)>, Option<u64>),
    End(EndReason, Vec<String>, Event),
}
