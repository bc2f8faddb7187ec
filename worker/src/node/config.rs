//! Node configuration: the resolved settings ([`NodeConfig`]), their defaults and checks.
//!
//! The defaults are named here once ([`NodeConfig::new`], with the queue's in `QueueConfig`
//! and the job maximums in `JobCeilings`). The `forkbox` binary builds a `NodeConfig` from
//! its one settings type, flags and environment over the `--config` file over these defaults.
//! A job asking for more than the maximums is dead-lettered as `invalid`.

use std::net::SocketAddr;
use std::time::Duration;

use forkbox_queue::schema::{MAX_ATTEMPTS, MAX_RESULT_TTL_S};
use forkbox_queue::{Endpoint, JobCeilings, QueueConfig, RedisTls};

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
    /// One Redis URL, or with `cluster` the comma-separated seed URLs of a Redis Cluster.
    pub redis_url: String,
    /// CA file and client certificate of a `rediss://` URL.
    pub redis_tls: RedisTls,
    /// Whether `redis_url` names a Redis Cluster's seed nodes.
    pub cluster: bool,
    /// Queues in priority order, highest first.
    pub queues: Vec<String>,
    /// Partitions of each queue (1: the v1 layout); must match the queues' meta keys.
    pub partitions: usize,
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
    /// The most a job may ask for (limits, `timeout_ms`, `max_attempts`, `result_ttl_s`);
    /// the engine refuses a job asking for more as `invalid`.
    pub ceilings: JobCeilings,
    /// Cap on the bytes of the files one job collects.
    pub collect_max_bytes: u64,
    /// Serve from a Redis whose `maxmemory-policy` is not `noeviction` (it may evict job
    /// streams and results); refused without it.
    pub allow_eviction: bool,
    /// The languages the node probes at start and publishes with its heartbeat.
    pub runtimes: crate::runtimes::Catalogue,
    /// How many sessions, how much memory for them, and their maximum lifetimes.
    pub sessions: SessionSettings,
}

/// A node's capacity for sessions (docs/protocol.md "Sessions").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSettings {
    /// Sessions live at once (`--max-sessions`); 0 serves none.
    pub max_sessions: usize,
    /// The most the live sessions' `memory_mb` may sum to (`--session-memory-mb`).
    pub memory_mb: u64,
    /// The most `ttl_s` and `idle_s` a session may ask (`--max-session-ttl`,
    /// `--max-session-idle`).
    pub ceilings: forkbox_queue::session::SessionCeilings,
    /// Session sandboxes kept opened ahead of demand (`--session-pool`), counted against
    /// the two limits above; 0 opens each at its create.
    pub pool: usize,
    /// Checkpoints one session may hold at once (`--max-session-checkpoints`).
    pub max_checkpoints: usize,
}

impl Default for SessionSettings {
    fn default() -> Self {
        SessionSettings {
            max_sessions: 8,
            memory_mb: host_memory_mb() / 4,
            ceilings: Default::default(),
            pool: 1,
            max_checkpoints: 8,
        }
    }
}

/// The host's memory (`MemTotal`), in MiB; 4096 when it cannot be read.
fn host_memory_mb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(4096, |kb| kb / 1024)
}

impl NodeConfig {
    /// A configuration with defaults for everything but the Redis URL.
    pub fn new(redis_url: impl Into<String>) -> NodeConfig {
        NodeConfig {
            redis_url: redis_url.into(),
            redis_tls: RedisTls::default(),
            cluster: false,
            queues: vec![DEFAULT_QUEUE.to_owned()],
            partitions: 1,
            slots: crate::sandbox::default_slots(),
            prefetch: 0,
            name: default_name(),
            metrics_addr: None,
            grace: Duration::from_secs_f64(DEFAULT_GRACE_S),
            queue: QueueConfig::default(),
            block_ms: 1000,
            lag_interval: Duration::from_secs(5),
            ceilings: JobCeilings::default(),
            collect_max_bytes: crate::sandbox::EngineConfig::default().collect_max_bytes,
            allow_eviction: false,
            runtimes: crate::runtimes::Catalogue::builtin(),
            sessions: SessionSettings::default(),
        }
    }

