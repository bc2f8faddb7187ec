//! What runs beside the reader: heartbeats, claim refreshes, the lag gauge, consumer clean-up.
//!
//! Every third of the visibility timeout the node renews its heartbeat key on each queue and
//! refreshes its claims on every entry it holds (running, or finished and waiting in the
//! outbox), so the reclaimers of other nodes never take a live job; beside the heartbeat it
//! publishes what the node can run (`forkbox:{Q}:runtimes:<name>`, once probed). Every `lag_interval` it
//! reads the queues' stats into `forkbox_queue_lag`, `forkbox_queue_pending` and
//! `forkbox_dead_letter_length` (each by `queue`); every few visibility timeouts it
//! removes consumers that hold nothing and whose heartbeat expired (the queue crate's script
//! checks both atomically, so a dead worker's entries are reclaimed before its consumer goes).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use forkbox_queue::QueueSet;

use crate::node::health::RedisHealth;
use crate::node::held::Held;
use crate::node::metrics as m;

/// Runs until aborted.
pub async fn run(
    set: QueueSet,
    worker: String,
    held: Arc<Held>,
    health: Arc<RedisHealth>,
    visibility: Duration,
    lag_interval: Duration,
    runtimes: Arc<OnceLock<String>>,
) {
    let refresh_every = (visibility / 3).max(Duration::from_millis(100));
    // Longer than two refresh periods, so one late refresh does not make the node look dead.
    let heartbeat_ttl = visibility.max(refresh_every * 3);
    let cleanup_every = (visibility * 4).max(Duration::from_secs(10));
    let mut tick = tokio::time::interval(refresh_every.min(lag_interval));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let now = Instant::now();
    let (mut next_refresh, mut next_lag, mut next_cleanup) = (now, now, now + cleanup_every);
    loop {
        tick.tick().await;
        let now = Instant::now();
        if now >= next_refresh {
            next_refresh = now + refresh_every;
            for q in set.queues() {
                if let Err(e) = q.heartbeat(&worker, heartbeat_ttl).await {
                    health.failed("renewing the heartbeat", &e);
                    continue;
                }
                // What the node can run lives as long as its heartbeat (once probed).
                if let Some(json) = runtimes.get() {
                    if let Err(e) = q.publish_runtimes(&worker, json, heartbeat_ttl).await {
                        health.failed("publishing the runtimes", &e);
                    }
                }
                let ids = held.of(q.name(), q.keys().partition_index());
                match q.refresh_claims(&worker, &ids).await {
                    Ok(lost) => {
                        for entry in lost {
                            // Either acknowledged meanwhile, or another node took it while this
                            // one stalled; the first stored result wins either way.
                            if held
                                .of(q.name(), q.keys().partition_index())
                                .contains(&entry)
                            {
                                tracing::warn!(
                                    queue = q.name(),
                                    "entry {entry} is no longer ours (reclaimed by another \
                                     worker); finishing it anyway"
                                );
                            }
                        }
                    }
                    Err(e) => health.failed("refreshing claims", &e),
                }
            }
        }
        if now >= next_lag {
            next_lag = now + lag_interval;
            for q in set.queues() {
                match q.stats().await {
                    Ok(s) => {
                        let lag = s.lag.unwrap_or(s.length.saturating_sub(s.pending));
                        let queue = q.name().to_owned();
                        ::metrics::gauge!(m::QUEUE_LAG, "queue" => queue.clone()).set(lag as f64);
                        ::metrics::gauge!(m::QUEUE_PENDING, "queue" => queue.clone())
                            .set(s.pending as f64);
                        ::metrics::gauge!(m::DEAD_LETTER_LENGTH, "queue" => queue)
                            .set(s.dead as f64);
                    }
                    Err(e) => health.failed("reading queue stats", &e),
                }
            }
        }
        if now >= next_cleanup {
            next_cleanup = now + cleanup_every;
            for q in set.queues() {
                match q.remove_dead_consumers().await {
                    Ok(gone) if !gone.is_empty() => tracing::info!(
                        queue = q.name(),
                        "removed dead consumer(s) with nothing pending: {}",
                        gone.join(", ")
                    ),
                    Ok(_) => {}
                    Err(e) => health.failed("removing dead consumers", &e),
                }
            }
        }
    }
}
