//! What a node checks of its Redis before it reads a job.
//!
//! A Redis that evicts keys at its memory limit (any `maxmemory-policy` but `noeviction`)
//! drops job streams and results silently: jobs vanish unrun and batches never finish. The node
//! refuses to start on one unless told `--allow-eviction`, and then says at every start that
//! jobs may be lost. Redis' `proto-max-bulk-len` bounds one value: results are cut below it so
//! that storing one never breaks the connection. Managed Redis services often refuse `CONFIG`;
//! the node then says it could not check and goes on.

use std::collections::HashMap;
use std::time::Duration;

use forkbox_queue::{redis, Broker};

use crate::node::config::NodeConfig;
use crate::node::error::NodeError;

/// Room left under `proto-max-bulk-len` for the rest of a completion's arguments (a quarter of
/// it when that is less).
const BULK_MARGIN: u64 = 1024 * 1024;

/// Whether a node may serve from a Redis with this `maxmemory-policy`.
pub fn policy_allowed(policy: &str, allow_eviction: bool) -> Result<(), NodeError> {
    if policy == "noeviction" || allow_eviction {
        Ok(())
    } else {
        Err(NodeError::EvictionPolicy {
            policy: policy.to_owned(),
        })
    }
}

/// The largest result JSON the node stores, given Redis' `proto-max-bulk-len`.
pub fn result_bytes_within(configured: usize, proto_max_bulk_len: u64) -> usize {
    let margin = BULK_MARGIN.min(proto_max_bulk_len / 4);
    let room = proto_max_bulk_len.saturating_sub(margin).max(64 * 1024);
    configured.min(usize::try_from(room).unwrap_or(usize::MAX))
}

/// Checks the eviction policy and fits the result-size maximum to Redis; returns the config
/// the node runs with.
pub async fn check_redis(broker: &Broker, mut config: NodeConfig) -> Result<NodeConfig, NodeError> {
    match config_get(broker, "maxmemory-policy").await {
        Ok(Some(policy)) => {
            policy_allowed(&policy, config.allow_eviction)?;
            if policy != "noeviction" {
                tracing::warn!(
                    "Redis runs with maxmemory-policy {policy} and --allow-eviction is set: at \
                     its memory limit Redis evicts job streams and results, and jobs are lost \
                     without a trace. Use maxmemory-policy noeviction."
                );
            }
        }
        Ok(None) => tracing::warn!(
            "Redis did not report its maxmemory-policy; make sure it is noeviction, or jobs \
             and results may be evicted"
        ),
        Err(e) => tracing::warn!(
            "could not check Redis' maxmemory-policy ({e}); make sure it is noeviction, or \
             jobs and results may be evicted"
        ),
    }
    if let Ok(Some(len)) = config_get(broker, "proto-max-bulk-len").await {
        if let Ok(len) = len.parse::<u64>() {
            let fitted = result_bytes_within(config.queue.max_result_bytes, len);
            if fitted < config.queue.max_result_bytes {
                tracing::info!(
                    "Redis takes values of at most {len} bytes (proto-max-bulk-len): results \
                     are cut at {fitted} bytes"
                );
                config.queue.max_result_bytes = fitted;
            }
        }
    }
    Ok(config)
}

/// `CONFIG GET name`; `Ok(None)` when Redis knows no such setting.
async fn config_get(broker: &Broker, name: &str) -> Result<Option<String>, String> {
    let mut conn = broker.connection();
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg(name);
    let query = cmd.query_async::<HashMap<String, String>>(&mut conn);
    match tokio::time::timeout(Duration::from_secs(10), query).await {
        Ok(Ok(mut m)) => Ok(m.remove(name)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 10 s".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_noeviction_passes_unless_allowed() {
        assert!(policy_allowed("noeviction", false).is_ok());
        for p in [
            "allkeys-lru",
            "volatile-lru",
            "allkeys-random",
            "volatile-ttl",
        ] {
            let e = policy_allowed(p, false).unwrap_err().to_string();
            assert!(e.contains(p) && e.contains("--allow-eviction"), "{e}");
            assert!(policy_allowed(p, true).is_ok());
        }
    }

    #[test]
    fn results_are_cut_below_the_bulk_limit() {
        let mib = 1024 * 1024;
        assert_eq!(result_bytes_within(32 * mib, 512 * mib as u64), 32 * mib);
        assert_eq!(result_bytes_within(32 * mib, 4 * mib as u64), 3 * mib);
        assert_eq!(result_bytes_within(32 * mib, mib as u64), 768 * 1024);
        assert_eq!(result_bytes_within(32 * mib, 100_000), 75_000);
        assert_eq!(result_bytes_within(32 * mib, 80_000), 64 * 1024);
    }
}
