//! Forkbox: a job-queue worker node that runs untrusted code in rootless sandboxes forked from
//! a warm zygote.

// The only unsafe code lives in `sandbox::kernel::sys`, which opts back in.
#![deny(unsafe_code)]

pub mod gateway;
pub mod node;
pub mod runtimes;
pub mod sandbox;