    /// Where Redis is: `redis_url` read as one URL, or as cluster seeds.
    pub fn endpoint(&self) -> Result<Endpoint, forkbox_queue::QueueError> {
        Endpoint::parse(&self.redis_url, self.cluster)
    }

    /// Rejects settings the node cannot work with.
    pub fn validate(&self) -> Result<(), NodeError> {
        let bad = |setting, message: &str| {
            Err(NodeError::Setting {
                setting,
                message: message.to_owned(),
            })
        };
        let urls = match self.endpoint() {
            Ok(Endpoint::Single(url)) => vec![url],
            Ok(Endpoint::Cluster(seeds)) => seeds,
            Err(e) => return bad("redis", &e.to_string()),
        };
        for url in &urls {
            if let Err(message) = check_redis_url(url, &self.redis_tls) {
                return Err(NodeError::Setting {
                    setting: "redis",
                    message,
                });
            }
        }
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
        if self.partitions == 0 || self.partitions > forkbox_queue::keys::MAX_PARTITIONS {
            return Err(NodeError::Setting {
                setting: "partitions",
                message: format!(
                    "must be 1 to {}, not {}",
                    forkbox_queue::keys::MAX_PARTITIONS,
                    self.partitions
                ),
            });
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
        let c = &self.ceilings;
        if c.max_attempts == 0 || c.max_attempts > MAX_ATTEMPTS {
            return bad(
                "max_job_attempts",
                &format!("must be between 1 and {MAX_ATTEMPTS}"),
            );
        }
        if c.result_ttl_s == 0 || c.result_ttl_s > MAX_RESULT_TTL_S {
            return bad(
                "max_result_ttl_s",
                &format!("must be between 1 and {MAX_RESULT_TTL_S}"),
            );
        }
        if self.queue.result_ttl_s == 0 {
            return bad("result_ttl_s", "must be at least 1");
        }
        if !(MIN_RESULT_BYTES..=MAX_RESULT_BYTES).contains(&self.queue.max_result_bytes) {
            return bad(
                "max_result_bytes",
                &format!("must be between {MIN_RESULT_BYTES} and {MAX_RESULT_BYTES}"),
            );
        }
        if self.name.is_empty() || self.name.contains(|c: char| c.is_whitespace()) {
            return bad("name", "must be non-empty without spaces");
        }
        Ok(())
    }
}

/// Smallest `max_result_bytes`: room for a result's fields besides the output.
pub const MIN_RESULT_BYTES: usize = 64 * 1024;
/// Largest `max_result_bytes`: Redis' default `proto-max-bulk-len` (512 MiB) less room for the
/// other arguments of a completion.
pub const MAX_RESULT_BYTES: usize = 511 * 1024 * 1024;

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

/// URL schemes the Redis client understands.
const REDIS_SCHEMES: [&str; 4] = ["redis", "rediss", "redis+unix", "unix"];

/// Refuses a Redis URL the client cannot use with the TLS settings `tls`, saying why in words
/// (the client library's own message for an `http://` URL is "did not parse-
/// InvalidClientConfig").
pub fn check_redis_url(url: &str, tls: &RedisTls) -> Result<(), String> {
    let shown = forkbox_queue::connect::without_password(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "{shown:?} is not a Redis URL; write redis://HOST:PORT[/DB], rediss://HOST:PORT or \
             redis+unix:///PATH"
        ));
    };
    if !REDIS_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) {
        return Err(format!(
            "{shown}: the scheme {scheme}:// is not Redis's; use redis://, rediss:// (TLS) or \
             redis+unix:// (a socket)"
        ));
    }
    if rest.is_empty() {
        return Err(format!("{shown}: names no host or socket"));
    }
    forkbox_queue::connect::redis_client(url, tls)
        .map(drop)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        c.slots = 1;
        c.ceilings.max_attempts = 0;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("max_job_attempts"));
        c.ceilings.max_attempts = 10;
        c.queue.max_result_bytes = 10;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("max_result_bytes"));
    }
}
