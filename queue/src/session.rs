//! Sessions: long-lived sandboxes on one node, served calls through Redis.
//!
//! A session is opened by an ordinary job whose JSON has a `session` object ([`SessionSpec`])
//! and no program. Its result carries [`SessionOpened`]. Calls ([`Call`]) go to the session's
//! node on `forkbox:{Q}:calls:<node>` through `lua/session_call.lua`; the node answers each
//! with events ([`Event`]) on `forkbox:{Q}:call:<cid>`, the last one terminal. The same rules
//! as a job's apply: parsing is strict and every rejection names the field at fault.
//! `docs/protocol.md` ("Sessions") describes the same contract for other languages.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::schema::{check_relative, invalid, no_nul, FileData, Job, JobError};
pub use crate::schema::{
    SessionOpened, SessionSpec, DEFAULT_SESSION_IDLE_S, DEFAULT_SESSION_TTL_S, MAX_SESSION_S,
};

/// A call's wall-clock limit when it sets no `timeout_ms`.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 30_000;
/// Longest call JSON (a frame to the session's supervisor is at most [`MAX_FRAME_BYTES`]).
pub const MAX_CALL_BYTES: usize = 1024 * 1024 - 4096;
/// Longest frame between a node and a session's supervisor, either way.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;
/// Most bytes of one `stdout`/`stderr` event's `data`.
pub const MAX_EVENT_DATA_BYTES: usize = 64 * 1024;
/// Calls of one session that may wait behind the running one; past it a call ends `busy`.
pub const CALL_QUEUE_LEN: usize = 64;
/// Most branches one `fork` call asks for (the node's session capacity bounds it further).
pub const MAX_FORK_BRANCHES: u32 = 16;
/// A checkpoint's lifetime when its `checkpoint` call sets no `ttl_s` (within the node's
/// session ttl maximum; a checkpoint ends with its session in any case).
pub const DEFAULT_CHECKPOINT_TTL_S: u64 = 600;
/// Random hex digits a checkpoint's id ends with, after its session's id and a `.`.
pub const CHECKPOINT_ID_RANDOM: usize = 32;
/// How long a call's event stream lives after its terminal event.
pub const CALL_EVENTS_LINGER_MS: u64 = 300_000;
/// Approximate cap (`MAXLEN ~`) of a node's calls stream.
pub const CALLS_MAXLEN: u64 = 10_000;
/// A call with no terminal event this long after its `timeout_ms` ends its session
/// (`crashed`, "unresponsive").
pub const BACKSTOP_GRACE_MS: u64 = 5_000;
/// Longest slice a waiter blocks on a call's events before it checks the node's heartbeat.
pub const WAIT_SLICE_MS: u64 = 1_000;
/// Stream entry field of a call (on `calls:<node>`).
pub const CALL_FIELD: &str = "call";
/// Stream entry field of an event (on `call:<cid>`).
pub const EVENT_FIELD: &str = "event";

/// A node's maximums for a session's `ttl_s` and `idle_s` (`--max-session-ttl`,
/// `--max-session-idle`). A default above a maximum is lowered to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionCeilings {
    pub ttl_s: u64,
    pub idle_s: u64,
}

impl Default for SessionCeilings {
    fn default() -> Self {
        SessionCeilings {
            ttl_s: 3600,
            idle_s: 600,
        }
    }
}

impl SessionCeilings {
    /// Refuses a spec over these maximums, naming the field and the maximum.
    pub fn check(&self, spec: &SessionSpec) -> Result<(), JobError> {
        self.check_values("session.", spec.ttl_s, spec.idle_s)
    }

    /// Refuses a `set_timeout` call over these maximums.
    pub fn check_call(&self, call: &Call) -> Result<(), JobError> {
        self.check_values("", call.ttl_s, call.idle_s)
    }

    fn check_values(&self, at: &str, ttl: Option<u64>, idle: Option<u64>) -> Result<(), JobError> {
        for (name, value, max) in [("ttl_s", ttl, self.ttl_s), ("idle_s", idle, self.idle_s)] {
            if let Some(v) = value.filter(|v| *v > max) {
                return Err(invalid(
                    format!("{at}{name}"),
                    format!("{v} is over this node's maximum of {max}"),
                ));
            }
        }
        Ok(())
    }

