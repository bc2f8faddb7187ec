//! The reader: the node's read path. Every job of the node starts here.
//!
//! It takes every free admission of the [`SlotPool`](crate::node::admission::SlotPool) before
//! it reads, asks Redis for at most that many entries, and admits each delivery with its
//! [`Permits`] (see [`admission`](crate::node::admission)): held from then on, it waits in read
//! order for one of the engine's slots (see [`job`](crate::node::job)). Entries the outbox
//! read on a completion's round trip come to the reader through a channel (`ReadBack`) and
//! are admitted the same way.
//!
//! At start the reader drains the node's own pending entries; every half visibility timeout
//! it reclaims idle entries of dead workers with the admissions it has, and again as
//! soon as admissions free up while a reclaim found more idle entries than it could take, so
//! a large abandoned backlog drains at the speed of the node's slots. As often as a read may
//! take to answer, whatever the visibility timeout, it takes back the node's own entries whose
//! read reply was lost on the way (a connection that failed or timed out after Redis handed
//! them out, a cluster connection that sent a read again): pending on this consumer, held by
//! no job, and idle longer than any read takes to answer.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkbox_queue::{Delivery, Status};
use tokio::sync::{mpsc, oneshot};

use crate::node::admission::Permits;
use crate::node::health::Backoff;
use crate::node::metrics as m;
use crate::node::outbox::{Outbox, ReadBack};
use crate::node::shared::{Queued, Shared, Unfinished};
use crate::node::stop::StopLevel;

/// The read loop of one node, and the only place its jobs start from.
pub(crate) struct Reader {
    shared: Arc<Shared>,
    /// Handed to every job it starts.
    outbox: Outbox,
    /// What completions read (see [`outbox`](crate::node::outbox)), to start as the reader
    /// starts what it reads.
    read_back: mpsc::UnboundedReceiver<ReadBack>,
    backoff: Backoff,
}

impl Reader {
    pub(crate) fn new(
        shared: Arc<Shared>,
        outbox: Outbox,
        read_back: mpsc::UnboundedReceiver<ReadBack>,
    ) -> Reader {
        Reader {
            shared,
            outbox,
            read_back,
            backoff: Backoff::default(),
        }
    }

    /// Reads until the node stops: `ready` is called once it reads its queues, `stopped` once
    /// it reads no more. It then starts what completions still read, until the outbox is over.
    pub(crate) async fn run(mut self, ready: impl FnOnce(), stopped: oneshot::Sender<()>) {
        if self.resume().await {
            ready();
            self.read().await;
        }
        let _ = stopped.send(());
        let Reader {
            shared,
            outbox,
            mut read_back,
            ..
        } = self;
        drop(outbox);
        while let Some(r) = read_back.recv().await {
            admit(&shared, r.delivery, r.permits, &r.outbox);
        }
    }

    /// Creates the consumer groups (a fresh Redis has none), then starts what a previous life
    /// of this consumer name left pending. False when the node stopped first.
    async fn resume(&mut self) -> bool {
        let shared = self.shared.clone();
        while let Err(e) = self.forwarding(shared.queue.ensure_groups()).await {
            shared.health.failed("creating consumer groups", &e);
            if !shared.pause(self.backoff.next_delay()).await {
                return false;
            }
        }
        shared.health.ok();
        for part in shared.queue.parts() {
            loop {
                let mut permits = self.forwarding(shared.intake.slots.take_free()).await;
                let read = shared
                    .queue
                    .read_own_pending(&part, &shared.name, permits.len());
                match self.forwarding(read).await {
                    Ok(ds) => {
                        if !ds.is_empty() {
                            tracing::info!(
                                queue = part.queue,
                                "resuming {} entr(ies) this worker name held before",
                                ds.len()
                            );
                        }
                        self.admit_all(ds, &mut permits);
                        break;
                    }
                    Err(e) => {
                        drop(permits);
                        shared.health.failed("reading own pending entries", &e);
                        if !shared.pause(self.backoff.next_delay()).await {
                            return false;
                        }
                    }
                }
            }
        }
        true
    }

    /// The read loop proper: every free admission is read with, reclaims with or recovers with.
    async fn read(&mut self) {
        let shared = self.shared.clone();
        let vis = Duration::from_millis(shared.config.queue.visibility_timeout_ms);
        // Reclaim at once: jobs of workers that died while none was running wait no longer.
        let reclaim_every = (vis / 2).max(Duration::from_millis(100));
        let mut next_reclaim = Instant::now();
        shared.intake.gate.reclaim_at(next_reclaim);
        let mut next_recovery = Instant::now() + self.stranded_after();
        let mut stop = shared.life.stop.clone();
        loop {
            let free = async {
                tokio::select! {
                    p = shared.intake.slots.take_free() => Some(p),
                    _ = stop.wait_for(|l| *l >= StopLevel::Drain) => None,
                }
            };
            let Some(mut permits) = self.forwarding(free).await else {
                return;
            };
            if shared.stopping() {
                return;
            }
            if Instant::now() >= next_recovery {
                self.recover_stranded(&mut permits, vis).await;
                next_recovery = Instant::now() + self.stranded_after();
                if permits.is_empty() {
                    continue;
                }
            }
            if Instant::now() >= next_reclaim {
                let more = self.reclaim(&mut permits, vis).await;
                // More idle entries than admissions: take the next ones as soon as admissions
                // free up, not a period later.
                next_reclaim = if more {
                    Instant::now()
                } else {
                    Instant::now() + reclaim_every
                };
                shared.intake.gate.reclaim_at(next_reclaim);
                if permits.is_empty() {
                    continue;
                }
            }
            let block = (next_reclaim
                .min(next_recovery)
                .saturating_duration_since(Instant::now())
                .as_millis() as u64)
                .clamp(1, shared.config.block_ms);
            // The read is not cancelled on stop: entries it took must reach a job task.
            let read = shared.queue.read(&shared.name, permits.len(), block);
            match self.forwarding(read).await {
                Ok(ds) => {
                    self.backoff.reset();
                    shared.health.ok();
                    self.admit_all(ds, &mut permits);
                }
                Err(e) => {
                    drop(permits);
                    shared.health.failed("reading jobs", &e);
                    if !shared.pause(self.backoff.next_delay()).await {
                        return;
                    }
                }
            }
        }
    }

