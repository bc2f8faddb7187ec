//! The worker node: consumes jobs from Redis Streams and runs them in the sandbox engine.
//!
//! A [`Node`] is one `forkbox worker` process seen from the inside. Its parts, one module each:
//!
//! - [`worker`]: the [`Node`] itself: it connects, opens the queues, starts the other parts
//!   and, once asked to stop, drains them in order.
//! - [`reader`]: the read path, where every job starts. It reads no more stream entries than
//!   it has free admissions (slots plus prefetch), drains its own pending entries at start,
//!   reclaims idle ones, and admits what completions read, which the outbox hands it.
//! - [`job`]: the dispatcher, which starts deliveries in read order as engine slots free up,
//!   and the job task, which runs one in the engine and carries out its disposition.
//! - [`disposition`]: the pure decision whether a finished run is stored, dead-lettered, left
//!   pending or handed back.
//! - [`shared`]: the state the reader, the job tasks, the outbox and upkeep share.
//! - [`admission`]: the [`SlotPool`](admission::SlotPool) of the two permits of each
//!   delivery, its [`Admission`](admission::Admission) and its [`Hold`](admission::Hold).
//! - `seam`: the `Runner` and `JobQueue` traits through which the reader, the outbox and the
//!   job tasks reach the engine and Redis (unit tests put fakes behind them).
//! - [`held`]: the entries the node holds, whose claims upkeep refreshes.
//! - [`stop`]: the [`StopLevel`] every part watches and the [`StopHandle`] that raises it.
//! - [`outbox`]: finished results (and dead letters) waiting to be stored. It completes them in
//!   batches with one pipelined call and keeps them, retrying, while Redis is away, so a result
//!   that was computed is never dropped; what a completion reads goes to the reader.
//! - [`upkeep`]: what runs beside the loop: heartbeats, claim refreshes for held entries, the
//!   queue-lag gauge, removal of dead consumers.
//! - [`cancel`]: the local view of cancelled ids and of the jobs that can be killed.
//! - [`metrics`]: the Prometheus recorder and the tiny HTTP responder for `/metrics` and
//!   `/healthz`.
//! - [`health`]: Redis error accounting and back-off.
//! - [`data_loss`]: seeing Redis lose data under the node, and the one warning that says what
//!   was lost.
//! - [`gate`]: the bounds on a listening socket (connections, time to send a request head)
//!   and the node's descriptor headroom.
//! - [`preflight`]: what the node checks of its Redis before it reads (eviction policy, largest
//!   value Redis takes).
//! - `session`, `session_task`, `session_relay`: sessions (long-lived sandboxes served calls
//!   through Redis): opening them from their create jobs, routing calls, one task per session
//!   owning its sandbox, and the pure pieces (capacity, output cap, clocks); `session_fork`:
//!   a session's `fork` call (capacity, the engine's fork, the branches recorded and started).
//!   `session_pool`: session sandboxes opened ahead of demand, within the sessions' capacity.
//! - [`config`]: the resolved settings of a node ([`NodeConfig`]), their defaults and checks.
//!
//! The command-line entry points (`forkbox worker`, `up`, the client commands) live in the
//! binary's `cmd` tree, which builds a [`NodeConfig`] and an engine and runs a [`Node`].

pub mod admission;
pub mod cancel;
pub mod config;
pub mod data_loss;
pub mod disposition;
pub mod error;
#[cfg(test)]
mod fake;
pub mod gate;
pub mod health;
pub mod held;
pub mod job;
pub mod metrics;
pub mod outbox;
#[cfg(test)]
mod path_test;
pub mod preflight;
pub mod reader;
pub(crate) mod seam;
pub(crate) mod session;
pub(crate) mod session_calls;
pub(crate) mod session_checkpoint;
pub(crate) mod session_fork;
pub(crate) mod session_pool;
pub(crate) mod session_relay;
pub(crate) mod session_task;
pub mod shared;
pub mod stop;
pub mod upkeep;
pub mod worker;

pub use config::NodeConfig;
pub use error::NodeError;
pub use stop::{StopHandle, StopLevel};
pub use worker::{Node, NodeReport};