    /// The lifetime and idle timeout `spec` gets: its own, else the defaults within the
    /// maximums.
    pub fn resolve(&self, spec: &SessionSpec) -> (u64, u64) {
        (
            spec.ttl_s.unwrap_or(DEFAULT_SESSION_TTL_S.min(self.ttl_s)),
            spec.idle_s
                .unwrap_or(DEFAULT_SESSION_IDLE_S.min(self.idle_s)),
        )
    }
}

/// What a call asks of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallOp {
    RunCode,
    Exec,
    FilesWrite,
    FilesRead,
    FilesList,
    FilesRemove,
    Interrupt,
    SetTimeout,
    Kill,
    Info,
    Fork,
    Checkpoint,
    Restore,
    DropCheckpoint,
}

impl CallOp {
    pub const ALL: [CallOp; 14] = [
        CallOp::RunCode,
        CallOp::Exec,
        CallOp::FilesWrite,
        CallOp::FilesRead,
        CallOp::FilesList,
        CallOp::FilesRemove,
        CallOp::Interrupt,
        CallOp::SetTimeout,
        CallOp::Kill,
        CallOp::Info,
        CallOp::Fork,
        CallOp::Checkpoint,
        CallOp::Restore,
        CallOp::DropCheckpoint,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CallOp::RunCode => "run_code",
            CallOp::Exec => "exec",
            CallOp::FilesWrite => "files_write",
            CallOp::FilesRead => "files_read",
            CallOp::FilesList => "files_list",
            CallOp::FilesRemove => "files_remove",
            CallOp::Interrupt => "interrupt",
            CallOp::SetTimeout => "set_timeout",
            CallOp::Kill => "kill",
            CallOp::Info => "info",
            CallOp::Fork => "fork",
            CallOp::Checkpoint => "checkpoint",
            CallOp::Restore => "restore",
            CallOp::DropCheckpoint => "drop_checkpoint",
        }
    }

    /// The op's own fields (beside `id`, `session`, `op`, `timeout_ms`), and which of them it
    /// needs.
    pub fn fields(self) -> (&'static [&'static str], &'static [&'static str]) {
        match self {
            CallOp::RunCode => (&["code"], &["code"]),
            CallOp::Exec => (&["cmd", "argv", "stdin", "env", "cwd"], &[]),
            CallOp::FilesWrite => (&["path", "data"], &["path", "data"]),
            CallOp::FilesRead | CallOp::FilesRemove => (&["path"], &["path"]),
            CallOp::FilesList => (&["path"], &[]),
            CallOp::SetTimeout => (&["ttl_s", "idle_s"], &[]),
            CallOp::Interrupt | CallOp::Kill | CallOp::Info => (&[], &[]),
            CallOp::Fork => (&["n"], &["n"]),
            CallOp::Checkpoint => (&["ttl_s"], &[]),
            CallOp::Restore | CallOp::DropCheckpoint => (&["checkpoint"], &["checkpoint"]),
        }
    }

    /// Served at once by the node, never queued behind the running call.
    pub fn is_immediate(self) -> bool {
        matches!(
            self,
            CallOp::Interrupt | CallOp::Kill | CallOp::Info | CallOp::SetTimeout
        )
    }
}

/// One call to a session (the JSON of a `calls:<node>` entry's `call` field).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Call {
    /// The call's id: its events are on `call:<id>`.
    pub id: String,
    /// The session's id.
    pub session: String,
    pub op: Option<CallOp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// `run_code`: Python source, run in the session's interpreter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// `exec`: a shell string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
    /// `exec`: a program and its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<FileData>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// `files_*`: relative to `/work`, or absolute under `/work`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `files_write`: the content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<FileData>,
    /// `set_timeout`: a new lifetime, counted from now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// `set_timeout`: a new idle timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_s: Option<u64>,
    /// `fork`: how many branches (1 to [`MAX_FORK_BRANCHES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// `restore`, `drop_checkpoint`: the checkpoint's id (see [`checkpoint_session`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
}

impl Call {
    /// A call of `op` to session `session`, with a fresh id (uuid v7).
    pub fn new(session: impl Into<String>, op: CallOp) -> Call {
        Call {
            id: uuid::Uuid::now_v7().to_string(),
            session: session.into(),
            op: Some(op),
            ..Call::default()
        }
    }

    pub fn run_code(session: impl Into<String>, code: impl Into<String>) -> Call {
        Call {
            code: Some(code.into()),
            ..Call::new(session, CallOp::RunCode)
        }
    }

