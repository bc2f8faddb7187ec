//! Handing a job to a sandbox: a ready launcher the zygote gave the engine (placed in the job's
//! cgroup first), or the zygote's own queue when none is at hand.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;

use forkbox_queue::schema::{EffectiveLimits, Network};
use tokio::sync::mpsc;

use super::payload::pipe;
use super::run_error::RunError;
use super::start::{Engine, NEXT_REQ};
use crate::sandbox::isolate::cgroup;
use crate::sandbox::process::wire::{self, FromZygote, ToInit, ToZygote};

/// A job handed to a sandbox: its request, its events, its cgroup if the engine placed it,
/// and the host pids of its init and launcher when the engine handed it over itself (else
/// the zygote's `Assigned` tells them, with a cgroup handshake or for a session).
pub(super) type Handed = (
    u64,
    mpsc::UnboundedReceiver<FromZygote>,
    Option<cgroup::JobCgroup>,
    Option<Vec<i32>>,
);

impl Engine {
    /// Gives a job's descriptors (payload, stdin, stdout, stderr, report, and a staged job's
    /// compile-stage report) to a sandbox built
    /// for its `network` and registers for its events. A ready launcher the zygote gave the engine gets them
    /// directly, which saves the spawn a wake-up of the zygote: with cgroups, its init and
    /// launcher are placed in the job's cgroup first (the launcher is idle until it gets the
    /// job, so no instruction of the job runs outside its limits); then the zygote is told
    /// (with the exec-notify pipe for its watchdog); then the launcher gets the job. Without a
    /// launcher at hand, the zygote queues the job for its next ready sandbox. Returns the
    /// request, its events and the job's cgroup if it was placed here. A `session`'s sandbox
    /// is long-lived and outside the slots: the zygote does not count it as a running job.
    pub(super) fn hand_over(
        &self,
        network: Network,
        (timeout_ms, stage_ms): (u64, Option<u64>),
        session: bool,
        limits: &EffectiveLimits,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Handed, RunError> {
        let inner = &self.inner;
        loop {
            let req = NEXT_REQ.fetch_add(1, Ordering::Relaxed);
            let (tx, events) = mpsc::unbounded_channel();
            inner.waiters.lock().expect("waiters lock").insert(req, tx);
            let unregister = || {
                inner.waiters.lock().expect("waiters lock").remove(&req);
            };
            let launcher = loop {
                let next = {
                    let mut launchers = inner.launchers.lock().expect("launchers lock");
                    // Its seccomp program fixes a sandbox's network: only one built for the
                    // job's will do.
                    let at = launchers.iter().position(|l| l.network == network);
                    at.and_then(|i| launchers.remove(i))
                };
                match next {
                    // A launcher that died while it waited shows as its channel's hang-up (it
                    // never writes on it). Skipping it before `place` also keeps a pid freed by
                    // its death, and perhaps reused since, out of a job's cgroup.
                    Some(l) if wire::has_message(l.channel.as_fd()) => continue,
                    other => break other,
                }
            };
            let Some(launcher) = launcher else {
                let spawn = ToZygote::Spawn {
                    req,
                    timeout_ms,
                    network,
                    stage_ms,
                    session,
                };
                if let Err(e) = wire::send(inner.control.as_fd(), &spawn, fds) {
                    unregister();
                    return Err(RunError::SendJob(e));
                }
                return Ok((req, events, None, None));
            };
            let (notify_r, notify_w) = match pipe() {
                Ok(p) => p,
                Err(e) => {
                    unregister();
                    inner
                        .launchers
                        .lock()
                        .expect("launchers lock")
                        .push_front(launcher);
                    return Err(e);
                }
            };
            let started = ToZygote::Started {
                req,
                sandbox: launcher.sandbox,
                timeout_ms,
                stage_ms,
                session,
            };
            if let Err(e) = wire::send(inner.control.as_fd(), &started, &[notify_r.as_fd()]) {
                unregister();
                return Err(RunError::SendStarted(e));
            }
            drop(notify_r);
            let cgroup = match self.place(req, &launcher.pids, limits) {
                Ok(cg) => cg,
                Err(e) => {
                    // The sandbox may sit in a half-made cgroup: retire it, unused.
                    unregister();
                    self.send(ToZygote::Kill { req });
                    return Err(e);
                }
            };
            let run = ToInit::Run {
                wait_for_release: false,
            };
            let mut with_notify = fds.to_vec();
            with_notify.push(notify_w.as_fd());
            if wire::send(launcher.channel.as_fd(), &run, &with_notify).is_ok() {
                return Ok((req, events, cgroup, Some(launcher.pids)));
            }
            // That sandbox ended while ready: the zygote reports it under this request, which
            // nobody waits for any more. Try the next one.
            unregister();
            self.send(ToZygote::Kill { req });
            if let Some(cg) = cgroup {
                let _ = cg.finish();
            }
        }
    }

    /// With cgroups, creates job `req`'s cgroup with its limits and moves the sandbox's init
    /// and launcher (`pids`) into it; `None` without cgroups.
    pub(super) fn place(
        &self,
        req: u64,
        pids: &[i32],
        limits: &EffectiveLimits,
    ) -> Result<Option<cgroup::JobCgroup>, RunError> {
        let Some(tree) = &self.inner.cgroups else {
            return Ok(None);
        };
        if pids.len() != 2 {
            // Without the launcher's pid the program would run unlimited.
            return Err(RunError::LauncherPidUnknown { req });
        }
        let name = format!("job-{}-{req}", std::process::id());
        let cg = tree
            .create_job(&name, limits)
            .map_err(RunError::CgroupPlacement)?;
        match pids.iter().try_for_each(|pid| cg.add(*pid)) {
            Ok(()) => Ok(Some(cg)),
            Err(e) => {
                let _ = cg.finish();
                Err(RunError::CgroupPlacement(e))
            }
        }
    }
}
