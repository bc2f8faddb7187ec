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

use forkbox_queue::{Delivery, Job, JobResult, Outcome, Status};
use tokio::sync::{mpsc, Notify};

use crate::node::admission::{Admission, Hold, Permits};
use crate::node::cancel::Start;
use crate::node::disposition::{disposition, Disposition, Ran, SandboxCheck};
use crate::node::error::NodeFault;
use crate::node::gate::Descriptors;
use crate::node::metrics as m;
use crate::node::outbox::Outbox;
use crate::node::seam::{Run, RunSlot};
use crate::node::shared::{Queued, Shared};
use crate::node::stop::StopLevel;

/// Starts the admitted deliveries in the order they were read (priorities and stream order
/// hold even for entries read ahead), each once an engine slot is free. Past the grace period,
/// what still waits is left pending unrun.
pub(crate) async fn dispatch(shared: Arc<Shared>, mut waiting: mpsc::UnboundedReceiver<Queued>) {
    let mut stop = shared.life.stop.clone();
    while let Some(q) = waiting.recv().await {
        let slot = tokio::select! {
            biased;
            _ = stop.wait_for(|l| *l >= StopLevel::Kill) => None,
            slot = shared.runner.slot() => Some(slot),
        };
        let Some(slot) = slot else {
            shared.life.abandoned.fetch_add(1, Ordering::Relaxed);
            shared.leave_pending(&q.d);
            continue;
        };
        let Queued {
            d,
            permits: Permits { admission, hold },
            outbox,
            unfinished,
        } = q;
        let task = JobTask {
            shared: shared.clone(),
            d,
            admission,
            hold,
            outbox,
        };
        tokio::spawn(async move {
            task.run(slot).await;
            drop(unfinished);
        });
    }
}

/// One delivery on its way through a slot to the outbox.
struct JobTask {
    shared: Arc<Shared>,
    d: Delivery,
    admission: Admission,
    hold: Hold,
    outbox: Outbox,
}

/// How a run went, as its disposition needs it.
struct Finish {
    outcome: Outcome,
    /// The node's fault, when the run's set-up failed for want of descriptors or memory.
    fault: Option<NodeFault>,
    killed: bool,
    started_at_ms: u64,
    finished_at_ms: u64,
}