    pub fn exec_argv(session: impl Into<String>, argv: Vec<String>) -> Call {
        Call {
            argv: Some(argv),
            ..Call::new(session, CallOp::Exec)
        }
    }

    pub fn exec_shell(session: impl Into<String>, cmd: impl Into<String>) -> Call {
        Call {
            cmd: Some(cmd.into()),
            ..Call::new(session, CallOp::Exec)
        }
    }

    /// A `files_*` call on `path`.
    pub fn files(session: impl Into<String>, op: CallOp, path: impl Into<String>) -> Call {
        Call {
            path: Some(path.into()),
            ..Call::new(session, op)
        }
    }

    pub fn op(&self) -> CallOp {
        self.op.unwrap_or(CallOp::Info)
    }

    /// The call's wall-clock limit: its own, else [`DEFAULT_CALL_TIMEOUT_MS`] within `max_ms`.
    pub fn timeout_ms(&self, max_ms: u64) -> u64 {
        self.timeout_ms
            .unwrap_or(DEFAULT_CALL_TIMEOUT_MS.min(max_ms))
    }

    /// Parses and validates a call of at most [`MAX_CALL_BYTES`]; `max_timeout_ms` is the
    /// node's job maximum.
    pub fn parse(payload: &[u8], max_timeout_ms: u64) -> Result<Call, JobError> {
        if payload.len() > MAX_CALL_BYTES {
            return Err(JobError::TooLarge {
                size: payload.len(),
                limit: MAX_CALL_BYTES,
            });
        }
        let mut de = serde_json::Deserializer::from_slice(payload);
        let call: Call = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let inner = e.inner();
            if inner.is_syntax() || inner.is_eof() {
                return JobError::NotJson(inner.to_string());
            }
            let path = match e.path().to_string() {
                p if p == "." || p.is_empty() => "call".to_owned(),
                p => p,
            };
            let msg = inner.to_string();
            let msg = msg.split(" at line ").next().unwrap_or(&msg).to_owned();
            JobError::Schema { path, message: msg }
        })?;
        de.end().map_err(|e| JobError::NotJson(e.to_string()))?;
        call.validate(max_timeout_ms)?;
        Ok(call)
    }

    /// The rules types cannot express: ids, the op's own fields only, paths, bounds.
    pub fn validate(&self, max_timeout_ms: u64) -> Result<(), JobError> {
        check_id("id", &self.id)?;
        check_id("session", &self.session)?;
        let Some(op) = self.op else {
            return Err(invalid("op", "a call needs an `op`"));
        };
        if let Some(t) = self.timeout_ms {
            if t == 0 || t > max_timeout_ms {
                return Err(invalid(
                    "timeout_ms",
                    format!("must be between 1 and {max_timeout_ms}, got {t}"),
                ));
            }
        }
        let (takes, needs) = op.fields();
        for (name, set) in self.given() {
            if set && !takes.contains(&name) {
                return Err(invalid(
                    name,
                    format!("does not apply to a `{}` call", op.as_str()),
                ));
            }
        }
        if let Some((name, _)) = self
            .given()
            .iter()
            .find(|(n, set)| !set && needs.contains(n))
        {
            return Err(invalid(
                *name,
                format!("a `{}` call needs `{name}`", op.as_str()),
            ));
        }
        self.check_op_fields(op)
    }

    fn given(&self) -> [(&'static str, bool); 12] {
        [
            ("code", self.code.is_some()),
            ("cmd", self.cmd.is_some()),
            ("argv", self.argv.is_some()),
            ("stdin", self.stdin.is_some()),
            ("env", self.env.is_some()),
            ("cwd", self.cwd.is_some()),
            ("path", self.path.is_some()),
            ("data", self.data.is_some()),
            ("ttl_s", self.ttl_s.is_some()),
            ("idle_s", self.idle_s.is_some()),
            ("n", self.n.is_some()),
            ("checkpoint", self.checkpoint.is_some()),
        ]
    }

    fn check_op_fields(&self, op: CallOp) -> Result<(), JobError> {
        if let Some(code) = &self.code {
            no_nul("code", code)?;
        }
        if op == CallOp::Exec {
            let job = Job {
                cmd: self.cmd.clone(),
                argv: self.argv.clone(),
                stdin: self.stdin.clone(),
                env: self.env.clone().unwrap_or_default(),
                cwd: self.cwd.clone(),
                ..Job::default()
            };
            job.validate()?;
        }
        if let Some(path) = &self.path {
            check_session_path("path", path)?;
        }
        if let Some(data) = &self.data {
            data.to_bytes()
                .map_err(|e| invalid("data", format!("invalid base64: {e}")))?;
        }
        if op == CallOp::SetTimeout && self.ttl_s.is_none() && self.idle_s.is_none() {
            return Err(invalid(
                "ttl_s",
                "a `set_timeout` call needs `ttl_s` or `idle_s`",
            ));
        }
        if let Some(cp) = &self.checkpoint {
            match checkpoint_session(cp) {
                Some(sid) if sid == self.session => {}
                Some(sid) => {
                    return Err(invalid(
                        "checkpoint",
                        format!(
                            "{cp:?} is a checkpoint of session {sid:?}, not of {:?}",
                            self.session
                        ),
                    ))
                }
                None => {
                    return Err(invalid(
                        "checkpoint",
                        format!(
                            "{cp:?} is not a checkpoint's id (a session's id, `.`, and \
                             {CHECKPOINT_ID_RANDOM} hex digits)"
                        ),
                    ))
                }
            }
        }
        if let Some(n) = self.n.filter(|n| *n == 0 || *n > MAX_FORK_BRANCHES) {
            return Err(invalid(
                "n",
                format!("must be between 1 and {MAX_FORK_BRANCHES}, got {n}"),
            ));
        }
        for (name, value) in [("ttl_s", self.ttl_s), ("idle_s", self.idle_s)] {
            if let Some(v) = value.filter(|v| *v == 0 || *v > MAX_SESSION_S) {
                return Err(invalid(
                    name,
                    format!("must be between 1 and {MAX_SESSION_S}, got {v}"),
                ));
            }
        }
        Ok(())
    }
}

