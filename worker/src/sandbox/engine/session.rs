//! A session: a long-lived sandbox whose program is the session supervisor
//! (`runtime::session`), talked to in frames.
//!
//! A session's sandbox is a job's sandbox with three descriptors changed and nothing else:
//! fd 0 is a pipe from the node (instead of the stdin memfd), fd 1 a pipe to the node
//! (instead of the captured stdout), fd 2 the supervisor's diagnostics (capped). Payload,
//! hand-over, the zygote's events, the watchdog, cgroup placement, the init's budgets, usage
//! and the fold into an outcome are the job path's own. Its deadline is its ttl, so the
//! watchdog ends it at the ttl even if the node forgets; its limits are the sandbox's, so
//! `cpu_ms` is cumulative over the session and `memory_mb`, `pids`, `disk_mb`, `open_files`
//! hold across calls. It takes no slot of the engine, and the zygote does not count it as a
//! running job when it keeps spares ready, so jobs are never starved by sessions.
//!
//! Frames, both ways: a 4-byte big-endian length, then a JSON object of at most
//! [`MAX_FRAME`] bytes. What the supervisor sends is untrusted (the session's code can reach
//! its descriptors): a frame over the bound or not a JSON object ends the session
//! ([`EndReason::ProtocolViolation`]). The supervisor's first frame is its hello
//! (`{"kind": "ready", ...}`), awaited by [`Engine::open_session`].

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use forkbox_queue::schema::{
    EffectiveLimits, FileData, Job, Limits, Network, Outcome, OutputMode, Runtime, RuntimeUse,
    Status,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};

use super::event_loop::RunEvents;
use super::events::Unregister;
use super::outcome::{self, Observed, Terms};
use super::output;
use super::payload::{exec_args_limit, exec_bytes, memfd_with, pipe};
use super::run::files_past_disk;
use super::run_error::RunError;
use super::start::Engine;
use crate::sandbox::isolate::{memory, usage};
use crate::sandbox::kernel::clock::mono_ns;
use crate::sandbox::process::wire::ToZygote;
use crate::sandbox::runtime::session::SUPERVISOR_SOURCE;

/// Set in a fork's branch sandbox for its supervisor: its first kernel waits stopped for the
/// twin copy. Refused in a session's own environment.
pub(super) const TWIN_ENV: &str = "FORKBOX_SESSION_TWIN";

/// The largest frame either side may send, in bytes (the length prefix excluded).
pub const MAX_FRAME: usize = 1024 * 1024;

/// The supervisor's own diagnostics (its fd 2) kept per session, in bytes; the rest is read
/// and discarded, never a reason to end the session.
pub const DIAGNOSTICS_BYTES: u64 = 64 * 1024;

/// Frames read ahead of the node: past them the supervisor blocks on its fd 1.
const FRAMES_AHEAD: usize = 16;

/// How long the supervisor may take from the hand-over to its hello (its interpreter's start
/// when cold, the kernel's fork).
const HELLO_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// What a session's sandbox is made of.
#[derive(Debug, Clone, Default)]
pub struct SessionSpec {
    /// The sandbox's limits, held over the whole session (`cpu_ms` is cumulative).
    pub limits: Limits,
    /// Extra environment of the supervisor and everything it starts.
    pub env: BTreeMap<String, String>,
    /// Files written into `/work` before the supervisor starts.
    pub files: BTreeMap<String, FileData>,
    pub network: Option<Network>,
    /// `Some(Python)`: the supervisor (and so every `run_code`) runs in the warm interpreter;
    /// `None`: `python3` from the sandbox's root, cold.
    pub runtime: Option<Runtime>,
    /// The session's lifetime: the watchdog kills its sandbox this long after its start.
    pub ttl_ms: u64,
}

/// Why the engine could not open a session.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The spec is malformed or over the node's maximums: not worth a retry.
    #[error("{0}")]
    Invalid(String),
    /// The sandbox or its supervisor could not be set up.
    #[error("{0}")]
    Failed(String),
}

/// How a session's sandbox ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndReason {
    /// The supervisor exited by itself with this code.
    Exited { code: i32 },
    /// The supervisor was killed by a signal of its own doing.
    Signaled { signal: i32 },
    /// The watchdog killed it at its ttl.
    Ttl,
    /// [`SandboxSession::kill`] (or the session was dropped).
    Killed,
    /// Its memory went past `memory_mb` and the sandbox was killed.
    MemoryLimit,
    /// Its CPU time over the whole session went past `cpu_ms`.
    CpuLimit,
    /// It sent a frame over [`MAX_FRAME`] or one that is not a JSON object; the node ended it.
    ProtocolViolation(String),
    /// The sandbox failed (set-up, the zygote gone); the text says why.
    Failed(String),
}