impl JobTask {
    async fn run(self, slot: Box<dyn RunSlot>) {
        let JobTask {
            shared,
            d,
            admission,
            hold,
            outbox,
        } = self;
        if d.job.is_ok() && !shared.life.sandbox.alive() {
            drop((slot, admission, hold));
            shared.hand_back(&d).await;
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
                outbox.dead_letter(d, Status::Invalid, reason, hold);
                return;
            }
        };
        let notify = match shared.board.start(&d.queue, &d.id) {
            Start::Cancelled => {
                tracing::info!(queue = d.queue, "job {} was cancelled before it ran", d.id);
                let outcome = Outcome::not_run(Status::Cancelled, "cancelled before it started");
                let result = result_of(&shared, &d, outcome);
                drop((slot, admission));
                outbox.complete(d, result, hold);
                return;
            }
            Start::Run(n) => n,
        };
        let finish = execute(&shared, &d, job, slot, notify).await;
        let task = JobTask {
            shared,
            d,
            admission,
            hold,
            outbox,
        };
        task.settle(finish).await;
    }

    /// Carries out what [`disposition`] decides of a finished run.
    async fn settle(self, finish: Finish) {
        let JobTask {
            shared,
            d,
            admission,
            hold,
            outbox,
        } = self;
        let Finish {
            outcome,
            fault,
            killed,
            ..
        } = &finish;
        // The admission is kept until the sandbox is known to be alive: a run that failed
        // because the zygote died under it must not let the reader take another entry before
        // the node has noticed and stopped reading (it would hand that one back too).
        let sandbox_alive = match SandboxCheck::after(outcome.status, *killed) {
            SandboxCheck::Skip => true,
            SandboxCheck::Now => shared.life.sandbox.alive(),
            SandboxCheck::Settled => shared.life.sandbox.alive_after_failure().await,
        };
        // Where completions read (one stream on a single Redis), the admission goes with a
        // result to be stored: the outbox reads the next entry with it on the completion's
        // round trip, or gives it back; otherwise it goes back to the reader now.
        let mut admission = Some(admission);
        if !shared.intake.reads_with_completions
            || matches!(outcome.status, Status::Error | Status::Invalid)
        {
            drop(admission.take());
        }
        // A set-up that failed for want of descriptors or memory is the node's fault: the job
        // is handed back uncharged and /healthz says so.
        let node_short = outcome.status == Status::Error
            && (fault.is_some() || Descriptors::now().is_some_and(Descriptors::short));
        if node_short {
            shared
                .life
                .sandbox
                .status
                .resource_fault(outcome.error.as_deref().unwrap_or_default());
        }
        let max = d.max_attempts(shared.config.queue.max_attempts);
        let decided = disposition(&Ran {
            status: outcome.status,
            error: outcome.error.as_deref(),
            killed: *killed,
            sandbox_alive,
            node_short,
            deliveries: d.deliveries,
            max_attempts: max,
        });
        match decided {
            Disposition::Abandon => {
                drop(admission.take());
                shared.life.abandoned.fetch_add(1, Ordering::Relaxed);
                shared.leave_pending(&d);
            }
            Disposition::HandBack => {
                drop((hold, admission.take()));
                shared.hand_back(&d).await;
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
                shared.leave_pending(&d);
            }
            Disposition::DeadLetter { status, reason } => {
                if status == Status::Error {
                    tracing::error!(queue = d.queue, "job {}: {reason}", d.id);
                }
                outbox.dead_letter(d, status, reason, hold);
            }
            Disposition::Store => {
                let result = JobResult {
                    started_at_ms: Some(finish.started_at_ms),
                    finished_at_ms: Some(finish.finished_at_ms),
                    ..result_of(&shared, &d, finish.outcome)
                };
                outbox.complete_reading(d, result, hold, admission.take());
            }
        }
    }
}

/// Runs `job` in `slot`, killed when it is cancelled or the grace period runs out. The slot
/// goes back with the run: the next job may start while this result is stored.
async fn execute(
    shared: &Shared,
    d: &Delivery,
    job: &Job,
    slot: Box<dyn RunSlot>,
    notify: Arc<Notify>,
) -> Finish {
    ::metrics::gauge!(m::SLOTS_BUSY).increment(1.0);
    let started_at_ms = forkbox_queue::now_ms();
    if let Some(enqueued) = d.enqueued_at_ms() {
        ::metrics::histogram!(m::QUEUE_WAIT, "queue" => d.queue.clone())
            .record(started_at_ms.saturating_sub(enqueued) as f64 / 1e3);
    }
    let killed = AtomicBool::new(false);
    let Run { outcome, fault } = {
        let mut stop = shared.life.stop.clone();
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
        slot.run(job, Box::pin(cancel)).await
    };
    ::metrics::gauge!(m::SLOTS_BUSY).decrement(1.0);
    let finished_at_ms = forkbox_queue::now_ms();
    shared.board.finish(&d.queue, &d.id);
    record_run(&d.queue, &outcome);
    Finish {
        outcome,
        fault,
        killed: killed.load(Ordering::Relaxed),
        started_at_ms,
        finished_at_ms,
    }
}

/// The result of `d`, with its enqueue time and its finish time set to now; a job that ran
/// also gets its start time from the caller.
fn result_of(shared: &Shared, d: &Delivery, outcome: Outcome) -> JobResult {
    JobResult {
        batch: d.batch(),
        enqueued_at_ms: d.enqueued_at_ms(),
        finished_at_ms: Some(forkbox_queue::now_ms()),
        ..JobResult::new(
            d.id.clone(),
            outcome,
            u32::try_from(d.deliveries).unwrap_or(u32::MAX),
            shared.name.clone(),
        )
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
