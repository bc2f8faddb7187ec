//! The sandbox engine: runs jobs in rootless, fully isolated sandboxes forked from a warm zygote.
//!
//! [`Engine::start`] exec's the zygote (`forkbox __zygote`), writes its user-namespace id maps
//! and waits until it is ready; [`Engine::run`] then costs one message to the zygote, which hands
//! a pre-built sandbox the job. The engine's side of a run is all asynchronous: stdout and stderr
//! are read from pipes with a cap, the init's report and the zygote's exit event are awaited, and
//! everything is folded into an [`Outcome`]. See `docs/architecture.md` for the whole sequence.

pub mod cgroup;
pub mod init;
pub mod netns;
pub mod rootfs;
pub mod seccomp;
#[allow(unsafe_code)]
pub mod sys;
pub mod wire;
pub mod zygote;

use std::collections::{HashMap, VecDeque};
use std::io::{Seek, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use forkbox_queue::schema::{
    EffectiveLimits, Job, Outcome, Status, EXIT_SANDBOX_ERROR, EXIT_TIMEOUT,
};
use nix::unistd::Uid;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, Semaphore};

use wire::{Exit, FromZygote, Payload, Report, RootSource, ToInit, ToZygote, ZygoteConfig};

/// Host directories exposed by default (those that exist).
pub const DEFAULT_ALLOWLIST: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];
/// `PATH` inside the sandbox unless the job sets one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Host uid (and gid) that the sandbox's root maps to when the node runs as host root.
pub const DEFAULT_ROOT_MAPPED_ID: u32 = 100_000;

/// CLOCK_MONOTONIC in nanoseconds; shared by the engine and the zygote.
pub fn mono_ns() -> i64 {
    let ts =
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    ts.tv_sec() * 1_000_000_000 + ts.tv_nsec()
}

/// How an engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The `forkbox` binary that serves `__zygote` (default: the running executable).
    pub zygote_exe: PathBuf,
    /// Concurrent sandboxes; also the number kept pre-warmed.
    pub slots: usize,
    pub root: RootSource,
    /// The working directory inside the sandbox.
    pub work_dir: String,
    /// Limits for jobs that do not set their own.
    pub defaults: EffectiveLimits,
    /// Host id of the sandbox's root when running as host root.
    pub root_mapped_id: u32,
    /// Where to create the staging directory.
    pub runtime_dir: PathBuf,
    /// One network namespace per sandbox (default) rather than one shared by all.
    pub net_per_sandbox: bool,
    /// Cap on the bytes of collected files per job.
    pub collect_max_bytes: u64,
    /// Use cgroup v2 when delegated (`Some(probe source)`), never (`None`).
    pub cgroup: Option<CgroupSource>,
}

/// Where to look for cgroup v2 delegation (parameters so tests can use a fake tree).
#[derive(Debug, Clone)]
pub struct CgroupSource {
    pub mountinfo: PathBuf,
    pub self_cgroup: PathBuf,
}

impl Default for CgroupSource {
    fn default() -> Self {
        CgroupSource {
            mountinfo: "/proc/self/mountinfo".into(),
            self_cgroup: "/proc/self/cgroup".into(),
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            zygote_exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("forkbox")),
            slots: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
            root: RootSource::Allowlist(DEFAULT_ALLOWLIST.iter().map(PathBuf::from).collect()),
            work_dir: "/work".into(),
            defaults: EffectiveLimits::default(),
            root_mapped_id: DEFAULT_ROOT_MAPPED_ID,
            runtime_dir: std::env::temp_dir(),
            net_per_sandbox: true,
            collect_max_bytes: 8 * 1024 * 1024,
            cgroup: Some(CgroupSource::default()),
        }
    }
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("staging directory {path}: {source}")]
    Staging {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("engine channel: {0}")]
    Channel(nix::errno::Errno),
    #[error("starting the zygote {exe}: {source}")]
    SpawnZygote {
        exe: PathBuf,
        source: std::io::Error,
    },
    #[error("writing the zygote's id maps ({path}): {source}")]
    IdMap {
        path: String,
        source: std::io::Error,
    },
    #[error("zygote set-up failed: {0}")]
    ZygoteFailed(String),
    #[error("the zygote exited during start-up")]
    ZygoteGone,
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// How the node enforces each limit on this host.
#[derive(Debug, Clone)]
pub struct Mechanisms {
    pub cgroup: cgroup::Delegation,
    pub seccomp_instructions: usize,
    pub identity: String,
}

