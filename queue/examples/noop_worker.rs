//! A worker that runs nothing: forkbox's queue protocol with a no-op processor, for measuring
//! what the protocol costs Redis at rates no sandbox reaches on one host (`bench/redis_cost.py`,
//! system `forkbox-noop`, the counterpart of BullMQ's no-op worker).
//!
//! It reads and completes as a node's reader and outbox do (`Queue::read` when it holds
//! nothing, then `Queue::complete_many_and_read`: the completions and the next read on one
//! round trip), and stores for each delivery the result a `/bin/true` job gets, without running
//! anything (a malformed job too: this is a measuring tool, not a node; it has no reclaimer and
//! no heartbeat either). On SIGTERM or SIGINT it stops reading, completes what it holds and
//! exits, printing how many results it stored.
//!
//! Usage: noop_worker REDIS_URL QUEUE [SLOTS]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use forkbox_queue::{now_ms, Completion, Delivery, JobResult, Outcome, Queue, QueueConfig, Status};
use tokio::signal::unix::{signal, SignalKind};

/// How long one blocking read waits before the stop flag is looked at again.
const READ_BLOCK_MS: u64 = 200;

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
    let stop = Arc::new(AtomicBool::new(false));
    for kind in [SignalKind::terminate(), SignalKind::interrupt()] {
        let mut sig = signal(kind)?;
        let stop = stop.clone();
        tokio::spawn(async move {
            sig.recv().await;
            stop.store(true, Ordering::SeqCst);
        });
    }
    let mut held: Vec<Delivery> = Vec::new();
    let mut stored = 0usize;
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        if held.is_empty() {
            if stopping {
                break;
            }
            // A read is never abandoned half-way (an entry Redis handed out then would stay
            // pending): it blocks briefly and the flag is looked at between reads.
            held = q.read(&consumer, slots, READ_BLOCK_MS).await?;
            continue;
        }
        let results: Vec<JobResult> = held.iter().map(|d| result_of(d, &consumer)).collect();
        let done: Vec<(&Delivery, &JobResult)> = held.iter().zip(&results).collect();
        let (completions, read) = if stopping {
            (q.complete_many(&done).await, Ok(Vec::new()))
        } else {
            q.complete_many_and_read(&done, &consumer, slots).await
        };
        // A failure ends the run: what it held stays pending, for a node's reclaimer.
        stored += completions?
            .iter()
            .filter(|c| matches!(c, Completion::Stored))
            .count();
        held = read?;
    }
    eprintln!("noop_worker: {stored} completed");
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