impl EndReason {
    /// The protocol's short name for it (`docs/protocol.md`, "Ends"): a supervisor that
    /// exited or was killed by its own doing, a protocol violation and a failed sandbox are
    /// all `crashed` ([`SessionEnd::message`] says which).
    pub fn name(&self) -> &'static str {
        match self {
            EndReason::Exited { .. }
            | EndReason::Signaled { .. }
            | EndReason::ProtocolViolation(_)
            | EndReason::Failed(_) => "crashed",
            EndReason::Ttl => "ttl",
            EndReason::Killed => "killed",
            EndReason::MemoryLimit => "memory_limit",
            EndReason::CpuLimit => "cpu_limit",
        }
    }
}

/// How a session ended: why, and the sandbox's outcome (CPU time, peak memory, and the
/// supervisor's diagnostics in `stderr`).
#[derive(Debug, Clone)]
pub struct SessionEnd {
    pub reason: EndReason,
    pub outcome: Outcome,
}

impl SessionEnd {
    /// One line for logs and the protocol's `reason` text.
    pub fn message(&self) -> String {
        match &self.reason {
            EndReason::Exited { code } => format!("the session's supervisor exited with {code}"),
            EndReason::Signaled { signal } => {
                format!("the session's supervisor was killed by signal {signal}")
            }
            EndReason::Ttl => "the session reached its ttl".into(),
            EndReason::Killed => "the session was killed".into(),
            EndReason::MemoryLimit => format!(
                "the session went past its memory limit (peak {} KiB)",
                self.outcome.max_rss_kb
            ),
            EndReason::CpuLimit => format!(
                "the session used up its CPU time (cpu_ms, {} ms used)",
                self.outcome.cpu_ms
            ),
            EndReason::ProtocolViolation(why) => format!("protocol violation: {why}"),
            EndReason::Failed(why) => format!("the session's sandbox failed: {why}"),
        }
    }

    /// The fold of how the sandbox ended into why the session did.
    fn of(outcome: Outcome, violation: Option<String>) -> SessionEnd {
        let reason = match (violation, outcome.status) {
            (Some(why), _) => EndReason::ProtocolViolation(why),
            (None, Status::Timeout) => EndReason::Ttl,
            (None, Status::Cancelled) => EndReason::Killed,
            (None, Status::MemoryLimit) => EndReason::MemoryLimit,
            (None, Status::CpuLimit) => EndReason::CpuLimit,
            (None, Status::Signaled) => EndReason::Signaled {
                signal: outcome.signal.unwrap_or(0),
            },
            (None, Status::Ok | Status::Failed) => EndReason::Exited {
                code: outcome.exit_code,
            },
            (None, _) => EndReason::Failed(
                outcome
                    .error
                    .clone()
                    .unwrap_or_else(|| format!("status {:?}", outcome.status)),
            ),
        };
        SessionEnd { reason, outcome }
    }
}

/// What a live session uses now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionUsage {
    /// Memory its processes hold now (anonymous, shared and page tables), in KiB.
    pub memory_kb: u64,
    /// CPU time of its processes so far, reaped children included, in ms.
    pub cpu_ms: u64,
    /// Bytes its disk holds now (`/work`, `/tmp` and `/dev/shm` together), of
    /// [`SandboxSession::disk_mb`].
    pub disk_bytes: u64,
}

/// A live session: one owner (the node's session task) sends calls and receives events.
pub struct SandboxSession {
    to_supervisor: Arc<tokio::sync::Mutex<tokio::net::unix::pipe::Sender>>,
    frames: mpsc::Receiver<Vec<u8>>,
    end: watch::Receiver<Option<SessionEnd>>,
    kill: Option<oneshot::Sender<()>>,
    pids: Arc<Mutex<Pids>>,
    hello: serde_json::Value,
    runtime: Option<RuntimeUse>,
    /// The size of its disk, in MiB: the `disk_mb` it was opened with.
    disk_mb: u64,
}

/// The host pids of a session's init and supervisor, known at the hand-over or once the
/// zygote assigns its sandbox.
enum Pids {
    Known(Vec<i32>),
    Awaited(oneshot::Receiver<Vec<i32>>),
}

