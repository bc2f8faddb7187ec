//! The node's two seams: the [`Runner`] in front of the sandbox engine and the [`JobQueue`] in
//! front of Redis.
//!
//! The reader, the outbox and the job tasks reach the engine and the queues only through
//! these, so their logic runs in unit tests against a fake engine and a fake queue. The real
//! implementations ([`Engine`] and [`QueueSet`]) are here too, each in one place: what the
//! node calls of the engine and of the queue crate is this file. Upkeep, cancellation and the
//! start-up checks talk to Redis directly; they are not on a job's path.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;

use forkbox_queue::{Completion, Delivery, Job, JobResult, Outcome, Queue, QueueError, QueueSet};
use forkbox_queue::{Reclaimed, Status};

use crate::node::error::NodeFault;
use crate::sandbox::{Engine, Slot};

/// A future the node awaits through a seam.
pub(crate) type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What runs jobs: the sandbox engine, as the node uses it.
pub(crate) trait Runner: Send + Sync + 'static {
    /// Waits for one of the runner's slots (first come, first served).
    fn slot(&self) -> Boxed<'_, Box<dyn RunSlot>>;
    /// Whether jobs can still run (the engine's zygote is alive).
    fn is_alive(&self) -> bool;
}

/// One slot of a [`Runner`], taken; given back when its run is over.
pub(crate) trait RunSlot: Send {
    /// Runs `job` in this slot; when `cancel` completes first, the run is killed and its
    /// outcome is `cancelled`.
    fn run<'a>(self: Box<Self>, job: &'a Job, cancel: Boxed<'a, ()>) -> Boxed<'a, Run>;
}

/// How a run ended: its outcome and, when its set-up failed for want of the host's
/// descriptors or memory, that fault of the node.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) outcome: Outcome,
    pub(crate) fault: Option<NodeFault>,
}

impl Runner for Engine {
    fn slot(&self) -> Boxed<'_, Box<dyn RunSlot>> {
        Box::pin(async move {
            let slot = Engine::slot(self).await;
            Box::new(EngineSlot {
                engine: self.clone(),
                slot,
            }) as Box<dyn RunSlot>
        })
    }

    fn is_alive(&self) -> bool {
        Engine::is_alive(self)
    }
}

/// A slot of the engine.
struct EngineSlot {
    engine: Engine,
    slot: Slot,
}

impl RunSlot for EngineSlot {
    fn run<'a>(self: Box<Self>, job: &'a Job, cancel: Boxed<'a, ()>) -> Boxed<'a, Run> {
        let EngineSlot { engine, slot } = *self;
        Box::pin(async move {
            let end = engine.run_in(slot, job, cancel, None).await;
            Run {
                outcome: end.outcome,
                fault: end.setup_errno.and_then(NodeFault::of),
            }
        })
    }
}

/// One partition of one queue, as the node names it: where a delivery came from and where it
/// is completed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Part {
    pub(crate) queue: String,
    pub(crate) partition: usize,
}

impl Part {
    pub(crate) fn of(d: &Delivery) -> Part {
        Part {
            queue: d.queue.clone(),
            partition: d.partition,
        }
    }
}

/// A result to store, with the delivery whose entry its storing acknowledges.
pub(crate) type Done<'a> = (&'a Delivery, &'a JobResult);

/// A delivery to dead-letter, with its status and the reason.
pub(crate) type Letter<'a> = (&'a Delivery, Status, &'a str);

/// What completing a batch returns: the completions, and the entries read with them.
pub(crate) type CompleteAndRead = (
    Result<Vec<Completion>, QueueError>,
    Result<Vec<Delivery>, QueueError>,
);

/// The node's queues, as the reader, the outbox and the job tasks use them (see
/// [`forkbox_queue`] for what each operation does in Redis).
pub(crate) trait JobQueue: Send + Sync + 'static {
    /// Every partition of every queue, in reading order.
    fn parts(&self) -> Vec<Part>;
    /// Whether `part` is one of the node's.
    fn has(&self, part: &Part) -> bool;
    fn ensure_groups(&self) -> Boxed<'_, Result<(), QueueError>>;
    /// Up to `count` new deliveries, higher queues first; blocks up to `block_ms` when every
    /// queue is empty.
    fn read<'a>(
        &'a self,
        consumer: &'a str,
        count: usize,
        block_ms: u64,
    ) -> Boxed<'a, Result<Vec<Delivery>, QueueError>>;
    /// Up to `count` entries `consumer` held before (a previous life of the node).
    fn read_own_pending<'a>(
        &'a self,
        part: &'a Part,
        consumer: &'a str,
        count: usize,
    ) -> Boxed<'a, Result<Vec<Delivery>, QueueError>>;
    /// Takes over up to `limit` entries idle at least `min_idle_ms`.
    fn reclaim<'a>(
        &'a self,
        part: &'a Part,
        consumer: &'a str,
        min_idle_ms: u64,
        limit: usize,
    ) -> Boxed<'a, Result<Reclaimed, QueueError>>;
    /// Takes back up to `limit` of `consumer`'s own entries idle at least `min_idle_ms` and not
    /// in `skip`.
    fn recover_stranded<'a>(
        &'a self,
        part: &'a Part,
        consumer: &'a str,
        min_idle_ms: u64,
        skip: &'a HashSet<String>,
        limit: usize,
    ) -> Boxed<'a, Result<Vec<Delivery>, QueueError>>;
    /// Stores `done` in one round trip and, with `read` (`consumer`, `count`), reads up to
    /// `count` new entries on the same one.
    fn complete<'a>(
        &'a self,
        part: &'a Part,
        done: &'a [Done<'a>],
        read: Option<(&'a str, usize)>,
    ) -> Boxed<'a, CompleteAndRead>;
    /// Dead-letters `letters` in one round trip.
    fn dead_letter<'a>(
        &'a self,
        part: &'a Part,
        letters: &'a [Letter<'a>],
        worker: &'a str,
    ) -> Boxed<'a, Result<Vec<Completion>, QueueError>>;
    /// Dead-letters `letters` one by one (`None`: the entry left without a result).
    fn dead_letter_each<'a>(
        &'a self,
        part: &'a Part,
        letters: &'a [Letter<'a>],
        worker: &'a str,
    ) -> Boxed<'a, Vec<Result<Option<Completion>, QueueError>>>;
    /// Hands `entries` (`(entry id, deliveries)`) back to the group, uncharged.
    fn hand_back<'a>(
        &'a self,
        part: &'a Part,
        consumer: &'a str,
        entries: &'a [(&'a str, u64)],
    ) -> Boxed<'a, Result<u64, QueueError>>;
}

