//! The zygote's events: one thread reads them off the engine's channel and routes each to the
//! run waiting for it (or to the pool of ready launchers the engine hands jobs to).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use std::collections::VecDeque;

use forkbox_queue::schema::Network;
use tokio::sync::mpsc;

use crate::sandbox::process::wire::{self, FromZygote};

pub(super) type Waiters = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<FromZygote>>>>;

/// A ready sandbox the zygote gave the engine.
pub(super) struct Launcher {
    pub(super) sandbox: u64,
    /// Host pids of its init and its launcher.
    pub(super) pids: Vec<i32>,
    /// The job channel to the launcher.
    pub(super) channel: OwnedFd,
    /// The network it was built for (its seccomp program is already loaded).
    pub(super) network: Network,
}

pub(super) type Launchers = Arc<Mutex<VecDeque<Launcher>>>;

/// Stops routing a run's events when the run ends, however it ends.
pub(super) struct Unregister<'a> {
    pub(super) waiters: &'a Waiters,
    pub(super) req: u64,
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        if let Ok(mut w) = self.waiters.lock() {
            w.remove(&self.req);
        }
    }
}

/// Routes zygote events to the runs waiting for them.
pub(super) fn spawn_event_reader(
    sock: OwnedFd,
    waiters: Waiters,
    launchers: Launchers,
    alive: Arc<AtomicBool>,
) {
    std::thread::Builder::new()
        .name("forkbox-zygote-events".into())
        .spawn(move || loop {
            let (msg, fds) = match wire::recv::<FromZygote>(sock.as_fd()) {
                Ok(Some(m)) => (m.message, m.fds),
                Ok(None) | Err(_) => {
                    let unexpected = alive.swap(false, Ordering::AcqRel);
                    // Dropping the senders wakes every waiting run with "zygote died".
                    waiters.lock().map(|mut w| w.clear()).ok();
                    if unexpected {
                        tracing::error!(
                            "the sandbox zygote exited; running jobs fail with status error"
                        );
                    }
                    return;
                }
            };
            let req = match &msg {
                FromZygote::Assigned { req, .. } => *req,
                FromZygote::Exited(e) => e.req,
                FromZygote::Launcher {
                    sandbox,
                    pids,
                    network,
                } => {
                    if let Some(channel) = fds.into_iter().next() {
                        launchers
                            .lock()
                            .expect("launchers lock")
                            .push_back(Launcher {
                                sandbox: *sandbox,
                                pids: pids.clone(),
                                channel,
                                network: *network,
                            });
                    }
                    continue;
                }
                FromZygote::LauncherGone { sandbox } => {
                    launchers
                        .lock()
                        .expect("launchers lock")
                        .retain(|l| l.sandbox != *sandbox);
                    continue;
                }
                _ => continue,
            };
            if let Some(tx) = waiters.lock().expect("waiters lock").get(&req) {
                let _ = tx.send(msg);
            }
        })
        .expect("spawning the zygote event thread");
}
