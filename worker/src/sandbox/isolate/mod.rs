//! The isolation steps, one file per concern, each used by the processes of the sandbox tree
//! (and some by the engine to read what they left): they import from `kernel` and from each
//! other, never from `process` or `engine`. A step that fails says so with a [`SetupError`]
//! (`setup_error`), which travels between processes as data.
//!
//! [`SetupError`]: setup_error::SetupError

pub(crate) mod budget;
pub(crate) mod cgroup;
pub(crate) mod collect;
pub(crate) mod counts;
pub(crate) mod hardening;
pub(crate) mod held;
pub(crate) mod ipc;
pub(crate) mod limits;
pub(crate) mod memory;
pub(crate) mod netns;
pub(crate) mod pipes;
pub(crate) mod procfs;
pub(crate) mod rootfs;
pub(crate) mod seccomp;
pub(crate) mod setup_error;
pub(crate) mod sockets;
pub(crate) mod usage;
