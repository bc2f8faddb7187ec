//! The outbox: finished work waiting to be stored in Redis.
//!
//! Job tasks hand their results and dead letters to the [`Outbox`] and return. One completer
//! task takes everything that has accumulated and stores it with one pipelined
//! `complete_many` (and one `dead_letter_many`) per queue, so jobs that finish together share a
//! round trip. When Redis is away the items stay here and the completer retries with back-off
//! until they are stored: a result that was computed is never dropped. Each item carries the
//! [`Hold`] of its job, released only once the result is stored, and its entry stays in the
//! held set (its claim refreshed) until then.
//!
//! Redis refusing the data of one job (a script error on its values) is not an outage: when a
//! batch is refused, its items are stored one by one, and the one Redis refuses is
//! dead-lettered with Redis' reason instead of being retried for ever with its hold. Only
//! Redis being unreachable (or out of memory, loading, failing over) keeps items here.
//!
//! A completion may also carry the admission its job freed: when the node reads one stream on
//! one server, the completer then reads the next entries on the same round trip
//! ([`forkbox_queue::Queue::complete_many_and_read`]) and hands what it read, each entry with
//! its permits, to the reader (`ReadWith`), which starts it as it starts what it reads
//! itself; so a node working through a backlog spends one round trip per job. An admission not
//! used that way (the queue is empty, the node is stopping, a reclaim is due, or the store
//! failed) goes back to the pool. The outbox never starts a job itself: the read path is the
//! reader's.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use forkbox_queue::{Completion, Delivery, JobResult, Status};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::node::admission::{Admission, Hold, Permits, SlotPool};
use crate::node::health::{Backoff, RedisHealth};
use crate::node::held::Held;
use crate::node::metrics as m;
use crate::node::seam::{JobQueue, Part};
use crate::node::stop::StopLevel;

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

/// One finished delivery with its hold.
#[derive(Debug)]
pub struct Finished {
    pub delivery: Delivery,
    pub action: Action,
    /// Given back once the result is stored.
    pub hold: Hold,
    /// The admission its run freed, for the completer to read the next entry with.
    pub admission: Option<Admission>,
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
    pub fn complete(&self, delivery: Delivery, result: JobResult, hold: Hold) {
        self.send(delivery, Action::Complete(Box::new(result)), hold, None);
    }

    /// [`Outbox::complete`], handing over the admission the job's run freed (see the module
    /// documentation).
    pub fn complete_reading(
        &self,
        delivery: Delivery,
        result: JobResult,
        hold: Hold,
        admission: Option<Admission>,
    ) {
        self.send(
            delivery,
            Action::Complete(Box::new(result)),
            hold,
            admission,
        );
    }

    pub fn dead_letter(&self, delivery: Delivery, status: Status, reason: String, hold: Hold) {
        self.send(delivery, Action::DeadLetter { status, reason }, hold, None);
    }

