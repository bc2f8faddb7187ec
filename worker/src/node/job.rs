//! The dispatcher and the job tasks.
//!
//! The dispatcher starts deliveries in read order as engine slots free up. A job task runs one
//! delivery in the engine and decides what becomes of it (after the run,
//! [`disposition`](crate::node::disposition) decides):
//!
//! - a malformed entry, or one the engine rejects as `invalid`: dead-lettered with the reason;
//! - a sandbox set-up fault (`error`): left pending for the reclaimer, so it is retried, and
//!   dead-lettered with the fault's text on its last allowed delivery;
//! - any delivery the node cannot run because its sandbox zygote is gone (a fault of the node,
//!   not of the job): handed back ([`Queue::hand_back`](forkbox_queue::Queue::hand_back)) so
//!   another node takes it at once, with no attempt charged; the node stops reading at the
//!   first such failure, so it hands back at most its admissions;
//! - a job killed because the grace period ran out: left pending, untouched;
//! - anything else (`ok`, `failed`, `timeout`, `cancelled`, ...): a result.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use forkbox_queue::{Delivery, JobResult, Outcome, Status};
use tokio::sync::mpsc;

use crate::sandbox::Slot;

use crate::node::admission::Hold;
use crate::node::cancel::Start;
use crate::node::disposition::{disposition, Disposition, Ran, SandboxCheck};
use crate::node::gate::{node_resource_error, Descriptors};
use crate::node::metrics as m;
use crate::node::outbox::Outbox;
use crate::node::shared::{Queued, Shared};
use crate::node::stop::StopLevel;

impl Shared {
    /// Starts the read deliveries in the order they were read (priorities and stream order
    /// hold even for entries read ahead), each once an engine slot is free. Past the grace
    /// period, what still waits is left pending unrun.
    pub(crate) async fn dispatch(self: Arc<Self>, mut waiting: mpsc::UnboundedReceiver<Queued>) {
        let mut stop = self.life.stop.clone();
        while let Some(q) = waiting.recv().await {
            let slot = tokio::select! {
                biased;
                _ = stop.wait_for(|l| *l >= StopLevel::Kill) => None,
                slot = self.engine.slot() => Some(slot),
            };
            let Some(slot) = slot else {
                self.life.abandoned.fetch_add(1, Ordering::Relaxed);
                self.leave_pending(&q.d);
                continue;
            };
            let node = self.clone();
            tokio::spawn(async move {
                node.run_job(q.d, q.hold, slot, q.outbox).await;
                drop(q.unfinished);
            });
        }
    }

    /// Hands an entry this node cannot run back to the group, for another node to take now and
    /// with no attempt charged (see [`Queue::hand_back`](forkbox_queue::Queue::hand_back)).
    /// When Redis cannot be told, the entry stays pending and is reclaimed after the
    /// visibility timeout.
    pub(crate) async fn hand_back(&self, d: &Delivery) {
        // No longer held first: a claim refresh after the hand-back would make it look busy.
        self.held.leave(&d.queue, d.partition, &d.entry_id);
        let Some(q) = self.set.get(&d.queue, d.partition) else {
            return;
        };
        match q
            .hand_back(&self.name, &[(&d.entry_id, d.deliveries)])
            .await
        {
            Ok(_) => tracing::info!(
                queue = d.queue,
                "job {} handed back unrun: this node cannot run jobs now",
                d.id
            ),
            Err(e) => self.health.failed("handing back an entry", &e),
        }
    }

    /// Leaves an entry pending, unrefreshed: the reclaimer hands it out again after the
    /// visibility timeout (or this worker name's next life resumes it).
    pub(crate) fn leave_pending(&self, d: &Delivery) {
        self.held.leave(&d.queue, d.partition, &d.entry_id);
    }