type Waiters = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<FromZygote>>>>;
/// A ready sandbox the zygote gave the engine.
struct Launcher {
    sandbox: u64,
    /// Host pids of its init and its launcher.
    pids: Vec<i32>,
    /// The job channel to the launcher.
    channel: OwnedFd,
}

type Launchers = Arc<Mutex<VecDeque<Launcher>>>;

/// A job handed to a sandbox: its request, its events, and its cgroup if the engine placed it.
type Handed = (
    u64,
    mpsc::UnboundedReceiver<FromZygote>,
    Option<cgroup::JobCgroup>,
);

struct Inner {
    control: OwnedFd,
    waiters: Waiters,
    launchers: Launchers,
    alive: Arc<AtomicBool>,
    next_req: AtomicU64,
    slots: Semaphore,
    config: EngineConfig,
    cgroups: Option<cgroup::Tree>,
    mechanisms: Mechanisms,
    staging: PathBuf,
    zygote: Mutex<std::process::Child>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // An orderly stop: the event thread must not report the zygote's exit as a failure.
        self.alive.store(false, Ordering::Release);
        if let Ok(mut child) = self.zygote.lock() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir(self.staging.join("root"));
        let _ = std::fs::remove_dir(self.staging.join("layers"));
        let _ = std::fs::remove_dir(&self.staging);
    }
}

/// A warm sandbox engine. Cheap to clone; all clones share one zygote.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("slots", &self.inner.config.slots)
            .finish()
    }
}

