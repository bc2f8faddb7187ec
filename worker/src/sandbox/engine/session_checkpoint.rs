//! A live session's checkpoint, and its restores: a checkpoint is a frozen fork that keeps no
//! CPU; restoring it makes a new session whose interpreter and disk are the session's at the
//! checkpoint.
//!
//! A checkpoint is two things:
//! - the frozen copy F of the session's kernel (`fork_freeze` with `checkpoint`, as a fork's
//!   first step), left stopped in the session's own sandbox: its memory is the session's
//!   (its pages are the kernel's until either writes them, then counted in the sandbox's
//!   budget and cgroup as any process's), and it ends with the sandbox. Before it stops, F
//!   lets go of the kernel's pipes, so the supervisor still sees its kernel's end; continued
//!   by anything but a twin copy it ends at once;
//! - a copy of the session's disk taken at the checkpoint, in a directory of the node's
//!   (`runtime_dir`, private to the node), bounded by the session's disk size as it is copied
//!   (`disk_copy::CopyBound`) and removed with the checkpoint.
//!
//! A restore opens a branch sandbox of the session's spec, copies the checkpoint's disk into
//! it and makes its waiting kernel a twin of F (`Engine::branch_from`, the fork's own step),
//! and F is kept: a checkpoint restores any number of times. Before each, F must still be the
//! process the checkpoint froze, stopped where it stopped: it must be alive, in a stop, and
//! must not have run since (its context switches, counted by the kernel, are the ones the
//! node last saw); else the restore is refused, naming why.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::unistd::Pid;

use super::disk_copy::{copy_work_out, CopyBound, DiskCopy, DiskCopyError, DiskSource};
use super::session::{SandboxSession, SessionSpec};
use super::session_fork::{freeze, ForkError, ForkedBranch};
use super::start::Engine;
use crate::sandbox::kernel::sys::pidfd_signal;

/// How long F may take to be back in its stop once a copy let it go.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A checkpoint of a live session: its frozen interpreter and its disk's copy. Dropped, it
/// ends: F is killed (the session's kernel reaps it) and the disk's copy removed.
pub struct SessionCheckpoint {
    f: Pid,
    pidfd: OwnedFd,
    /// The node's private directory of this checkpoint; the disk's copy is `disk` in it.
    dir: Option<tempfile::TempDir>,
    /// F's context switches when the node last saw it stopped.
    switches: u64,
    /// What a restore does not get of the session's (as a fork's branch does not).
    not_carried: Vec<String>,
    pub disk: DiskCopy,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Fork(#[from] ForkError),
    #[error("copying the session's disk into the checkpoint: {0}")]
    Disk(#[from] DiskCopyError),
    #[error("the checkpoint's directory: {0}")]
    Dir(std::io::Error),
    #[error("the checkpoint's frozen interpreter {0}: it cannot be restored")]
    Changed(String),
}

impl Engine {
    /// Takes a checkpoint of the live session `parent` (opened with `spec`): its kernel forks
    /// a frozen copy of itself, and its disk is copied into a directory of the node's. The
    /// session pauses only for its kernel's fork and the disk's copy.
    pub async fn checkpoint_session(
        &self,
        parent: &mut SandboxSession,
        spec: &SessionSpec,
    ) -> Result<SessionCheckpoint, CheckpointError> {
        self.check_forkable(parent, spec)?;
        let init = parent
            .host_pids()
            .and_then(|p| p.first().copied())
            .ok_or_else(|| ForkError::Locate {
                what: "session's init",
                why: "not known".into(),
            })?;
        let frozen = freeze(parent, true).await?;
        let mut cp = SessionCheckpoint {
            f: frozen.pid,
            pidfd: frozen.pidfd,
            dir: None,
            switches: 0,
            not_carried: frozen.not_carried,
            disk: DiskCopy::default(),
        };
        let dir = tempfile::Builder::new()
            .prefix("forkbox-checkpoint-")
            .tempdir_in(&self.inner.config.runtime_dir)
            .map_err(CheckpointError::Dir)?;
        let disk = dir.path().join("disk");
        cp.dir = Some(dir);
        let work = self.inner.config.work_dir.clone();
        // Bounded while it copies: the session runs on meanwhile, and may write.
        let bound = CopyBound {
            disk_mb: parent.disk_mb(),
        };
        cp.disk = tokio::task::spawn_blocking(move || -> Result<DiskCopy, CheckpointError> {
            make_disk_dir(&disk, init, &work)?;
            Ok(copy_work_out(init, &work, &disk, bound)?)
        })
        .await
        .map_err(|e| CheckpointError::Dir(std::io::Error::other(e.to_string())))??;
        cp.switches = cp.check(None)?;
        Ok(cp)
    }

    /// Restores `cp`, a checkpoint of a session opened with `spec`: a new session whose
    /// interpreter and disk are the checkpoint's. The checkpoint stays, for another restore.
    pub async fn restore_checkpoint(
        &self,
        cp: &mut SessionCheckpoint,
        spec: &SessionSpec,
    ) -> Result<ForkedBranch, CheckpointError> {
        cp.check(Some(cp.switches))?;
        let opened = self.open_branches(spec, 1).await;
        let disk = DiskSource::Dir(cp.disk_dir().to_owned());
        let branch = self
            .branch_from(cp.f, disk, opened, spec, &cp.not_carried, || {})
            .await?
            .pop()
            .expect("one branch asked, one answered");
        // Let go by the copier, F runs in the kernel for a moment to stop again (its group
        // stop is still in effect): it is seen again once stopped, and the switches of the
        // copy's own stops and starts become the ones to compare with.
        let seen = cp.settled().await;
        match (branch, seen) {
            (Ok(b), Ok(switches)) => {
                cp.switches = switches;
                Ok(b)
            }
            (Ok(b), Err(e)) => {
                b.session.kill().await;
                Err(e)
            }
            (Err(e), _) => Err(e.into()),
        }
    }
}

impl SessionCheckpoint {
    /// F's host pid.
    pub fn frozen_pid(&self) -> Pid {
        self.f
    }

    /// The directory of the disk's copy.
    pub fn disk_dir(&self) -> PathBuf {
        match &self.dir {
            Some(d) => d.path().join("disk"),
            None => PathBuf::new(),
        }
    }

    /// [`Self::check`] once F is back in its stop after a copy, within [`SETTLE_WAIT`].
    async fn settled(&self) -> Result<u64, CheckpointError> {
        let started = std::time::Instant::now();
        loop {
            match self.check(None) {
                Err(CheckpointError::Changed(_)) if started.elapsed() < SETTLE_WAIT => {
                    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                }
                other => return other,
            }
        }
    }

    /// Whether F is as the checkpoint left it: alive and stopped, and, given the switches it
    /// had, not run since. Its context switches now.
    pub fn check(&self, had: Option<u64>) -> Result<u64, CheckpointError> {
        let gone = || CheckpointError::Changed("ended (killed, or continued and so ended)".into());
        pidfd_signal(&self.pidfd, 0).map_err(|_| gone())?;
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.f)).map_err(|_| gone())?;
        // The pid read was still F's: the pidfd says F lives, and so its pid is not reused.
        pidfd_signal(&self.pidfd, 0).map_err(|_| gone())?;
        let (state, switches) = stop_and_switches(&status);
        if !matches!(state, 'T' | 't') {
            return Err(CheckpointError::Changed(format!(
                "is no longer stopped (state {state})"
            )));
        }
        if had.is_some_and(|h| h != switches) {
            return Err(CheckpointError::Changed(
                "ran since it was frozen (it was continued, then stopped again)".into(),
            ));
        }
        Ok(switches)
    }
}