impl Engine {
    /// Opens a session: a sandbox (from the warm runtime's zygote when the spec's runtime is
    /// `python`, else the plain one, running `python3` from the root) whose program is the
    /// session supervisor, and waits for the supervisor's hello. Takes no slot.
    pub async fn open_session(&self, spec: SessionSpec) -> Result<SandboxSession, OpenError> {
        self.open_session_as(spec, false).await
    }

    /// [`Engine::open_session`], or with `twin` a branch's sandbox of a fork, whose first
    /// kernel waits stopped for the copy (set here, after the spec's checks, so that no
    /// session's own environment can ask for it).
    pub(super) async fn open_session_as(
        &self,
        spec: SessionSpec,
        twin: bool,
    ) -> Result<SandboxSession, OpenError> {
        let engine = match (spec.runtime, &self.runtime) {
            (Some(_), Some(runtime)) => runtime.as_ref().clone(),
            _ => self.clone(),
        };
        let mut job = engine.session_job(&spec)?;
        if twin {
            job.env.insert(TWIN_ENV.into(), "1".into());
        }
        let limits = job.limits.resolve(&engine.inner.config.defaults);
        if let Some(refused) = files_past_disk(&job, &limits) {
            return Err(OpenError::Invalid(refused.error.unwrap_or_default()));
        }
        let session = engine
            .start_session(&job, limits)
            .map_err(|e| OpenError::Failed(e.to_string()))?;
        session.hello_awaited().await
    }

    /// The job a session's sandbox runs: the supervisor, with the spec's limits, files,
    /// environment and network, and its ttl as the deadline; checked as any job is, but
    /// against the node's job timeout only by the node (its session ttl ceiling is its own).
    pub(super) fn session_job(&self, spec: &SessionSpec) -> Result<Job, OpenError> {
        if spec.env.contains_key(TWIN_ENV) {
            return Err(OpenError::Invalid(format!(
                "env: {TWIN_ENV} is reserved for the node (a fork's branches)"
            )));
        }
        let job = Job {
            argv: Some(vec![
                "python3".into(),
                "-c".into(),
                SUPERVISOR_SOURCE.into(),
            ]),
            env: spec.env.clone(),
            files: spec.files.clone(),
            limits: spec.limits,
            network: spec.network,
            runtime: spec.runtime,
            timeout_ms: Some(spec.ttl_ms),
            // The supervisor's diagnostics are capped, never a reason to end the session.
            output_mode: Some(OutputMode::Truncate),
            ..Job::default()
        };
        let unchecked_timeout = Job {
            timeout_ms: None,
            ..job.clone()
        };
        job.validate()
            .and_then(|()| self.inner.config.ceilings.check(&unchecked_timeout))
            .map_err(|e| OpenError::Invalid(e.to_string()))?;
        let (exec, limit) = (
            exec_bytes(&job, &self.inner.config.work_dir),
            exec_args_limit(),
        );
        if exec > limit {
            return Err(OpenError::Invalid(format!(
                "env: the supervisor and env take {exec} bytes at exec, over the {limit} bytes \
                 this host allows"
            )));
        }
        Ok(job)
    }

