//! A worker that runs nothing: forkbox's queue protocol with a no-op processor, for measuring
//! what the protocol costs Redis at rates no sandbox reaches on one host (`bench/redis_cost.py`,
//! system `forkbox-noop`, the counterpart of BullMQ's no-op worker).
//!
//! It reads and completes exactly as a node does (`Queue::read` when it holds nothing, then
//! `Queue::complete_many_and_read`: the completions and the next read on one round trip), and
//! stores for each delivery the result a `/bin/true` job gets, without running anything. It
//! stops on SIGTERM or SIGINT, after completing what it holds.
//!
//! Usage: noop_worker REDIS_URL QUEUE [SLOTS]

use forkbox_queue::{now_ms, Delivery, JobResult, Outcome, Queue, QueueConfig, Status};
use tokio::signal::unix::{signal, SignalKind};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, queue) = match &args[..] {
        [url, queue, ..] => (url.as_str(), queue.as_str()),
        _ => anyhow::bail!("usage: noop_worker REDIS_URL QUEUE [SLOTS]"),
    };
    let slots: usize = match args.get(2) {
        Some(s) => s.parse().map_err(|e| anyhow::anyhow!("SLOTS {s:?}: {e}"))?,
        None => 2,
    };
    anyhow::ensure!(slots > 0, "SLOTS must be at least 1");
    let q = Queue::connect(url, queue, QueueConfig::default()).await?;
    let consumer = format!("noop-{}", std::process::id());
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut held: Vec<Delivery> = Vec::new();
    let mut completed = 0u64;
    loop {
        if held.is_empty() {
            held = tokio::select! {
                read = q.read(&consumer, slots, 1000) => read?,
                _ = term.recv() => break,
                _ = int.recv() => break,
            };
            continue;
        }
        let results: Vec<JobResult> = held.iter().map(|d| result_of(d, &consumer)).collect();
        let done: Vec<(&Delivery, &JobResult)> = held.iter().zip(&results).collect();
        let (stored, read) = q.complete_many_and_read(&done, &consumer, slots).await;
        completed += stored?.len() as u64;
        held = read?;
    }
    eprintln!("noop_worker: {completed} completed");
    Ok(())
}

/// The result a `/bin/true` job gets, with its timing fields filled, so that it is as large
/// as a real one.
fn result_of(d: &Delivery, worker: &str) -> JobResult {
    let now = now_ms();
    let mut outcome = Outcome::not_run(Status::Ok, "");
    outcome.exit_code = 0;
    outcome.error = None;
    outcome.duration_ms = 0.412;
    outcome.spawn_us = 312;
    outcome.max_rss_kb = 1408;
    let mut r = JobResult::new(
        d.id.clone(),
        outcome,
        d.deliveries as u32,
        worker.to_owned(),
    );
    r.batch = d.batch();
    r.enqueued_at_ms = d.enqueued_at_ms();
    r.started_at_ms = Some(now);
    r.finished_at_ms = Some(now);
    r
}
