//! The node's view of cancellations.
//!
//! A [`CancelBoard`] holds, per queue, the ids clients cancelled (fed by one
//! [`CancelWatcher`](forkbox_queue::CancelWatcher) per queue, see [`watch`]) and the jobs
//! running now, each with a [`Notify`] that kills it. Starting a job and cancelling one take
//! the same lock, so a cancel that races with the start is seen by one side or the other: the
//! job is either skipped or killed, never missed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use forkbox_queue::{CancelEvent, Queue};
use tokio::sync::{watch, Notify};

use crate::node::health::{Backoff, RedisHealth};
use crate::node::stop::StopLevel;

type Key = (String, String);

#[derive(Debug, Default)]
struct State {
    /// Cancelled ids per queue.
    cancelled: HashMap<String, HashSet<String>>,
    /// Running jobs by (queue, id).
    running: HashMap<Key, Arc<Notify>>,
}

/// Cancelled ids and killable running jobs.
#[derive(Debug, Default)]
pub struct CancelBoard {
    state: Mutex<State>,
}

/// What [`CancelBoard::start`] decided.
#[derive(Debug)]
pub enum Start {
    /// The id is cancelled: complete it as `cancelled` without running it.
    Cancelled,
    /// Run it; the notify fires when a client cancels it.
    Run(Arc<Notify>),
}

impl CancelBoard {
    /// Registers a job about to run, unless it is cancelled already.
    pub fn start(&self, queue: &str, id: &str) -> Start {
        let mut s = self.state.lock().expect("cancel board lock");
        if s.cancelled.get(queue).is_some_and(|ids| ids.contains(id)) {
            return Start::Cancelled;
        }
        let notify = Arc::new(Notify::new());
        s.running
            .insert((queue.to_owned(), id.to_owned()), notify.clone());
        Start::Run(notify)
    }

    /// Unregisters a job that ended.
    pub fn finish(&self, queue: &str, id: &str) {
        let mut s = self.state.lock().expect("cancel board lock");
        s.running.remove(&(queue.to_owned(), id.to_owned()));
    }

    /// Applies one event of a queue's watcher; returns the running jobs it killed.
    pub fn apply(&self, queue: &str, event: CancelEvent) -> usize {
        let mut s = self.state.lock().expect("cancel board lock");
        let ids = match event {
            CancelEvent::Cancelled(id) => vec![id],
            CancelEvent::Resynced(ids) => {
                // The set in Redis is the truth after a reconnect (it is trimmed there).
                s.cancelled.insert(queue.to_owned(), HashSet::new());
                ids
            }
        };
        let mut killed = 0;
        for id in ids {
            let key = (queue.to_owned(), id);
            if let Some(n) = s.running.get(&key) {
                // notify_one stores a permit: a job that has not reached its await yet still
                // sees it.
                n.notify_one();
                killed += 1;
            }
            s.cancelled.entry(key.0).or_default().insert(key.1);
        }
        killed
    }
}

/// Follows `queue`'s cancellations into `board` until the node stops.
pub async fn watch(
    queue: Queue,
    board: Arc<CancelBoard>,
    health: Arc<RedisHealth>,
    mut stop: watch::Receiver<StopLevel>,
) {
    let mut watcher = queue.watch_cancellations();
    let mut backoff = Backoff::default();
    loop {
        let event = tokio::select! {
            e = watcher.next() => e,
            _ = stop.wait_for(|l| *l >= StopLevel::Kill) => return,
        };
        match event {
            Ok(event) => {
                backoff.reset();
                if let CancelEvent::Cancelled(id) = &event {
                    tracing::info!(queue = queue.name(), "job {id} cancelled");
                }
                board.apply(queue.name(), event);
            }
            Err(e) => {
                health.failed("following cancellations", &e);
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancelled_id_is_skipped_and_a_running_one_is_killed() {
        let board = CancelBoard::default();
        board.apply("q", CancelEvent::Cancelled("a".into()));
        assert!(matches!(board.start("q", "a"), Start::Cancelled));
        assert!(matches!(board.start("other", "a"), Start::Run(_)));
        let Start::Run(n) = board.start("q", "b") else {
            panic!("b is not cancelled")
        };
        assert_eq!(board.apply("q", CancelEvent::Cancelled("b".into())), 1);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(1), n.notified())
                .await
                .expect("the running job was told to stop");
        });
        board.finish("q", "b");
        // A resync replaces the set.
        board.apply("q", CancelEvent::Resynced(vec!["c".into()]));
        assert!(matches!(board.start("q", "a"), Start::Run(_)));
        assert!(matches!(board.start("q", "c"), Start::Cancelled));
    }
}