    /// The sandbox and its watch: the job path's payload and hand-over with the session's
    /// own descriptors, then a task that watches it to its end as a run's event loop does.
    pub(super) fn start_session(
        &self,
        job: &Job,
        limits: EffectiveLimits,
    ) -> Result<SandboxSession, RunError> {
        let inner = &self.inner;
        if !inner.alive.load(Ordering::Acquire) {
            return Err(RunError::ZygoteGone);
        }
        let (payload, runtime) = self.payload(job, limits);
        let payload_fd =
            memfd_with(&serde_json::to_vec(&payload).map_err(RunError::EncodePayload)?)?;
        let (calls_r, calls_w) = pipe()?;
        let (events_r, events_w) = pipe()?;
        let (diag_r, diag_w) = pipe()?;
        let (report_r, report_w) = pipe()?;
        let requested_ns = mono_ns();
        let fds = [
            payload_fd.as_fd(),
            calls_r.as_fd(),
            events_w.as_fd(),
            diag_w.as_fd(),
            report_w.as_fd(),
        ];
        let network = job.network.unwrap_or(inner.config.network_default);
        let (req, events, cgroup, pids) =
            self.hand_over(network, (job.timeout_ms(), None), true, &limits, &fds)?;
        drop((payload_fd, calls_r, events_w, diag_w, report_w));
        let to_supervisor = tokio::net::unix::pipe::Sender::from_owned_fd(calls_w)
            .map_err(|e| RunError::Pipe(io_errno(&e)))?;
        let (assigned_tx, assigned_rx) = oneshot::channel();
        let pids = match pids {
            Some(p) => Pids::Known(p),
            None => Pids::Awaited(assigned_rx),
        };
        let (kill_tx, kill_rx) = oneshot::channel();
        let (violation_tx, violation_rx) = oneshot::channel();
        let (frames_tx, frames) = mpsc::channel(FRAMES_AHEAD);
        let (end_tx, end) = watch::channel(None);
        tokio::spawn(read_frames(events_r, frames_tx, violation_tx));
        let terms = Terms {
            requested_ns,
            cpu_ms: limits.cpu_ms,
            memory_mb: limits.memory_mb,
            memory: payload.memory,
            runtime: runtime.clone(),
            output_mode: OutputMode::Truncate,
        };
        let watched = Watch {
            engine: self.clone(),
            req,
            events,
            cgroup,
            report_r,
            diag_r,
            limits,
            assigned: assigned_tx,
            kill: kill_rx,
            violation: violation_rx,
        };
        tokio::spawn(async move {
            let end = watched.run(terms).await;
            let _ = end_tx.send(Some(end));
        });
        Ok(SandboxSession {
            to_supervisor: Arc::new(tokio::sync::Mutex::new(to_supervisor)),
            frames,
            end,
            kill: Some(kill_tx),
            pids: Arc::new(Mutex::new(pids)),
            hello: serde_json::Value::Null,
            runtime,
            disk_mb: limits.disk_mb,
        })
    }
}

fn io_errno(e: &std::io::Error) -> nix::errno::Errno {
    nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Everything a session's watch owns: the job path's event loop over its sandbox, ended by
/// the sandbox's own end, a kill, or a protocol violation.
struct Watch {
    engine: Engine,
    req: u64,
    events: mpsc::UnboundedReceiver<crate::sandbox::process::wire::FromZygote>,
    cgroup: Option<crate::sandbox::isolate::cgroup::JobCgroup>,
    report_r: OwnedFd,
    diag_r: OwnedFd,
    limits: EffectiveLimits,
    assigned: oneshot::Sender<Vec<i32>>,
    kill: oneshot::Receiver<()>,
    violation: oneshot::Receiver<String>,
}

impl Watch {
    async fn run(self, terms: Terms) -> SessionEnd {
        let Watch {
            engine,
            req,
            events,
            cgroup,
            report_r,
            diag_r,
            limits,
            assigned,
            mut kill,
            mut violation,
        } = self;
        let inner = &engine.inner;
        let _unregister = Unregister {
            waiters: &inner.waiters,
            req,
        };
        // A dropped watch (the runtime shutting down) must not leave the sandbox running.
        let guard = KillOnDrop {
            engine: &engine,
            req,
        };
        let (capture, over) = output::capture_diagnostics(diag_r, DIAGNOSTICS_BYTES);
        let mut capture = std::pin::pin!(capture);
        let report = output::read_all(report_r, 64 * 1024);
        let mut violated = None;
        // A kill (sent, or its sender dropped with the session) or a violation ends it.
        let cancel = async {
            tokio::select! {
                _ = &mut kill => {}
                Ok(why) = &mut violation => violated = Some(why),
            }
        };
        let watched = engine
            .watch(
                RunEvents {
                    req,
                    events,
                    cgroup,
                    over,
                    report,
                    capture: capture.as_mut(),
                    assigned: Some(assigned),
                },
                &limits,
                OutputMode::Truncate,
                cancel,
            )
            .await;
        std::mem::forget(guard);
        let mut watched = match watched {
            Ok(w) => w,
            Err(e) => {
                engine.send(ToZygote::Kill { req });
                let outcome = Outcome::not_run(Status::Error, e.to_string());
                return SessionEnd::of(outcome, None);
            }
        };
        let (stdout, stderr) = match watched.captured.take() {
            Some(both) => both,
            None => capture.await,
        };
        let accounting = watched.cgroup.and_then(|cg| {
            cg.finish()
                .map_err(|e| tracing::warn!("session cgroup left behind: {e}"))
                .ok()
        });
        let observed = Observed {
            report: watched.report,
            exit: watched.exit,
            kills: watched.kills,
            stdout,
            stderr,
            cpu_at_report_us: watched.cpu_at_report_us,
            accounting,
        };
        SessionEnd::of(outcome::fold(observed, terms), violated)
    }
}

struct KillOnDrop<'a> {
    engine: &'a Engine,
    req: u64,
}

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        self.engine.send(ToZygote::Kill { req: self.req });
    }
}