    fn send(&self, delivery: Delivery, action: Action, hold: Hold, admission: Option<Admission>) {
        let seq = self.unstored.add(&delivery);
        let item = Finished {
            delivery,
            action,
            hold,
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

/// When completions may read the next entries: the node is not stopping and no reclaim is
/// due (the reader reclaims with the admissions it gets back, so a busy node still reclaims on
/// time). The reader sets when it reclaims next.
#[derive(Debug)]
pub(crate) struct ReadGate {
    stop: watch::Receiver<StopLevel>,
    next_reclaim: Mutex<Instant>,
}

impl ReadGate {
    pub(crate) fn new(stop: watch::Receiver<StopLevel>) -> ReadGate {
        ReadGate {
            stop,
            next_reclaim: Mutex::new(Instant::now()),
        }
    }

    /// The reader reclaims next at `at`.
    pub(crate) fn reclaim_at(&self, at: Instant) {
        *self.next_reclaim.lock().expect("reclaim lock") = at;
    }

    /// Whether a completion may read new entries now.
    pub(crate) fn open(&self) -> bool {
        *self.stop.borrow() < StopLevel::Drain
            && Instant::now() < *self.next_reclaim.lock().expect("reclaim lock")
    }
}

/// How completions read the next entries: when the gate is open, with a hold from `slots` for
/// each admission they carry, handing each entry read to the reader through `to`.
#[derive(Debug)]
pub(crate) struct ReadWith {
    pub(crate) gate: Arc<ReadGate>,
    pub(crate) slots: SlotPool,
    pub(crate) to: mpsc::UnboundedSender<ReadBack>,
}

/// An entry a completion read, with its permits, on its way to the reader; with an outbox
/// handle for its job, so the completer stays up until it is started.
#[derive(Debug)]
pub(crate) struct ReadBack {
    pub(crate) delivery: Delivery,
    pub(crate) permits: Permits,
    pub(crate) outbox: Outbox,
}

/// Starts the completer for `queue`; with `read_with`, completions read the next entries for
/// the admissions they carry and hand them to the reader.
pub(crate) fn start(
    queue: Arc<dyn JobQueue>,
    worker: String,
    held: Arc<Held>,
    health: Arc<RedisHealth>,
    read_with: Option<ReadWith>,
) -> (Outbox, Completer) {
    let (tx, rx) = mpsc::unbounded_channel();
    let unstored = Arc::new(Unstored::default());
    let store = Store {
        queue,
        worker,
        held,
        health,
        unstored: unstored.clone(),
        read_with,
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
    queue: Arc<dyn JobQueue>,
    worker: String,
    held: Arc<Held>,
    health: Arc<RedisHealth>,
    unstored: Arc<Unstored>,
    /// How completions read (see [`start`]).
    read_with: Option<ReadWith>,
    /// For the outbox handle of jobs read here; weak, so that the completer still stops
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
        let mut by_part: BTreeMap<(String, usize), (Vec<Finished>, Vec<Finished>)> =
            BTreeMap::new();
        for f in items {
            let slot = by_part
                .entry((f.delivery.queue.clone(), f.delivery.partition))
                .or_default();
            match f.action {
                Action::Complete(_) => slot.0.push(f),
                Action::DeadLetter { .. } => slot.1.push(f),
            }
        }
        let mut retry = Vec::new();
        for ((queue, partition), (results, mut letters)) in by_part {
            let part = Part { queue, partition };
            if !self.queue.has(&part) {
                tracing::error!(
                    "delivery from unknown queue {} partition {partition}; dropped",
                    part.queue
                );
                continue;
            }
            if !results.is_empty() {
                let (refused, again) = self.results(&part, results).await;
                retry.extend(again);
                letters.extend(refused);
            }
            if !letters.is_empty() {
                retry.extend(self.letters(&part, letters).await);
            }
        }
        retry
    }

    /// Completes `results` in one round trip; when Redis refuses the batch, one by one.
    /// Returns the refused ones, turned into dead letters, and the ones to retry.
    async fn results(
        &self,
        part: &Part,
        mut results: Vec<Finished>,
    ) -> (Vec<Finished>, Vec<Finished>) {
        let batch = results.len() > 1;
        // Admissions ride only on the first attempt: a retry or a one-by-one re-send gives
        // them back to the pool.
        let admissions: Vec<Admission> = results
            .iter_mut()
            .filter_map(|f| f.admission.take())
            .collect();
        let reading = self.read_permits(admissions);
        let (outcome, read) = {
            let pairs: Vec<(&Delivery, &JobResult)> = results.iter().map(as_result).collect();
            let count = reading.as_ref().map(|(_, permits)| permits.len());
            let read = count.map(|n| (self.worker.as_str(), n));
            self.queue.complete(part, &pairs, read).await
        };
        if let Some((outbox, permits)) = reading {
            match read {
                Ok(ds) => self.hand_to_reader(ds, permits, &outbox),
                Err(e) => self.health.failed("reading jobs with a completion", &e),
            }
        }
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
                    queue = part.queue,
                    "Redis refused a batch of {} results ({e}); storing them one by one",
                    results.len()
                );
                let (mut refused, mut again) = (Vec::new(), Vec::new());
                for f in results {
                    let (r, a) = Box::pin(self.results(part, vec![f])).await;
                    refused.extend(r);
                    again.extend(a);
                }
                (refused, again)
            }
            Err(e) if e.is_refused() => {
                self.health.ok();
                let mut f = results.into_iter().next().expect("one result");
                let reason = format!("Redis refused to store the result: {e}");
                tracing::error!(queue = part.queue, "job {}: {reason}", f.delivery.id);
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

    /// What a completion reads with: an outbox handle for the jobs it reads, and the permits
    /// of each admission (fewer when results waiting to be stored take the holds). None when it
    /// must not read (see [`ReadGate`]); the admissions then go back to the pool.
    fn read_permits(&self, admissions: Vec<Admission>) -> Option<(Outbox, Vec<Permits>)> {
        let with = self.read_with.as_ref()?;
        if admissions.is_empty() || !with.gate.open() {
            return None;
        }
        let outbox = Outbox {
            tx: self.sender.upgrade()?,
            unstored: self.unstored.clone(),
        };
        let permits: Vec<Permits> = admissions
            .into_iter()
            .filter_map(|a| with.slots.hold_now(a))
            .collect();
        (!permits.is_empty()).then_some((outbox, permits))
    }

    /// Hands the entries a completion read to the reader, each with its permits; permits not
    /// used go back to the pool.
    fn hand_to_reader(&self, read: Vec<Delivery>, mut permits: Vec<Permits>, outbox: &Outbox) {
        let Some(with) = &self.read_with else {
            return;
        };
        for delivery in read {
            let permits = permits.pop().expect("at most one entry per admission");
            let back = ReadBack {
                delivery,
                permits,
                outbox: outbox.clone(),
            };
            if let Err(mpsc::error::SendError(back)) = with.to.send(back) {
                // Only once the node is over: the entry stays pending for the reclaimer.
                tracing::warn!(
                    queue = back.delivery.queue,
                    "job {} read as the node stopped; left pending",
                    back.delivery.id
                );
            }
        }
    }

    /// Dead-letters `letters` in one round trip; when Redis refuses the batch, one by one
    /// (an entry whose dead letter is refused too leaves the stream with its reason, without
    /// a result). Returns the ones to retry.
    async fn letters(&self, part: &Part, letters: Vec<Finished>) -> Vec<Finished> {
        let outcome = {
            let triples: Vec<(&Delivery, Status, &str)> = letters.iter().map(as_letter).collect();
            self.queue.dead_letter(part, &triples, &self.worker).await
        };
        match outcome {
            Ok(done) => {
                self.health.ok();
                for (f, c) in letters.into_iter().zip(done) {
                    let status = as_letter(&f).1;
                    ::metrics::counter!(m::DEAD_LETTERS, "queue" => part.queue.clone())
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
                    self.queue
                        .dead_letter_each(part, &triples, &self.worker)
                        .await
                };
                let mut again = Vec::new();
                for (f, r) in letters.into_iter().zip(each) {
                    match r {
                        Ok(c) => {
                            let status = as_letter(&f).1;
                            ::metrics::counter!(m::DEAD_LETTERS, "queue" => part.queue.clone())
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

    /// Done with `f`: its entry is retired, its hold goes back. `c` is `None` when the entry
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use forkbox_queue::Outcome;

    use super::*;
    use crate::node::fake::{delivery, Asked, FakeQueue};
    use crate::node::stop::StopHandle;

    fn result(d: &Delivery) -> JobResult {
        JobResult::new(
            d.id.clone(),
            Outcome::not_run(Status::Ok, ""),
            1,
            "n".to_owned(),
        )
    }

    fn outbox(queue: &Arc<FakeQueue>, read_with: Option<ReadWith>) -> (Outbox, Completer) {
        start(
            queue.clone(),
            "n".to_owned(),
            Arc::new(Held::default()),
            Arc::new(RedisHealth::default()),
            read_with,
        )
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        for _ in 0..400 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("never: {what}");
    }

    #[tokio::test]
    async fn a_failing_store_keeps_the_hold_until_the_result_is_stored() {
        let queue = FakeQueue::with([]);
        queue.fail_completes(2);
        let pool = SlotPool::new(1, 0);
        let Permits { admission, hold } = pool.take_free().await.pop().unwrap();
        drop(admission);
        let (outbox, mut completer) = outbox(&queue, None);
        let d = delivery("a", "ok", 1);
        outbox.complete(d.clone(), result(&d), hold);
        // Redis is away: the result waits, and so does its hold.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(queue.asked().is_empty());
        assert_eq!(pool.free_holds(), 1);
        until("stored", || !queue.asked().is_empty()).await;
        assert_eq!(queue.asked(), [Asked::Stored("a".into(), Status::Ok)]);
        assert_eq!(pool.free_holds(), 2);
        drop(outbox);
        completer.wait().await;
    }

    #[tokio::test]
    async fn a_refused_batch_is_stored_one_by_one_and_the_refused_result_dead_lettered() {
        let queue = FakeQueue::with([]);
        queue.refuse("b");
        let pool = SlotPool::new(2, 0);
        let (outbox, mut completer) = outbox(&queue, None);
        // Sent before the completer runs: one batch.
        for (id, p) in ["a", "b"].into_iter().zip(pool.take_free().await) {
            let d = delivery(id, "ok", 1);
            outbox.complete(d.clone(), result(&d), p.hold);
        }
        drop(outbox);
        completer.wait().await;
        let asked = queue.asked();
        assert_eq!(asked.len(), 2, "{asked:?}");
        assert_eq!(asked[0], Asked::Stored("a".into(), Status::Ok));
        let Asked::DeadLettered(id, status, reason) = &asked[1] else {
            panic!("{asked:?}");
        };
        assert_eq!((id.as_str(), *status), ("b", Status::Error));
        assert!(
            reason.starts_with("Redis refused to store the result"),
            "{reason}"
        );
        assert_eq!(pool.free_holds(), 4);
    }

    #[tokio::test]
    async fn what_redis_never_stores_is_listed_when_the_completer_is_stopped() {
        let queue = FakeQueue::with([]);
        queue.fail_completes(usize::MAX);
        let pool = SlotPool::new(1, 0);
        let (outbox, completer) = outbox(&queue, None);
        let d = delivery("a", "ok", 1);
        outbox.complete(
            d.clone(),
            result(&d),
            pool.take_free().await.pop().unwrap().hold,
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(completer.abort(), [("q".to_owned(), "a".to_owned())]);
    }

    fn read_with(
        pool: &SlotPool,
        gate: &Arc<ReadGate>,
    ) -> (ReadWith, mpsc::UnboundedReceiver<ReadBack>) {
        let (to, back) = mpsc::unbounded_channel();
        let with = ReadWith {
            gate: gate.clone(),
            slots: pool.clone(),
            to,
        };
        (with, back)
    }

    #[tokio::test]
    async fn a_completion_reads_the_next_entry_with_its_admission_and_hands_it_to_the_reader() {
        let queue = FakeQueue::with([delivery("next", "ok", 1)]);
        let pool = SlotPool::new(1, 0);
        let stop = StopHandle::default();
        let gate = Arc::new(ReadGate::new(stop.subscribe()));
        gate.reclaim_at(Instant::now() + Duration::from_secs(3600));
        let (with, mut back) = read_with(&pool, &gate);
        let (outbox, _completer) = outbox(&queue, Some(with));
        let Permits { admission, hold } = pool.take_free().await.pop().unwrap();
        let d = delivery("done", "ok", 1);
        outbox.complete_reading(d.clone(), result(&d), hold, Some(admission));
        let read = back.recv().await.expect("an entry read");
        assert_eq!(read.delivery.id, "next");
        assert_eq!(queue.asked(), [Asked::Stored("done".into(), Status::Ok)]);
        // Its permits came with it: none free until the reader lets go of them.
        assert_eq!((pool.free_admissions(), pool.free_holds()), (0, 1));
        drop(read);
        assert_eq!((pool.free_admissions(), pool.free_holds()), (1, 2));
    }

    #[tokio::test]
    async fn a_completion_does_not_read_when_a_reclaim_is_due_or_the_node_stops() {
        for stopping in [false, true] {
            let queue = FakeQueue::with([delivery("next", "ok", 1)]);
            let pool = SlotPool::new(1, 0);
            let stop = StopHandle::default();
            let gate = Arc::new(ReadGate::new(stop.subscribe()));
            if stopping {
                gate.reclaim_at(Instant::now() + Duration::from_secs(3600));
                stop.raise(StopLevel::Drain);
            } else {
                gate.reclaim_at(Instant::now());
            }
            let (with, mut back) = read_with(&pool, &gate);
            let (outbox, mut completer) = outbox(&queue, Some(with));
            let Permits { admission, hold } = pool.take_free().await.pop().unwrap();
            let d = delivery("done", "ok", 1);
            outbox.complete_reading(d.clone(), result(&d), hold, Some(admission));
            // The outbox stays open while the result is stored: only the gate stops the read.
            until("stored", || !queue.asked().is_empty()).await;
            assert!(back.try_recv().is_err(), "read while it must not");
            assert_eq!(queue.read_with_completions(), 0);
            drop(outbox);
            completer.wait().await;
            assert_eq!(queue.asked(), [Asked::Stored("done".into(), Status::Ok)]);
            // The admission went back to the pool for the reader.
            assert_eq!((pool.free_admissions(), pool.free_holds()), (1, 2));
        }
    }
}
