//! Forkbox: a job-queue worker node that runs untrusted code in rootless sandboxes forked from
//! a warm zygote.

pub mod bench;
pub mod check;
pub mod cli;
pub mod daemon;
pub mod node;
pub mod sandbox;