impl Engine {
    /// Starts the zygote and waits until it serves. Blocking; call it before heavy async work
    /// or from `spawn_blocking`.
    pub fn start(config: EngineConfig) -> Result<Engine, EngineError> {
        if config.slots == 0 {
            return Err(EngineError::Config("slots must be at least 1".into()));
        }
        if let RootSource::Image(dir) = &config.root {
            if !dir.join("bin").exists() && !dir.join("usr").is_dir() {
                return Err(EngineError::Config(format!(
                    "rootfs {} does not look like a root filesystem (no bin or usr)",
                    dir.display()
                )));
            }
        }
        let staging = make_staging(&config.runtime_dir)?;
        let (ours, theirs) = wire::seqpacket_pair().map_err(EngineError::Channel)?;
        let mut command = std::process::Command::new(&config.zygote_exe);
        command
            .arg("__zygote")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        command.env_clear();
        // Every sandbox's init is a fork of the zygote, and any process may read pid 1's
        // command line: it names no host path.
        std::os::unix::process::CommandExt::arg0(&mut command, "forkbox");
        // Its own process group: a terminal's Ctrl-C is for the node, which decides how
        // running jobs end; the zygote exits when the engine's channel closes.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        sys::pass_fd(&mut command, std::os::fd::AsRawFd::as_raw_fd(&theirs), 3);
        let child = command.spawn().map_err(|source| EngineError::SpawnZygote {
            exe: config.zygote_exe.clone(),
            source,
        })?;
        drop(theirs);
        let pid = child.id();
        let guard = ZygoteGuard(Some(child));

        let probe = config
            .cgroup
            .as_ref()
            .map(|src| cgroup::probe(&src.mountinfo, &src.self_cgroup));
        let delegation = probe
            .map(|p| p.delegation)
            .unwrap_or(cgroup::Delegation::Unavailable(
                "disabled by configuration".into(),
            ));
        let cgroups = match &delegation {
            cgroup::Delegation::Delegated(dir) => {
                cgroup::Tree::prepare(dir, std::process::id()).ok()
            }
            cgroup::Delegation::Unavailable(_) => None,
        };
        let zcfg = ZygoteConfig {
            root: config.root.clone(),
            staging: staging.clone(),
            work_dir: config.work_dir.clone(),
            defaults: config.defaults,
            pool: config.slots + 1,
            net_per_sandbox: config.net_per_sandbox,
            cgroup_handshake: cgroups.is_some(),
        };
        wire::send(ours.as_fd(), &zcfg, &[]).map_err(EngineError::Channel)?;
        expect(&ours, |m| matches!(m, FromZygote::NeedMaps))?;
        let identity = write_id_maps(pid, config.root_mapped_id)?;
        wire::send(ours.as_fd(), &ToZygote::MapsWritten, &[]).map_err(EngineError::Channel)?;
        let seccomp_instructions = match expect(&ours, |m| matches!(m, FromZygote::Ready { .. }))? {
            FromZygote::Ready {
                seccomp_instructions,
            } => seccomp_instructions,
            _ => unreachable!("checked by expect"),
        };

        let waiters: Waiters = Arc::default();
        let launchers: Launchers = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let reader = ours.try_clone().map_err(|e| {
            EngineError::Channel(nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0)))
        })?;
        spawn_event_reader(reader, waiters.clone(), launchers.clone(), alive.clone());
        let slots = Semaphore::new(config.slots);
        Ok(Engine {
            inner: Arc::new(Inner {
                control: ours,
                waiters,
                launchers,
                alive,
                next_req: AtomicU64::new(1),
                slots,
                mechanisms: Mechanisms {
                    cgroup: delegation,
                    seccomp_instructions,
                    identity,
                },
                config,
                cgroups,
                staging,
                zygote: Mutex::new(guard.take()),
            }),
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Whether the zygote still serves; once it is gone every run fails with `error`.
    pub fn is_alive(&self) -> bool {
        self.inner.alive.load(Ordering::Acquire)
    }

    /// How limits and identity are enforced on this host.
    pub fn mechanisms(&self) -> &Mechanisms {
        &self.inner.mechanisms
    }

    /// Runs one job to completion.
    pub async fn run(&self, job: &Job) -> Outcome {
        self.run_cancellable(job, std::future::pending()).await
    }

    /// Runs one job; when `cancel` completes first, the sandbox is killed and the outcome is
    /// `cancelled`.
    pub async fn run_cancellable(
        &self,
        job: &Job,
        cancel: impl std::future::Future<Output = ()>,
    ) -> Outcome {
        self.run_with(job, cancel, None).await
    }

    /// Like [`Engine::run_cancellable`], also sending stdout and stderr chunks to `output` as
    /// they arrive (within the output cap).
    pub async fn run_with(
        &self,
        job: &Job,
        cancel: impl std::future::Future<Output = ()>,
        output: Option<mpsc::UnboundedSender<OutputChunk>>,
    ) -> Outcome {
        if let Err(e) = job.validate() {
            return Outcome::not_run(Status::Invalid, e.to_string());
        }
        let Ok(_permit) = self.inner.slots.acquire().await else {
            return Outcome::not_run(Status::Error, "engine is shutting down");
        };
        match self.execute(job, cancel, output).await {
            Ok(outcome) => outcome,
            Err(e) => Outcome::not_run(Status::Error, e),
        }
    }

    async fn execute(
        &self,
        job: &Job,
        cancel: impl std::future::Future<Output = ()>,
        output: Option<mpsc::UnboundedSender<OutputChunk>>,
    ) -> Result<Outcome, String> {
        let inner = &self.inner;
        if !inner.alive.load(Ordering::Acquire) {
            return Err("the sandbox zygote is gone; restart the node".into());
        }
        let limits = job.limits.resolve(&inner.config.defaults);
        let file_bytes: u64 = job.files.values().map(|d| d.byte_len() as u64).sum();
        if file_bytes > limits.disk_mb * 1024 * 1024 {
            // The launcher would run out of room writing them: a fault of the job, not of the
            // sandbox, so not worth a retry.
            return Ok(Outcome::not_run(
                Status::Invalid,
                format!(
                    "files: {file_bytes} bytes do not fit the job's disk of {} MiB \
                     (limits.disk_mb)",
                    limits.disk_mb
                ),
            ));
        }
        let payload = Payload {
            job: job.clone(),
            argv: job.command(),
            env: job_env(job, &inner.config.work_dir),
            limits,
            collect_max_bytes: inner.config.collect_max_bytes,
        };
        let payload_fd = memfd_with(&serde_json::to_vec(&payload).map_err(|e| e.to_string())?)?;
        let stdin_bytes = match &job.stdin {
            Some(data) => data.to_bytes().map_err(|e| format!("stdin: {e}"))?,
            None => Vec::new(),
        };
        let stdin_fd = memfd_with(&stdin_bytes)?;
        let (stdout_r, stdout_w) = pipe()?;
        let (stderr_r, stderr_w) = pipe()?;
        let (report_r, report_w) = pipe()?;

        let requested_ns = mono_ns();
        let fds = [
            payload_fd.as_fd(),
            stdin_fd.as_fd(),
            stdout_w.as_fd(),
            stderr_w.as_fd(),
            report_w.as_fd(),
        ];
        let (req, mut events, mut cgroup_job) = self.hand_over(job.timeout_ms(), &limits, fds)?;
        let _unregister = Unregister {
            waiters: &inner.waiters,
            req,
        };
        drop((payload_fd, stdin_fd, stdout_w, stderr_w, report_w));
        // From here on, a dropped future must not leave the sandbox running.
        let mut kill_guard = KillGuard {
            engine: self,
            req,
            armed: true,
        };

        let cap = limits.output_bytes;
        let (over_tx, mut over_rx) = mpsc::unbounded_channel::<()>();
        let stdout_task = tokio::spawn(read_capped(
            stdout_r,
            cap,
            over_tx.clone(),
            OutputStream::Stdout,
            output.clone(),
        ));
        let stderr_task = tokio::spawn(read_capped(
            stderr_r,
            cap,
            over_tx,
            OutputStream::Stderr,
            output,
        ));
        let mut report_task = tokio::spawn(read_all(
            report_r,
            inner.config.collect_max_bytes * 2 + 65536,
        ));

        let mut output_killed = false;
        let mut cancelled = false;
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
                        // The launcher waits for this release: limits apply before the program
                        // runs.
                        match self.place(req, &pids, &limits) {
                            Ok(cg) => {
                                cgroup_job = cg;
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
                    None => return Err("the sandbox zygote died during the job".into()),
                },
                bytes = &mut report_task, if report_pending => {
                    report_pending = false;
                    report = serde_json::from_slice(&bytes.unwrap_or_default()).ok();
                }
                Some(()) = over_rx.recv(), if !output_killed => {
                    output_killed = true;
                    self.send(ToZygote::Kill { req });
                }
                () = &mut cancel, if !cancelled => {
                    cancelled = true;
                    self.send(ToZygote::Kill { req });
                }
            }
            let killed = output_killed || cancelled;
            if exit.is_some() || (report.is_some() && cgroup_job.is_none() && !killed) {
                break;
            }
        }
        kill_guard.armed = false;
        if report_pending {
            report = serde_json::from_slice(&report_task.await.unwrap_or_default()).ok();
        }
        let (stdout, stdout_truncated) = stdout_task.await.unwrap_or_default();
        let (stderr, stderr_truncated) = stderr_task.await.unwrap_or_default();
        let accounting = cgroup_job.and_then(|cg| cg.finish().ok());

        let setup_error = report
            .as_ref()
            .and_then(|r| r.setup_error.clone())
            .or_else(|| exit.as_ref().and_then(|e| e.error.clone()));
        if let Some(error) = setup_error {
            if cancelled {
                // Our own kill landed before the program started (the launcher was still
                // writing files, say): the job was cancelled, and its sandbox did not fail.
                return Ok(Outcome::not_run(
                    Status::Cancelled,
                    "cancelled before the program started",
                ));
            }
            if let Some(fault) = error.strip_prefix(init::JOB_FAULT_MARK) {
                return Ok(Outcome::not_run(
                    Status::Invalid,
                    format!("job not run: {fault}"),
                ));
            }
            let mut o = Outcome::not_run(
                Status::Error,
                format!("sandbox set-up failed, job not run: {error}"),
            );
            o.stderr = String::from_utf8_lossy(&stderr).into_owned();
            return Ok(o);
        }
        let exit = exit.unwrap_or_default();
        let exec_ns = report.as_ref().and_then(|r| r.exec_ns).or(exit.exec_ns);
        let exit_ns = report
            .as_ref()
            .and_then(|r| r.exit_ns)
            .unwrap_or(exit.exit_ns);
        let (cpu_us, rss_kb) = match &report {
            Some(r) => (r.cpu_us, r.max_rss_kb),
            None => (exit.cpu_us, exit.max_rss_kb),
        };
        let mut outcome = Outcome {
            status: Status::Ok,
            exit_code: 0,
            signal: None,
            timed_out: exit.timed_out,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            stdout_truncated,
            stderr_truncated,
            duration_ms: exec_ns
                .map(|e| (exit_ns - e).max(0) as f64 / 1e6)
                .unwrap_or(0.0),
            spawn_us: exec_ns
                .map(|e| ((e - requested_ns).max(0) / 1000) as u64)
                .unwrap_or(0),
            cpu_ms: cpu_us / 1000,
            max_rss_kb: accounting.and_then(|a| a.memory_peak_kb).unwrap_or(rss_kb),
            files: Default::default(),
            watchdog_overshoot_us: exit.overshoot_ns.map(|ns| ns / 1000),
            error: None,
        };
        let killed_by = |o: &mut Outcome, status| {
            o.status = status;
            o.signal = Some(libc::SIGKILL);
            o.exit_code = 128 + libc::SIGKILL;
        };
        if exit.timed_out {
            killed_by(&mut outcome, Status::Timeout);
            outcome.exit_code = EXIT_TIMEOUT;
        } else if cancelled {
            killed_by(&mut outcome, Status::Cancelled);
        } else if output_killed || stdout_truncated || stderr_truncated {
            // Past the cap the sandbox is killed and its pipes closed; whichever of the kill,
            // the program's own reaction to the closed pipe and our noticing came first, the
            // job ended because of its output.
            killed_by(&mut outcome, Status::OutputLimit);
        } else if accounting.is_some_and(|a| a.oom_killed) {
            killed_by(&mut outcome, Status::MemoryLimit);
        } else if let Some(r) = report {
            if let Some(sig) = r.signal {
                let cpu_exhausted = sig == libc::SIGXCPU
                    || (sig == libc::SIGKILL && outcome.cpu_ms >= limits.cpu_ms);
                outcome.status = if cpu_exhausted {
                    Status::CpuLimit
                } else {
                    Status::Signaled
                };
                outcome.signal = Some(sig);
                outcome.exit_code = 128 + sig;
            } else {
                let code = r.exit_code.unwrap_or(EXIT_SANDBOX_ERROR);
                outcome.exit_code = code;
                outcome.status = if code == 0 {
                    Status::Ok
                } else {
                    Status::Failed
                };
            }
            outcome.files = r.files;
            outcome.error = r.collect_error;
        } else {
            outcome.status = Status::Error;
            outcome.exit_code = EXIT_SANDBOX_ERROR;
            outcome.error = Some("the sandbox init died without a report".into());
        }
        Ok(outcome)
    }

    /// Gives a job's descriptors (payload, stdin, stdout, stderr, report) to a sandbox and
    /// registers for its events. A ready launcher the zygote gave the engine gets them
    /// directly, which saves the spawn a wake-up of the zygote: with cgroups, its init and
    /// launcher are placed in the job's cgroup first (the launcher is idle until it gets the
    /// job, so no instruction of the job runs outside its limits); then the zygote is told
    /// (with the exec-notify pipe for its watchdog); then the launcher gets the job. Without a
    /// launcher at hand, the zygote queues the job for its next ready sandbox. Returns the
    /// request, its events and the job's cgroup if it was placed here.
    fn hand_over(
        &self,
        timeout_ms: u64,
        limits: &EffectiveLimits,
        fds: [BorrowedFd<'_>; 5],
    ) -> Result<Handed, String> {
        let inner = &self.inner;
        loop {
            let req = inner.next_req.fetch_add(1, Ordering::Relaxed);
            let (tx, events) = mpsc::unbounded_channel();
            inner.waiters.lock().expect("waiters lock").insert(req, tx);
            let unregister = || {
                inner.waiters.lock().expect("waiters lock").remove(&req);
            };
            let launcher = loop {
                let next = inner.launchers.lock().expect("launchers lock").pop_front();
                match next {
                    // A launcher that died while it waited shows as its channel's hang-up (it
                    // never writes on it). Skipping it before `place` also keeps a pid freed by
                    // its death, and perhaps reused since, out of a job's cgroup.
                    Some(l) if wire::has_message(l.channel.as_fd()) => continue,
                    other => break other,
                }
            };
            let Some(launcher) = launcher else {
                let spawn = ToZygote::Spawn { req, timeout_ms };
                if let Err(e) = wire::send(inner.control.as_fd(), &spawn, &fds) {
                    unregister();
                    return Err(format!("sending the job to the zygote: {e}"));
                }
                return Ok((req, events, None));
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
            };
            if let Err(e) = wire::send(inner.control.as_fd(), &started, &[notify_r.as_fd()]) {
                unregister();
                return Err(format!("telling the zygote about the job: {e}"));
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
                return Ok((req, events, cgroup));
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
    fn place(
        &self,
        req: u64,
        pids: &[i32],
        limits: &EffectiveLimits,
    ) -> Result<Option<cgroup::JobCgroup>, String> {
        let Some(tree) = &self.inner.cgroups else {
            return Ok(None);
        };
        if pids.len() != 2 {
            // Without the launcher's pid the program would run unlimited.
            return Err(format!(
                "cgroup placement failed (job not run): job {req}: launcher pid unknown"
            ));
        }
        let name = format!("job-{}-{req}", std::process::id());
        let cg = tree
            .create_job(&name, limits)
            .map_err(|e| format!("cgroup placement failed (job not run): {e}"))?;
        match pids.iter().try_for_each(|pid| cg.add(*pid)) {
            Ok(()) => Ok(Some(cg)),
            Err(e) => {
                let _ = cg.finish();
                Err(format!("cgroup placement failed (job not run): {e}"))
            }
        }
    }

    fn send(&self, msg: ToZygote) {
        let _ = wire::send(self.inner.control.as_fd(), &msg, &[]);
    }
}

/// Kills the sandbox of a run whose future was dropped before it finished.
struct KillGuard<'a> {
    engine: &'a Engine,
    req: u64,
    armed: bool,
}

impl Drop for KillGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.engine.send(ToZygote::Kill { req: self.req });
        }
    }
}

