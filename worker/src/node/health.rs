//! Redis error accounting and back-off.
//!
//! Every failed Redis call of the node goes through [`RedisHealth::failed`]: it counts
//! `forkbox_redis_errors_total`, logs the first failure of an outage at `warn` (later ones at
//! `debug`, so a long outage does not flood the log) and remembers when the outage began;
//! [`RedisHealth::ok`] logs the recovery with the outage's length. [`Backoff`] spaces the
//! retries of one loop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use forkbox_queue::QueueError;

use crate::node::metrics as m;

/// Whether Redis is currently failing for this node, and since when.
#[derive(Debug, Default)]
pub struct RedisHealth {
    failing_since: Mutex<Option<Instant>>,
}

impl RedisHealth {
    /// Records a failed call. `what` says what the node was doing ("reading", "completing").
    pub fn failed(&self, what: &str, err: &QueueError) {
        ::metrics::counter!(m::REDIS_ERRORS).increment(1);
        let mut since = self.failing_since.lock().expect("health lock");
        if since.is_none() {
            *since = Some(Instant::now());
            if err.is_connection() {
                tracing::warn!("Redis unreachable while {what}: {err}; retrying with back-off");
            } else {
                tracing::error!("Redis call failed while {what}: {err}; retrying with back-off");
            }
        } else {
            tracing::debug!("still failing while {what}: {err}");
        }
    }

    /// Records a successful call; logs the end of an outage.
    pub fn ok(&self) {
        let mut since = self.failing_since.lock().expect("health lock");
        if let Some(t) = since.take() {
            tracing::info!(
                "Redis reachable again after {:.1} s",
                t.elapsed().as_secs_f64()
            );
        }
    }

    /// How long Redis has been failing, if it is.
    pub fn outage(&self) -> Option<Duration> {
        self.failing_since
            .lock()
            .expect("health lock")
            .map(|t| t.elapsed())
    }
}

/// Requests sent to Redis by the node (a pipeline counts once), for `forkbox bench queue`.
/// Counted where the node calls the queue crate, from each call's documented round trips.
#[derive(Debug, Clone, Default)]
pub struct RoundTrips(Arc<AtomicU64>);

impl RoundTrips {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Exponential back-off between retries of one loop: 50 ms doubling up to 5 s.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: BACKOFF_FIRST,
        }
    }
}

impl Backoff {
    /// The pause before the next retry; each call doubles the following one.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        d
    }

    /// Back to the shortest pause, after a success.
    pub fn reset(&mut self) {
        self.next = BACKOFF_FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::default();
        let delays: Vec<_> = (0..10).map(|_| b.next_delay()).collect();
        assert_eq!(delays[0], BACKOFF_FIRST);
        assert_eq!(delays[1], BACKOFF_FIRST * 2);
        assert_eq!(*delays.last().unwrap(), BACKOFF_MAX);
        b.reset();
        assert_eq!(b.next_delay(), BACKOFF_FIRST);
    }
}
