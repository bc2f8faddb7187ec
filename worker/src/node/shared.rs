//! The state the reader, the dispatcher, the job tasks, the outbox and upkeep share.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use forkbox_queue::Delivery;
use tokio::sync::{mpsc, watch};

use crate::node::admission::{Permits, SlotPool};
use crate::node::cancel::CancelBoard;
use crate::node::config::NodeConfig;
use crate::node::health::RedisHealth;
use crate::node::held::Held;
use crate::node::metrics::NodeStatus;
use crate::node::outbox::{Outbox, ReadGate};
use crate::node::seam::{JobQueue, Part, Runner};
use crate::node::stop::{StopHandle, StopLevel};

/// Counts one job task in `Shared::busy` for as long as it lives, panics included, so a drain
/// never waits for a task that is gone.
pub(crate) struct Unfinished(watch::Sender<usize>);

impl Unfinished {
    pub(crate) fn count(shared: &Shared) -> Unfinished {
        shared.life.busy.send_modify(|n| *n += 1);
        Unfinished(shared.life.busy.clone())
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// Where the reader sends a session's create job instead of the dispatcher (the node's
/// sessions, `node::session`): it opens the session and gives the admission back.
pub(crate) trait SessionOpener: Send + Sync {
    fn open(self: Arc<Self>, shared: Arc<Shared>, queued: Queued);
}

/// A delivery read and waiting for an engine slot.
pub(crate) struct Queued {
    pub(crate) d: Delivery,
    pub(crate) permits: Permits,
    pub(crate) outbox: Outbox,
    pub(crate) unfinished: Unfinished,
}

/// State shared by the reader, the job tasks, the outbox and upkeep.
pub(crate) struct Shared {
    pub name: String,
    /// The node's queues (see [`seam`](crate::node::seam)).
    pub queue: Arc<dyn JobQueue>,
    /// What runs the jobs (see [`seam`](crate::node::seam)).
    pub runner: Arc<dyn Runner>,
    pub config: NodeConfig,
    /// How read entries wait for a run.
    pub intake: Intake,
    /// What the node is doing about stopping, and what it has left to finish.
    pub life: Lifetime,
    pub held: Arc<Held>,
    pub board: Arc<CancelBoard>,
    pub health: Arc<RedisHealth>,
    /// Where session create jobs go instead of the dispatcher (set once the queues are open).
    pub sessions: std::sync::OnceLock<Arc<dyn SessionOpener>>,
}

/// How read entries wait for a run: the slots that bound the reading, the deliveries waiting
/// for one, and when the reader reclaims next.
pub(crate) struct Intake {
    pub slots: SlotPool,
    /// Deliveries in read order, waiting for a slot (see [`job`](crate::node::job)).
    pub queued: mpsc::UnboundedSender<Queued>,
    /// Whether completions may read now (see [`ReadGate`]).
    pub gate: Arc<ReadGate>,
    /// Whether completions read the next entries (one stream on a single Redis); otherwise a
    /// finished run's admission goes straight back to the reader.
    pub reads_with_completions: bool,
}

/// The node's lifetime as its tasks see it.
pub(crate) struct Lifetime {
    pub stop: watch::Receiver<StopLevel>,
    /// Job tasks still running (see [`Unfinished`]).
    pub busy: watch::Sender<usize>,
    /// Runs left unfinished by a stop past its grace period.
    pub abandoned: std::sync::atomic::AtomicUsize,
    /// Stops the node when its zygote is gone.
    pub sandbox: SandboxWatch,
}

/// Stops the node once its zygote is gone: no job can run any more.
#[derive(Clone)]
pub(crate) struct SandboxWatch {
    pub(crate) runner: Arc<dyn Runner>,
    pub(crate) status: Arc<NodeStatus>,
    pub(crate) stop: StopHandle,
    pub(crate) lost: Arc<AtomicBool>,
}

impl SandboxWatch {
    /// Whether the engine can still run jobs. A job that failed because the zygote died may
    /// finish a moment before the engine's event thread has seen the zygote go: after a
    /// failure, ask [`SandboxWatch::alive_after_failure`] instead.
    pub(crate) fn alive(&self) -> bool {
        if self.runner.is_alive() {
            return true;
        }
        self.lose();
        false
    }

    /// [`SandboxWatch::alive`] for a run that did not end well, giving the engine a moment to
    /// notice a zygote that died under it.
    pub(crate) async fn alive_after_failure(&self) -> bool {
        for _ in 0..10 {
            if !self.alive() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.alive()
    }

    /// Marks the node unhealthy and stops its reading.
    fn lose(&self) {
        mark_lost(&self.status, &self.stop, &self.lost);
    }
}

/// What [`SandboxWatch::lose`] does, apart from the engine. The stop is raised by every
/// caller before it returns, not only by the first: a job task that learns the zygote is gone
/// frees its admission on that answer, and the reader, taking it, must find the node stopping
/// already (else it reads an entry only to hand it back), even while another task that learnt
/// it first is still on its way to raising the stop. Said once, by the first.
fn mark_lost(status: &NodeStatus, stop: &StopHandle, lost: &AtomicBool) {
    status.sandbox_alive.store(false, Ordering::Relaxed);
    let running = stop.level() == StopLevel::Running;
    stop.raise(StopLevel::Drain);
    if running && !lost.swap(true, Ordering::Relaxed) {
        tracing::error!(
            "the sandbox zygote exited; stopping the node and handing back its entries"
        );
    }
}

impl Shared {
    pub(crate) fn stopping(&self) -> bool {
        self.life.stopping()
    }

    /// Sleeps `d`, or less when a stop is requested. Returns false when stopping.
    pub(crate) async fn pause(&self, d: Duration) -> bool {
        self.life.pause(d).await
    }

    /// Hands an entry this node cannot run back to the group, for another node to take now and
    /// with no attempt charged (see [`Queue::hand_back`](forkbox_queue::Queue::hand_back)).
    /// When Redis cannot be told, the entry stays pending and is reclaimed after the
    /// visibility timeout.
    pub(crate) async fn hand_back(&self, d: &Delivery) {
        // No longer held first: a claim refresh after the hand-back would make it look busy.
        self.held.leave(&d.queue, d.partition, &d.entry_id);
        let part = Part::of(d);
        if !self.queue.has(&part) {
            return;
        }
        match self
            .queue
            .hand_back(&part, &self.name, &[(&d.entry_id, d.deliveries)])
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
}

impl Lifetime {
    pub(crate) fn stopping(&self) -> bool {
        *self.stop.borrow() >= StopLevel::Drain
    }

    /// Sleeps `d`, or less when a stop is requested. Returns false when stopping.
    pub(crate) async fn pause(&self, d: Duration) -> bool {
        let mut stop = self.stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(d) => !self.stopping(),
            _ = stop.wait_for(|l| *l >= StopLevel::Drain) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whoever_learns_the_zygote_is_gone_finds_the_node_stopping() {
        let (status, stop, lost) = (
            NodeStatus::default(),
            StopHandle::default(),
            AtomicBool::new(false),
        );
        status.sandbox_alive.store(true, Ordering::Relaxed);
        // Another task learnt it first and has not raised the stop yet.
        lost.store(true, Ordering::Relaxed);
        mark_lost(&status, &stop, &lost);
        assert_eq!(stop.level(), StopLevel::Drain);
        assert!(!status.sandbox_alive.load(Ordering::Relaxed));
        // The first to learn it raises it too; a stop already past draining stays where it is.
        let (stop, lost) = (StopHandle::default(), AtomicBool::new(false));
        mark_lost(&status, &stop, &lost);
        assert_eq!(stop.level(), StopLevel::Drain);
        assert!(lost.load(Ordering::Relaxed));
        stop.raise(StopLevel::Kill);
        mark_lost(&status, &stop, &lost);
        assert_eq!(stop.level(), StopLevel::Kill);
    }
}