struct Unregister<'a> {
    waiters: &'a Waiters,
    req: u64,
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        if let Ok(mut w) = self.waiters.lock() {
            w.remove(&self.req);
        }
    }
}

struct ZygoteGuard(Option<std::process::Child>);

impl ZygoteGuard {
    fn take(mut self) -> std::process::Child {
        self.0.take().expect("taken once")
    }
}

impl Drop for ZygoteGuard {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn expect(sock: &OwnedFd, want: impl Fn(&FromZygote) -> bool) -> Result<FromZygote, EngineError> {
    match wire::recv::<FromZygote>(sock.as_fd()) {
        Ok(Some(m)) if want(&m.message) => Ok(m.message),
        Ok(Some(wire::Received {
            message: FromZygote::StartFailed { error },
            ..
        })) => Err(EngineError::ZygoteFailed(error)),
        Ok(Some(other)) => Err(EngineError::ZygoteFailed(format!(
            "unexpected message {:?}",
            other.message
        ))),
        Ok(None) => Err(EngineError::ZygoteGone),
        Err(e) => Err(EngineError::Channel(e)),
    }
}

/// Writes the zygote's maps. Host uid 0 is never mapped: as root, the sandbox's root is an
/// unprivileged id; as an ordinary user, it is that user.
fn write_id_maps(pid: u32, root_mapped_id: u32) -> Result<String, EngineError> {
    let write = |file: &str, content: &str| {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, content).map_err(|source| EngineError::IdMap { path, source })
    };
    if Uid::current().is_root() {
        if root_mapped_id == 0 {
            return Err(EngineError::Config(
                "refusing to map host uid 0 into the sandbox".into(),
            ));
        }
        write("uid_map", &format!("0 {root_mapped_id} 1"))?;
        write("gid_map", &format!("0 {root_mapped_id} 1"))?;
        Ok(format!(
            "host root: sandbox root is host uid/gid {root_mapped_id}"
        ))
    } else {
        let (uid, gid) = (
            Uid::current().as_raw(),
            nix::unistd::Gid::current().as_raw(),
        );
        // An unprivileged writer may only map its own ids, and only after denying setgroups.
        write("setgroups", "deny")?;
        write("uid_map", &format!("0 {uid} 1"))?;
        write("gid_map", &format!("0 {gid} 1"))?;
        Ok(format!("rootless: sandbox root is host uid {uid}"))
    }
}

