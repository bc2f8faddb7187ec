//! The outbox: finished work waiting to be stored in Redis.
//!
//! Job tasks hand their results and dead letters to the [`Outbox`] and return. One completer
//! task takes everything that has accumulated and stores it with one pipelined
//! `complete_many` (and one `dead_letter_many`) per queue, so jobs that finish together share a
//! round trip. When Redis is away the items stay here and the completer retries with back-off
//! until they are stored: a result that was computed is never dropped. Each item carries the
//! slot permit of its job, released only once the result is stored, and its entry stays in the
//! held set (its claim refreshed) until then.
//!
//! Redis refusing the data of one job (a script error on its values) is not an outage: when a
//! batch is refused, its items are stored one by one, and the one Redis refuses is
//! dead-lettered with Redis' reason instead of being retried for ever with its slot. Only
//! Redis being unreachable (or out of memory, loading, failing over) keeps items here.
//!
//! A completion may also carry the admission its job freed: when the node reads one stream on
//! one server, the completer then reads the next entries on the same round trip
//! ([`forkbox_queue::Queue::complete_many_and_read`]) and starts them with those admissions,
//! so a node working through a backlog spends one round trip per job. An admission not used
//! that way (the queue is empty, the node is stopping, a reclaim is due, or the store failed)
//! goes back to the reader.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use forkbox_queue::{Completion, Delivery, JobResult, QueueSet, Status};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::task::JoinHandle;

use crate::node::admission::Hold;
use crate::node::health::{Backoff, RedisHealth};
use crate::node::held::Held;
use crate::node::metrics as m;

/// What to store for a delivery.
#[derive(Debug)]
pub enum Action {
    Complete(Box<JobResult>),
    /// Dead-letter with this status (`invalid` for the job's own fault, `error` otherwise).
    DeadLetter {
        status: Status,
        reason: String,
    },
}

/// One finished delivery with its slot.
#[derive(Debug)]
pub struct Finished {
    pub delivery: Delivery,
    pub action: Action,
    pub permit: Option<OwnedSemaphorePermit>,
    /// The admission its run freed, for the completer to read the next entry with.
    pub admission: Option<OwnedSemaphorePermit>,
    /// Its key in [`Unstored`].
    seq: u64,
}

/// The items sent and not yet stored, by send order: `(queue, job id)`. Each leaves the moment
/// its own store is confirmed, so what is left at exit is exactly what Redis never
/// acknowledged.
#[derive(Debug, Default)]
struct Unstored {
    next: AtomicU64,
    items: Mutex<BTreeMap<u64, (String, String)>>,
}

impl Unstored {
    fn add(&self, d: &Delivery) -> u64 {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        self.items
            .lock()
            .expect("unstored lock")
            .insert(seq, (d.queue.clone(), d.id.clone()));
        seq
    }

    fn remove(&self, seq: u64) {
        self.items.lock().expect("unstored lock").remove(&seq);
    }

    fn list(&self) -> Vec<(String, String)> {
        self.items
            .lock()
            .expect("unstored lock")
            .values()
            .cloned()
            .collect()
    }
}

/// The sending side; cheap to clone. The completer stops once every clone is dropped and
/// everything sent is stored.
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Finished>,
    unstored: Arc<Unstored>,
}

impl Outbox {
    pub fn complete(&self, delivery: Delivery, result: JobResult, permit: OwnedSemaphorePermit) {
        self.send(delivery, Action::Complete(Box::new(result)), permit, None);
    }

    /// [`Outbox::complete`], handing over the admission the job's run freed (see the module
    /// documentation).
    pub fn complete_reading(
        &self,
        delivery: Delivery,
        result: JobResult,
        permit: OwnedSemaphorePermit,
        admission: Option<OwnedSemaphorePermit>,
    ) {
        self.send(
            delivery,
            Action::Complete(Box::new(result)),
            permit,
            admission,
        );
    }

    pub fn dead_letter(
        &self,
        delivery: Delivery,
        status: Status,
        reason: String,
        permit: OwnedSemaphorePermit,
    ) {
        self.send(
            delivery,
            Action::DeadLetter { status, reason },
            permit,
            None,
        );
    }