/// A new checkpoint id of session `session`: the session's id, `.`, and
/// [`CHECKPOINT_ID_RANDOM`] random hex digits (unguessable: 128 random bits).
pub fn new_checkpoint_id(session: &str) -> String {
    format!("{session}.{}", uuid::Uuid::new_v4().simple())
}

/// The session a checkpoint's id names; `None` when it is not a checkpoint's id.
pub fn checkpoint_session(id: &str) -> Option<&str> {
    let cut = id.len().checked_sub(CHECKPOINT_ID_RANDOM + 1)?;
    let (sid, rest) = (id.get(..cut)?, id.get(cut..)?);
    let hex = rest.strip_prefix('.')?;
    let ok = hex.len() == CHECKPOINT_ID_RANDOM
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (ok && check_id("session", sid).is_ok()).then_some(sid)
}

/// A session's path: relative to `/work`, or absolute under `/work`, never with `..`.
/// `files_list` may name `/work` itself (or `.`).
pub fn check_session_path(field: &str, path: &str) -> Result<(), JobError> {
    no_nul(field, path)?;
    let rel = match path.strip_prefix("/work") {
        Some("") => return Ok(()),
        Some(rest) if rest.starts_with('/') => rest.trim_start_matches('/'),
        _ if path.starts_with('/') => {
            return Err(invalid(
                field,
                format!("{path:?} is outside /work: paths are relative to /work or under it"),
            ))
        }
        _ => path,
    };
    if rel.is_empty() || rel.split('/').all(|c| c.is_empty() || c == ".") {
        return Ok(());
    }
    check_relative(field, rel).map_err(|e| match e {
        JobError::Invalid { reason, .. } => invalid(field, format!("{path:?}: {reason}")),
        other => other,
    })
}

fn check_id(field: &str, id: &str) -> Result<(), JobError> {
    if id.is_empty() || id.len() > crate::schema::MAX_ID_LEN {
        return Err(invalid(
            field,
            format!("must be 1 to {} characters", crate::schema::MAX_ID_LEN),
        ));
    }
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(field, "must be printable ASCII without spaces"));
    }
    Ok(())
}

/// A call found on a node's calls stream before the node's start: one sent to a previous life
/// of the node's name, which may have died before it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EarlierCall {
    pub session: String,
    pub id: String,
    /// Its limit: its own `timeout_ms`, else [`DEFAULT_CALL_TIMEOUT_MS`].
    pub timeout_ms: u64,
}