/// Name prefix of staging directories, followed by the owning process's tag
/// ([`forkbox_queue::owner`]).
const STAGING_PREFIX: &str = "forkbox-";

/// Makes this engine's staging directory, named after this process so that the next engine
/// removes it if this process is killed outright (its `Drop` never runs then). Those left by
/// processes that are gone are removed first: they hold only the empty mount points `root` and
/// `layers` (the mounts on them lived in namespaces that died with their zygote), so only empty
/// directories are ever removed.
fn make_staging(parent: &Path) -> Result<PathBuf, EngineError> {
    use std::os::unix::fs::PermissionsExt;
    remove_stale_staging(parent);
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| EngineError::Staging { path, source }
    };
    let dir = tempfile::Builder::new()
        .prefix(&format!("{STAGING_PREFIX}{}-", forkbox_queue::owner::tag()))
        .tempdir_in(parent)
        .map_err(err(parent))?
        .keep();
    // Only mount points live here; the sandbox's unprivileged root must be able to reach them.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).map_err(err(&dir))?;
    for sub in ["root", "layers"] {
        std::fs::create_dir(dir.join(sub)).map_err(err(&dir))?;
    }
    Ok(dir)
}

fn remove_stale_staging(parent: &Path) {
    for dir in forkbox_queue::owner::abandoned(parent, STAGING_PREFIX) {
        for sub in ["root", "layers"] {
            let _ = std::fs::remove_dir(dir.join(sub));
        }
        let _ = std::fs::remove_dir(&dir);
    }
}