    fn send(
        &self,
        delivery: Delivery,
        action: Action,
        permit: OwnedSemaphorePermit,
        admission: Option<OwnedSemaphorePermit>,
    ) {
        let seq = self.unstored.add(&delivery);
        let item = Finished {
            delivery,
            action,
            permit: Some(permit),
            admission,
            seq,
        };
        // The completer outlives every sender (it stops when they are all gone).
        if self.tx.send(item).is_err() {
            self.unstored.remove(seq);
            tracing::error!("outbox closed: a finished result was dropped");
        }
    }
}

/// The completer task.
#[derive(Debug)]
pub struct Completer {
    task: JoinHandle<()>,
    unstored: Arc<Unstored>,
}

impl Completer {
    /// Waits until every sender is gone and everything is stored.
    pub async fn wait(&mut self) {
        let _ = (&mut self.task).await;
    }

    /// Stops the completer; returns the `(queue, job id)` of every item Redis never
    /// confirmed as stored.
    pub fn abort(self) -> Vec<(String, String)> {
        self.task.abort();
        self.unstored.list()
    }
}

/// The node, as completions that read the next entries see it.
pub(crate) trait Refill: Send + Sync {
    /// Whether a completion may read new entries now.
    fn may_refill(&self) -> bool;
    /// A hold for `admission`, when one is free.
    fn hold_now(&self, admission: OwnedSemaphorePermit) -> Option<Hold>;
    /// Starts an entry a completion read, as the reader starts what it reads.
    fn start(self: Arc<Self>, d: Delivery, hold: Hold, outbox: &Outbox);
}

/// Starts the completer for the queues of `set`; with `refill`, completions read the next
/// entries for the admissions they carry and start them on that node.
pub(crate) fn start(
    set: QueueSet,
    worker: String,
    held: Arc<Held>,
    health: Arc<RedisHealth>,
    refill: Option<Arc<dyn Refill>>,
) -> (Outbox, Completer) {
    let (tx, rx) = mpsc::unbounded_channel();
    let unstored = Arc::new(Unstored::default());
    let store = Store {
        set,
        worker,
        held,
        health,
        unstored: unstored.clone(),
        refill,
        sender: tx.downgrade(),
    };
    let task = tokio::spawn(run(store, rx));
    (
        Outbox {
            tx,
            unstored: unstored.clone(),
        },
        Completer { task, unstored },
    )
}

/// What storing needs.
struct Store {
    set: QueueSet,
    worker: String,
    held: Arc<Held>,
    health: Arc<RedisHealth>,
    unstored: Arc<Unstored>,
    /// The node that starts what a completion read (see [`start`]).
    refill: Option<Arc<dyn Refill>>,
    /// For the outbox handle of jobs started here; weak, so that the completer still stops
    /// once every job task and the node have dropped theirs.
    sender: mpsc::WeakUnboundedSender<Finished>,
}

async fn run(store: Store, mut rx: mpsc::UnboundedReceiver<Finished>) {
    let mut buffer: Vec<Finished> = Vec::new();
    let mut backoff = Backoff::default();
    let mut open = true;
    loop {
        if buffer.is_empty() {
            match rx.recv().await {
                Some(f) => buffer.push(f),
                None => return,
            }
        }
        while open {
            match rx.try_recv() {
                Ok(f) => buffer.push(f),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        buffer = store.all(buffer).await;
        if buffer.is_empty() {
            backoff.reset();
            if !open {
                return;
            }
        } else {
            let pause = backoff.next_delay();
            if open {
                // Keep accepting while waiting, so job tasks never block on a Redis outage.
                let deadline = tokio::time::sleep(pause);
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        _ = &mut deadline => break,
                        f = rx.recv() => match f {
                            Some(f) => buffer.push(f),
                            None => { open = false; break }
                        },
                    }
                }
            } else {
                tokio::time::sleep(pause).await;
            }
        }
    }
}

