//! The worker node: consumes jobs from Redis Streams and runs them in the sandbox engine.
//!
//! A [`Node`] is one `forkbox worker` process seen from the inside. Its parts, one module each:
//!
//! - [`worker`]: the reader loop, the [`SlotPool`](worker::SlotPool) of admissions and holds,
//!   and the dispatcher. It reads no more stream entries than it has free slots plus its
//!   prefetch; each entry is started in read order as a job task that runs in the engine and
//!   hands its result to the outbox.
//! - [`outbox`]: finished results (and dead letters) waiting to be stored. It completes them in
//!   batches with one pipelined call and keeps them, retrying, while Redis is away, so a result
//!   that was computed is never dropped.
//! - [`upkeep`]: what runs beside the loop: heartbeats, claim refreshes for held entries, the
//!   queue-lag gauge, removal of dead consumers.
//! - [`cancel`]: the local view of cancelled ids and of the jobs that can be killed.
//! - [`metrics`]: the Prometheus recorder and the tiny HTTP responder for `/metrics` and
//!   `/healthz`.
//! - [`health`]: Redis error accounting and back-off.
//! - [`config`], [`cli`], [`client`], [`up`]: configuration, command-line entry points, the
//!   client commands and the one-command local node.

pub mod bench;
pub mod cancel;
pub mod cli;
pub mod client;
pub mod config;
pub mod error;
pub mod health;
pub mod metrics;
pub mod outbox;
pub mod up;
pub mod upkeep;
pub mod worker;

pub use config::NodeConfig;
pub use error::NodeError;
pub use worker::{Node, NodeReport, StopHandle, StopLevel};