impl Drop for SessionCheckpoint {
    fn drop(&mut self) {
        let _ = pidfd_signal(&self.pidfd, libc::SIGKILL);
        if let Some(dir) = self.dir.take() {
            remove_tree(dir.path());
            drop(dir);
        }
    }
}

/// A process's state letter and its context switches, from its `/proc/<pid>/status`.
fn stop_and_switches(status: &str) -> (char, u64) {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_default()
    };
    let state = field("State:").chars().next().unwrap_or('?');
    let switches = ["voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"]
        .iter()
        .map(|f| field(f).parse::<u64>().unwrap_or(0))
        .sum();
    (state, switches)
}

/// Makes the disk's copy's directory, given to the owner of the session's working directory
/// (the copy runs as that owner, as a fork's does); its parent is the node's alone (0700).
fn make_disk_dir(disk: &Path, init: i32, work: &str) -> Result<(), CheckpointError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let owner = std::fs::metadata(format!("/proc/{init}/root{work}")).map_err(|e| {
        CheckpointError::Dir(std::io::Error::new(
            e.kind(),
            format!("the session's working directory: {e}"),
        ))
    })?;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(disk)
        .map_err(CheckpointError::Dir)?;
    std::os::unix::fs::chown(disk, Some(owner.uid()), Some(owner.gid()))
        .map_err(CheckpointError::Dir)
}

/// Removes a checkpoint's directory, read-only directories of the session's included (their
/// permissions came with the copy).
fn remove_tree(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    fn open_up(dir: &Path) {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                open_up(&e.path());
            }
        }
    }
    open_up(dir);
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!(
            "a checkpoint's directory {} was not removed: {e}",
            dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_gives_the_state_and_the_switches() {
        let status = "Name:\tpython3\nState:\tT (stopped)\nvoluntary_ctxt_switches:\t7\n\
                      nonvoluntary_ctxt_switches:\t2\n";
        assert_eq!(stop_and_switches(status), ('T', 9));
        assert_eq!(stop_and_switches("State:\tR (running)\n"), ('R', 0));
    }
}
