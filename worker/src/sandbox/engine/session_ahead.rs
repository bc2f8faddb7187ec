//! Session sandboxes opened ahead of demand: a [`PreparedSession`] is a session's sandbox
//! with its supervisor started and its kernel forked, opened for a [`SessionShape`] (what
//! only a sandbox's creation can set: its limits, network and runtime) and for no session
//! yet. [`PreparedSession::hand_over`] gives it a session's environment and files in one
//! `setup` frame, the supervisor's first call, and returns the live [`SandboxSession`].
//!
//! A prepared sandbox has run no code but the supervisor's own start and its kernel's
//! throwaway cell (in a namespace of its own, uncounted, its output drained: it copies the
//! pages a cell's paths write before the session rather than in its first cell): its
//! environment is the sandbox's default one, `/work` is empty, its kernel has run no cell of
//! a session's. What a fresh session
//! gets at its start is then what the setup gives it: the environment (in the supervisor and
//! the kernel, whose cells have not begun) and the files, written as the launcher writes
//! them. A spec whose environment the interpreter reads at its start or the warm runtime's
//! plan depends on (`PATH`, `PYTHON*`, locale, `TZ`, `TMPDIR`, `HOME`) or whose files do not
//! fit a frame is never served this way ([`SessionShape::of`] says `None`): it is opened
//! fresh. The engine only provides the two steps; keeping a pool of them is the node's.

use std::time::{Duration, Instant};

use forkbox_queue::schema::{Limits, Network, Runtime};
use serde_json::json;

use super::run::files_past_disk;
use super::session::{OpenError, SandboxSession, SessionEnd, SessionSpec, MAX_FRAME};
use super::start::Engine;

/// How long the supervisor may take to answer its setup.
const SETUP_WAIT: Duration = Duration::from_secs(30);

/// The argument the supervisor takes to wait for its setup (`session_supervisor.py`).
const PREPARED_ARG: &str = "--prepared";

/// What a prepared sandbox was made for: everything of a session's spec that only its
/// sandbox's creation can set. A session takes a prepared sandbox of its own shape only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionShape {
    pub limits: Limits,
    pub network: Option<Network>,
    pub runtime: Option<Runtime>,
    /// The sandbox's lifetime from its start (its watchdog's deadline).
    pub ttl_ms: u64,
}

impl SessionShape {
    /// The shape of the sandbox `spec` asks for, when a prepared one can serve it: `None`
    /// when its environment names a variable read at the interpreter's start (or by the warm
    /// runtime's plan), or when its environment and files would not fit the setup frame.
    pub fn of(spec: &SessionSpec) -> Option<SessionShape> {
        if spec.env.keys().any(|k| read_at_start(k)) {
            return None;
        }
        let setup = setup_frame(spec);
        if setup.len() > MAX_FRAME {
            return None;
        }
        Some(SessionShape {
            limits: spec.limits,
            network: spec.network,
            runtime: spec.runtime,
            ttl_ms: spec.ttl_ms,
        })
    }

    /// The spec of a session of this shape with no environment or files of its own.
    fn spec(&self) -> SessionSpec {
        SessionSpec {
            limits: self.limits,
            network: self.network,
            runtime: self.runtime,
            ttl_ms: self.ttl_ms,
            ..SessionSpec::default()
        }
    }
}

/// Whether an environment variable is read by the interpreter at its start, by the warm
/// runtime's plan or by the launcher's preparation, so that setting it after the start
/// would not give what a fresh session gets.
fn read_at_start(name: &str) -> bool {
    name.starts_with("PYTHON")
        || name.starts_with("LC_")
        || matches!(
            name,
            "PATH" | "LANG" | "LANGUAGE" | "TZ" | "TMPDIR" | "HOME"
        )
}

/// The supervisor's first call: the session's environment and files.
fn setup_frame(spec: &SessionSpec) -> Vec<u8> {
    let files: serde_json::Map<String, serde_json::Value> = spec
        .files
        .iter()
        .map(|(path, data)| {
            let value = match data {
                forkbox_queue::schema::FileData::Text(t) => json!(t),
                forkbox_queue::schema::FileData::Base64(b) => json!({ "b64": b }),
            };
            (path.clone(), value)
        })
        .collect();
    let frame = json!({"id": "setup", "op": "setup", "env": spec.env, "files": files});
    serde_json::to_vec(&frame).unwrap_or_default()
}

/// A session's sandbox opened ahead of its session: its supervisor is ready and waits for
/// its setup. Dropped, it is killed as a session is.
pub struct PreparedSession {
    session: SandboxSession,
    shape: SessionShape,
    deadline: Instant,
}

impl Engine {
    /// Opens a sandbox for a session of `shape` that does not exist yet, and waits for its
    /// supervisor's hello. Takes no slot, as [`Engine::open_session`].
    pub async fn prepare_session(&self, shape: SessionShape) -> Result<PreparedSession, OpenError> {
        let engine = self.session_engine(shape.runtime);
        let mut job = engine.session_job(&shape.spec())?;
        if let Some(argv) = job.argv.as_mut() {
            argv.push(PREPARED_ARG.into());
        }
        let limits = job.limits.resolve(&engine.inner.config.defaults);
        // The deadline is counted from before the hand-over: never later than the watchdog's.
        let started = Instant::now();
        let session = engine
            .start_session(&job, limits)
            .map_err(|e| OpenError::Failed(e.to_string()))?;
        let session = session.hello_awaited().await?;
        Ok(PreparedSession {
            session,
            shape,
            deadline: started + Duration::from_millis(shape.ttl_ms),
        })
    }
}

