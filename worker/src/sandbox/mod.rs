//! The sandbox engine: runs jobs in rootless, fully isolated sandboxes forked from a warm zygote.
//!
//! [`Engine::start`] exec's the zygote (`forkbox __zygote`), writes its user-namespace id maps
//! and waits until it is ready; [`Engine::run`] then costs one message to the zygote, which hands
//! a pre-built sandbox the job. The engine's side of a run is all asynchronous: stdout and stderr
//! are read from pipes with a cap, the init's report and the zygote's exit event are awaited, and
//! everything is folded into an [`Outcome`](forkbox_queue::schema::Outcome). See
//! `docs/architecture.md` for the whole sequence.
//!
//! Five rooms on four floors; a module imports only from its own floor or one below, never up
//! (`worker/tests/module_cycles.rs` holds the plan):
//! - `engine` (floor 3): the node's side, all asynchronous: configuration and the zygote's
//!   start-up (`start`), one job end to end (`run`), its payload, hand-over, events and waits,
//!   capped output, the pure fold into an outcome, the host staging directory, the defaults,
//!   and `check`, the probe of what the host supports;
//! - `process` (floor 2): one file per process of the sandbox tree, `zygote` (with its
//!   `watchdog`), `init` (pid 1 of each sandbox) and `launcher` (which becomes the program),
//!   the messages between them and the engine (`wire`) and the user namespaces they hand each
//!   other (`identity`);
//! - `isolate` (floor 1): the isolation steps the processes share, one file each: `rootfs`,
//!   `netns`, `ipc`, `counts`, `limits`, `hardening` (no_new_privs, capabilities, seccomp),
//!   `seccomp`, `cgroup`, `budget`, `memory`, `collect`, `usage`, `held`, `procfs` (the one
//!   reader of a sandbox's `/proc`), and the `SetupError` every step returns;
//! - `runtime` (floor 1): warm interpreters, initialised in the zygote and handed a job by the
//!   launcher;
//! - `kernel` (floor 0): `sys`, where every `unsafe` block lives (the CPython FFI included),
//!   `syscalls`, the seam over the calls whose order is the design, and `clock`.

mod engine;
mod isolate;
mod kernel;
mod process;
mod runtime;

pub use engine::check;
pub use engine::defaults::{DEFAULT_ALLOWLIST, DEFAULT_ROOT_MAPPED_ID, DEFAULT_WORK_DIR};
pub use engine::disk_copy::{CopyBound, DiskCopy, DiskCopyError, DiskSource};
pub use engine::output::{OutputChunk, OutputStream};
pub use engine::run::{RunEnd, Slot};
pub use engine::session::{
    EndReason, OpenError, SandboxSession, SessionEnd, SessionSpec, SessionUsage, MAX_FRAME,
};
pub use engine::session_ahead::{PreparedSession, SessionShape};
pub use engine::session_checkpoint::{CheckpointError, SessionCheckpoint};
pub use engine::session_fork::{BranchSteps, ForkError, ForkedBranch, SessionFork};
pub use engine::start::{
    default_slots, CgroupSource, Engine, EngineConfig, EngineError, Mechanisms,
};
pub use isolate::cgroup::{probe as probe_cgroup, Delegation};
pub use isolate::rootfs::{own_mount_points, RootSource};
pub use isolate::seccomp::denied_numbers;
pub use process::copy_cost::{
    measure_init_copy, AddedMemory, CopyCost, CopyCostPlan, CopyFigures, CopyMode,
};
pub use process::twin::{
    make_twin, make_twin_keeping, make_twin_of, FrozenState, HeldFrozen, TwinError, TwinLimits,
    TwinReport, TwinSteps,
};
pub use process::zygote::main as zygote_main;
pub use runtime::python::{
    PythonRuntime, PythonSettings, DEFAULT_PRELOAD as DEFAULT_PYTHON_PRELOAD,
};
