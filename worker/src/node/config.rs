//! Node configuration: resolved settings ([`NodeConfig`]) and the TOML file ([`FileConfig`]).
//!
//! Each setting comes from, in order of precedence: the command-line flag, its environment
//! variable (`FORKBOX_REDIS_URL`, `FORKBOX_QUEUES`, `FORKBOX_SLOTS`, `FORKBOX_METRICS_ADDR`, ...),
//! the TOML file given with `--config`, and the built-in default. The file uses the flags'
//! names with underscores (`redis`, `queues`, `slots`, `prefetch`, `metrics_addr`, `grace`,
//! `visibility_timeout_ms`, `max_attempts`, `name`, ...); unknown keys are rejected.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use forkbox_queue::QueueConfig;
use serde::Deserialize;

use crate::node::error::NodeError;

/// Where a node looks for Redis when told nothing.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// The queue a node reads when told nothing.
pub const DEFAULT_QUEUE: &str = "default";
/// Seconds running jobs get to finish after SIGTERM.
pub const DEFAULT_GRACE_S: f64 = 30.0;

/// Everything a [`Node`](crate::node::Node) needs besides its engine.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub redis_url: String,
    /// Queues in priority order, highest first.
    pub queues: Vec<String>,
    /// Jobs run at once.
    pub slots: usize,
    /// Entries read ahead of a free slot, so a slot that frees up starts its next job without
    /// a Redis round trip. Each waits on this node while it could run on an idle one, so it
    /// suits queues that stay full (batch runs) more than latency-bound ones; 0 by default.
    pub prefetch: usize,
    /// Consumer name in group `workers`; unique per process.
    pub name: String,
    /// Where `/metrics` and `/healthz` are served; `None` for no listener.
    pub metrics_addr: Option<SocketAddr>,
    /// How long running jobs may take to finish after a stop request.
    pub grace: Duration,
    /// Visibility timeout, attempts, TTLs and caps of every queue read.
    pub queue: QueueConfig,
    /// Longest blocking read; bounds how late the reclaimer runs and a stop is noticed.
    pub block_ms: u64,
    /// How often `forkbox_queue_lag` is refreshed.
    pub lag_interval: Duration,
}

impl NodeConfig {
    /// A configuration with defaults for everything but the Redis URL.
    pub fn new(redis_url: impl Into<String>) -> NodeConfig {
        NodeConfig {
            redis_url: redis_url.into(),
            queues: vec![DEFAULT_QUEUE.to_owned()],
            slots: default_slots(),
            prefetch: 0,
            name: default_name(),
            metrics_addr: None,
            grace: Duration::from_secs_f64(DEFAULT_GRACE_S),
            queue: QueueConfig::default(),
            block_ms: 1000,
            lag_interval: Duration::from_secs(5),
        }
    }

    /// Rejects settings the node cannot work with.
    pub fn validate(&self) -> Result<(), NodeError> {
        let bad = |setting, message: &str| {
            Err(NodeError::Setting {
                setting,
                message: message.to_owned(),
            })
        };
        if self.slots == 0 {
            return bad("slots", "must be at least 1");
        }
        if self.queues.is_empty() {
            return bad("queues", "name at least one queue");
        }
        for q in &self.queues {
            if let Err(e) = forkbox_queue::Keys::new(q) {
                return Err(NodeError::Setting {
                    setting: "queues",
                    message: e.to_string(),
                });
            }
        }
        if self.queue.visibility_timeout_ms < 300 {
            return bad(
                "visibility_timeout_ms",
                "must be at least 300 (claims are refreshed every third of it)",
            );
        }
        if self.queue.max_attempts == 0 {
            return bad("max_attempts", "must be at least 1");
        }
        if self.name.is_empty() || self.name.contains(|c: char| c.is_whitespace()) {
            return bad("name", "must be non-empty without spaces");
        }
        Ok(())
    }
}

/// One slot per CPU.
pub fn default_slots() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// `<hostname>-<pid>`: differs between hosts and between processes of one host.
pub fn default_name() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "forkbox".to_owned());
    let host: String = host
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect();
    format!("{host}-{}", std::process::id())
}

/// The `--config` file. Every key is optional.
#[derive(Debug, Default, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub redis: Option<String>,
    pub queues: Option<QueueList>,
    pub slots: Option<usize>,
    pub prefetch: Option<usize>,
    pub metrics_addr: Option<SocketAddr>,
    /// Seconds.
    pub grace: Option<f64>,
    pub visibility_timeout_ms: Option<u64>,
    pub max_attempts: Option<u32>,
    pub name: Option<String>,
    pub max_job_bytes: Option<usize>,
    pub result_ttl_s: Option<u64>,
    pub results_maxlen: Option<u64>,
    /// See `QueueConfig::skip_completed_on_read`.
    pub skip_completed_on_read: Option<bool>,
}

/// `queues = "high,default"` or `queues = ["high", "default"]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum QueueList {
    Joined(String),
    List(Vec<String>),
}

impl QueueList {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            QueueList::Joined(s) => split_queues(&s),
            QueueList::List(v) => v,
        }
    }
}

/// `high, default` → `["high", "default"]`.
pub fn split_queues(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|q| !q.is_empty())
        .map(str::to_owned)
        .collect()
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<FileConfig, NodeError> {
        let text = std::fs::read_to_string(path).map_err(|source| NodeError::ReadConfig {
            path: path.to_owned(),
            source,
        })?;
        FileConfig::parse(&text).map_err(|message| NodeError::ParseConfig {
            path: path.to_owned(),
            message,
        })
    }

    pub fn parse(text: &str) -> Result<FileConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim_end().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_keys_parse_and_unknown_keys_are_rejected() {
        let c = FileConfig::parse(
            "redis = \"redis://r:1/\"\nqueues = \"high, default\"\nslots = 3\n\
             metrics_addr = \"127.0.0.1:0\"\ngrace = 2.5\nvisibility_timeout_ms = 5000\n",
        )
        .unwrap();
        assert_eq!(c.redis.as_deref(), Some("redis://r:1/"));
        assert_eq!(c.queues.unwrap().into_vec(), ["high", "default"]);
        assert_eq!(c.slots, Some(3));
        assert_eq!(c.grace, Some(2.5));
        let c = FileConfig::parse("queues = [\"a\", \"b\"]").unwrap();
        assert_eq!(c.queues.unwrap().into_vec(), ["a", "b"]);
        let e = FileConfig::parse("slot = 3").unwrap_err();
        assert!(e.contains("unknown field `slot`"), "{e}");
    }

    #[test]
    fn default_name_carries_the_pid() {
        assert!(default_name().ends_with(&format!("-{}", std::process::id())));
    }

    #[test]
    fn validation_names_the_setting() {
        let mut c = NodeConfig::new("redis://x");
        c.validate().unwrap();
        c.queues = vec!["a b".into()];
        assert!(c.validate().unwrap_err().to_string().contains("queues"));
        c.queues = vec!["a".into()];
        c.slots = 0;
        assert!(c.validate().unwrap_err().to_string().contains("slots"));
    }
}