/// Reads the supervisor's frames into `frames` until its fd 1 closes or the session is gone;
/// a frame over [`MAX_FRAME`] or not a JSON object is a violation: the session is ended.
async fn read_frames(
    fd: OwnedFd,
    frames: mpsc::Sender<Vec<u8>>,
    violation: oneshot::Sender<String>,
) {
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        let _ = violation.send("the supervisor's pipe could not be read".into());
        return;
    };
    loop {
        let mut len = [0u8; 4];
        // A frame cut short by the sandbox's end is no violation: the end says why.
        if rx.read_exact(&mut len).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes(len) as usize;
        if let Err(why) = check_frame_len(len) {
            let _ = violation.send(why);
            return;
        }
        let mut frame = vec![0u8; len];
        if rx.read_exact(&mut frame).await.is_err() {
            return;
        }
        if let Err(why) = check_frame(&frame) {
            let _ = violation.send(why);
            return;
        }
        if frames.send(frame).await.is_err() {
            return;
        }
    }
}

/// A frame's length as announced: at most [`MAX_FRAME`].
fn check_frame_len(len: usize) -> Result<(), String> {
    if len > MAX_FRAME {
        return Err(format!(
            "a frame of {len} bytes, over the {MAX_FRAME}-byte bound"
        ));
    }
    Ok(())
}

/// A frame's body: one JSON object.
fn check_frame(frame: &[u8]) -> Result<(), String> {
    match serde_json::from_slice::<serde_json::Value>(frame) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        Ok(_) => Err("a frame that is not a JSON object".into()),
        Err(e) => Err(format!("a frame that is not JSON: {e}")),
    }
}

impl SandboxSession {
    /// The session once its supervisor said it is ready (its hello kept), or why not.
    pub(super) async fn hello_awaited(mut self) -> Result<SandboxSession, OpenError> {
        let first = tokio::time::timeout(HELLO_WAIT, self.recv()).await;
        let hello = match first {
            Ok(Ok(frame)) => serde_json::from_slice::<serde_json::Value>(&frame)
                .ok()
                .filter(|v| v["kind"] == "ready"),
            Ok(Err(end)) => return Err(OpenError::Failed(end.message())),
            Err(_) => None,
        };
        match hello {
            Some(hello) => {
                self.hello = hello;
                Ok(self)
            }
            None => {
                let end = self.kill().await;
                Err(OpenError::Failed(format!(
                    "the session's supervisor did not say it was ready ({})",
                    end.message()
                )))
            }
        }
    }

