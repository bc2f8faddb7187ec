//! `forkbox-loadgen`: drives a Forkbox cluster through Redis and measures it.
//!
//! A run sends jobs from a workload [`mix`] (closed loop, open loop at a fixed rate, or a ramp),
//! reads every result from the queue's results stream ([`driver`]), and reports throughput,
//! latency percentiles (HDR histograms, corrected for coordinated omission: [`stats`]), results
//! by status, and lost and duplicated jobs ([`report`], [`plot`]). It can start the cluster it
//! measures: worker nodes ([`cluster`]), optionally in network namespaces standing in for
//! separate hosts ([`netns`]), and its own Redis (`forkbox_private_redis::RedisServer`), and it can
//! kill a worker or Redis part-way through to check that no job is lost. With `--gateway URL`
//! it measures the HTTP gateway's cost per request against a direct client ([`gateway`]).

#![forbid(unsafe_code)]

pub mod cli;
pub mod cluster;
pub mod driver;
pub mod gateway;
pub mod humaneval;
pub mod mix;
pub mod netns;
pub mod orphans;
pub mod plot;
pub mod report;
pub mod run;
pub mod sessions;
pub mod stats;

use std::path::PathBuf;

/// The workspace root (the parent of this crate's directory), for default paths.
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

#[cfg(test)]
mod tests {
    /// The load generator measures from outside, as a client: the protocol crate, never the
    /// engine (docs/architecture.md, "Benchmarks").
    #[test]
    fn the_load_generator_never_links_the_engine() {
        let manifest = std::fs::read_to_string(super::workspace_root().join("loadgen/Cargo.toml"))
            .expect("loadgen/Cargo.toml");
        let value: toml::Value = manifest.parse().expect("a valid manifest");
        let mut deps = Vec::new();
        for table in ["dependencies", "build-dependencies"] {
            if let Some(t) = value.get(table).and_then(|t| t.as_table()) {
                deps.extend(t.keys().cloned());
            }
        }
        assert!(deps.iter().any(|d| d == "forkbox-queue"), "{deps:?}");
        assert!(!deps.iter().any(|d| d == "forkbox"), "{deps:?}");
    }
}