impl PreparedSession {
    pub fn shape(&self) -> &SessionShape {
        &self.shape
    }

    /// When the sandbox's watchdog ends it at the latest (its ttl from its start).
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether its sandbox has ended (killed, or its watchdog's deadline passed).
    pub fn is_ended(&self) -> bool {
        self.session.is_ended()
    }

    /// Host pids of its init and supervisor, once known.
    pub fn host_pids(&self) -> Option<Vec<i32>> {
        self.session.host_pids()
    }

    /// Makes it the session `spec` asks for: `spec` is checked as [`Engine::open_session`]
    /// checks it, must be of this sandbox's shape, and its environment and files are given
    /// to the supervisor. On any failure the sandbox is killed: the caller opens the
    /// session fresh, which says what is wrong with the spec, if anything.
    pub async fn hand_over(
        self,
        engine: &Engine,
        spec: &SessionSpec,
    ) -> Result<SandboxSession, OpenError> {
        let PreparedSession {
            mut session, shape, ..
        } = self;
        let checked = engine.check_prepared(spec, &shape);
        if let Err(e) = checked {
            session.kill().await;
            return Err(e);
        }
        match setup(&mut session, spec).await {
            Ok(()) => Ok(session),
            Err(why) => {
                let end = session.kill().await;
                Err(OpenError::Failed(format!(
                    "the prepared session's setup failed: {why} ({})",
                    end.message()
                )))
            }
        }
    }

    /// Ends it: kills its sandbox and waits until everything it held is released.
    pub async fn discard(self) -> SessionEnd {
        self.session.kill().await
    }
}

impl Engine {
    /// The engine whose zygote builds a session's sandbox: the warm runtime's for a runtime.
    fn session_engine(&self, runtime: Option<Runtime>) -> Engine {
        match (runtime, &self.runtime) {
            (Some(_), Some(r)) => r.as_ref().clone(),
            _ => self.clone(),
        }
    }

    /// `spec` checked as a fresh open checks it, and of `shape`.
    fn check_prepared(&self, spec: &SessionSpec, shape: &SessionShape) -> Result<(), OpenError> {
        if SessionShape::of(spec).as_ref() != Some(shape) {
            return Err(OpenError::Failed(
                "the session is not of the prepared sandbox's shape".into(),
            ));
        }
        let engine = self.session_engine(spec.runtime);
        let job = engine.session_job(spec)?;
        let limits = job.limits.resolve(&engine.inner.config.defaults);
        match files_past_disk(&job, &limits) {
            Some(refused) => Err(OpenError::Invalid(refused.error.unwrap_or_default())),
            None => Ok(()),
        }
    }
}

/// Sends the setup and waits for its result.
async fn setup(session: &mut SandboxSession, spec: &SessionSpec) -> Result<(), String> {
    session
        .send(&setup_frame(spec))
        .await
        .map_err(|e| format!("sending it: {e}"))?;
    let answer = tokio::time::timeout(SETUP_WAIT, session.recv())
        .await
        .map_err(|_| "no answer".to_owned())?
        .map_err(|end| end.message())?;
    let result: serde_json::Value =
        serde_json::from_slice(&answer).map_err(|e| format!("its answer: {e}"))?;
    match (&result["call"], &result["kind"], &result["ok"]) {
        (c, k, serde_json::Value::Bool(true)) if c == "setup" && k == "result" => Ok(()),
        _ => Err(result["error"]
            .as_str()
            .unwrap_or("an unexpected answer")
            .to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_served_prepared_unless_its_start_would_differ() {
        let spec = |env: &[(&str, &str)]| SessionSpec {
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            runtime: Some(Runtime::Python),
            ttl_ms: 1000,
            ..SessionSpec::default()
        };
        let cases: [(&[(&str, &str)], bool); 9] = [
            (&[], true),
            (&[("FOO", "1"), ("MPLBACKEND", "svg")], true),
            (&[("PATH", "/x")], false),
            (&[("PYTHONHASHSEED", "0")], false),
            (&[("LC_ALL", "C")], false),
            (&[("LANG", "C")], false),
            (&[("TZ", "UTC")], false),
            (&[("TMPDIR", "/work")], false),
            (&[("HOME", "/work")], false),
        ];
        for (env, served) in cases {
            let s = spec(env);
            assert_eq!(SessionShape::of(&s).is_some(), served, "{env:?}");
        }
        let mut big = spec(&[]);
        big.files.insert(
            "big.txt".into(),
            forkbox_queue::schema::FileData::Text("x".repeat(MAX_FRAME)),
        );
        assert_eq!(SessionShape::of(&big), None);
    }

    #[test]
    fn a_shape_is_what_only_the_sandbox_creation_sets() {
        let a = SessionSpec {
            runtime: Some(Runtime::Python),
            ttl_ms: 1000,
            ..SessionSpec::default()
        };
        let mut b = a.clone();
        b.env.insert("FOO".into(), "1".into());
        assert_eq!(SessionShape::of(&a), SessionShape::of(&b));
        b.limits.memory_mb = Some(64);
        assert_ne!(SessionShape::of(&a), SessionShape::of(&b));
        let c = SessionSpec {
            network: Some(Network::Loopback),
            ..a.clone()
        };
        assert_ne!(SessionShape::of(&a), SessionShape::of(&c));
    }
}
