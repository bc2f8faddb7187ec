//! `forkbox-loadgen`: drives a Forkbox cluster and reports throughput and latency.

#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    anyhow::bail!("forkbox-loadgen is not built yet")
}
