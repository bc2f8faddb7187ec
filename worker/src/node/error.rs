//! Errors of the node: what can stop a worker from starting or from shutting down cleanly.
//!
//! Redis outages are not among them: the node rides those out with back-off (see
//! [`crate::node::health`]). These are the faults an operator must fix.

use std::net::SocketAddr;

use forkbox_queue::QueueError;
use nix::errno::Errno;

/// A fault of the node, not of the job: a sandbox's set-up failed because the host ran short
/// of descriptors or memory. Such a job is handed back uncharged, and `/healthz` says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NodeFault {
    #[error("out of file descriptors ({0})")]
    Descriptors(Errno),
    #[error("out of memory ({0})")]
    Memory(Errno),
}

impl NodeFault {
    /// The node's fault behind a set-up that failed with `errno`, if it is one.
    pub fn of(errno: Errno) -> Option<NodeFault> {
        match errno {
            Errno::EMFILE | Errno::ENFILE => Some(NodeFault::Descriptors(errno)),
            Errno::ENOMEM => Some(NodeFault::Memory(errno)),
            _ => None,
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_host_short_of_descriptors_or_memory_is_the_node_s_fault() {
        assert_eq!(
            NodeFault::of(Errno::EMFILE),
            Some(NodeFault::Descriptors(Errno::EMFILE))
        );
        assert_eq!(
            NodeFault::of(Errno::ENFILE),
            Some(NodeFault::Descriptors(Errno::ENFILE))
        );
        assert_eq!(
            NodeFault::of(Errno::ENOMEM),
            Some(NodeFault::Memory(Errno::ENOMEM))
        );
        for errno in [Errno::ENOENT, Errno::EPERM, Errno::EINVAL, Errno::ENOSPC] {
            assert_eq!(NodeFault::of(errno), None, "{errno}");
        }
    }
}
