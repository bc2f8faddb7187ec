//! A fake queue and a fake runner behind the node's [`seam`](crate::node::seam), for unit
//! tests of the node's own logic: they record what the node asked of them (what was read,
//! stored, dead-lettered, handed back; what ran, and how many at once).

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use forkbox_queue::redis::{ErrorKind, RedisError};
use forkbox_queue::{
    parse_payload, Completion, Delivery, Job, Outcome, QueueError, Reclaimed, Status,
};
use tokio::sync::Semaphore;

use crate::node::error::NodeFault;
use crate::node::seam::{
    Boxed, CompleteAndRead, Done, JobQueue, Letter, Part, Run, RunSlot, Runner,
};

pub(crate) const QUEUE: &str = "q";

/// A delivery of job `id` whose command is `cmd` (see [`FakeRunner`] for what it does).
pub(crate) fn delivery(id: &str, cmd: &str, deliveries: u64) -> Delivery {
    let payload = serde_json::json!({ "id": id, "cmd": cmd }).to_string();
    Delivery {
        queue: QUEUE.to_owned(),
        partition: 0,
        entry_id: format!("{id}-0"),
        id: id.to_owned(),
        job: parse_payload(payload.as_bytes(), 1 << 20),
        payload: payload.into_bytes(),
        deliveries,
        vetted: true,
    }
}

/// A delivery whose job does not parse.
pub(crate) fn malformed(id: &str) -> Delivery {
    let payload = b"{not json".to_vec();
    Delivery {
        job: parse_payload(&payload, 1 << 20),
        payload,
        ..delivery(id, "ok", 1)
    }
}

/// What the fake queue was asked, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Asked {
    /// A result stored and its entry acknowledged: (job id, status).
    Stored(String, Status),
    /// Dead-lettered: (job id, status, reason).
    DeadLettered(String, Status, String),
    /// Handed back unrun: the job id.
    HandedBack(String),
}

/// One queue partition in memory.
#[derive(Debug, Default)]
pub(crate) struct FakeQueue {
    state: Mutex<QueueState>,
}

#[derive(Debug, Default)]
struct QueueState {
    /// Entries not yet read, in stream order.
    stream: VecDeque<Delivery>,
    /// What the node asked, in order.
    asked: Vec<Asked>,
    /// Entries read and neither stored, dead-lettered nor handed back; and the most at once.
    out: HashSet<String>,
    most_out: usize,
    /// Completion round trips to fail as a lost connection before one succeeds.
    fail_completes: usize,
    /// Job ids whose result Redis refuses (a script error on their values).
    refuse: HashSet<String>,
    /// Entries read with a completion.
    read_with_completions: usize,
}

impl FakeQueue {
    pub(crate) fn with(entries: impl IntoIterator<Item = Delivery>) -> Arc<FakeQueue> {
        let q = FakeQueue::default();
        q.state.lock().unwrap().stream.extend(entries);
        Arc::new(q)
    }

    /// The next `n` completion round trips fail as if Redis were unreachable.
    pub(crate) fn fail_completes(&self, n: usize) {
        self.state.lock().unwrap().fail_completes = n;
    }

    /// Redis refuses to store the result of `id`.
    pub(crate) fn refuse(&self, id: &str) {
        self.state.lock().unwrap().refuse.insert(id.to_owned());
    }

    pub(crate) fn asked(&self) -> Vec<Asked> {
        self.state.lock().unwrap().asked.clone()
    }

    /// The most entries read and not yet finished with at once.
    pub(crate) fn most_out(&self) -> usize {
        self.state.lock().unwrap().most_out
    }

    pub(crate) fn out(&self) -> usize {
        self.state.lock().unwrap().out.len()
    }

    pub(crate) fn read_with_completions(&self) -> usize {
        self.state.lock().unwrap().read_with_completions
    }

