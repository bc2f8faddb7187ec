//! Session sandboxes opened ahead of demand (`--session-pool N`): the node keeps up to N
//! prepared sandboxes (`sandbox::PreparedSession`: the supervisor started, its kernel
//! forked, no session's environment or files yet) of the shapes its creates asked for most
//! recently (the default shape, a `python` session with the node's default limits, until one
//! is asked), so a create whose shape one matches only hands it over.
//!
//! The pool is part of the node's session capacity: its sandboxes count against
//! `--max-sessions` and `--session-memory-mb` as live sessions do, it only grows into room no
//! live session uses, and a create that needs the room takes it back (prepared sandboxes are
//! dropped, oldest first). A prepared sandbox waits at most [`MAX_AGE`] before it is retired
//! and replaced: its deadline (a session's longest life, `set_timeout` included) counts from
//! its own start, so a session it serves may live that much less than a fresh one could. One
//! task fills the pool, one sandbox at a time.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::node::config::SessionSettings;
use crate::node::metrics as m;
use crate::sandbox::{Engine, PreparedSession, SessionShape};

/// The longest a prepared sandbox waits for its session.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(60);

/// How often the pool looks for sandboxes to retire when nothing wakes it.
const SWEEP: Duration = Duration::from_secs(10);

/// How long the pool waits after a failed preparation before it tries again.
const RETRY: Duration = Duration::from_secs(5);

/// What the live sessions hold: their count and the sum of their `memory_mb`.
pub(crate) type LiveUsage = Arc<dyn Fn() -> (usize, u64) + Send + Sync>;

pub(crate) struct SessionPool {
    engine: Engine,
    settings: SessionSettings,
    state: Mutex<PoolState>,
    wake: Notify,
}

#[derive(Default)]
struct PoolState {
    ready: Vec<Pooled>,
    /// The shapes to keep ready, most recently asked first, with their `memory_mb`.
    wanted: VecDeque<(SessionShape, u64)>,
    /// The `memory_mb` of the sandbox being prepared.
    preparing: Option<u64>,
    /// A create took the room of the sandbox being prepared: it is dropped once ready.
    drop_preparing: bool,
    stopped: bool,
}

impl PoolState {
    /// Shows how many prepared sandboxes wait.
    fn count(&self) {
        ::metrics::gauge!(m::SESSION_POOL_READY).set(self.ready.len() as f64);
    }
}

struct Pooled {
    prepared: PreparedSession,
    memory_mb: u64,
}

/// What the pool's task does next.
enum Next {
    Prepare(SessionShape, u64),
    Again,
    Wait,
    Stop,
}

/// What the pool does next, as decided from shapes alone.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Prepare(usize),
    Discard(usize),
    Idle,
}

/// The pool's next step, from the shapes wanted (most recent first), the shapes of the
/// sandboxes ready and the room the live sessions leave (whether one more fits): each of the
/// `size` places holds the wanted shapes in turn, a ready sandbox no place wants is
/// discarded, and a place without its sandbox gets one when it fits.
fn next_step(wanted: &[SessionShape], ready: &[SessionShape], size: usize, fits: bool) -> Step {
    let mut unmatched: Vec<Option<&SessionShape>> = ready.iter().map(Some).collect();
    let mut missing = None;
    let places = if wanted.is_empty() { 0 } else { size };
    for place in 0..places {
        let w = place % wanted.len();
        match unmatched.iter().position(|r| *r == Some(&wanted[w])) {
            Some(i) => unmatched[i] = None,
            None => missing = missing.or(Some(w)),
        }
    }
    if let Some(i) = unmatched.iter().position(Option::is_some) {
        return Step::Discard(i);
    }
    match missing {
        Some(w) if fits => Step::Prepare(w),
        _ => Step::Idle,
    }
}

/// How many pooled sandboxes (of `pooled_mb` each, oldest first) must go so that they and
/// the live sessions (`live`, `live_mb`) fit the node's session capacity.
fn over_capacity(
    settings: &SessionSettings,
    live: usize,
    live_mb: u64,
    pooled_mb: &[u64],
) -> usize {
    let mut n = pooled_mb.len();
    let mut mb: u64 = pooled_mb.iter().sum();
    let mut drop = 0;
    while n > 0 && (live + n > settings.max_sessions || live_mb + mb > settings.memory_mb) {
        mb -= pooled_mb[drop];
        n -= 1;
        drop += 1;
    }
    drop
}

