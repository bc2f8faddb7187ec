//! The reader: reading deliveries into admissions and handing them to the dispatcher.
//!
//! It takes every free admission of the [`SlotPool`] before it reads, asks Redis for
//! at most that many entries, and gives each delivery one [`Hold`] (see
//! [`admission`](crate::node::admission)); a job waits for one of the engine's slots before
//! it runs. At start the reader drains the node's own pending entries; every half visibility
//! timeout it reclaims idle entries of dead workers with the admissions it has, and again as
//! soon as admissions free up while a reclaim found more idle entries than it could take, so
//! a large abandoned backlog drains at the speed of the node's slots. As often as a read may
//! take to answer, whatever the visibility timeout, it takes back the node's own entries whose
//! read reply was lost on the way (a connection that failed or timed out after Redis handed
//! them out, a cluster connection that sent a read again): pending on this consumer, held by
//! no job, and idle longer than any read takes to answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use forkbox_queue::{Delivery, Status};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use crate::node::admission::Hold;
use crate::node::health::Backoff;
use crate::node::metrics as m;
use crate::node::outbox::{Outbox, Refill};
use crate::node::shared::{Queued, Shared, Unfinished};
use crate::node::stop::StopLevel;

impl Shared {
    pub(crate) async fn read_loop(
        self: Arc<Self>,
        outbox: Outbox,
        on_ready: impl FnOnce(Option<std::net::SocketAddr>),
        metrics_addr: Option<std::net::SocketAddr>,
    ) {
        let vis = Duration::from_millis(self.config.queue.visibility_timeout_ms);
        let mut backoff = Backoff::default();
        // Groups first (a fresh Redis has none), then what a previous life of this consumer
        // name left pending.
        while let Err(e) = self.set.ensure_groups().await {
            self.health.failed("creating consumer groups", &e);
            if !self.pause(backoff.next_delay()).await {
                return;
            }
        }
        self.health.ok();
        for q in self.set.queues() {
            loop {
                let mut permits = self.intake.slots.take_free().await;
                match q.read_own_pending(&self.name, permits.len()).await {
                    Ok(ds) => {
                        if !ds.is_empty() {
                            tracing::info!(
                                queue = q.name(),
                                "resuming {} entr(ies) this worker name held before",
                                ds.len()
                            );
                        }
                        for d in ds {
                            let p = permits.pop().expect("at most one delivery per permit");
                            self.clone().spawn_job(d, p, &outbox);
                        }
                        break;
                    }
                    Err(e) => {
                        drop(permits);
                        self.health.failed("reading own pending entries", &e);
                        if !self.pause(backoff.next_delay()).await {
                            return;
                        }
                    }
                }
            }
        }
        on_ready(metrics_addr);
        // Reclaim at once: jobs of workers that died while none was running wait no longer.
        let reclaim_every = (vis / 2).max(Duration::from_millis(100));
        let mut next_reclaim = Instant::now();
        self.set_next_reclaim(next_reclaim);
        let mut next_recovery = Instant::now() + self.stranded_after();
        let mut stop = self.life.stop.clone();
        loop {
            let mut permits = tokio::select! {
                p = self.intake.slots.take_free() => p,
                _ = stop.wait_for(|l| *l >= StopLevel::Drain) => return,
            };
            if self.stopping() {
                return;
            }
            if Instant::now() >= next_recovery {
                self.recover_stranded(&mut permits, vis, &outbox).await;
                next_recovery = Instant::now() + self.stranded_after();
                if permits.is_empty() {
                    continue;
                }
            }
            if Instant::now() >= next_reclaim {
                let more = self.reclaim(&mut permits, vis, &outbox).await;
                // More idle entries than admissions: take the next ones as soon as admissions
                // free up, not a period later.
                next_reclaim = if more {
                    Instant::now()
                } else {
                    Instant::now() + reclaim_every
                };
                self.set_next_reclaim(next_reclaim);
                if permits.is_empty() {
                    continue;
                }
            }
            let block = (next_reclaim
                .min(next_recovery)
                .saturating_duration_since(Instant::now())
                .as_millis() as u64)
                .clamp(1, self.config.block_ms);
            // The read is not cancelled on stop: entries it took must reach a job task.
            match self.set.read(&self.name, permits.len(), block).await {
                Ok(ds) => {
                    backoff.reset();
                    self.health.ok();
                    for d in ds {
                        let p = permits.pop().expect("at most one delivery per permit");
                        self.clone().spawn_job(d, p, &outbox);
                    }
                }
                Err(e) => {
                    drop(permits);
                    self.health.failed("reading jobs", &e);
                    if !self.pause(backoff.next_delay()).await {
                        return;
                    }
                }
            }
        }
    }

