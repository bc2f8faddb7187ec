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
    #[error(
        "connecting to the Redis Cluster through {seeds}: {source} (are the seeds nodes of a \
         cluster with every slot served? a single server is used without --cluster)"
    )]
    ConnectCluster {
        seeds: String,
        #[source]
        source: redis::RedisError,
    },
    #[error(transparent)]
    Client(#[from] crate::connect::ConnectError),
    #[error("--redis {redis}: {reason}")]
    BadEndpoint { redis: String, reason: &'static str },
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
    #[error("handing entries back on queue {queue}: {source}")]
    HandBack {
        queue: String,
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
    #[error("session operation on queue {queue}: {source}")]
    Session {
        queue: String,
        #[source]
        source: redis::RedisError,
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
    #[error("checking this user's Redis rights on queue {queue}: {source}")]
    Rights {
        queue: String,
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
    #[error("reading the layout of queue {queue} (forkbox:{{{queue}}}:meta): {source}")]
    Layout {
        queue: String,
        #[source]
        source: redis::RedisError,
    },
    #[error(
        "queue {queue} has {live} partition(s) in Redis (forkbox:{{{queue}}}:meta), but \
         {configured} were asked for (--partitions {configured}); use --partitions {live}, or \
         drain and delete the queue to change it"
    )]
    PartitionsMismatch {
        queue: String,
        configured: usize,
        live: String,
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
            | ConnectCluster { source, .. }
            | EnsureGroup { source, .. }
            | Enqueue { source, .. }
            | Read { source, .. }
            | Complete { source, .. }
            | DeadLetter { source, .. }
            | HandBack { source, .. }
            | Reclaim { source, .. }
            | RefreshClaims { source, .. }
            | Results { source, .. }
            | Cancel { source, .. }
            | Session { source, .. }
            | Heartbeat { source, .. }
            | Stats { source, .. }
            | Rights { source, .. }
            | RemoveConsumers { source, .. }
            | Dlq { source, .. }
            | Batch { source, .. }
            | Layout { source, .. } => Some(source),
            Keys(_)
            | Client(_)
            | BadEndpoint { .. }
            | MixedBrokers
            | PartitionsMismatch { .. }
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
                || is_cluster_transient(e)
        })
    }

    /// True when Redis answered and refused the data of this operation: a script or command
    /// error on the values sent (an expire time out of range, a key of the wrong type, keys in
    /// different Cluster slots). Repeating the same operation cannot succeed, so the node
    /// gives up on the one job rather than retrying it for ever. Everything else that Redis
    /// may get over (out of memory, loading, a failover, busy, no permission) is not a
    /// refusal: the caller keeps the data and retries.
    pub fn is_refused(&self) -> bool {
        if self.is_connection() {
            return false;
        }
        self.redis_error().is_some_and(|e| {
            matches!(e.kind(), redis::ErrorKind::CrossSlot)
                || matches!(e.code(), Some("ERR" | "WRONGTYPE" | "CROSSSLOT"))
        })
    }
}

/// Whether `e` says a cluster slot is briefly unserved or moving (a failover or resharding
/// under way, and the cluster connection ran out of retries before it settled): retried like a
/// lost connection.
fn is_cluster_transient(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        redis::ErrorKind::ClusterDown
            | redis::ErrorKind::TryAgain
            | redis::ErrorKind::MasterDown
            | redis::ErrorKind::Moved
            | redis::ErrorKind::Ask
    ) || e
        .code()
        .is_some_and(|c| c == "CLUSTERDOWN" || c == "TRYAGAIN" || c == "MASTERDOWN")
}
