//! The session supervisor: the Python program a session's sandbox runs instead of a job's
//! own (`session_supervisor.py`, stdlib only, Python 3.9+). It reads call frames on fd 0,
//! writes event frames on fd 1 (4-byte big-endian length, then a JSON object), keeps the
//! session's interpreter state in a kernel process it forks, and runs `exec` calls and file
//! operations itself. The engine's side is `engine::session`; the frames are in
//! `docs/protocol.md` and the process tree in `docs/architecture.md` ("Sessions").

/// The supervisor's source, run as `python3 -c SOURCE` (warm when the runtime allows it).
pub(crate) const SUPERVISOR_SOURCE: &str = include_str!("session_supervisor.py");