    /// Takes over entries idle past the visibility timeout, at most one per free permit.
    /// Returns whether some queue had more idle entries than it could take.
    async fn reclaim(
        self: &Arc<Self>,
        permits: &mut Vec<Hold>,
        vis: Duration,
        outbox: &Outbox,
    ) -> bool {
        let mut more = false;
        for q in self.set.queues() {
            if permits.is_empty() {
                return true;
            }
            match q
                .reclaim(&self.name, vis.as_millis() as u64, permits.len())
                .await
            {
                Ok(r) => {
                    if !r.deliveries.is_empty() {
                        tracing::info!(
                            queue = q.name(),
                            "reclaimed {} entr(ies) idle past the visibility timeout",
                            r.deliveries.len()
                        );
                    }
                    if !r.dead_lettered.is_empty() {
                        tracing::warn!(
                            queue = q.name(),
                            "dead-lettered {} entr(ies) that exceeded max_attempts",
                            r.dead_lettered.len()
                        );
                        let n = r.dead_lettered.len() as u64;
                        ::metrics::counter!(m::DEAD_LETTERS, "queue" => q.name().to_owned())
                            .increment(n);
                        ::metrics::counter!(m::JOBS, "queue" => q.name().to_owned(),
                            "status" => Status::Error.as_str())
                        .increment(n);
                    }
                    ::metrics::counter!(m::RECLAIMED, "queue" => q.name().to_owned())
                        .increment(r.deliveries.len() as u64);
                    more |= r.more;
                    for d in r.deliveries {
                        let p = permits
                            .pop()
                            .expect("reclaim is limited to the free permits");
                        self.clone().spawn_job(d, p, outbox);
                    }
                }
                Err(e) => self.health.failed("reclaiming idle entries", &e),
            }
        }
        more
    }

    /// How long an own pending entry held by no job must be idle to be taken for one whose
    /// read reply was lost: longer than any read may take to answer.
    fn stranded_after(&self) -> Duration {
        Duration::from_millis(self.config.block_ms)
            + forkbox_queue::RESPONSE_TIMEOUT
            + Duration::from_secs(1)
    }

    /// Takes back this node's own entries whose read reply was lost, at most one per free
    /// permit (see [`forkbox_queue::Queue::recover_stranded`]).
    async fn recover_stranded(
        self: &Arc<Self>,
        permits: &mut Vec<Hold>,
        vis: Duration,
        outbox: &Outbox,
    ) {
        let stranded_ms = self.stranded_after().as_millis() as u64;
        for q in self.set.queues() {
            if permits.is_empty() {
                return;
            }
            let skip = self
                .held
                .held_or_left(q.name(), q.keys().partition_index(), vis * 2);
            match q
                .recover_stranded(&self.name, stranded_ms, &skip, permits.len())
                .await
            {
                Ok(ds) => {
                    if !ds.is_empty() {
                        tracing::warn!(
                            queue = q.name(),
                            "took back {} entr(ies) a read was handed but never received",
                            ds.len()
                        );
                    }
                    ::metrics::counter!(m::RECOVERED, "queue" => q.name().to_owned())
                        .increment(ds.len() as u64);
                    for d in ds {
                        let p = permits
                            .pop()
                            .expect("recovery is limited to the free permits");
                        self.clone().spawn_job(d, p, outbox);
                    }
                }
                Err(e) => self
                    .health
                    .failed("recovering entries of lost read replies", &e),
            }
        }
    }

    pub(crate) fn spawn_job(self: Arc<Self>, d: Delivery, hold: Hold, outbox: &Outbox) {
        self.held.add(&d.queue, d.partition, &d.entry_id);
        let queued = Queued {
            unfinished: Unfinished::count(&self),
            d,
            hold,
            outbox: outbox.clone(),
        };
        if let Err(mpsc::error::SendError(q)) = self.intake.queued.send(queued) {
            // Only once the node is over: the entry stays pending for the reclaimer.
            self.leave_pending(&q.d);
        }
    }
}

/// A node's completions read its next entries ([`crate::node::outbox`]) through this.
impl Refill for Shared {
    fn may_refill(&self) -> bool {
        Shared::may_refill(self)
    }

    fn hold_now(&self, admission: OwnedSemaphorePermit) -> Option<Hold> {
        self.intake.slots.hold_now(admission)
    }

    fn start(self: Arc<Self>, d: Delivery, hold: Hold, outbox: &Outbox) {
        self.spawn_job(d, hold, outbox);
    }
}
