//! Errors of the queue operations.
//!
//! One variant per operation, carrying the queue and the Redis error, so a log line says what
//! was attempted where. [`QueueError::is_connection`] tells the node whether to back off and
//! retry (Redis unreachable or restarting) or to treat the failure as a bug or bad input.

use crate::keys::KeyError;
use crate::schema::JobError;

/// A failed queue operation.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("connecting to Redis at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: redis::RedisError,
    },
    #[error(transparent)]
    Keys(#[from] KeyError),
    #[error("queues of one set must share one broker connection")]
    MixedBrokers,
    #[error("creating consumer group on queue {queue}: {source}")]
    EnsureGroup {
        queue: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("refusing to enqueue an invalid job: {0}")]
    InvalidJob(#[source] JobError),
    #[error("enqueueing on queue {queue}: {source}")]
    Enqueue {
        queue: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("reading queue {queue}: {source}")]
    Read {
        queue: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("completing job {id} on queue {queue}: {source}")]
    Complete {
        queue: String,
        id: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("result id {result} does not match delivery id {delivery}")]
    IdMismatch { delivery: String, result: String },
    #[error("dead-lettering entry {entry_id} on queue {queue}: {source}")]
    DeadLetter {
        queue: String,
        entry_id: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("reclaiming idle entries on queue {queue}: {source}")]
    Reclaim {
        queue: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("refreshing claims on queue {queue}: {source}")]
    RefreshClaims {
        queue: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("looking up results on queue {queue}: {source}")]
    Results {
        queue: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("result of {id} on queue {queue} is not valid result JSON: {source}")]
    CorruptResult {
        queue: String,
        id: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cancellation on queue {queue}: {source}")]
    Cancel {
        queue: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("heartbeat of {worker} on queue {queue}: {source}")]
    Heartbeat {
        queue: String,
        worker: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("reading stats of queue {queue}: {source}")]
    Stats {
        queue: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("removing consumers of queue {queue}: {source}")]
    RemoveConsumers {
        queue: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("dead-letter operation on queue {queue}: {source}")]
    Dlq {
        queue: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("batch {batch} on queue {queue}: {source}")]
    Batch {
        queue: String,
        batch: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("unexpected reply to {command} on queue {queue}: {detail}")]
    UnexpectedReply {
        queue: String,
        command: &'static str,
        detail: String,
    },
}

impl QueueError {
    /// The underlying Redis error, if any.
    pub fn redis_error(&self) -> Option<&redis::RedisError> {
        use QueueError::*;
        match self {
            Connect { source, .. }
            | EnsureGroup { source, .. }
            | Enqueue { source, .. }
            | Read { source, .. }
            | Complete { source, .. }
            | DeadLetter { source, .. }
            | Reclaim { source, .. }
            | RefreshClaims { source, .. }
            | Results { source, .. }
            | Cancel { source, .. }
            | Heartbeat { source, .. }
            | Stats { source, .. }
            | RemoveConsumers { source, .. }
            | Dlq { source, .. }
            | Batch { source, .. } => Some(source),
            Keys(_)
            | MixedBrokers
            | InvalidJob(_)
            | IdMismatch { .. }
            | CorruptResult { .. }
            | UnexpectedReply { .. } => None,
        }
    }

    /// True when Redis was unreachable or the connection dropped: retry after a back-off.
    /// Such an operation may or may not have taken effect; every operation of this crate is
    /// safe to repeat (completion and dead-lettering are idempotent per id).
    pub fn is_connection(&self) -> bool {
        self.redis_error().is_some_and(|e| {
            e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.is_timeout()
                || e.code() == Some("LOADING")
        })
    }
}
