//! A live session's fork into branches: each branch is a new session whose interpreter is a
//! copy of the parent's, in a sandbox of its own.
//!
//! The steps, in this order:
//! 1. open each branch's sandbox with the parent's spec (its files come from the parent's
//!    disk instead); its supervisor forks a kernel T that stops where a twin is expected, and
//!    says so in its hello: opened first, so the parent pauses for none of it;
//! 2. freeze: the parent's kernel forks a copy F of itself between cells, which stops at once
//!    (`fork_freeze`); the parent pauses only for that fork, and answers on;
//! 3. one blocking thread seizes F and reads its registers once (`HeldFrozen`: F can have
//!    one tracer, and stays stopped while held); then for each branch, from that thread:
//!    copy the parent's disk into the branch's (the twin opens the parent's files again by
//!    path), then `make_twin_of(F, T)` (F's memory read through `/proc`), keeping T's own
//!    pipes to its supervisor at the kernel's fixed numbers, so the copied interpreter talks
//!    to the branch's supervisor;
//! 4. kill F (the parent's kernel reaps it at its next request);
//! 5. join: each branch's supervisor waits for its kernel to run on as the copy
//!    (`fork_join`: it reseeds `random` and the like, and reports its execution count).
//!
//! Each branch succeeds or fails on its own; a branch that failed is killed, never left half
//! made. What a branch does not get of the parent's (sockets, pipes, threads, processes
//! other than the interpreter) is named in its [`ForkedBranch::not_carried`].

use std::os::fd::OwnedFd;
use std::time::Duration;

use forkbox_queue::schema::Runtime;
use nix::unistd::Pid;
use serde_json::{json, Value};

use super::disk_copy::{copy_dir_in, copy_work, CopyBound, DiskCopy, DiskCopyError, DiskSource};
use super::session::{OpenError, SandboxSession, SessionSpec};
use super::start::Engine;
use crate::sandbox::kernel::sys::{pidfd_open, pidfd_signal};
use crate::sandbox::process::twin::{
    make_twin_of, FrozenState, HeldFrozen, TwinError, TwinLimits, TwinReport,
};

/// The kernel's pipes to its supervisor (`KERNEL_CALLS_FD`, `KERNEL_REPLIES_FD` of
/// `session_supervisor.py`): the twin keeps its own there.
const KERNEL_OWN_FDS: [i32; 2] = [3, 4];

/// How long the parent's freeze and a branch's join may take (the supervisor's own bound is
/// 30 s; this is the node's, past it).
const CALL_WAIT: Duration = Duration::from_secs(40);

/// How long the frozen copy may take to stop itself.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// How long one twin copy may take.
const TWIN_TIMEOUT: Duration = Duration::from_secs(60);

/// A branch made.
pub struct ForkedBranch {
    pub session: SandboxSession,
    /// The interpreter's execution count, the parent's at the fork.
    pub execution_count: u64,
    /// What the branch does not have of the parent's, each named.
    pub not_carried: Vec<String>,
    /// Modules reseeded in the branch (`random`, `numpy.random`, ...).
    pub reseeded: Vec<String>,
    pub twin: TwinReport,
    pub disk: DiskCopy,
    /// Where the branch's time went.
    pub steps: BranchSteps,
}

/// A branch's steps, timed by the node.
#[derive(Debug, Clone, Default)]
pub struct BranchSteps {
    /// Its sandbox's open, to the supervisor's hello (side by side with the others').
    pub open: Duration,
    /// The parent's disk copied into its own.
    pub disk: Duration,
    /// The twin copy (its own steps in [`TwinReport::steps`]).
    pub twin: Duration,
    /// Its supervisor's `fork_join`, to its answer.
    pub join: Duration,
}