    /// Sends one frame (a call's JSON, at most [`MAX_FRAME`] bytes) to the supervisor.
    pub async fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        write_frame(&self.to_supervisor, frame).await
    }

    /// The supervisor's next frame (an event JSON object with its `"call"`), or how the
    /// session ended once it has and every frame before its end was read. Cancel-safe.
    pub async fn recv(&mut self) -> Result<Vec<u8>, SessionEnd> {
        if let Some(frame) = self.frames.recv().await {
            return Ok(frame);
        }
        self.ended().await
    }

    /// How the session ended, once it has.
    async fn ended(&mut self) -> Result<Vec<u8>, SessionEnd> {
        let end = self.end.wait_for(Option::is_some).await.map(|e| e.clone());
        Err(match end {
            Ok(Some(end)) => end,
            _ => SessionEnd::of(
                Outcome::not_run(Status::Error, "the session's watch is gone"),
                None,
            ),
        })
    }

    /// Interrupts the running `run_code` (SIGINT to the kernel: `KeyboardInterrupt`, the
    /// state stays), through an `interrupt` frame the supervisor serves at once, even while
    /// a call runs. Needs a tokio runtime.
    pub fn interrupt(&self) {
        let to = self.to_supervisor.clone();
        tokio::spawn(async move {
            let _ = write_frame(&to, br#"{"op":"interrupt"}"#).await;
        });
    }

    /// Ends the session: kills its sandbox and waits until everything it held is released.
    pub async fn kill(mut self) -> SessionEnd {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        // Frames still queued are of no use to anyone now.
        self.frames.close();
        match self.ended().await {
            Err(end) => end,
            Ok(_) => unreachable!("ended() only returns the end"),
        }
    }

    /// Whether the session has ended (its [`SandboxSession::recv`] then returns the end once
    /// the frames before it are read).
    pub fn is_ended(&self) -> bool {
        self.end.borrow().is_some()
    }

    /// The supervisor's hello: `{"kind": "ready", "python": version, "pid": ...}`.
    pub fn hello(&self) -> &serde_json::Value {
        &self.hello
    }

    /// Whether the supervisor runs in the warm interpreter, and if not why (`None` when the
    /// session asked for no runtime).
    pub fn runtime(&self) -> Option<&RuntimeUse> {
        self.runtime.as_ref()
    }

    /// Host pids of the sandbox's init and of the supervisor, once known.
    pub fn host_pids(&self) -> Option<Vec<i32>> {
        let mut pids = self.pids.lock().ok()?;
        if let Pids::Awaited(rx) = &mut *pids {
            let known = rx.try_recv().ok()?;
            *pids = Pids::Known(known);
        }
        match &*pids {
            Pids::Known(p) => Some(p.clone()),
            Pids::Awaited(_) => None,
        }
    }

    /// Memory held now and CPU time so far, read from the sandbox's own `/proc`, and the
    /// bytes its disk holds (zero when the session has ended or its sandbox is not known yet).
    pub fn usage(&self) -> SessionUsage {
        let Some(init) = self
            .host_pids()
            .and_then(|p| p.first().copied())
            .filter(|_| !self.is_ended())
        else {
            return SessionUsage::default();
        };
        let Some(proc) = usage::sandbox_proc(init) else {
            return SessionUsage::default();
        };
        let used = usage::used(&proc);
        SessionUsage {
            memory_kb: memory::MemoryBudget::new(0, &proc).used_kb(),
            cpu_ms: used.cpu_us / 1000,
            disk_bytes: usage::sandbox_disk_bytes(init).unwrap_or(0),
        }
    }

    /// The size of the session's disk, in MiB.
    pub fn disk_mb(&self) -> u64 {
        self.disk_mb
    }
}

impl Drop for SandboxSession {
    fn drop(&mut self) {
        // The kill's sender, dropped, ends the sandbox as a kill does.
        self.kill.take();
    }
}

async fn write_frame(
    to: &tokio::sync::Mutex<tokio::net::unix::pipe::Sender>,
    frame: &[u8],
) -> std::io::Result<()> {
    if frame.len() > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "a frame of {} bytes, over the {MAX_FRAME}-byte bound",
                frame.len()
            ),
        ));
    }
    let mut buf = Vec::with_capacity(frame.len() + 4);
    buf.extend_from_slice(&(frame.len() as u32).to_be_bytes());
    buf.extend_from_slice(frame);
    // One frame at a time: the lock keeps an interrupt from landing inside another frame.
    let mut to = to.lock().await;
    to.write_all(&buf).await?;
    to.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_one_json_object_within_the_bound() {
        assert!(check_frame_len(MAX_FRAME).is_ok());
        assert!(check_frame_len(MAX_FRAME + 1).is_err());
        assert!(check_frame(br#"{"kind":"result"}"#).is_ok());
        assert!(check_frame(b"[1]").is_err());
        assert!(check_frame(b"{").is_err());
    }

    #[test]
    fn how_the_sandbox_ended_decides_why_the_session_did() {
        let with = |status, code, signal| {
            let mut o = Outcome::not_run(status, "x");
            o.exit_code = code;
            o.signal = signal;
            o
        };
        let cases = [
            (with(Status::Timeout, 124, None), None, EndReason::Ttl),
            (with(Status::Cancelled, 137, None), None, EndReason::Killed),
            (
                with(Status::MemoryLimit, 137, None),
                None,
                EndReason::MemoryLimit,
            ),
            (with(Status::CpuLimit, 137, None), None, EndReason::CpuLimit),
            (
                with(Status::Signaled, 139, Some(11)),
                None,
                EndReason::Signaled { signal: 11 },
            ),
            (
                with(Status::Failed, 3, None),
                None,
                EndReason::Exited { code: 3 },
            ),
            (
                with(Status::Error, 125, None),
                None,
                EndReason::Failed("x".into()),
            ),
            // A violation is why, whatever the kill it caused looks like.
            (
                with(Status::Cancelled, 137, None),
                Some("big".to_owned()),
                EndReason::ProtocolViolation("big".into()),
            ),
        ];
        for (outcome, violation, want) in cases {
            assert_eq!(SessionEnd::of(outcome, violation).reason, want);
        }
    }
}