impl EarlierCall {
    /// Reads what answering the call needs from its JSON, leniently (the call is not run, and
    /// one its node would have refused still has a caller waiting); `None` without a usable
    /// call id or session.
    pub fn parse(payload: &[u8]) -> Option<EarlierCall> {
        let v: Value = serde_json::from_slice(payload).ok()?;
        let text = |name: &str| {
            let s = v.get(name)?.as_str()?;
            check_id(name, s).ok()?;
            Some(s.to_owned())
        };
        let timeout_ms = v
            .get("timeout_ms")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_CALL_TIMEOUT_MS);
        Some(EarlierCall {
            session: text("session")?,
            id: text("id")?,
            timeout_ms,
        })
    }
}

/// Whether a caller may still be waiting, at `now_ms`, on a call added at `added_ms` (both
/// Redis' clock: the time in the call's entry id) with a limit of `timeout_ms`. A caller waits
/// the call's limit, the node's [`BACKSTOP_GRACE_MS`] and a slack of its own; the slack is
/// allowed for here as [`CALL_EVENTS_LINGER_MS`], which also covers a node's clock behind
/// Redis' by as much.
pub fn caller_may_wait(added_ms: u64, timeout_ms: u64, now_ms: u64) -> bool {
    added_ms
        .saturating_add(timeout_ms)
        .saturating_add(BACKSTOP_GRACE_MS)
        .saturating_add(CALL_EVENTS_LINGER_MS)
        >= now_ms
}

/// The time (Unix ms) in stream entry id `id` (`<ms>-<seq>`); 0 when it has none.
pub fn entry_ms(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0)
}

/// Why a call ended without a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorReason {
    /// The session's node died or restarted.
    SessionLost,
    /// The session ended (ttl, idle, killed, crashed, node stopped); the message says which.
    SessionEnded,
    /// The call was malformed.
    Invalid,
    /// The session's call queue was full.
    Busy,
}

impl ErrorReason {
    pub const ALL: [ErrorReason; 4] = [
        ErrorReason::SessionLost,
        ErrorReason::SessionEnded,
        ErrorReason::Invalid,
        ErrorReason::Busy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorReason::SessionLost => "session_lost",
            ErrorReason::SessionEnded => "session_ended",
            ErrorReason::Invalid => "invalid",
            ErrorReason::Busy => "busy",
        }
    }
}

/// Why a session ended (the hash's `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    Ttl,
    Idle,
    Killed,
    Crashed,
    NodeStopped,
    Lost,
}

impl EndReason {
    pub const ALL: [EndReason; 6] = [
        EndReason::Ttl,
        EndReason::Idle,
        EndReason::Killed,
        EndReason::Crashed,
        EndReason::NodeStopped,
        EndReason::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Ttl => "ttl",
            EndReason::Idle => "idle",
            EndReason::Killed => "killed",
            EndReason::Crashed => "crashed",
            EndReason::NodeStopped => "node_stopped",
            EndReason::Lost => "lost",
        }
    }
}

/// One event of a call (the JSON of a `call:<cid>` entry's `event` field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    Stdout {
        data: String,
    },
    Stderr {
        data: String,
    },
    /// The call's result: `ok`, `error`, `wall_ms`, `cpu_ms`, `session_memory_kb`, and the
    /// op's own fields (docs/protocol.md).
    Result(Map<String, Value>),
    Error {
        error: String,
        reason: ErrorReason,
    },
}

impl Event {
    pub fn is_terminal(&self) -> bool {
        matches!(self, Event::Result(_) | Event::Error { .. })
    }

