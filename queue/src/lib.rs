//! The Forkbox wire protocol.
//!
//! This crate is the contract between any Redis client and the worker nodes: the v1 job and
//! result JSON schemas ([`schema`]), the Redis key layout ([`keys`]), and the queue operations
//! on a [`Queue`]: enqueue, read, complete, dead-letter, reclaim, cancel, wait for results,
//! stats and dead-letter handling. It holds no sandbox code, so clients and tools can depend on
//! it without pulling in the engine. `docs/protocol.md` describes the same contract for clients
//! in other languages. Running a Redis (`forkbox-private-redis`) and the test harness
//! (`forkbox-testkit`) live in crates of their own.
//!
//! A worker's loop, in terms of this crate:
//!
//! 1. `queue.ensure_group()`, then `queue.read_own_pending(name, slots)` once;
//! 2. `set.read(name, free_slots, block_ms)` (a [`QueueSet`] in priority order);
//! 3. run each [`Delivery`] whose `job` is `Ok`; [`Queue::dead_letter`] the others;
//! 4. [`Queue::complete_many`] the finished ones (one round trip);
//! 5. in the background: [`Queue::refresh_claims`] and [`Queue::heartbeat`] every third of the
//!    visibility timeout, [`Queue::reclaim`] every half visibility timeout (and again at
//!    once while [`Reclaimed::more`] says idle entries remain), [`Queue::recover_stranded`]
//!    as often as a read may take to answer (its own entries whose read reply was lost), and
//!    a [`CancelWatcher`] feeding the local set of cancelled ids;
//! 6. when it can no longer run jobs (its sandbox is gone): stop reading and
//!    [`Queue::hand_back`] what it holds, for the others to take at once.
//!
//! Round trips on the hot path: one blocking XREADGROUP per read, plus one pipelined EXISTS
//! when it returned entries added by a raw XADD rather than the enqueue script (see
//! [`QueueConfig::skip_completed_on_read`]), plus one [`Queue::complete_many`] for all the
//! jobs that finished together.

#![forbid(unsafe_code)]

mod admin;
mod cancel;
mod complete;
pub mod connect;
pub mod contract;
mod delivery;
mod enqueue;
mod error;
pub mod keys;
mod link;
mod members;
pub mod owner;
mod partitioned;
mod priority;
mod queue;
mod reclaim;
mod reply;
mod results;
pub mod schema;
mod scripts;
pub mod session;
mod session_ops;
pub mod shared_wait;
pub mod topology;

pub use admin::{
    glob_escape, live_workers, BatchStatus, ConsumerStats, DeadLetter, DlqSelection, Stats,
};
pub use cancel::{CancelEvent, CancelWatcher, JobState, MAX_CANCEL_AHEAD_S, SUBSCRIPTION_PING};
pub use complete::Completion;
pub use connect::{ConnectError, RedisTls};
pub use delivery::{parse_payload, Delivery};
pub use enqueue::Enqueued;
pub use error::QueueError;
pub use keys::Keys;
pub use link::{Link, CONNECT_TIMEOUT, RESPONSE_TIMEOUT};
pub use partitioned::Partitioned;
pub use priority::QueueSet;
pub use queue::{
    now_ms, Broker, Connection, Endpoint, Queue, QueueConfig, RoundTrips, DEFAULT_MAX_RESULT_BYTES,
};
pub use reclaim::{Reclaimed, HANDED_BACK_IDLE_MS, RECLAIM_PAGE};
pub use schema::{
    CompileStage, EffectiveLimits, FileData, Job, JobCeilings, JobError, JobResult, Limits,
    Network, Outcome, OutputMode, Runtime, RuntimeUse, StageLimits, StageOutcome, StageStatus,
    Status,
};
pub use session::{Call, CallOp, EndReason, ErrorReason, Event, SessionInfo, SessionOpened};
pub use session_ops::SessionError;
pub use shared_wait::SharedWaits;

/// Re-exported so users name the same redis-rs version as this crate.
pub use redis;
