//! Errors of the node: what can stop a worker from starting or from shutting down cleanly.
//!
//! Redis outages are not among them: the node rides those out with back-off (see
//! [`crate::node::health`]). These are the faults an operator must fix.

use std::net::SocketAddr;

use forkbox_queue::QueueError;

/// A node start-up or shutdown failure.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("the sandbox zygote exited; the node stopped so that its supervisor restarts it")]
    SandboxGone,
    #[error("invalid setting {setting}: {message}")]
    Setting {
        setting: &'static str,
        message: String,
    },
    #[error("queue {queue}: {source}")]
    OpenQueue {
        queue: String,
        #[source]
        source: Box<QueueError>,
    },
    #[error("binding the metrics listener on {addr}: {source}")]
    MetricsBind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("installing the Prometheus recorder: {0}")]
    MetricsInstall(String),
    #[error("installing the {signal} handler: {source}")]
    Signal {
        signal: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{count} finished result(s) could not be stored before exit (queue/id: {jobs}); their \
         entries stay pending and will run again"
    )]
    Unflushed { count: usize, jobs: String },
    #[error(
        "Redis runs with maxmemory-policy {policy}: at its memory limit it evicts keys, job \
         streams and results included, and jobs vanish unrun. Set `maxmemory-policy \
         noeviction` (redis.conf, or CONFIG SET), or start the node with --allow-eviction to \
         accept the loss"
    )]
    EvictionPolicy { policy: String },
    #[error(
        "Redis' ACL refuses this node's user {missing} (queue {queue}); give it the worker \
         role of docs/operations.md (\"ACL roles\")"
    )]
    MissingRight { queue: String, missing: String },
}