impl SessionPool {
    pub(crate) fn new(
        engine: Engine,
        settings: SessionSettings,
        default: (SessionShape, u64),
    ) -> SessionPool {
        let mut state = PoolState::default();
        if settings.pool > 0 {
            state.wanted.push_back(default);
        }
        SessionPool {
            engine,
            settings,
            state: Mutex::new(state),
            wake: Notify::new(),
        }
    }

    /// A prepared sandbox of `shape` fit to be handed over, if one is ready.
    pub(crate) fn take(&self, shape: &SessionShape) -> Option<PreparedSession> {
        let mut st = self.state.lock().expect("pool lock");
        let now = Instant::now();
        let i = st
            .ready
            .iter()
            .position(|p| p.prepared.shape() == shape && usable(&p.prepared, now))?;
        let taken = st.ready.remove(i).prepared;
        st.count();
        self.wake.notify_one();
        Some(taken)
    }

    /// Looks again at the room the live sessions leave (one has ended).
    pub(crate) fn notify(&self) {
        self.wake.notify_one();
    }

    /// Records that a create asked for `shape`: the pool keeps the most recent shapes ready.
    pub(crate) fn want(&self, shape: SessionShape, memory_mb: u64) {
        if self.settings.pool == 0 {
            return;
        }
        let mut st = self.state.lock().expect("pool lock");
        st.wanted.retain(|(s, _)| *s != shape);
        st.wanted.push_front((shape, memory_mb));
        st.wanted.truncate(self.settings.pool);
        self.wake.notify_one();
    }

    /// Gives a session about to open the room it needs: with `live` sessions of `live_mb`
    /// (it included), prepared sandboxes past the capacity are dropped.
    pub(crate) fn make_room(&self, live: usize, live_mb: u64) {
        let mut st = self.state.lock().expect("pool lock");
        let mut pooled: Vec<u64> = st.ready.iter().map(|p| p.memory_mb).collect();
        pooled.extend(st.preparing);
        let over = over_capacity(&self.settings, live, live_mb, &pooled);
        let from_ready = over.min(st.ready.len());
        let dropped: Vec<Pooled> = st.ready.drain(..from_ready).collect();
        if over > from_ready {
            st.drop_preparing = true;
        }
        st.count();
        drop(st);
        discard(dropped);
        self.wake.notify_one();
    }

    /// Fills the pool until the node stops; `live` says what the live sessions hold.
    pub(crate) async fn run(self: Arc<Self>, live: LiveUsage) {
        loop {
            match self.step(&live) {
                Next::Prepare(shape, memory_mb) => self.prepare(shape, memory_mb).await,
                Next::Again => continue,
                Next::Wait => {
                    let _ = tokio::time::timeout(SWEEP, self.wake.notified()).await;
                }
                Next::Stop => return,
            }
        }
    }

    /// Retires what is ended or too old, then decides (and carries out a discard).
    fn step(&self, live: &LiveUsage) -> Next {
        let (n, mb) = live();
        let mut st = self.state.lock().expect("pool lock");
        if st.stopped {
            return Next::Stop;
        }
        let now = Instant::now();
        let (keep, retire): (Vec<Pooled>, Vec<Pooled>) = std::mem::take(&mut st.ready)
            .into_iter()
            .partition(|p| usable(&p.prepared, now));
        st.ready = keep;
        let mut pooled: Vec<u64> = st.ready.iter().map(|p| p.memory_mb).collect();
        let wanted: Vec<SessionShape> = st.wanted.iter().map(|(s, _)| *s).collect();
        let ready: Vec<SessionShape> = st.ready.iter().map(|p| *p.prepared.shape()).collect();
        let next_mb = |w: usize| st.wanted.get(w).map_or(0, |(_, m)| *m);
        // Whether the first missing place's sandbox would fit beside what is live.
        let fits = match next_step(&wanted, &ready, self.settings.pool, true) {
            Step::Prepare(w) => {
                pooled.push(next_mb(w));
                over_capacity(&self.settings, n, mb, &pooled) == 0
            }
            _ => false,
        };
        let mut gone = retire;
        let next = match next_step(&wanted, &ready, self.settings.pool, fits) {
            Step::Prepare(w) => {
                let (shape, memory_mb) = st.wanted[w];
                st.preparing = Some(memory_mb);
                st.drop_preparing = false;
                Next::Prepare(shape, memory_mb)
            }
            Step::Discard(i) => {
                gone.push(st.ready.remove(i));
                Next::Again
            }
            Step::Idle => Next::Wait,
        };
        st.count();
        drop(st);
        discard(gone);
        next
    }