    /// Waits until the node asked `n` things.
    pub(crate) async fn wait_asked(&self, n: usize) -> Vec<Asked> {
        for _ in 0..1000 {
            let asked = self.asked();
            if asked.len() >= n {
                return asked;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the node asked only {:?}", self.asked());
    }
}

impl QueueState {
    fn take(&mut self, count: usize) -> Vec<Delivery> {
        let n = count.min(self.stream.len());
        let ds: Vec<Delivery> = self.stream.drain(..n).collect();
        for d in &ds {
            self.out.insert(d.id.clone());
        }
        self.most_out = self.most_out.max(self.out.len());
        ds
    }

    fn finish(&mut self, asked: Asked) {
        let id = match &asked {
            Asked::Stored(id, _) | Asked::DeadLettered(id, _, _) | Asked::HandedBack(id) => id,
        };
        self.out.remove(id);
        self.asked.push(asked);
    }
}

/// A Redis error of the given kind, as a queue error of `command`.
fn redis_error(refused: bool) -> QueueError {
    let source = if refused {
        RedisError::from((ErrorKind::ResponseError, "ERR", "refused".to_owned()))
    } else {
        RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset",
        ))
    };
    QueueError::Complete {
        queue: QUEUE.to_owned(),
        id: String::new(),
        source,
    }
}

fn ok<T: Send + 'static>(v: T) -> Boxed<'static, T> {
    Box::pin(async move { v })
}

impl JobQueue for FakeQueue {
    fn parts(&self) -> Vec<Part> {
        vec![Part {
            queue: QUEUE.to_owned(),
            partition: 0,
        }]
    }

    fn has(&self, part: &Part) -> bool {
        part.queue == QUEUE && part.partition == 0
    }

    fn ensure_groups(&self) -> Boxed<'_, Result<(), QueueError>> {
        ok(Ok(()))
    }

    fn read<'a>(
        &'a self,
        _consumer: &'a str,
        count: usize,
        block_ms: u64,
    ) -> Boxed<'a, Result<Vec<Delivery>, QueueError>> {
        Box::pin(async move {
            let ds = self.state.lock().unwrap().take(count);
            if ds.is_empty() {
                tokio::time::sleep(Duration::from_millis(block_ms.min(10))).await;
            }
            Ok(ds)
        })
    }

    fn read_own_pending<'a>(
        &'a self,
        _part: &'a Part,
        _consumer: &'a str,
        _count: usize,
    ) -> Boxed<'a, Result<Vec<Delivery>, QueueError>> {
        ok(Ok(Vec::new()))
    }

    fn reclaim<'a>(
        &'a self,
        _part: &'a Part,
        _consumer: &'a str,
        _min_idle_ms: u64,
        _limit: usize,
    ) -> Boxed<'a, Result<Reclaimed, QueueError>> {
        ok(Ok(Reclaimed::default()))
    }

    fn recover_stranded<'a>(
        &'a self,
        _part: &'a Part,
        _consumer: &'a str,
        _min_idle_ms: u64,
        _skip: &'a HashSet<String>,
        _limit: usize,
    ) -> Boxed<'a, Result<Vec<Delivery>, QueueError>> {
        ok(Ok(Vec::new()))
    }

    fn complete<'a>(
        &'a self,
        _part: &'a Part,
        done: &'a [Done<'a>],
        read: Option<(&'a str, usize)>,
    ) -> Boxed<'a, CompleteAndRead> {
        let mut s = self.state.lock().unwrap();
        if s.fail_completes > 0 {
            s.fail_completes -= 1;
            return ok((Err(redis_error(false)), Err(redis_error(false))));
        }
        if done.iter().any(|(d, _)| s.refuse.contains(&d.id)) {
            return ok((Err(redis_error(true)), Ok(Vec::new())));
        }
        for (d, r) in done {
            s.finish(Asked::Stored(d.id.clone(), r.outcome.status));
        }
        let read = read.map(|(_, n)| s.take(n)).unwrap_or_default();
        s.read_with_completions += read.len();
        ok((Ok(vec![Completion::Stored; done.len()]), Ok(read)))
    }

    fn dead_letter<'a>(
        &'a self,
        _part: &'a Part,
        letters: &'a [Letter<'a>],
        _worker: &'a str,
    ) -> Boxed<'a, Result<Vec<Completion>, QueueError>> {
        let mut s = self.state.lock().unwrap();
        for (d, status, reason) in letters {
            s.finish(Asked::DeadLettered(
                d.id.clone(),
                *status,
                (*reason).to_owned(),
            ));
        }
        ok(Ok(vec![Completion::Stored; letters.len()]))
    }

    fn dead_letter_each<'a>(
        &'a self,
        part: &'a Part,
        letters: &'a [Letter<'a>],
        worker: &'a str,
    ) -> Boxed<'a, Vec<Result<Option<Completion>, QueueError>>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for l in letters {
                let one = self
                    .dead_letter(part, std::slice::from_ref(l), worker)
                    .await;
                out.push(one.map(|c| c.into_iter().next()));
            }
            out
        })
    }

    fn hand_back<'a>(
        &'a self,
        _part: &'a Part,
        _consumer: &'a str,
        entries: &'a [(&'a str, u64)],
    ) -> Boxed<'a, Result<u64, QueueError>> {
        let mut s = self.state.lock().unwrap();
        for (entry, _) in entries {
            let id = entry.trim_end_matches("-0").to_owned();
            s.finish(Asked::HandedBack(id));
        }
        ok(Ok(entries.len() as u64))
    }
}

