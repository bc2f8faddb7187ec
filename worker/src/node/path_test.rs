//! The job's path through the node, read → admit → run → store → ack, with the reader, the
//! dispatcher, the job tasks and the outbox wired as [`Node::run`](crate::node::Node::run)
//! wires them, over the fake queue and runner of [`fake`](crate::node::fake).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkbox_queue::Status;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::node::config::NodeConfig;
use crate::node::fake::{delivery, malformed, Asked, FakeQueue, FakeRunner};
use crate::node::health::RedisHealth;
use crate::node::metrics::NodeStatus;
use crate::node::outbox::{Completer, Outbox};
use crate::node::shared::{SandboxWatch, Shared};
use crate::node::stop::{StopHandle, StopLevel};
use crate::node::worker::{flush, wait_for_jobs, Parts};

/// A node's job path over fakes.
struct Path {
    shared: Arc<Shared>,
    stop: StopHandle,
    outbox: Outbox,
    completer: Completer,
    stopped: oneshot::Receiver<()>,
    background: Vec<JoinHandle<()>>,
}

impl Path {
    fn start(
        queue: &Arc<FakeQueue>,
        runner: &Arc<FakeRunner>,
        slots: usize,
        prefetch: usize,
        reads_with_completions: bool,
    ) -> Path {
        let mut config = NodeConfig::new("redis://127.0.0.1:1");
        config.name = "fake-node".to_owned();
        config.slots = slots;
        config.prefetch = prefetch;
        config.block_ms = 10;
        config.queue.max_attempts = 3;
        config.grace = Duration::from_millis(300);
        let stop = StopHandle::default();
        let sandbox = SandboxWatch {
            runner: runner.clone(),
            status: Arc::new(NodeStatus::default()),
            stop: stop.clone(),
            lost: Arc::new(AtomicBool::new(false)),
        };
        let path = (
            queue.clone() as _,
            runner.clone() as _,
            reads_with_completions,
        );
        let health = Arc::new(RedisHealth::default());
        let parts = Parts::new(config, path, health, &stop.subscribe(), sandbox);
        let mut background = Vec::new();
        let (shared, outbox, completer, stopped) = parts.start_path(|| {}, &mut background);
        Path {
            shared,
            stop,
            outbox,
            completer,
            stopped,
            background,
        }
    }

    /// Drains as the node does; returns the `(queue, id)` of results never stored.
    async fn stop(self) -> Vec<(String, String)> {
        let drain_started = Instant::now();
        self.stop.raise(StopLevel::Drain);
        let _ = self.stopped.await;
        drop(self.outbox);
        wait_for_jobs(&self.shared, &self.stop, drain_started).await;
        let unflushed = flush(&self.shared.config, self.completer, drain_started).await;
        for task in self.background {
            task.abort();
        }
        unflushed
    }
}

fn stored(id: &str, status: Status) -> Asked {
    Asked::Stored(id.to_owned(), status)
}

async fn every_job_once_within_capacity(reads_with_completions: bool) -> Arc<FakeQueue> {
    let (slots, prefetch) = (2, 1);
    let jobs: Vec<_> = (0..30)
        .map(|i| delivery(&format!("j{i}"), if i % 3 == 0 { "fail" } else { "ok" }, 1))
        .collect();
    let queue = FakeQueue::with(jobs);
    let runner = FakeRunner::new(slots);
    let path = Path::start(&queue, &runner, slots, prefetch, reads_with_completions);
    let mut asked = queue.wait_asked(30).await;
    assert!(path.stop().await.is_empty());
    asked.sort_by_key(|a| match a {
        Asked::Stored(id, _) => id[1..].parse::<usize>().unwrap(),
        other => panic!("only results expected, got {other:?}"),
    });
    let expected: Vec<Asked> = (0..30)
        .map(|i| {
            let status = if i % 3 == 0 {
                Status::Failed
            } else {
                Status::Ok
            };
            stored(&format!("j{i}"), status)
        })
        .collect();
    assert_eq!(asked, expected);
    assert_eq!(queue.asked().len(), 30, "a result stored twice");
    assert!(runner.most_running() <= slots, "{}", runner.most_running());
    // Admissions (slots plus prefetch) and holds (twice the slots plus the prefetch) bound
    // what the node has read and not finished with.
    assert!(
        queue.most_out() <= 2 * slots + prefetch,
        "{}",
        queue.most_out()
    );
    assert_eq!(queue.out(), 0);
    queue
}

#[tokio::test]
async fn every_job_is_run_once_and_its_result_stored_within_the_node_s_capacity() {
    let queue = every_job_once_within_capacity(true).await;
    assert!(queue.read_with_completions() > 0, "no completion read");
}

#[tokio::test]
async fn with_several_streams_only_the_reader_reads() {
    let queue = every_job_once_within_capacity(false).await;
    assert_eq!(queue.read_with_completions(), 0);
}

#[tokio::test]
async fn jobs_run_and_are_stored_in_read_order_even_when_read_ahead() {
    let ids: Vec<String> = (0..8).map(|i| format!("j{i}")).collect();
    let queue = FakeQueue::with(ids.iter().map(|id| delivery(id, "ok", 1)));
    let runner = FakeRunner::new(1);
    let path = Path::start(&queue, &runner, 1, 3, true);
    let asked = queue.wait_asked(ids.len()).await;
    assert!(path.stop().await.is_empty());
    assert_eq!(runner.started(), ids);
    let order: Vec<Asked> = ids.iter().map(|id| stored(id, Status::Ok)).collect();
    assert_eq!(asked, order);
}

