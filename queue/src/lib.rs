//! The Forkbox wire protocol.
//!
//! This crate is the contract between any Redis client and the worker nodes: the v1 job and
//! result JSON schemas ([`schema`]), the Redis key layout ([`keys`]), and the queue operations
//! on a [`Queue`]: enqueue, read, complete, dead-letter, reclaim, cancel, wait for results,
//! stats and dead-letter handling. It holds no sandbox code, so clients and tools can depend on
//! it without pulling in the engine. `docs/protocol.md` describes the same contract for clients
//! in other languages. [`redis_server::RedisServer`] runs a private `redis-server` for tests and
//! for `forkbox up`.
//!
//! A worker's loop, in terms of this crate:
//!
//! 1. `queue.ensure_group()`, then `queue.read_own_pending(name, slots)` once;
//! 2. `set.read(name, free_slots, block_ms)` (a [`QueueSet`] in priority order);
//! 3. run each [`Delivery`] whose `job` is `Ok`; [`Queue::dead_letter`] the others;
//! 4. [`Queue::complete_many`] the finished ones (one round trip);
//! 5. in the background: [`Queue::refresh_claims`] and [`Queue::heartbeat`] every third of the
//!    visibility timeout, [`Queue::reclaim`] every visibility timeout, and a
//!    [`CancelWatcher`] feeding the local set of cancelled ids.
//!
//! Round trips on the hot path: one blocking XREADGROUP per read, plus one pipelined EXISTS
//! when it returned entries added by a raw XADD rather than the enqueue script (see
//! [`QueueConfig::skip_completed_on_read`]), plus one [`Queue::complete_many`] for all the
//! jobs that finished together.

#![forbid(unsafe_code)]

mod admin;
mod cancel;
mod complete;
mod delivery;
mod enqueue;
mod error;
pub mod keys;
pub mod owner;
mod priority;
mod queue;
mod reclaim;
pub mod redis_server;
mod reply;
mod results;
pub mod schema;

pub use admin::{BatchStatus, ConsumerStats, DeadLetter, DlqSelection, Stats};
pub use cancel::{CancelEvent, CancelWatcher};
pub use complete::Completion;
pub use delivery::{parse_payload, Delivery};
pub use enqueue::Enqueued;
pub use error::QueueError;
pub use keys::Keys;
pub use priority::QueueSet;
pub use queue::{Broker, Queue, QueueConfig};
pub use reclaim::{Reclaimed, RECLAIM_PAGE};
pub use redis_server::{RedisServer, RedisServerError, RedisServerOptions};
pub use schema::{EffectiveLimits, FileData, Job, JobError, JobResult, Limits, Outcome, Status};

/// Re-exported so users name the same redis-rs version as this crate.
pub use redis;