impl Store {
    /// Stores what it can; returns the items to retry.
    async fn all(&self, items: Vec<Finished>) -> Vec<Finished> {
        let mut by_queue: BTreeMap<(String, usize), (Vec<Finished>, Vec<Finished>)> =
            BTreeMap::new();
        for f in items {
            let slot = by_queue
                .entry((f.delivery.queue.clone(), f.delivery.partition))
                .or_default();
            match f.action {
                Action::Complete(_) => slot.0.push(f),
                Action::DeadLetter { .. } => slot.1.push(f),
            }
        }
        let mut retry = Vec::new();
        for ((name, partition), (results, mut letters)) in by_queue {
            let Some(q) = self.set.get(&name, partition) else {
                tracing::error!(
                    "delivery from unknown queue {name} partition {partition}; dropped"
                );
                continue;
            };
            if !results.is_empty() {
                let (refused, again) = self.results(q, results).await;
                retry.extend(again);
                letters.extend(refused);
            }
            if !letters.is_empty() {
                retry.extend(self.letters(q, letters).await);
            }
        }
        retry
    }

    /// Completes `results` in one round trip; when Redis refuses the batch, one by one.
    /// Returns the refused ones, turned into dead letters, and the ones to retry.
    async fn results(
        &self,
        q: &forkbox_queue::Queue,
        results: Vec<Finished>,
    ) -> (Vec<Finished>, Vec<Finished>) {
        let batch = results.len() > 1;
        let mut results = results;
        // Admissions ride only on the first attempt: a retry or a one-by-one re-send gives
        // them back to the reader.
        let admissions: Vec<OwnedSemaphorePermit> = results
            .iter_mut()
            .filter_map(|f| f.admission.take())
            .collect();
        let refill = self.refill_holds(admissions);
        let outcome = {
            let pairs: Vec<(&Delivery, &JobResult)> = results.iter().map(as_result).collect();
            match refill {
                Some((node, outbox, mut holds)) => {
                    let (done, read) = q
                        .complete_many_and_read(&pairs, &self.worker, holds.len())
                        .await;
                    match read {
                        Ok(ds) => {
                            for d in ds {
                                let hold = holds.pop().expect("at most one entry per hold");
                                node.clone().start(d, hold, &outbox);
                            }
                        }
                        Err(e) => self.health.failed("reading jobs with a completion", &e),
                    }
                    // Holds not used give their admissions back to the reader.
                    done
                }
                None => q.complete_many(&pairs).await,
            }
        };
        match outcome {
            Ok(done) => {
                self.health.ok();
                for (f, c) in results.into_iter().zip(done) {
                    let status = as_result(&f).1.outcome.status;
                    self.stored(f, status, Some(c));
                }
                (Vec::new(), Vec::new())
            }
            Err(e) if e.is_refused() && batch => {
                self.health.ok();
                tracing::warn!(
                    queue = q.name(),
                    "Redis refused a batch of {} results ({e}); storing them one by one",
                    results.len()
                );
                let (mut refused, mut again) = (Vec::new(), Vec::new());
                for f in results {
                    let (r, a) = Box::pin(self.results(q, vec![f])).await;
                    refused.extend(r);
                    again.extend(a);
                }
                (refused, again)
            }
            Err(e) if e.is_refused() => {
                self.health.ok();
                let mut f = results.into_iter().next().expect("one result");
                let reason = format!("Redis refused to store the result: {e}");
                tracing::error!(queue = q.name(), "job {}: {reason}", f.delivery.id);
                f.action = Action::DeadLetter {
                    status: Status::Error,
                    reason,
                };
                (vec![f], Vec::new())
            }
            Err(e) => {
                self.health.failed("storing results", &e);
                (Vec::new(), results)
            }
        }
    }

