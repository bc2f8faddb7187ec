//! What a node may hold at once: two permits per delivery, an [`Admission`] and a [`Hold`].
//!
//! The reader takes every free admission before it reads and asks Redis for at most that
//! many entries. Admissions number the slots plus the prefetch, and one returns as soon as its
//! job's run is over, so the next read overlaps the storing of the result. The hold returns
//! only when the result is stored (see [`outbox`](crate::node::outbox)), which caps the
//! entries a node holds at twice its slots plus the prefetch however slowly results are
//! stored. Where completions read the next entries (one stream on a single Redis), a finished
//! run's admission goes with its result to the outbox, which reads with it on the
//! completion's round trip or gives it back.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What a node may hold: admissions (entries read and not yet run to the end: the slots plus
/// the prefetch) and holds (entries whose result is not yet stored).
#[derive(Debug, Clone)]
pub struct SlotPool {
    admissions: Arc<Semaphore>,
    holds: Arc<Semaphore>,
}

/// The permit of an entry read and not yet run to the end; back to the pool when dropped.
#[derive(Debug)]
pub struct Admission(#[allow(dead_code)] OwnedSemaphorePermit);

/// The permit of an entry whose result is not yet stored; back to the pool when dropped.
#[derive(Debug)]
pub struct Hold(#[allow(dead_code)] OwnedSemaphorePermit);

/// The two permits of one delivery.
#[derive(Debug)]
pub struct Permits {
    pub(crate) admission: Admission,
    pub(crate) hold: Hold,
}

impl SlotPool {
    pub(crate) fn new(slots: usize, prefetch: usize) -> SlotPool {
        SlotPool {
            admissions: Arc::new(Semaphore::new(slots + prefetch)),
            holds: Arc::new(Semaphore::new(2 * slots + prefetch)),
        }
    }

    /// A hold for `admission` when one is free now (the outbox's read with a completion, which
    /// must not wait); otherwise the admission goes back.
    pub(crate) fn hold_now(&self, admission: Admission) -> Option<Permits> {
        let hold = Hold(self.holds.clone().try_acquire_owned().ok()?);
        Some(Permits { admission, hold })
    }

    /// Waits for one free admission, takes every other free one too, and a hold for each
    /// (waiting while earlier results are still being stored).
    pub(crate) async fn take_free(&self) -> Vec<Permits> {
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
            let hold = self
                .holds
                .clone()
                .acquire_owned()
                .await
                .expect("the slot pool is never closed");
            out.push(Permits {
                admission: Admission(admission),
                hold: Hold(hold),
            });
        }
        out
    }

    /// Admissions free now.
    #[cfg(test)]
    pub(crate) fn free_admissions(&self) -> usize {
        self.admissions.available_permits()
    }

    /// Holds free now.
    #[cfg(test)]
    pub(crate) fn free_holds(&self) -> usize {
        self.holds.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// What `take_free` takes, within a bound a correct pool never nears.
    async fn take(pool: &SlotPool) -> Vec<Permits> {
        tokio::time::timeout(Duration::from_secs(5), pool.take_free())
            .await
            .expect("take_free waited with admissions and holds free")
    }

    async fn pending<T>(f: impl std::future::Future<Output = T>) -> bool {
        tokio::time::timeout(Duration::from_millis(50), f)
            .await
            .is_err()
    }

    #[tokio::test]
    async fn take_free_takes_every_free_admission_with_a_hold_each() {
        let pool = SlotPool::new(2, 1);
        let taken = take(&pool).await;
        assert_eq!(taken.len(), 3);
        assert_eq!(pool.free_admissions(), 0);
        assert_eq!(pool.free_holds(), 5 - 3);
        // None free: the next take waits for a run to end.
        assert!(pending(pool.take_free()).await);
        drop(taken);
        assert_eq!(take(&pool).await.len(), 3);
    }

    #[tokio::test]
    async fn a_finished_run_frees_its_admission_but_results_not_stored_cap_the_reads() {
        let pool = SlotPool::new(1, 1);
        // Runs over (admissions back), results not stored (holds kept).
        let mut unstored: Vec<Hold> = take(&pool).await.into_iter().map(|p| p.hold).collect();
        assert_eq!(unstored.len(), 2);
        assert_eq!((pool.free_admissions(), pool.free_holds()), (2, 1));
        let next = tokio::spawn({
            let pool = pool.clone();
            async move { pool.take_free().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !next.is_finished(),
            "read past twice the slots plus the prefetch"
        );
        // One result stored: the waiting read gets its second hold.
        unstored.pop();
        let next = next.await.expect("take_free");
        assert_eq!(next.len(), 2);
        assert_eq!(unstored.len() + next.len(), 3);
        assert_eq!(pool.free_holds(), 0);
    }

    #[tokio::test]
    async fn hold_now_never_waits_and_gives_the_admission_back_without_a_hold() {
        let pool = SlotPool::new(1, 0);
        let first = take(&pool).await.pop().expect("one");
        let Permits { admission, hold } = first;
        // One hold left of two: the admission gets it.
        let again = pool.hold_now(admission).expect("a hold is free");
        assert_eq!(pool.free_holds(), 0);
        let Permits {
            admission,
            hold: second,
        } = again;
        assert!(pool.hold_now(admission).is_none());
        // The admission went back to the pool with the refusal.
        assert_eq!(pool.free_admissions(), 1);
        drop((hold, second));
        assert_eq!(pool.free_holds(), 2);
    }
}
