//! The floor every other room stands on: the system calls no library wraps safely, and the
//! clock. Nothing here imports from the rest of the sandbox.
//!
//! - `sys`: every `unsafe` block of the crate, each behind a safe function with a proof type
//!   where the call's soundness depends on the caller's state (`SingleThreaded`, `Forked`);
//!   the CPython FFI of the warm runtime is here too;
//! - `syscalls`: the seam over the calls whose order is the sandbox's design (mount, pivot,
//!   unshare, prctl, seccomp), with the host's implementation and a recording one for tests;
//! - `clock`: CLOCK_MONOTONIC, the one clock all processes stamp their events with.

pub(crate) mod clock;
#[allow(unsafe_code)]
pub(crate) mod sys;
pub(crate) mod syscalls;