#[tokio::test]
async fn a_malformed_entry_is_dead_lettered_invalid_without_running() {
    let queue = FakeQueue::with([malformed("bad"), delivery("good", "ok", 1)]);
    let runner = FakeRunner::new(1);
    let path = Path::start(&queue, &runner, 1, 0, true);
    let mut asked = queue.wait_asked(2).await;
    assert!(path.stop().await.is_empty());
    assert_eq!(runner.started(), ["good"]);
    asked.sort_by_key(|a| format!("{a:?}"));
    let Asked::DeadLettered(id, status, reason) = &asked[0] else {
        panic!("{asked:?}");
    };
    assert_eq!((id.as_str(), *status), ("bad", Status::Invalid));
    assert!(!reason.is_empty());
    assert_eq!(asked[1], stored("good", Status::Ok));
}

#[tokio::test]
async fn a_set_up_fault_is_left_pending_until_its_last_delivery_then_dead_lettered() {
    // Max attempts is 3: the first delivery is retried later, the third is the last.
    let queue = FakeQueue::with([delivery("early", "setup", 1), delivery("last", "setup", 3)]);
    let runner = FakeRunner::new(1);
    let path = Path::start(&queue, &runner, 1, 0, true);
    let asked = queue.wait_asked(1).await;
    // Both ran; only the last delivery's fault is final.
    for _ in 0..200 {
        if runner.started().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(path.stop().await.is_empty());
    assert_eq!(runner.started(), ["early", "last"]);
    let Asked::DeadLettered(id, status, reason) = &asked[0] else {
        panic!("{asked:?}");
    };
    assert_eq!((id.as_str(), *status), ("last", Status::Error));
    assert!(reason.contains("chdir work: ENOENT"), "{reason}");
    assert_eq!(queue.asked().len(), 1, "{:?}", queue.asked());
    // Neither stored nor acknowledged: pending for the reclaimer.
    assert_eq!(queue.out(), 1);
}

#[tokio::test]
async fn a_node_whose_sandbox_is_gone_hands_back_what_it_read_unrun_and_stops_reading() {
    let queue = FakeQueue::with((0..10).map(|i| delivery(&format!("j{i}"), "ok", 1)));
    let runner = FakeRunner::new(2);
    runner.lose();
    let path = Path::start(&queue, &runner, 2, 1, true);
    let mut stop = path.shared.life.stop.clone();
    let _ = stop.wait_for(|l| *l >= StopLevel::Drain).await;
    let lost = path.shared.life.sandbox.lost.clone();
    assert!(path.stop().await.is_empty());
    assert!(lost.load(std::sync::atomic::Ordering::Relaxed));
    assert!(runner.started().is_empty());
    let asked = queue.asked();
    assert!(!asked.is_empty());
    assert!(
        asked.iter().all(|a| matches!(a, Asked::HandedBack(_))),
        "{asked:?}"
    );
    // At most its admissions, and nothing left unaccounted for.
    assert!(asked.len() <= 3, "{asked:?}");
    assert_eq!(queue.out(), 0);
}

#[tokio::test]
async fn a_store_that_fails_keeps_the_result_and_stores_it_once_redis_is_back() {
    let queue = FakeQueue::with([delivery("a", "ok", 1), delivery("b", "ok", 1)]);
    queue.fail_completes(3);
    let runner = FakeRunner::new(1);
    let path = Path::start(&queue, &runner, 1, 0, true);
    let mut asked = queue.wait_asked(2).await;
    assert!(path.stop().await.is_empty());
    asked.sort_by_key(|a| format!("{a:?}"));
    assert_eq!(asked, [stored("a", Status::Ok), stored("b", Status::Ok)]);
}

#[tokio::test]
async fn results_redis_never_takes_are_reported_unflushed_at_exit() {
    let queue = FakeQueue::with([delivery("a", "ok", 1)]);
    queue.fail_completes(usize::MAX);
    let runner = FakeRunner::new(1);
    let path = Path::start(&queue, &runner, 1, 0, true);
    for _ in 0..200 {
        if !runner.started().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let unflushed = path.stop().await;
    assert_eq!(unflushed, [("q".to_owned(), "a".to_owned())]);
    assert!(queue.asked().is_empty());
}

#[tokio::test]
async fn a_set_up_the_node_failed_for_want_of_descriptors_is_handed_back_uncharged() {
    // Its last allowed delivery: were it the job's fault, it would be dead-lettered.
    let queue = FakeQueue::with([delivery("a", "short", 3), delivery("b", "ok", 1)]);
    let runner = FakeRunner::new(1);
    let path = Path::start(&queue, &runner, 1, 0, true);
    let mut asked = queue.wait_asked(2).await;
    let status = path.shared.life.sandbox.status.clone();
    assert!(path.stop().await.is_empty());
    asked.sort_by_key(|a| format!("{a:?}"));
    assert_eq!(
        asked,
        [Asked::HandedBack("a".into()), stored("b", Status::Ok)]
    );
    // /healthz says why.
    assert!(status.resource_fault.lock().unwrap().is_some());
}