    pub fn error(reason: ErrorReason, error: impl Into<String>) -> Event {
        Event::Error {
            error: error.into(),
            reason,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an event always serializes")
    }
}

/// Reads one frame a session's supervisor sent for call `call_id`: a JSON object with
/// `"call": call_id` and an event (see [`Event`]). Everything in it is untrusted: a frame for
/// another call, a malformed one, a `stdout`/`stderr` event over [`MAX_EVENT_DATA_BYTES`] or a
/// `result` without a boolean `ok` is an error naming the problem (the node ends the session).
pub fn parse_frame(frame: &[u8], call_id: &str) -> Result<Event, String> {
    if frame.len() > MAX_FRAME_BYTES {
        return Err(format!(
            "a frame of {} bytes, over {MAX_FRAME_BYTES}",
            frame.len()
        ));
    }
    let mut object: Map<String, Value> =
        serde_json::from_slice(frame).map_err(|e| format!("a frame is not a JSON object: {e}"))?;
    match object.remove("call") {
        Some(Value::String(c)) if c == call_id => {}
        Some(other) => {
            return Err(format!(
                "a frame for call {other} while call {call_id:?} runs"
            ))
        }
        None => return Err("a frame without `call`".into()),
    }
    let event: Event = serde_json::from_value(Value::Object(object))
        .map_err(|e| format!("a frame is not an event: {e}"))?;
    match &event {
        Event::Stdout { data } | Event::Stderr { data } if data.len() > MAX_EVENT_DATA_BYTES => {
            Err(format!(
                "an output event of {} bytes, over {MAX_EVENT_DATA_BYTES}",
                data.len()
            ))
        }
        Event::Result(r) if !r.get("ok").is_some_and(Value::is_boolean) => {
            Err("a result event without a boolean `ok`".into())
        }
        _ => Ok(event),
    }
}

/// A session as its hash `forkbox:{Q}:session:<sid>` records it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub id: String,
    pub node: String,
    /// `starting`, `live` or `ended`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub created_ms: u64,
    pub expires_ms: u64,
    pub idle_s: u64,
    pub last_call_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// The session this one was forked from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The sessions forked from this one, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<String>,
    /// How a session with a parent was made: `fork`, or `restore` (of [`Self::checkpoint`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made_by: Option<String>,
    /// The checkpoint a restored session was made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// The session's live checkpoints, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpoints: Vec<CheckpointInfo>,
}

/// A live checkpoint of a session, as its hash lists it (`checkpoints`, a JSON array).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    pub id: String,
    pub created_ms: u64,
    pub expires_ms: u64,
}