/// The clean environment of a job: defaults, then the job's own variables.
fn job_env(job: &Job, work_dir: &str) -> Vec<(String, String)> {
    let mut env: std::collections::BTreeMap<String, String> = [
        ("PATH", DEFAULT_PATH),
        ("HOME", work_dir),
        ("LANG", "C.UTF-8"),
        ("TMPDIR", "/tmp"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    env.extend(job.env.clone());
    env.into_iter().collect()
}

fn memfd_with(bytes: &[u8]) -> Result<OwnedFd, String> {
    let fd = nix::sys::memfd::memfd_create(
        c"forkbox-job",
        nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
    )
    .map_err(|e| format!("memfd: {e}"))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes).map_err(|e| format!("memfd: {e}"))?;
    file.rewind().map_err(|e| format!("memfd: {e}"))?;
    Ok(file.into())
}

fn pipe() -> Result<(OwnedFd, OwnedFd), String> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))
}

/// Which output a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// A piece of a running job's output.
#[derive(Debug, Clone)]
pub struct OutputChunk {
    pub stream: OutputStream,
    pub data: Vec<u8>,
}

/// Reads up to `cap` bytes; signals `over` (and stops reading) when the program writes more.
async fn read_capped(
    fd: OwnedFd,
    cap: u64,
    over: mpsc::UnboundedSender<()>,
    stream: OutputStream,
    live: Option<mpsc::UnboundedSender<OutputChunk>>,
) -> (Vec<u8>, bool) {
    let forward = |data: &[u8]| {
        if let (Some(tx), false) = (&live, data.is_empty()) {
            let _ = tx.send(OutputChunk {
                stream,
                data: data.to_vec(),
            });
        }
    };
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return (Vec::new(), false);
    };
    // One byte past the cap is read to tell "exactly the cap" from "more than the cap"; the
    // bytes land straight in `out` (no zeroed scratch buffer, no second copy).
    let limit = (cap as usize).saturating_add(1);
    let mut out = Vec::new();
    loop {
        let want = (limit - out.len()).min(64 * 1024);
        out.reserve(want);
        // At most the cap so far (more returns below), so truncating keeps `before..` valid.
        let before = out.len();
        match (&mut rx).take(want as u64).read_buf(&mut out).await {
            Ok(0) | Err(_) => return (out, false),
            Ok(_) if out.len() > cap as usize => {
                out.truncate(cap as usize);
                forward(&out[before..]);
                let _ = over.send(());
                return (out, true);
            }
            Ok(_) => forward(&out[before..]),
        }
    }
}

async fn read_all(fd: OwnedFd, max: u64) -> Vec<u8> {
    let Ok(rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let _ = rx.take(max).read_to_end(&mut out).await;
    out
}

/// Routes zygote events to the runs waiting for them.
fn spawn_event_reader(
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
                FromZygote::Launcher { sandbox, pids } => {
                    if let Some(channel) = fds.into_iter().next() {
                        launchers
                            .lock()
                            .expect("launchers lock")
                            .push_back(Launcher {
                                sandbox: *sandbox,
                                pids: pids.clone(),
                                channel,
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
