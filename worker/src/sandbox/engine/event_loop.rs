//! A run's event loop: what it waits on (the zygote's events for it, the init's report, the
//! output cap, its cancel, its cgroup's CPU time) and the kills it sends, until the job is
//! over; what it saw goes to [`super::outcome::fold`].

use std::future::Future;
use std::pin::Pin;

use forkbox_queue::schema::{EffectiveLimits, OutputMode};
use tokio::sync::mpsc;

use super::outcome::{Captured, Kills};
use super::run_error::RunError;
use super::start::Engine;
use crate::sandbox::isolate::cgroup;
use crate::sandbox::process::wire::{Exit, FromZygote, Report, ToZygote};

/// A run's own sources of events, besides the cancel future. The report and output reads are
/// futures the event loop polls itself (see [`super::output`]).
pub(super) struct RunEvents<'a, R, C> {
    pub req: u64,
    /// The zygote's events for this run.
    pub events: mpsc::UnboundedReceiver<FromZygote>,
    /// The job's cgroup, when the engine placed it at the hand-over.
    pub cgroup: Option<cgroup::JobCgroup>,
    /// Fires when stdout or stderr goes past the cap.
    pub over: mpsc::UnboundedReceiver<()>,
    /// Reads the init's report.
    pub report: R,
    /// Reads stdout and stderr; polled here until both close, and by the caller after.
    pub capture: Pin<&'a mut C>,
    /// Told the host pids of the sandbox's init and launcher when the zygote assigns it (a
    /// session reads its usage from the init's `/proc`).
    pub assigned: Option<tokio::sync::oneshot::Sender<Vec<i32>>>,
}

/// What a run's event loop saw, for [`super::outcome::fold`].
pub(super) struct Watched {
    pub report: Option<Report>,
    pub exit: Option<Exit>,
    pub kills: Kills,
    pub cpu_at_report_us: Option<u64>,
    /// The job's cgroup, placed at the hand-over or on the zygote's `Assigned`.
    pub cgroup: Option<cgroup::JobCgroup>,
    /// stdout and stderr, when both closed before the loop ended.
    pub captured: Option<(Captured, Captured)>,
}

impl Engine {
    /// A run's event loop: places the job's cgroup when the zygote assigns it a sandbox, kills
    /// the sandbox past the output cap, on cancel or past the cgroup's CPU time, and waits
    /// for the init's report and (with a cgroup, or after a kill) the zygote's exit event.
    /// An error means the job did not run to an outcome (a failed placement, the zygote
    /// gone); the caller's kill guard then ends the sandbox.
    pub(super) async fn watch<R, C>(
        &self,
        run: RunEvents<'_, R, C>,
        limits: &EffectiveLimits,
        output_mode: OutputMode,
        cancel: impl Future<Output = ()>,
    ) -> Result<Watched, RunError>
    where
        R: Future<Output = Vec<u8>>,
        C: Future<Output = (Captured, Captured)>,
    {
        let RunEvents {
            req,
            mut events,
            mut cgroup,
            over: mut over_rx,
            report,
            mut capture,
            mut assigned,
        } = run;
        let mut report_read = std::pin::pin!(report);
        let mut captured = None;
        let mut kills = Kills::default();
        // With a cgroup, the CPU time of all the job's processes together is held to its
        // budget: cpu.max lets it use at most one CPU, so the budget cannot run out before as
        // much wall time has passed, and cpu.stat is read again only when it could have.
        let cpu_budget_us = limits.cpu_ms.saturating_mul(1000);
        let mut cpu_at_report_us = None;
        let mut cpu_check = std::pin::pin!(tokio::time::sleep(std::time::Duration::from_micros(
            cpu_budget_us
        )));
        let mut cancel = std::pin::pin!(cancel);
        // The job is over when the init's report arrives (the program exited; the sandbox's
        // teardown need not be waited for) or when the zygote reports the sandbox gone (killed
        // by the watchdog or for a cap, or a set-up failure). With a cgroup, the exit is also
        // awaited, so the cgroup is empty when it is removed.
        let mut report: Option<Report> = None;
        let mut report_pending = true;
        let mut exit: Option<Exit> = None;
        loop {
            tokio::select! {
                ev = events.recv(), if exit.is_none() => match ev {
                    Some(FromZygote::Assigned { pids, .. }) => {
                        if let Some(tx) = assigned.take() {
                            let _ = tx.send(pids.clone());
                        }
                        // Without a cgroup handshake (a session's sandbox) nothing waits.
                        if self.inner.cgroups.is_none() {
                            continue;
                        }
                        // The launcher waits for this release: limits apply before the program
                        // runs.
                        match self.place(req, &pids, limits) {
                            Ok(cg) => {
                                cgroup = cg;
                                self.send(ToZygote::Release { req });
                            }
                            Err(e) => {
                                self.send(ToZygote::Kill { req });
                                return Err(e);
                            }
                        }
                    }
                    Some(FromZygote::Exited(e)) => exit = Some(e),
                    Some(_) => {}
                    None if report.is_some() => exit = Some(Exit::default()),
                    None => return Err(RunError::ZygoteDied),
                },
                bytes = &mut report_read, if report_pending => {
                    report_pending = false;
                    report = serde_json::from_slice(&bytes).ok();
                    // The job's CPU time as the program ended: the sandbox's teardown, charged
                    // to the cgroup afterwards, is not the job's.
                    cpu_at_report_us = cgroup.as_ref().and_then(|cg| cg.cpu_usage_us());
                }
                out = &mut capture, if captured.is_none() => captured = Some(out),
                // Truncated output goes on being read and discarded until the job ends.
                Some(()) = over_rx.recv(), if !kills.output && output_mode == OutputMode::Kill => {
                    kills.output = true;
                    self.send(ToZygote::Kill { req });
                }
                () = &mut cancel, if !kills.cancelled => {
                    kills.cancelled = true;
                    self.send(ToZygote::Kill { req });
                }
                () = &mut cpu_check, if cgroup.is_some() && !kills.cpu => {
                    let used = cgroup.as_ref().and_then(|cg| cg.cpu_usage_us()).unwrap_or(0);
                    match cpu_budget_us.saturating_sub(used) {
                        0 => {
                            // The cgroup's own kill stops every process at once; the
                            // zygote's (through the init) ends the sandbox and reports it.
                            kills.cpu = true;
                            if let Some(cg) = &cgroup {
                                let _ = cg.kill();
                            }
                            self.send(ToZygote::Kill { req });
                        }
                        left => cpu_check.as_mut().reset(
                            tokio::time::Instant::now()
                                + std::time::Duration::from_micros(left.max(10_000)),
                        ),
                    }
                }
            }
            if exit.is_some() || (report.is_some() && cgroup.is_none() && !kills.any()) {
                break;
            }
        }
        if report_pending {
            report = serde_json::from_slice(&report_read.await).ok();
        }
        Ok(Watched {
            report,
            exit,
            kills,
            cpu_at_report_us,
            cgroup,
            captured,
        })
    }
}
