//! Redis error accounting and back-off.
//!
//! Every failed Redis call of the node goes through [`RedisHealth::failed`]: it counts
//! `forkbox_redis_errors_total`, logs the first failure of an outage at `warn` (later ones at
//! `debug`, so a long outage does not flood the log) and remembers when the outage began;
//! [`RedisHealth::ok`] logs the recovery with the outage's length. While an outage lasts,
//! [`probe`] PINGs Redis every [`PROBE_EVERY`], so the node notices the end of an outage (and
//! `/healthz` says so) within that, even when no other call is due. [`Backoff`] spaces the
//! retries of one loop.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use forkbox_queue::{Broker, QueueError};

/// Counter of failed Redis calls. Named here, where it is counted, so that this module needs
/// nothing of [`metrics`](crate::node::metrics), which reads [`RedisHealth`] for `/healthz`.
pub const REDIS_ERRORS: &str = "forkbox_redis_errors_total";

/// Whether Redis is currently failing for this node, and since when.
#[derive(Debug, Default)]
pub struct RedisHealth {
    failing_since: Mutex<Option<Instant>>,
}

impl RedisHealth {
    /// Records a failed call. `what` says what the node was doing ("reading", "completing").
    pub fn failed(&self, what: &str, err: &QueueError) {
        ::metrics::counter!(REDIS_ERRORS).increment(1);
        let mut since = self.failing_since.lock().expect("health lock");
        if since.is_none() {
            *since = Some(Instant::now());
            if let Some(why) = refusal(err) {
                tracing::error!("{why} while {what}: {err}; retrying with back-off");
            } else if err.is_connection() {
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

/// What a failure says when Redis answered but refused this node (its password, its
/// certificate, its ACL rights): no back-off fixes these, so they are named as such rather
/// than as an unreachable Redis.
fn refusal(err: &QueueError) -> Option<&'static str> {
    use forkbox_queue::connect::{is_auth_error, is_permission_error, is_tls_error};
    let e = err.redis_error()?;
    if is_auth_error(e) {
        Some(
            "Redis authentication failed (check the user and password in --redis; @ : / # ? % \
             in them must be %-encoded)",
        )
    } else if is_tls_error(e) {
        Some("the TLS handshake with Redis failed (check --redis-ca, --redis-cert, --redis-key)")
    } else if is_permission_error(e) {
        Some("Redis refused a command or key to this node's ACL user (NOPERM)")
    } else {
        None
    }
}

/// How often [`probe`] checks Redis during an outage.
pub const PROBE_EVERY: Duration = Duration::from_millis(500);

/// While Redis is failing for the node, PINGs it every [`PROBE_EVERY`] and records the
/// answer. Runs until aborted.
pub async fn probe(broker: Broker, health: Arc<RedisHealth>) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if health.outage().is_none() {
            continue;
        }
        let pong: forkbox_queue::redis::RedisResult<String> = forkbox_queue::redis::cmd("PING")
            .query_async(&mut broker.connection())
            .await;
        match pong {
            Ok(_) => health.ok(),
            Err(e) => tracing::debug!("Redis still unreachable: {e}"),
        }
    }
}

/// Exponential back-off between retries of one loop: 50 ms doubling up to 2 s, each pause
/// jittered down by up to half so that the nodes of a fleet do not retry in step.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

const BACKOFF_FIRST: Duration = Duration::from_millis(50);
pub const BACKOFF_MAX: Duration = Duration::from_secs(2);

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: BACKOFF_FIRST,
        }
    }
}

impl Backoff {
    /// The pause before the next retry, between half the current step and the step; each
    /// call doubles the following step.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        let unit = (uuid::Uuid::new_v4().as_u128() % 1024) as f64 / 1024.0;
        step.mul_f64(0.5 + unit / 2.0)
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
    fn backoff_doubles_up_to_the_cap_with_jitter_and_resets() {
        let mut b = Backoff::default();
        let delays: Vec<_> = (0..12).map(|_| b.next_delay()).collect();
        let within = |d: Duration, step: Duration| d >= step / 2 && d <= step;
        assert!(within(delays[0], BACKOFF_FIRST), "{delays:?}");
        assert!(within(delays[1], BACKOFF_FIRST * 2), "{delays:?}");
        assert!(delays.iter().all(|d| *d <= BACKOFF_MAX), "{delays:?}");
        assert!(within(*delays.last().unwrap(), BACKOFF_MAX), "{delays:?}");
        b.reset();
        assert!(within(b.next_delay(), BACKOFF_FIRST));
    }
}