impl SessionInfo {
    /// From the hash's fields; `None` when it has no `node` (no such session).
    pub fn from_hash(id: &str, h: &BTreeMap<String, String>) -> Option<SessionInfo> {
        let num = |k: &str| h.get(k).and_then(|v| v.parse().ok());
        Some(SessionInfo {
            id: id.to_owned(),
            node: h.get("node")?.clone(),
            state: h.get("state").cloned().unwrap_or_default(),
            reason: h.get("reason").cloned(),
            created_ms: num("created_ms").unwrap_or(0),
            expires_ms: num("expires_ms").unwrap_or(0),
            idle_s: num("idle_s").unwrap_or(0),
            last_call_ms: num("last_call_ms").unwrap_or(0),
            ended_ms: num("ended_ms"),
            runtime: h.get("runtime").filter(|r| !r.is_empty()).cloned(),
            memory_mb: num("memory_mb"),
            parent: h.get("parent").filter(|p| !p.is_empty()).cloned(),
            children: h
                .get("children")
                .map(|c| {
                    c.split(',')
                        .filter(|c| !c.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
            made_by: h.get("made_by").filter(|m| !m.is_empty()).cloned(),
            checkpoint: h.get("checkpoint").filter(|c| !c.is_empty()).cloned(),
            checkpoints: h
                .get("checkpoints")
                .and_then(|c| serde_json::from_str(c).ok())
                .unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_call_is_read_leniently_and_needs_an_id_and_a_session() {
        type Want = Option<(&'static str, &'static str, u64)>;
        let table: [(&str, Want); 7] = [
            (
                r#"{"id":"c1","session":"s1","op":"run_code","code":"1"}"#,
                Some(("s1", "c1", DEFAULT_CALL_TIMEOUT_MS)),
            ),
            (
                r#"{"id":"c2","session":"s1","op":"exec","timeout_ms":90000}"#,
                Some(("s1", "c2", 90_000)),
            ),
            // A field the node would refuse: the caller still waits, so it is answered.
            (
                r#"{"id":"c3","session":"s1","op":"nope","extra":1}"#,
                Some(("s1", "c3", DEFAULT_CALL_TIMEOUT_MS)),
            ),
            (r#"{"session":"s1","op":"run_code"}"#, None),
            (r#"{"id":"c4","op":"run_code"}"#, None),
            (r#"{"id":"has space","session":"s1"}"#, None),
            ("not json", None),
        ];
        for (payload, want) in table {
            let got = EarlierCall::parse(payload.as_bytes());
            let got = got
                .as_ref()
                .map(|c| (c.session.as_str(), c.id.as_str(), c.timeout_ms));
            assert_eq!(got, want, "{payload}");
        }
    }

    #[test]
    fn a_caller_may_wait_its_timeout_the_grace_and_the_linger() {
        let slack = BACKSTOP_GRACE_MS + CALL_EVENTS_LINGER_MS;
        let added = 1_000_000;
        let table = [
            (added, 30_000, added, true),
            (added, 30_000, added + 30_000 + slack, true),
            (added, 30_000, added + 30_000 + slack + 1, false),
            (
                added,
                crate::schema::MAX_TIMEOUT_MS,
                added + 3_600_000,
                true,
            ),
            (0, 30_000, u64::MAX, false),
            (u64::MAX, u64::MAX, u64::MAX, true),
        ];
        for (added_ms, timeout_ms, now_ms, want) in table {
            assert_eq!(
                caller_may_wait(added_ms, timeout_ms, now_ms),
                want,
                "{added_ms} {timeout_ms} {now_ms}"
            );
        }
        assert_eq!(entry_ms("1733000000123-7"), 1_733_000_000_123);
        assert_eq!(entry_ms("0-0"), 0);
        assert_eq!(entry_ms("junk"), 0);
    }

    #[test]
    fn a_checkpoint_id_names_its_session_and_is_checked_against_the_call() {
        let sid = "0190f1e2-aaaa-7bbb-8ccc-123456789abc";
        let cp = new_checkpoint_id(sid);
        assert_eq!(checkpoint_session(&cp), Some(sid));
        assert_eq!(
            checkpoint_session("a.b.0123456789abcdef0123456789abcdef"),
            Some("a.b")
        );
        for bad in [
            "",
            "x",
            "s.0123",
            "s.0123456789ABCDEF0123456789abcdef",
            ".0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(checkpoint_session(bad), None, "{bad:?}");
        }
        let restore = |session: &str, cp: &str| Call {
            checkpoint: Some(cp.to_owned()),
            ..Call::new(session, CallOp::Restore)
        };
        assert!(restore(sid, &cp).validate(60_000).is_ok());
        let other = restore("another", &cp).validate(60_000).unwrap_err();
        assert!(
            other.to_string().contains("is a checkpoint of session"),
            "{other}"
        );
        let junk = restore(sid, "nope").validate(60_000).unwrap_err();
        assert!(
            junk.to_string().contains("is not a checkpoint's id"),
            "{junk}"
        );
        let missing = Call::new(sid, CallOp::Restore)
            .validate(60_000)
            .unwrap_err();
        assert!(
            missing.to_string().contains("needs `checkpoint`"),
            "{missing}"
        );
        let ttl = Call {
            ttl_s: Some(60),
            ..Call::new(sid, CallOp::Checkpoint)
        };
        assert!(ttl.validate(60_000).is_ok());
    }

    fn session_job(extra: &str) -> Result<Job, JobError> {
        let json = format!(r#"{{"session": {{"ttl_s": 60, "idle_s": 30}}{extra}}}"#);
        Job::parse(json.as_bytes(), 1 << 20)
    }

    #[test]
    fn a_create_job_has_no_program() {
        let job = session_job(r#", "limits": {"memory_mb": 128}, "runtime": "python""#).unwrap();
        assert_eq!(job.session.unwrap().ttl_s(), 60);
        for (extra, field) in [
            (r#", "cmd": "true""#, "cmd"),
            (r#", "argv": ["true"]"#, "argv"),
            (r#", "timeout_ms": 10"#, "timeout_ms"),
            (r#", "collect": ["*"]"#, "collect"),
        ] {
            match session_job(extra) {
                Err(JobError::Invalid { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{extra}: {other:?}"),
            }
        }
        let err = Job::parse(br#"{"session": {"ttl_s": 0}}"#, 1 << 20).unwrap_err();
        assert!(err.to_string().starts_with("session.ttl_s:"), "{err}");
        let err = Job::parse(br#"{"session": {"ttl": 5}}"#, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("ttl"), "{err}");
        // Without `session`, a job still needs its program.
        assert!(Job::parse(br#"{"limits": {}}"#, 1 << 20).is_err());
    }

    #[test]
    fn node_ceilings_name_the_field() {
        let c = SessionCeilings {
            ttl_s: 100,
            idle_s: 10,
        };
        let spec = SessionSpec {
            ttl_s: Some(101),
            idle_s: None,
        };
        let err = c.check(&spec).unwrap_err().to_string();
        assert_eq!(err, "session.ttl_s: 101 is over this node's maximum of 100");
        assert_eq!(c.resolve(&SessionSpec::default()), (100, 10));
    }

    #[test]
    fn calls_take_their_own_fields_only() {
        let ok = br#"{"id": "c1", "session": "s1", "op": "run_code", "code": "1 + 1"}"#;
        let call = Call::parse(ok, 60_000).unwrap();
        assert_eq!(call.op(), CallOp::RunCode);
        assert_eq!(call.timeout_ms(60_000), DEFAULT_CALL_TIMEOUT_MS);
        let cases: [(&[u8], &str); 8] = [
            (br#"{"id": "c", "session": "s", "op": "run_code"}"#, "code"),
            (
                br#"{"id": "c", "session": "s", "op": "kill", "code": "x"}"#,
                "code",
            ),
            (
                br#"{"id": "c", "session": "s", "op": "files_read", "path": "../x"}"#,
                "path",
            ),
            (
                br#"{"id": "c", "session": "s", "op": "files_read", "path": "/etc/passwd"}"#,
                "path",
            ),
            (br#"{"id": "c", "session": "s", "op": "exec"}"#, "cmd"),
            (
                br#"{"id": "c", "session": "s", "op": "info", "timeout_ms": 0}"#,
                "timeout_ms",
            ),
            (br#"{"id": "c d", "session": "s", "op": "info"}"#, "id"),
            (
                br#"{"id": "c", "session": "s", "op": "set_timeout"}"#,
                "ttl_s",
            ),
        ];
        for (payload, field) in cases {
            match Call::parse(payload, 60_000) {
                Err(JobError::Invalid { field: f, .. }) => {
                    assert_eq!(f, field, "{}", String::from_utf8_lossy(payload))
                }
                other => panic!("{}: {other:?}", String::from_utf8_lossy(payload)),
            }
        }
        let unknown = br#"{"id": "c", "session": "s", "op": "info", "nope": 1}"#;
        assert!(Call::parse(unknown, 60_000).is_err());
        let bad_op = br#"{"id": "c", "session": "s", "op": "reboot"}"#;
        assert!(Call::parse(bad_op, 60_000)
            .unwrap_err()
            .to_string()
            .starts_with("op:"));
    }

    #[test]
    fn session_paths_stay_under_work() {
        for ok in ["a.txt", "/work/a/b", "/work", ".", "/work/"] {
            assert!(check_session_path("path", ok).is_ok(), "{ok}");
        }
        for bad in ["/workx/a", "/tmp/a", "a/../../b", "/work/../etc"] {
            assert!(check_session_path("path", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn frames_are_checked_before_they_become_events() {
        let ev = parse_frame(br#"{"call": "c1", "kind": "stdout", "data": "hi"}"#, "c1").unwrap();
        assert_eq!(ev, Event::Stdout { data: "hi".into() });
        let r = parse_frame(
            br#"{"call": "c1", "kind": "result", "ok": true, "text": "2"}"#,
            "c1",
        )
        .unwrap();
        assert!(r.is_terminal());
        assert!(!r.to_json().contains("\"call\""));
        for (bad, want) in [
            (
                &br#"{"call": "c2", "kind": "stdout", "data": "x"}"#[..],
                "call",
            ),
            (br#"{"kind": "stdout", "data": "x"}"#, "without `call`"),
            (br#"{"call": "c1", "kind": "result"}"#, "ok"),
            (br#"{"call": "c1", "kind": "shout"}"#, "not an event"),
            (br#"not json"#, "JSON"),
        ] {
            let err = parse_frame(bad, "c1").unwrap_err();
            assert!(err.contains(want), "{err}");
        }
        let big = format!(
            r#"{{"call": "c1", "kind": "stdout", "data": "{}"}}"#,
            "x".repeat(MAX_EVENT_DATA_BYTES + 1)
        );
        assert!(parse_frame(big.as_bytes(), "c1").is_err());
    }

    #[test]
    fn events_round_trip() {
        let e = Event::error(ErrorReason::SessionEnded, "session ended: ttl");
        assert_eq!(
            e.to_json(),
            r#"{"kind":"error","error":"session ended: ttl","reason":"session_ended"}"#
        );
        let back: Event = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(back, e);
    }
}
