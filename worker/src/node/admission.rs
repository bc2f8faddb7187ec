//! What a node may hold at once: admissions and holds, two permits per delivery.
//!
//! The reader takes every free admission before it reads and asks Redis for at most that
//! many entries. Admissions number the slots plus the prefetch, and one returns as soon as its
//! job's run is over, so the next read overlaps the storing of the result. The second permit,
//! the hold, returns only when the result is stored (see [`outbox`](crate::node::outbox)),
//! which caps the entries a node holds at twice its slots plus the prefetch however slowly
//! results are stored. Where completions read the next entries (one stream on a single
//! Redis), a finished run's admission goes with its result to the outbox, which reads with it
//! on the completion's round trip or gives it back.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What a node may hold: admissions (entries read and not yet run to the end: the slots plus
/// the prefetch) and holds (entries whose result is not yet stored).
#[derive(Debug, Clone)]
pub struct SlotPool {
    admissions: Arc<Semaphore>,
    holds: Arc<Semaphore>,
}

/// The two permits of one delivery: the admission returns when its run is over, the hold
/// when its result is stored.
#[derive(Debug)]
pub struct Hold {
    pub(crate) admission: OwnedSemaphorePermit,
    pub(crate) stored: OwnedSemaphorePermit,
}

impl SlotPool {
    pub(crate) fn new(slots: usize, prefetch: usize) -> SlotPool {
        SlotPool {
            admissions: Arc::new(Semaphore::new(slots + prefetch)),
            holds: Arc::new(Semaphore::new(2 * slots + prefetch)),
        }
    }

    /// A hold for `admission` when one is free now (the outbox's read with a completion, which
    /// must not wait).
    pub(crate) fn hold_now(&self, admission: OwnedSemaphorePermit) -> Option<Hold> {
        let stored = self.holds.clone().try_acquire_owned().ok()?;
        Some(Hold { admission, stored })
    }

    /// Waits for one free admission, takes every other free one too, and a hold for each
    /// (waiting while earlier results are still being stored).
    pub(crate) async fn take_free(&self) -> Vec<Hold> {
        let first = self
            .admissions
            .clone()
            .acquire_owned()
            .await
            .expect("the slot pool is never closed");
        let mut admissions = vec![first];
        while let Ok(p) = self.admissions.clone().try_acquire_owned() {
            admissions.push(p);
        }
        let mut out = Vec::with_capacity(admissions.len());
        for admission in admissions {
            let stored = self
                .holds
                .clone()
                .acquire_owned()
                .await
                .expect("the slot pool is never closed");
            out.push(Hold { admission, stored });
        }
        out
    }
}
