//! Forkbox: a job-queue worker node that runs untrusted code in rootless sandboxes forked from
//! a warm zygote.

pub mod sandbox;