    async fn run_job(self: Arc<Self>, d: Delivery, hold: Hold, slot: Slot, outbox: Outbox) {
        let Hold { admission, stored } = hold;
        if d.job.is_ok() && !self.life.sandbox.alive() {
            drop((slot, admission, stored));
            self.hand_back(&d).await;
            return;
        }
        let job = match &d.job {
            Ok(job) => job,
            Err(e) => {
                let reason = e.to_string();
                tracing::warn!(
                    queue = d.queue,
                    entry = d.entry_id,
                    "malformed job: {reason}"
                );
                drop((slot, admission));
                outbox.dead_letter(d, Status::Invalid, reason, stored);
                return;
            }
        };
        let notify = match self.board.start(&d.queue, &d.id) {
            Start::Cancelled => {
                tracing::info!(queue = d.queue, "job {} was cancelled before it ran", d.id);
                let outcome = Outcome::not_run(Status::Cancelled, "cancelled before it started");
                let result = self.result_of(&d, outcome);
                drop((slot, admission));
                outbox.complete(d, result, stored);
                return;
            }
            Start::Run(n) => n,
        };
        ::metrics::gauge!(m::SLOTS_BUSY).increment(1.0);
        let started_at_ms = forkbox_queue::now_ms();
        if let Some(enqueued) = d.enqueued_at_ms() {
            ::metrics::histogram!(m::QUEUE_WAIT, "queue" => d.queue.clone())
                .record(started_at_ms.saturating_sub(enqueued) as f64 / 1e3);
        }
        let killed = AtomicBool::new(false);
        let outcome = {
            let mut stop = self.life.stop.clone();
            let killed = &killed;
            let cancel = async move {
                tokio::select! {
                    _ = notify.notified() => {}
                    reached = async { stop.wait_for(|l| *l >= StopLevel::Kill).await.is_ok() } => {
                        if reached {
                            killed.store(true, Ordering::Relaxed);
                        } else {
                            std::future::pending::<()>().await;
                        }
                    }
                }
            };
            self.engine.run_in(slot, job, cancel, None).await
        };
        // The slot went back with the run: the next job may start while this result is stored.
        // Where completions read (one stream on a single Redis), the admission goes with a
        // result to be stored: the outbox reads the next entry with it on the completion's
        // round trip, or gives it back to the reader; otherwise it goes back to the reader now.
        ::metrics::gauge!(m::SLOTS_BUSY).decrement(1.0);
        let finished_at_ms = forkbox_queue::now_ms();
        self.board.finish(&d.queue, &d.id);
        record_run(&d.queue, &outcome);
        let killed = killed.load(Ordering::Relaxed);
        // The admission is kept until the sandbox is known to be alive: a run that failed
        // because the zygote died under it must not let the reader take another entry before
        // the node has noticed and stopped reading (it would hand that one back too).
        let sandbox_alive = match SandboxCheck::after(outcome.status, killed) {
            SandboxCheck::Skip => true,
            SandboxCheck::Now => self.life.sandbox.alive(),
            SandboxCheck::Settled => self.life.sandbox.alive_after_failure().await,
        };
        let mut admission = Some(admission);
        if !self.intake.reads_with_completions
            || matches!(outcome.status, Status::Error | Status::Invalid)
        {
            drop(admission.take());
        }
        // A set-up that failed for want of descriptors or memory is the node's fault: the job
        // is handed back uncharged and /healthz says so.
        let node_short = outcome.status == Status::Error
            && (outcome.error.as_deref().is_some_and(node_resource_error)
                || Descriptors::now().is_some_and(Descriptors::short));
        if node_short {
            self.life
                .sandbox
                .status
                .resource_fault(outcome.error.as_deref().unwrap_or_default());
        }
        let max = d.max_attempts(self.config.queue.max_attempts);
        let decided = disposition(&Ran {
            status: outcome.status,
            error: outcome.error.as_deref(),
            killed,
            sandbox_alive,
            node_short,
            deliveries: d.deliveries,
            max_attempts: max,
        });
        match decided {
            Disposition::Abandon => {
                drop(admission.take());
                self.life.abandoned.fetch_add(1, Ordering::Relaxed);
                self.leave_pending(&d);
            }
            Disposition::HandBack => {
                drop((stored, admission.take()));
                self.hand_back(&d).await;
            }
            Disposition::Retry => {
                tracing::warn!(
                    queue = d.queue,
                    "job {}: sandbox set-up failed (delivery {} of {max}): {}; \
                     left pending for a retry",
                    d.id,
                    d.deliveries,
                    outcome.error.as_deref().unwrap_or_default()
                );
                self.leave_pending(&d);
            }
            Disposition::DeadLetter { status, reason } => {
                if status == Status::Error {
                    tracing::error!(queue = d.queue, "job {}: {reason}", d.id);
                }
                outbox.dead_letter(d, status, reason, stored);
            }
            Disposition::Store => {
                let result = JobResult {
                    started_at_ms: Some(started_at_ms),
                    finished_at_ms: Some(finished_at_ms),
                    ..self.result_of(&d, outcome)
                };
                outbox.complete_reading(d, result, stored, admission.take());
            }
        }
    }

    /// The result of `d`, with its enqueue time and its finish time set to now; a job that ran
    /// also gets its start time from the caller.
    fn result_of(&self, d: &Delivery, outcome: Outcome) -> JobResult {
        JobResult {
            batch: d.batch(),
            enqueued_at_ms: d.enqueued_at_ms(),
            finished_at_ms: Some(forkbox_queue::now_ms()),
            ..JobResult::new(
                d.id.clone(),
                outcome,
                u32::try_from(d.deliveries).unwrap_or(u32::MAX),
                self.name.clone(),
            )
        }
    }
}

/// Histograms of a job that reached the sandbox.
fn record_run(queue: &str, outcome: &Outcome) {
    if outcome.spawn_us > 0 {
        ::metrics::histogram!(m::SPAWN, "queue" => queue.to_owned())
            .record(outcome.spawn_us as f64 / 1e6);
        ::metrics::histogram!(m::JOB_DURATION, "queue" => queue.to_owned())
            .record(outcome.duration_ms / 1e3);
    }
    if let Some(us) = outcome.watchdog_overshoot_us {
        ::metrics::histogram!(m::WATCHDOG_OVERSHOOT).record(us.max(0) as f64 / 1e6);
    }
}