/// Runs jobs by their command: `ok` succeeds, `fail` exits 1, `setup` fails to set up
/// (`error`), `short` fails to set up for want of the node's descriptors, `wait` runs until
/// cancelled. Counts what runs at once.
#[derive(Debug)]
pub(crate) struct FakeRunner {
    slots: Arc<Semaphore>,
    alive: AtomicBool,
    running: Arc<AtomicUsize>,
    most_running: Arc<AtomicUsize>,
    /// Job ids in the order their runs started.
    started: Arc<Mutex<Vec<String>>>,
}

impl FakeRunner {
    pub(crate) fn new(slots: usize) -> Arc<FakeRunner> {
        Arc::new(FakeRunner {
            slots: Arc::new(Semaphore::new(slots)),
            alive: AtomicBool::new(true),
            running: Default::default(),
            most_running: Default::default(),
            started: Default::default(),
        })
    }

    /// The zygote is gone: no job can run.
    pub(crate) fn lose(&self) {
        self.alive.store(false, Ordering::Relaxed);
    }

    pub(crate) fn started(&self) -> Vec<String> {
        self.started.lock().unwrap().clone()
    }

    pub(crate) fn most_running(&self) -> usize {
        self.most_running.load(Ordering::Relaxed)
    }
}

impl Runner for FakeRunner {
    fn slot(&self) -> Boxed<'_, Box<dyn RunSlot>> {
        Box::pin(async move {
            let permit = self.slots.clone().acquire_owned().await.unwrap();
            Box::new(FakeSlot {
                _permit: permit,
                running: self.running.clone(),
                most_running: self.most_running.clone(),
                started: self.started.clone(),
            }) as Box<dyn RunSlot>
        })
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }
}

struct FakeSlot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    running: Arc<AtomicUsize>,
    most_running: Arc<AtomicUsize>,
    started: Arc<Mutex<Vec<String>>>,
}

impl RunSlot for FakeSlot {
    fn run<'a>(self: Box<Self>, job: &'a Job, cancel: Boxed<'a, ()>) -> Boxed<'a, Run> {
        Box::pin(async move {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_running.fetch_max(now, Ordering::SeqCst);
            self.started
                .lock()
                .unwrap()
                .push(job.id.clone().unwrap_or_default());
            // Long enough for the other slots to fill.
            tokio::time::sleep(Duration::from_millis(2)).await;
            let cmd = job.cmd.clone().unwrap_or_default();
            let mut fault = None;
            let outcome = match cmd.as_str() {
                "ok" => ran(Status::Ok, 0),
                "fail" => ran(Status::Failed, 1),
                "setup" => Outcome::not_run(Status::Error, "chdir work: ENOENT"),
                "short" => {
                    fault = NodeFault::of(nix::errno::Errno::EMFILE);
                    // The text names no errno: the fault is told by its type alone.
                    Outcome::not_run(Status::Error, "sandbox set-up failed")
                }
                _ => {
                    cancel.await;
                    Outcome::not_run(Status::Cancelled, "cancelled")
                }
            };
            self.running.fetch_sub(1, Ordering::SeqCst);
            Run { outcome, fault }
        })
    }
}

fn ran(status: Status, exit_code: i32) -> Outcome {
    Outcome {
        exit_code,
        error: None,
        spawn_us: 1,
        ..Outcome::not_run(status, "")
    }
}
