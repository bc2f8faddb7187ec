//! The sandbox engine: runs jobs in rootless, fully isolated sandboxes forked from a warm zygote.
//!
//! [`Engine::start`] exec's the zygote (`forkbox __zygote`), writes its user-namespace id maps
//! and waits until it is ready; [`Engine::run`] then costs one message to the zygote, which hands
//! a pre-built sandbox the job. The engine's side of a run is all asynchronous: stdout and stderr
//! are read from pipes with a cap, the init's report and the zygote's exit event are awaited, and
//! everything is folded into an [`Outcome`](forkbox_queue::schema::Outcome). See
//! `docs/architecture.md` for the whole sequence.
//!
//! The engine's side, one file per concern:
//! - `engine`: configuration, start-up of the zygote, what the host enforces ([`Mechanisms`]);
//! - `run`: one job, end to end: checks, payload, hand-over, waiting, outcome;
//! - `payload`: what a job becomes before it is handed over (environment, memfds, exec size);
//! - `handover`: giving a job to a ready launcher (or the zygote's queue), cgroup placement;
//! - `events`: the zygote's event reader, routing each event to its run;
//! - `event_loop`: each run's wait for its report and exit, and the kills it sends;
//! - `output`: capped stdout/stderr capture;
//! - `outcome`: the pure fold of what was observed into an `Outcome`;
//! - `identity`: user namespaces and id maps; `staging`: the host staging directory.
//!
//! The processes it starts, one file each: `zygote` (with its `watchdog`), `init` (pid 1 of
//! each sandbox), and `launcher` (which becomes the program), with the isolation steps they
//! share in files named after them: `identity`, `rootfs`, `netns`, `ipc`, `counts`, `limits`,
//! `hardening` (no_new_privs, capabilities, seccomp), `seccomp`, `cgroup`, `budget`, `memory`,
//! `collect`, and `usage` (what a sandbox killed from outside used).
//! Messages between them are in `wire`; every `unsafe` block is in `sys`.

pub mod budget;
pub mod cgroup;
pub mod collect;
pub mod counts;
mod engine;
mod event_loop;
mod events;
mod handover;
pub mod hardening;
pub mod held;
mod identity;
pub mod init;
pub mod ipc;
pub mod launcher;
pub mod limits;
pub mod memory;
pub mod netns;
mod outcome;
mod output;
mod payload;
pub mod rootfs;
mod run;
pub mod runtime;
pub mod seccomp;
mod stage;
mod staging;
#[allow(unsafe_code)]
pub mod sys;
pub mod syscalls;
mod usage;
mod watchdog;
pub mod wire;
pub mod zygote;

pub use engine::{default_slots, CgroupSource, Engine, EngineConfig, EngineError, Mechanisms};
pub use output::{OutputChunk, OutputStream};
pub use run::Slot;

/// The job's working directory inside every sandbox (also its `HOME`).
pub const DEFAULT_WORK_DIR: &str = "/work";
/// Host directories exposed by default (those that exist).
pub const DEFAULT_ALLOWLIST: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];
/// `PATH` inside the sandbox unless the job sets one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Host uid (and gid) that the sandbox's root maps to when the node runs as host root.
pub const DEFAULT_ROOT_MAPPED_ID: u32 = 100_000;

/// CLOCK_MONOTONIC in nanoseconds; shared by the engine and the zygote.
pub fn mono_ns() -> i64 {
    let ts =
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    ts.tv_sec() * 1_000_000_000 + ts.tv_nsec()
}