/// The queue of `part` in `set`, or an error naming it.
fn queue_of<'s>(
    set: &'s QueueSet,
    part: &Part,
    command: &'static str,
) -> Result<&'s Queue, QueueError> {
    set.get(&part.queue, part.partition)
        .ok_or_else(|| QueueError::UnexpectedReply {
            queue: part.queue.clone(),
            command,
            detail: format!("partition {} is not one this node reads", part.partition),
        })
}

/// `op` on the queue of `part` in `set`, as a seam's future; the error of [`queue_of`],
/// naming `command`, when the node does not read `part`.
fn on_queue<'a, T, F>(
    set: &'a QueueSet,
    part: &'a Part,
    command: &'static str,
    op: impl FnOnce(&'a Queue) -> F + Send + 'a,
) -> Boxed<'a, Result<T, QueueError>>
where
    F: Future<Output = Result<T, QueueError>> + Send + 'a,
{
    Box::pin(async move { op(queue_of(set, part, command)?).await })
}

impl JobQueue for QueueSet {
    fn parts(&self) -> Vec<Part> {
        self.queues()
            .iter()
            .map(|q| Part {
                queue: q.name().to_owned(),
                partition: q.keys().partition_index(),
            })
            .collect()
    }

    fn has(&self, part: &Part) -> bool {
        self.get(&part.queue, part.partition).is_some()
    }

    fn ensure_groups(&self) -> Boxed<'_, Result<(), QueueError>> {
        Box::pin(QueueSet::ensure_groups(self))
    }

    fn read<'a>(
        &'a self,
        consumer: &'a str,
        count: usize,
        block_ms: u64,
    ) -> Boxed<'a, Result<Vec<Delivery>, QueueError>> {
        Box::pin(QueueSet::read(self, consumer, count, block_ms))
    }

    fn read_own_pending<'a>(
        &'a self,
        part: &'a Part,
        consumer: &'a str,
        count: usize,
    ) -> Boxed<'a, Result<Vec<Delivery>, QueueError>> {
        on_queue(self, part, "read_own_pending", move |q| {
            q.read_own_pending(consumer, count)
        })
    }

    fn reclaim<'a>(
        &'a self,
        part: &'a Part,
        consumer: &'a str,
        min_idle_ms: u64,
        limit: usize,
    ) -> Boxed<'a, Result<Reclaimed, QueueError>> {
        on_queue(self, part, "reclaim", move |q| {
            q.reclaim(consumer, min_idle_ms, limit)
        })
    }

    fn recover_stranded<'a>(
        &'a self,
        part: &'a Part,
        consumer: &'a str,
        min_idle_ms: u64,
        skip: &'a HashSet<String>,
        limit: usize,
    ) -> Boxed<'a, Result<Vec<Delivery>, QueueError>> {
        on_queue(self, part, "recover_stranded", move |q| {
            q.recover_stranded(consumer, min_idle_ms, skip, limit)
        })
    }

    fn complete<'a>(
        &'a self,
        part: &'a Part,
        done: &'a [Done<'a>],
        read: Option<(&'a str, usize)>,
    ) -> Boxed<'a, CompleteAndRead> {
        Box::pin(async move {
            let q = match queue_of(self, part, "complete") {
                Ok(q) => q,
                Err(e) => return (Err(e), Ok(Vec::new())),
            };
            match read {
                Some((consumer, count)) => q.complete_many_and_read(done, consumer, count).await,
                None => (q.complete_many(done).await, Ok(Vec::new())),
            }
        })
    }

    fn dead_letter<'a>(
        &'a self,
        part: &'a Part,
        letters: &'a [Letter<'a>],
        worker: &'a str,
    ) -> Boxed<'a, Result<Vec<Completion>, QueueError>> {
        on_queue(self, part, "dead_letter", move |q| {
            q.dead_letter_as(letters, worker)
        })
    }

    fn dead_letter_each<'a>(
        &'a self,
        part: &'a Part,
        letters: &'a [Letter<'a>],
        worker: &'a str,
    ) -> Boxed<'a, Vec<Result<Option<Completion>, QueueError>>> {
        Box::pin(async move {
            match queue_of(self, part, "dead_letter") {
                Ok(q) => q.dead_letter_each(letters, worker).await,
                Err(e) => {
                    let text = e.to_string();
                    letters
                        .iter()
                        .map(|_| {
                            Err(QueueError::UnexpectedReply {
                                queue: part.queue.clone(),
                                command: "dead_letter",
                                detail: text.clone(),
                            })
                        })
                        .collect()
                }
            }
        })
    }

    fn hand_back<'a>(
        &'a self,
        part: &'a Part,
        consumer: &'a str,
        entries: &'a [(&'a str, u64)],
    ) -> Boxed<'a, Result<u64, QueueError>> {
        on_queue(self, part, "hand_back", move |q| {
            q.hand_back(consumer, entries)
        })
    }
}
