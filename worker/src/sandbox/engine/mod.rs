//! The engine's side of the sandbox, all asynchronous and in the node's process:
//! - `start`: configuration, start-up of the zygote, what the host enforces (`Mechanisms`);
//! - `run`: one job, end to end: checks, payload, hand-over, waiting, outcome; `run_error`:
//!   why a run ended without an outcome of its own;
//! - `payload`: what a job becomes before it is handed over (environment, memfds, exec size);
//! - `handover`: giving a job to a ready launcher (or the zygote's queue), cgroup placement;
//! - `events`: the zygote's event reader, routing each event to its run;
//! - `event_loop`: each run's wait for its report and exit, and the kills it sends;
//! - `output`: capped stdout/stderr capture;
//! - `outcome`: the pure fold of what was observed into an `Outcome`;
//! - `session`: a long-lived sandbox running the session supervisor, talked to in frames;
//!   `session_fork`: a live session's fork into branches, with `disk_copy` (its disk);
//!   `session_checkpoint`: a live session's checkpoint (a frozen fork kept) and restores;
//!   `session_ahead`: a session's sandbox opened before its session, set up at hand-over;
//! - `staging`: the host staging directory; `defaults`: what a sandbox gets unless told;
//! - `check`: `forkbox check`'s probe of the host's mechanisms.

pub mod check;
pub(crate) mod defaults;
pub(crate) mod disk_copy;
pub(crate) mod event_loop;
pub(crate) mod events;
pub(crate) mod handover;
pub(crate) mod outcome;
pub(crate) mod output;
pub(crate) mod payload;
pub(crate) mod run;
pub(crate) mod run_error;
pub(crate) mod session;
pub(crate) mod session_ahead;
pub(crate) mod session_checkpoint;
pub(crate) mod session_fork;
pub(crate) mod staging;
pub(crate) mod start;
