//! How far a node has been asked to stop, and the handle that asks it.
//!
//! Every part of the node (the reader, the dispatcher, job tasks, cancellation) watches one
//! [`StopLevel`]; a [`StopHandle`] raises it, by hand or on SIGINT/SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::node::error::NodeError;

/// How far a node has been asked to stop. Levels only go up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StopLevel {
    Running,
    /// Stop reading; let running jobs finish.
    Drain,
    /// Kill running jobs now and leave their entries pending.
    Kill,
}

/// Asks a running node to stop; clones share one state.
#[derive(Debug, Clone)]
pub struct StopHandle {
    tx: Arc<watch::Sender<StopLevel>>,
}

impl Default for StopHandle {
    fn default() -> Self {
        StopHandle {
            tx: Arc::new(watch::channel(StopLevel::Running).0),
        }
    }
}

impl StopHandle {
    /// Raises the stop level (never lowers it).
    pub fn raise(&self, level: StopLevel) {
        self.tx.send_if_modified(|l| {
            let raise = level > *l;
            if raise {
                *l = level;
            }
            raise
        });
    }

    /// One step up: Running → Drain → Kill (a second Ctrl-C skips the grace period).
    pub fn escalate(&self) -> StopLevel {
        let next = match *self.tx.borrow() {
            StopLevel::Running => StopLevel::Drain,
            _ => StopLevel::Kill,
        };
        self.raise(next);
        next
    }

    pub fn level(&self) -> StopLevel {
        *self.tx.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<StopLevel> {
        self.tx.subscribe()
    }

    /// Escalates on every SIGINT and SIGTERM, logging what happens.
    pub fn on_signals(&self, grace: Duration) -> Result<(), NodeError> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt()).map_err(|source| NodeError::Signal {
            signal: "SIGINT",
            source,
        })?;
        let mut term = signal(SignalKind::terminate()).map_err(|source| NodeError::Signal {
            signal: "SIGTERM",
            source,
        })?;
        let stop = self.clone();
        tokio::spawn(async move {
            loop {
                let name = tokio::select! {
                    _ = int.recv() => "SIGINT",
                    _ = term.recv() => "SIGTERM",
                };
                match stop.escalate() {
                    StopLevel::Drain => tracing::info!(
                        "{name}: no new jobs; waiting up to {:.0} s for running jobs \
                         (again to kill them)",
                        grace.as_secs_f64()
                    ),
                    _ => tracing::warn!("{name} again: killing running jobs"),
                }
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_levels_only_go_up() {
        let s = StopHandle::default();
        assert_eq!(s.escalate(), StopLevel::Drain);
        s.raise(StopLevel::Running);
        assert_eq!(s.level(), StopLevel::Drain);
        assert_eq!(s.escalate(), StopLevel::Kill);
    }
}
