//! The outbox: finished work waiting to be stored in Redis.
//!
//! Job tasks hand their results and dead letters to the [`Outbox`] and return. One completer
//! task takes everything that has accumulated and stores it with one pipelined
//! `complete_many` (and one `dead_letter_many`) per queue, so jobs that finish together share a
//! round trip. When Redis is away the items stay here and the completer retries with back-off
//! until they are stored: a result that was computed is never dropped. Each item carries the
//! slot permit of its job, released only once the result is stored, and its entry stays in the
//! held set (its claim refreshed) until then.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use forkbox_queue::{Completion, Delivery, JobResult, QueueSet, Status};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::task::JoinHandle;

use crate::node::health::{Backoff, RedisHealth, RoundTrips};
use crate::node::metrics as m;
use crate::node::worker::Held;

/// What to store for a delivery.
#[derive(Debug)]
pub enum Action {
    Complete(Box<JobResult>),
    DeadLetter(String),
}

/// One finished delivery with its slot.
#[derive(Debug)]
pub struct Finished {
    pub delivery: Delivery,
    pub action: Action,
    pub permit: Option<OwnedSemaphorePermit>,
}

/// The sending side; cheap to clone. The completer stops once every clone is dropped and
/// everything sent is stored.
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Finished>,
    waiting: Arc<AtomicUsize>,
}

impl Outbox {
    pub fn complete(&self, delivery: Delivery, result: JobResult, permit: OwnedSemaphorePermit) {
        self.send(Finished {
            delivery,
            action: Action::Complete(Box::new(result)),
            permit: Some(permit),
        });
    }

    pub fn dead_letter(&self, delivery: Delivery, reason: String, permit: OwnedSemaphorePermit) {
        self.send(Finished {
            delivery,
            action: Action::DeadLetter(reason),
            permit: Some(permit),
        });
    }

    fn send(&self, item: Finished) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        // The completer outlives every sender (it stops when they are all gone).
        if self.tx.send(item).is_err() {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            tracing::error!("outbox closed: a finished result was dropped");
        }
    }
}

/// The completer task.
#[derive(Debug)]
pub struct Completer {
    task: JoinHandle<()>,
    waiting: Arc<AtomicUsize>,
}

impl Completer {
    /// Waits until every sender is gone and everything is stored.
    pub async fn wait(&mut self) {
        let _ = (&mut self.task).await;
    }

    /// Stops the completer; returns how many items were never stored.
    pub fn abort(self) -> usize {
        self.task.abort();
        self.waiting.load(Ordering::Relaxed)
    }
}

/// Starts the completer for the queues of `set`.
pub fn start(
    set: QueueSet,
    worker: String,
    held: Arc<Held>,
    health: Arc<RedisHealth>,
    trips: RoundTrips,
) -> (Outbox, Completer) {
    let (tx, rx) = mpsc::unbounded_channel();
    let waiting = Arc::new(AtomicUsize::new(0));
    let task = tokio::spawn(run(set, worker, held, health, trips, rx, waiting.clone()));
    (
        Outbox {
            tx,
            waiting: waiting.clone(),
        },
        Completer { task, waiting },
    )
}

async fn run(
    set: QueueSet,
    worker: String,
    held: Arc<Held>,
    health: Arc<RedisHealth>,
    trips: RoundTrips,
    mut rx: mpsc::UnboundedReceiver<Finished>,
    waiting: Arc<AtomicUsize>,
) {
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
        let before = buffer.len();
        buffer = store(&set, &worker, &held, &health, &trips, buffer).await;
        waiting.fetch_sub(before - buffer.len(), Ordering::Relaxed);
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

/// Stores what it can; returns the items to retry.
async fn store(
    set: &QueueSet,
    worker: &str,
    held: &Held,
    health: &RedisHealth,
    trips: &RoundTrips,
    items: Vec<Finished>,
) -> Vec<Finished> {
    let mut by_queue: BTreeMap<String, (Vec<Finished>, Vec<Finished>)> = BTreeMap::new();
    for f in items {
        let slot = by_queue.entry(f.delivery.queue.clone()).or_default();
        match f.action {
            Action::Complete(_) => slot.0.push(f),
            Action::DeadLetter(_) => slot.1.push(f),
        }
    }
    let mut retry = Vec::new();
    for (name, (results, letters)) in by_queue {
        let Some(q) = set.get(&name) else {
            tracing::error!("delivery from unknown queue {name}; dropped");
            continue;
        };
        if !results.is_empty() {
            let pairs: Vec<(&Delivery, &JobResult)> = results
                .iter()
                .map(|f| match &f.action {
                    Action::Complete(r) => (&f.delivery, &**r),
                    Action::DeadLetter(_) => unreachable!("sorted above"),
                })
                .collect();
            trips.add(1);
            match q.complete_many(&pairs).await {
                Ok(done) => {
                    health.ok();
                    for (f, c) in results.into_iter().zip(done) {
                        let Action::Complete(r) = &f.action else {
                            unreachable!("sorted above")
                        };
                        stored(held, &name, &f.delivery, r.outcome.status, c);
                    }
                }
                Err(e) => {
                    health.failed("storing results", &e);
                    retry.extend(results);
                }
            }
        }
        if !letters.is_empty() {
            let pairs: Vec<(&Delivery, &str)> = letters
                .iter()
                .map(|f| match &f.action {
                    Action::DeadLetter(reason) => (&f.delivery, reason.as_str()),
                    Action::Complete(_) => unreachable!("sorted above"),
                })
                .collect();
            trips.add(1);
            match q.dead_letter_many(&pairs, worker).await {
                Ok(done) => {
                    health.ok();
                    for (f, c) in letters.into_iter().zip(done) {
                        let status = if f.delivery.job.is_ok() {
                            Status::Error
                        } else {
                            Status::Invalid
                        };
                        ::metrics::counter!(m::DEAD_LETTERS).increment(1);
                        stored(held, &name, &f.delivery, status, c);
                    }
                }
                Err(e) => {
                    health.failed("dead-lettering", &e);
                    retry.extend(letters);
                }
            }
        }
    }
    retry
}

fn stored(held: &Held, queue: &str, d: &Delivery, status: Status, c: Completion) {
    held.remove(queue, &d.entry_id);
    match c {
        Completion::Stored => {
            ::metrics::counter!(m::JOBS, "queue" => queue.to_owned(), "status" => status.as_str())
                .increment(1);
            tracing::debug!(queue, "job {} stored: {status}", d.id);
        }
        Completion::Duplicate => {
            tracing::debug!(queue, "job {} already had a result; acknowledged", d.id)
        }
    }
}