    /// Awaits `f`, starting meanwhile what completions read.
    async fn forwarding<T>(&mut self, f: impl Future<Output = T>) -> T {
        tokio::pin!(f);
        loop {
            tokio::select! {
                biased;
                Some(r) = self.read_back.recv() => {
                    admit(&self.shared, r.delivery, r.permits, &r.outbox);
                }
                out = &mut f => return out,
            }
        }
    }

    /// Admits `ds`, one admission (with its hold) each.
    fn admit_all(&self, ds: Vec<Delivery>, permits: &mut Vec<Permits>) {
        for d in ds {
            let p = permits.pop().expect("at most one delivery per admission");
            admit(&self.shared, d, p, &self.outbox);
        }
    }

    /// Takes over entries idle past the visibility timeout, at most one per free admission.
    /// Returns whether some queue had more idle entries than it could take.
    async fn reclaim(&mut self, permits: &mut Vec<Permits>, vis: Duration) -> bool {
        let shared = self.shared.clone();
        let mut more = false;
        for part in shared.queue.parts() {
            if permits.is_empty() {
                return true;
            }
            let reclaim =
                shared
                    .queue
                    .reclaim(&part, &shared.name, vis.as_millis() as u64, permits.len());
            match self.forwarding(reclaim).await {
                Ok(r) => {
                    if !r.deliveries.is_empty() {
                        tracing::info!(
                            queue = part.queue,
                            "reclaimed {} entr(ies) idle past the visibility timeout",
                            r.deliveries.len()
                        );
                    }
                    if !r.dead_lettered.is_empty() {
                        tracing::warn!(
                            queue = part.queue,
                            "dead-lettered {} entr(ies) that exceeded max_attempts",
                            r.dead_lettered.len()
                        );
                        let n = r.dead_lettered.len() as u64;
                        ::metrics::counter!(m::DEAD_LETTERS, "queue" => part.queue.clone())
                            .increment(n);
                        ::metrics::counter!(m::JOBS, "queue" => part.queue.clone(),
                            "status" => Status::Error.as_str())
                        .increment(n);
                    }
                    ::metrics::counter!(m::RECLAIMED, "queue" => part.queue.clone())
                        .increment(r.deliveries.len() as u64);
                    more |= r.more;
                    self.admit_all(r.deliveries, permits);
                }
                Err(e) => shared.health.failed("reclaiming idle entries", &e),
            }
        }
        more
    }

    /// How long an own pending entry held by no job must be idle to be taken for one whose
    /// read reply was lost: longer than any read may take to answer.
    fn stranded_after(&self) -> Duration {
        Duration::from_millis(self.shared.config.block_ms)
            + forkbox_queue::RESPONSE_TIMEOUT
            + Duration::from_secs(1)
    }

    /// Takes back this node's own entries whose read reply was lost, at most one per free
    /// admission (see [`forkbox_queue::Queue::recover_stranded`]).
    async fn recover_stranded(&mut self, permits: &mut Vec<Permits>, vis: Duration) {
        let shared = self.shared.clone();
        let stranded_ms = self.stranded_after().as_millis() as u64;
        for part in shared.queue.parts() {
            if permits.is_empty() {
                return;
            }
            let skip = shared
                .held
                .held_or_left(&part.queue, part.partition, vis * 2);
            let recover = shared.queue.recover_stranded(
                &part,
                &shared.name,
                stranded_ms,
                &skip,
                permits.len(),
            );
            match self.forwarding(recover).await {
                Ok(ds) => {
                    if !ds.is_empty() {
                        tracing::warn!(
                            queue = part.queue,
                            "took back {} entr(ies) a read was handed but never received",
                            ds.len()
                        );
                    }
                    ::metrics::counter!(m::RECOVERED, "queue" => part.queue.clone())
                        .increment(ds.len() as u64);
                    self.admit_all(ds, permits);
                }
                Err(e) => shared
                    .health
                    .failed("recovering entries of lost read replies", &e),
            }
        }
    }
}

/// Admits one delivery read with `permits`: held from now on (its claim refreshed), it waits
/// in read order for an engine slot (see [`job`](crate::node::job)).
fn admit(shared: &Arc<Shared>, d: Delivery, permits: Permits, outbox: &Outbox) {
    shared.held.add(&d.queue, d.partition, &d.entry_id);
    // A session's create job opens a session: no engine slot, its admission given back once
    // the session is open.
    let creates_session = d.job.as_ref().is_ok_and(|j| j.session.is_some());
    if let Some(sessions) = shared.sessions.get().filter(|_| creates_session) {
        let queued = Queued {
            unfinished: Unfinished::count(shared),
            d,
            permits,
            outbox: outbox.clone(),
        };
        sessions.clone().open(shared.clone(), queued);
        return;
    }
    let queued = Queued {
        unfinished: Unfinished::count(shared),
        d,
        permits,
        outbox: outbox.clone(),
    };
    if let Err(mpsc::error::SendError(q)) = shared.intake.queued.send(queued) {
        // Only once the node is over: the entry stays pending for the reclaimer.
        shared.leave_pending(&q.d);
    }
}