    /// What a completion reads with: the node, an outbox handle for the jobs it starts, and a
    /// hold for each admission (fewer when results waiting to be stored take the holds). None
    /// when it must not read (see [`Refill::may_refill`]); the admissions then go back.
    fn refill_holds(
        &self,
        admissions: Vec<OwnedSemaphorePermit>,
    ) -> Option<(Arc<dyn Refill>, Outbox, Vec<Hold>)> {
        let node = self.refill.as_ref()?;
        if admissions.is_empty() || !node.may_refill() {
            return None;
        }
        let outbox = Outbox {
            tx: self.sender.upgrade()?,
            unstored: self.unstored.clone(),
        };
        let holds: Vec<Hold> = admissions
            .into_iter()
            .filter_map(|a| node.hold_now(a))
            .collect();
        (!holds.is_empty()).then(|| (node.clone(), outbox, holds))
    }

    /// Dead-letters `letters` in one round trip; when Redis refuses the batch, one by one
    /// (an entry whose dead letter is refused too leaves the stream with its reason, without
    /// a result). Returns the ones to retry.
    async fn letters(&self, q: &forkbox_queue::Queue, letters: Vec<Finished>) -> Vec<Finished> {
        let outcome = {
            let triples: Vec<(&Delivery, Status, &str)> = letters.iter().map(as_letter).collect();
            q.dead_letter_as(&triples, &self.worker).await
        };
        match outcome {
            Ok(done) => {
                self.health.ok();
                for (f, c) in letters.into_iter().zip(done) {
                    let status = as_letter(&f).1;
                    ::metrics::counter!(m::DEAD_LETTERS, "queue" => q.name().to_owned())
                        .increment(1);
                    self.stored(f, status, Some(c));
                }
                Vec::new()
            }
            Err(e) if e.is_refused() => {
                self.health.ok();
                let each = {
                    let triples: Vec<(&Delivery, Status, &str)> =
                        letters.iter().map(as_letter).collect();
                    q.dead_letter_each(&triples, &self.worker).await
                };
                let mut again = Vec::new();
                for (f, r) in letters.into_iter().zip(each) {
                    match r {
                        Ok(c) => {
                            let status = as_letter(&f).1;
                            ::metrics::counter!(m::DEAD_LETTERS, "queue" => q.name().to_owned())
                                .increment(1);
                            self.stored(f, status, c);
                        }
                        Err(e) => {
                            self.health.failed("dead-lettering", &e);
                            again.push(f);
                        }
                    }
                }
                again
            }
            Err(e) => {
                self.health.failed("dead-lettering", &e);
                letters
            }
        }
    }

    /// Done with `f`: its entry is retired, its slot goes back. `c` is `None` when the entry
    /// left the stream without a result.
    fn stored(&self, f: Finished, status: Status, c: Option<Completion>) {
        let (queue, d) = (&f.delivery.queue, &f.delivery);
        self.held.remove(queue, d.partition, &d.entry_id);
        self.unstored.remove(f.seq);
        match c {
            Some(Completion::Stored) => {
                ::metrics::counter!(m::JOBS, "queue" => queue.to_owned(), "status" => status.as_str())
                    .increment(1);
                tracing::debug!(queue, "job {} stored: {status}", d.id);
            }
            Some(Completion::Duplicate) => {
                tracing::debug!(queue, "job {} already had a result; acknowledged", d.id)
            }
            Some(Completion::Lost) => {
                ::metrics::counter!(m::RESULTS_LOST, "queue" => queue.to_owned()).increment(1);
                tracing::info!(
                    queue,
                    "job {} finished ({status}), result not stored: its entry is gone and no \
                     result exists (lost with Redis' data)",
                    d.id
                );
            }
            None => tracing::warn!(
                queue,
                "job {} moved to the dead-letter stream without a result",
                d.id
            ),
        }
    }
}

fn as_result(f: &Finished) -> (&Delivery, &JobResult) {
    match &f.action {
        Action::Complete(r) => (&f.delivery, &**r),
        Action::DeadLetter { .. } => unreachable!("sorted by action"),
    }
}

fn as_letter(f: &Finished) -> (&Delivery, Status, &str) {
    match &f.action {
        Action::DeadLetter { status, reason } => (&f.delivery, *status, reason.as_str()),
        Action::Complete(_) => unreachable!("sorted by action"),
    }
}