    /// Prepares one sandbox of `shape` and puts it in the pool, unless its room was taken
    /// meanwhile or the node stops.
    async fn prepare(&self, shape: SessionShape, memory_mb: u64) {
        let prepared = match self.engine.prepare_session(shape).await {
            Ok(p) => p,
            Err(e) => {
                self.state.lock().expect("pool lock").preparing = None;
                tracing::warn!("a session sandbox could not be prepared: {e}");
                tokio::time::sleep(RETRY).await;
                return;
            }
        };
        let unwanted = {
            let mut st = self.state.lock().expect("pool lock");
            st.preparing = None;
            if st.drop_preparing || st.stopped {
                Some(prepared)
            } else {
                st.ready.push(Pooled {
                    prepared,
                    memory_mb,
                });
                st.count();
                None
            }
        };
        if let Some(p) = unwanted {
            p.discard().await;
        }
    }

    /// Stops filling and ends every prepared sandbox, waiting until they are gone.
    pub(crate) async fn stop(&self) {
        let ready = {
            let mut st = self.state.lock().expect("pool lock");
            st.stopped = true;
            let ready = std::mem::take(&mut st.ready);
            st.count();
            ready
        };
        self.wake.notify_one();
        for p in ready {
            p.prepared.discard().await;
        }
    }
}

/// Whether a prepared sandbox can still serve a session: alive, and started less than
/// [`MAX_AGE`] ago.
fn usable(p: &PreparedSession, now: Instant) -> bool {
    let ttl = Duration::from_millis(p.shape().ttl_ms);
    !p.is_ended() && p.deadline() > now + ttl.saturating_sub(MAX_AGE)
}

/// Ends prepared sandboxes in the background.
fn discard(gone: Vec<Pooled>) {
    for p in gone {
        tokio::spawn(p.prepared.discard());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkbox_queue::schema::{Limits, Runtime};

    fn shape(memory_mb: u64) -> SessionShape {
        SessionShape {
            limits: Limits {
                memory_mb: Some(memory_mb),
                ..Limits::default()
            },
            runtime: Some(Runtime::Python),
            ttl_ms: 1000,
            ..SessionShape::default()
        }
    }

    #[test]
    fn the_pool_keeps_the_most_recent_shapes_in_its_places() {
        let (a, b) = (shape(1), shape(2));
        // (wanted, ready, places, whether one more fits, the step)
        type Case = (Vec<SessionShape>, Vec<SessionShape>, usize, bool, Step);
        let cases: Vec<Case> = vec![
            (vec![a], vec![], 1, true, Step::Prepare(0)),
            (vec![a], vec![], 1, false, Step::Idle),
            (vec![a], vec![a], 1, true, Step::Idle),
            // Two places, one shape: two of it.
            (vec![a], vec![a], 2, true, Step::Prepare(0)),
            // A shape no longer wanted gives its place to the new one.
            (vec![b], vec![a], 1, true, Step::Discard(0)),
            (vec![b, a], vec![a], 2, true, Step::Prepare(0)),
            (vec![b, a], vec![a, b], 2, true, Step::Idle),
            // Nothing wanted, or no places: nothing kept.
            (vec![], vec![a], 1, true, Step::Discard(0)),
            (vec![a], vec![a], 0, true, Step::Discard(0)),
            (vec![], vec![], 0, true, Step::Idle),
        ];
        for (wanted, ready, size, fits, want) in cases {
            assert_eq!(
                next_step(&wanted, &ready, size, fits),
                want,
                "{wanted:?} {ready:?} {size} {fits}"
            );
        }
    }

    #[test]
    fn prepared_sandboxes_yield_the_room_live_sessions_need() {
        let settings = SessionSettings {
            max_sessions: 3,
            memory_mb: 1000,
            ..SessionSettings::default()
        };
        let cases: [(usize, u64, &[u64], usize); 7] = [
            (0, 0, &[256], 0),
            (2, 512, &[256], 0),
            // One too many sandboxes: the oldest pooled one goes.
            (3, 768, &[256], 1),
            (2, 512, &[256, 256], 1),
            // Past the memory: as many as it takes.
            (1, 900, &[64, 64], 1),
            (1, 950, &[64, 64], 2),
            (0, 0, &[], 0),
        ];
        for (live, live_mb, pooled, want) in cases {
            assert_eq!(
                over_capacity(&settings, live, live_mb, pooled),
                want,
                "{live} {live_mb} {pooled:?}"
            );
        }
    }
}