/// A fork: the parent's pause and each branch, made or not.
pub struct SessionFork {
    /// How long the parent's kernel paused for its fork, as it measured it.
    pub parent_pause: Duration,
    /// The freeze as the node saw it: the call, its answer, and the frozen copy found stopped.
    pub freeze: Duration,
    pub branches: Vec<Result<ForkedBranch, ForkError>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    #[error(
        "a session forks only in the warm python runtime (a twin is copied from the same \
         warm interpreter): {0}"
    )]
    NotWarm(String),
    #[error("the parent's interpreter did not fork: {0}")]
    Freeze(String),
    #[error("opening the branch's sandbox: {0}")]
    Open(#[from] OpenError),
    #[error("finding the {what} process: {why}")]
    Locate { what: &'static str, why: String },
    #[error("copying the parent's disk: {0}")]
    Disk(#[from] DiskCopyError),
    #[error("the twin copy: {0}")]
    Twin(#[from] TwinError),
    #[error("the branch's interpreter did not run on as the copy: {0}")]
    Join(String),
    #[error("the branch's sandbox ended: {0}")]
    Ended(String),
}

/// What the parent's freeze reported.
pub(super) struct Frozen {
    /// F's host pid and a pidfd pinning it.
    pub(super) pid: Pid,
    pub(super) pidfd: OwnedFd,
    pub(super) pause: Duration,
    /// Named for every branch: the parent's threads and other processes.
    pub(super) not_carried: Vec<String>,
}

impl Engine {
    /// Forks the live session `parent` (opened with `spec`) into `n` new sessions, each a
    /// copy of its interpreter state and its disk (see the module's documentation). The
    /// parent is only paused for its kernel's fork; it is not ended by any failure here. An
    /// error is returned when nothing could be forked at all (the parent is not warm, or its
    /// kernel did not fork); otherwise each branch is made or fails on its own.
    pub async fn fork_session(
        &self,
        parent: &mut SandboxSession,
        spec: &SessionSpec,
        n: usize,
    ) -> Result<SessionFork, ForkError> {
        self.check_forkable(parent, spec)?;
        // The branches open first, so the parent pauses for none of it: opened while the
        // parent's kernel forks, they raised its pause (median 3.4 ms to 11.9 ms, measured).
        let opened = self.open_branches(spec, n).await;
        if opened.iter().all(Result::is_err) {
            return Ok(SessionFork {
                parent_pause: Duration::ZERO,
                freeze: Duration::ZERO,
                branches: opened
                    .into_iter()
                    .filter_map(Result::err)
                    .map(Err)
                    .collect(),
            });
        }
        let started = std::time::Instant::now();
        let frozen = match freeze(parent, false).await {
            Ok(f) => f,
            Err(e) => {
                for (session, _) in opened.into_iter().flatten() {
                    session.kill().await;
                }
                return Err(e);
            }
        };
        let freeze_took = started.elapsed();
        let disk = DiskSource::Sandbox(parent.host_pids().and_then(|p| p.first().copied()));
        let (f, pidfd) = (frozen.pid, frozen.pidfd);
        // F served every copy: it goes (its parent reaps it at its next request).
        let kill_f = move || {
            let _ = pidfd_signal(&pidfd, libc::SIGKILL);
        };
        let branches = self
            .branch_from(f, disk, opened, spec, &frozen.not_carried, kill_f)
            .await?;
        Ok(SessionFork {
            parent_pause: frozen.pause,
            freeze: freeze_took,
            branches,
        })
    }

    /// Makes each opened branch a twin of the frozen copy `f` with a copy of `disk` (from one
    /// blocking thread, which runs `after` once every copy is done), then joins it. Shared by
    /// a fork (F then killed) and a checkpoint's restore (F kept).
    pub(super) async fn branch_from(
        &self,
        f: Pid,
        disk: DiskSource,
        opened: Vec<Result<(SandboxSession, Duration), ForkError>>,
        spec: &SessionSpec,
        not_carried: &[String],
        after: impl FnOnce() + Send + 'static,
    ) -> Result<Vec<Result<ForkedBranch, ForkError>>, ForkError> {
        let resolved = spec.limits.resolve(&self.inner.config.defaults);
        let limits = TwinLimits {
            memory_bytes: resolved.memory_mb << 20,
            timeout: TWIN_TIMEOUT,
            skip_identical: false,
        };
        // Each branch's disk is the size of the session's: no copy may make more.
        let bound = CopyBound {
            disk_mb: resolved.disk_mb,
        };
        let work = self.inner.config.work_dir.clone();
        let targets: Vec<Option<(i32, i64)>> = opened
            .iter()
            .map(|b| b.as_ref().ok().and_then(|(s, _)| twin_of(s)))
            .collect();
        let copies = tokio::task::spawn_blocking(move || {
            let copies = copy_all(f, &disk, &targets, &work, (&limits, bound));
            after();
            copies
        })
        .await
        .map_err(|e| ForkError::Freeze(format!("the copier stopped: {e}")))?;
        let mut branches = Vec::with_capacity(opened.len());
        for (opened, copy) in opened.into_iter().zip(copies) {
            branches.push(join(opened, copy, not_carried).await);
        }
        Ok(branches)
    }

    /// Refuses a session not in the warm python runtime (a twin is copied from the same warm
    /// interpreter).
    pub(super) fn check_forkable(
        &self,
        parent: &SandboxSession,
        spec: &SessionSpec,
    ) -> Result<(), ForkError> {
        let warm = parent.runtime().is_some_and(|r| r.warm);
        if spec.runtime != Some(Runtime::Python) || !warm {
            let why = match parent.runtime() {
                Some(r) => r.note.clone().unwrap_or_else(|| "it runs cold".into()),
                None => "it asked for no runtime".into(),
            };
            return Err(ForkError::NotWarm(why));
        }
        Ok(())
    }

    /// Opens `n` branch sandboxes side by side, each with a kernel waiting for its copy.
    pub(super) async fn open_branches(
        &self,
        spec: &SessionSpec,
        n: usize,
    ) -> Vec<Result<(SandboxSession, Duration), ForkError>> {
        let mut branch = spec.clone();
        // The parent's disk is copied in whole; its spec's files would only be overwritten.
        branch.files.clear();
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let (engine, spec) = (self.clone(), branch.clone());
                tokio::spawn(async move {
                    let started = std::time::Instant::now();
                    let opened = engine.open_session_as(spec, true).await;
                    opened.map(|s| (s, started.elapsed()))
                })
            })
            .collect();
        let mut out = Vec::with_capacity(n);
        for h in handles {
            let opened = match h.await {
                Ok(Ok((s, took))) if s.hello()["twin_waiting"] == true => Ok((s, took)),
                Ok(Ok((s, _))) => {
                    let end = s.kill().await;
                    Err(ForkError::Join(format!(
                        "its kernel did not stop for the copy ({})",
                        end.message()
                    )))
                }
                Ok(Err(e)) => Err(ForkError::Open(e)),
                Err(e) => Err(ForkError::Open(OpenError::Failed(e.to_string()))),
            };
            out.push(opened);
        }
        out
    }
}

/// The branch's init's host pid and its waiting kernel's pid in its sandbox.
fn twin_of(session: &SandboxSession) -> Option<(i32, i64)> {
    let init = session.host_pids()?.first().copied()?;
    let kernel = session.hello()["kernel"].as_i64()?;
    Some((init, kernel))
}

/// Has the parent's kernel fork F, and finds F from the host. A `checkpoint`'s F lets go of
/// the kernel's pipes before it stops, and ends if continued other than by a twin copy.
pub(super) async fn freeze(
    parent: &mut SandboxSession,
    checkpoint: bool,
) -> Result<Frozen, ForkError> {
    let result = call(
        parent,
        json!({"op": "fork_freeze", "checkpoint": checkpoint}),
    )
    .await
    .map_err(ForkError::Freeze)?;
    if result["ok"] != true {
        return Err(ForkError::Freeze(
            result["error"].as_str().unwrap_or("no reason given").into(),
        ));
    }
    let r = &result["frozen"];
    let init = parent
        .host_pids()
        .and_then(|p| p.first().copied())
        .ok_or_else(|| ForkError::Freeze("the parent's sandbox is not known yet".into()))?;
    let ns = r["frozen"].as_i64().unwrap_or(-1);
    // F stops itself right after the fork; the kernel may answer before it has.
    let started = std::time::Instant::now();
    let (procs, pid) = loop {
        let procs = sandbox_processes(init).map_err(|why| ForkError::Locate {
            what: "parent's sandbox",
            why,
        })?;
        let found = procs.iter().find(|p| p.ns == ns).map(|p| (p.host, p.state));
        match found {
            Some((host, 'T')) => break (procs, Pid::from_raw(host)),
            Some(_) if started.elapsed() < STOP_WAIT => {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            _ => {
                return Err(ForkError::Locate {
                    what: "frozen",
                    why: format!("no stopped process {ns} in the parent's sandbox"),
                })
            }
        }
    };
    let pidfd = pidfd_open(pid).map_err(|e| ForkError::Locate {
        what: "frozen",
        why: e.to_string(),
    })?;
    let ours = [
        1,
        r["supervisor"].as_i64().unwrap_or(-1),
        r["kernel"].as_i64().unwrap_or(-1),
        ns,
    ];
    let mut not_carried: Vec<String> = r["threads"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            format!(
                "thread {}: threads are not carried",
                t.as_str().unwrap_or("?")
            )
        })
        .collect();
    // Threads the interpreter did not start (a native library's pool) are counted only.
    let native = r["tasks"]
        .as_u64()
        .unwrap_or(1)
        .saturating_sub(1 + not_carried.len() as u64);
    if native > 0 {
        not_carried.push(format!(
            "{native} thread(s) of native code: threads are not carried"
        ));
    }
    not_carried.extend(
        procs
            .iter()
            .filter(|p| !ours.contains(&p.ns) && p.state != 'Z')
            .map(|p| {
                format!(
                    "process {} ({}): only the interpreter is carried",
                    p.ns, p.comm
                )
            }),
    );
    Ok(Frozen {
        pid,
        pidfd,
        pause: Duration::from_micros(r["pause_us"].as_u64().unwrap_or(0)),
        not_carried,
    })
}

/// Every branch's disk and twin, one after the other: this thread holds F (seized, so it
/// stays stopped) and reads its registers once; each twin is seized by this thread too.
/// (Copies side by side, one thread per core with [`make_twin_of`], measured no faster on a
/// loaded 2-core host: docs/benchmarks.md, "Session fork".)
fn copy_all(
    f: Pid,
    disk: &DiskSource,
    targets: &[Option<(i32, i64)>],
    work: &str,
    bounds: (&TwinLimits, CopyBound),
) -> Vec<Option<Result<Copied, ForkError>>> {
    let held = match HeldFrozen::seize(f) {
        Ok(held) => held,
        Err(e) => {
            let why = format!("seizing the frozen copy: {e}");
            return targets
                .iter()
                .map(|t| t.map(|_| Err(ForkError::Freeze(why.clone()))))
                .collect();
        }
    };
    targets
        .iter()
        .map(|t| t.map(|t| copy_one(held.state(), disk, t, work, bounds)))
        .collect()
}

/// A branch's disk copied (and the time it took) and its twin made.
type Copied = (DiskCopy, Duration, TwinReport);

/// One branch's disk and twin, on the copier's thread.
fn copy_one(
    f: &FrozenState,
    disk: &DiskSource,
    (init, kernel): (i32, i64),
    work: &str,
    (limits, bound): (&TwinLimits, CopyBound),
) -> Result<Copied, ForkError> {
    let started = std::time::Instant::now();
    let disk = match disk {
        DiskSource::Sandbox(Some(parent_init)) => copy_work(*parent_init, init, work, bound)?,
        DiskSource::Sandbox(None) => {
            return Err(ForkError::Locate {
                what: "parent's init",
                why: "not known".into(),
            })
        }
        DiskSource::Dir(dir) => copy_dir_in(dir, init, work, bound)?,
    };
    let disk_took = started.elapsed();
    let procs = sandbox_processes(init).map_err(|why| ForkError::Locate {
        what: "branch's sandbox",
        why,
    })?;
    let t = procs
        .iter()
        .find(|p| p.ns == kernel)
        .map(|p| Pid::from_raw(p.host))
        .ok_or_else(|| ForkError::Locate {
            what: "twin",
            why: format!("no process {kernel} in the branch's sandbox"),
        })?;
    let twin = make_twin_of(f, t, limits, &KERNEL_OWN_FDS)?;
    Ok((disk, disk_took, twin))
}

/// A branch's last step: its supervisor waits for the copied kernel; any failure kills it.
async fn join(
    opened: Result<(SandboxSession, Duration), ForkError>,
    copy: Option<Result<Copied, ForkError>>,
    parent_not_carried: &[String],
) -> Result<ForkedBranch, ForkError> {
    let (mut session, open) = opened?;
    let (disk, disk_took, twin) = match copy {
        Some(Ok(done)) => done,
        Some(Err(e)) => {
            session.kill().await;
            return Err(e);
        }
        None => {
            session.kill().await;
            return Err(ForkError::Locate {
                what: "twin",
                why: "the branch's sandbox is not known yet".into(),
            });
        }
    };
    let started = std::time::Instant::now();
    let joined = match call(&mut session, json!({"op": "fork_join"})).await {
        Ok(r) if r["ok"] == true => Ok(r),
        Ok(r) => Err(ForkError::Join(
            r["error"].as_str().unwrap_or("no reason given").into(),
        )),
        Err(why) => Err(ForkError::Ended(why)),
    };
    let r = match joined {
        Ok(r) => r,
        Err(e) => {
            session.kill().await;
            return Err(e);
        }
    };
    let steps = BranchSteps {
        open,
        disk: disk_took,
        twin: twin.elapsed,
        join: started.elapsed(),
    };
    let mut not_carried = parent_not_carried.to_vec();
    not_carried.extend(twin.not_carried.iter().cloned());
    not_carried.extend(disk.not_copied.iter().cloned());
    Ok(ForkedBranch {
        session,
        execution_count: r["twin"]["execution_count"].as_u64().unwrap_or(0),
        not_carried,
        reseeded: r["twin"]["reseeded"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        twin,
        disk,
        steps,
    })
}

static NEXT_CALL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Sends one of the node's own calls and waits for its result (other frames are dropped:
/// the session serves one call at a time, and its owner has none in flight).
async fn call(session: &mut SandboxSession, mut frame: Value) -> Result<Value, String> {
    let id = format!(
        "fork-{}",
        NEXT_CALL.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    frame["id"] = json!(id);
    let bytes = serde_json::to_vec(&frame).map_err(|e| e.to_string())?;
    session.send(&bytes).await.map_err(|e| e.to_string())?;
    let answer = async {
        loop {
            let frame = session.recv().await.map_err(|end| end.message())?;
            let Ok(event) = serde_json::from_slice::<Value>(&frame) else {
                continue;
            };
            if event["call"] == json!(id) && (event["kind"] == "result" || event["kind"] == "error")
            {
                return Ok(event);
            }
        }
    };
    tokio::time::timeout(CALL_WAIT, answer)
        .await
        .map_err(|_| format!("no answer within {CALL_WAIT:?}"))?
}

/// A process of a sandbox, as the host sees it.
pub(super) struct SandboxProcess {
    pub(super) host: i32,
    /// Its pid in the sandbox.
    pub(super) ns: i64,
    pub(super) comm: String,
    pub(super) state: char,
}

/// The processes in the pid namespace of the sandbox whose init has host pid `init`.
pub(super) fn sandbox_processes(init: i32) -> Result<Vec<SandboxProcess>, String> {
    let ns = std::fs::read_link(format!("/proc/{init}/ns/pid"))
        .map_err(|e| format!("/proc/{init}/ns/pid: {e}"))?;
    let mut out = Vec::new();
    let entries = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
    for entry in entries.flatten() {
        let Ok(host) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // A process gone since the listing, or of another namespace, is not one of them.
        if std::fs::read_link(format!("/proc/{host}/ns/pid"))
            .ok()
            .as_ref()
            != Some(&ns)
        {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{host}/status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        let Some(pid) = field("NSpid:")
            .split_whitespace()
            .last()
            .and_then(|v| v.parse().ok())
        else {
            continue;
        };
        out.push(SandboxProcess {
            host,
            ns: pid,
            comm: field("Name:"),
            state: field("State:").chars().next().unwrap_or('?'),
        });
    }
    Ok(out)
}
