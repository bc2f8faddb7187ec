//! The engine: its configuration, the start of its zygote, and what the host enforces.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use forkbox_queue::schema::{EffectiveLimits, Job, JobCeilings, Network};
use tokio::sync::Semaphore;

use super::defaults::{DEFAULT_ALLOWLIST, DEFAULT_ROOT_MAPPED_ID, DEFAULT_WORK_DIR};
use super::events::{spawn_event_reader, Launchers, Waiters};
use super::payload::job_env;
use super::staging;
use crate::sandbox::isolate::cgroup;
use crate::sandbox::isolate::rootfs::RootSource;
use crate::sandbox::isolate::setup_error::SetupError;
use crate::sandbox::isolate::sockets;
use crate::sandbox::kernel::sys;
use crate::sandbox::process::identity;
use crate::sandbox::process::wire::{self, FromZygote, ToZygote, ZygoteConfig};
use crate::sandbox::runtime;

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
    /// The most a job may ask for; a job asking for more is `invalid`. The defaults must lie
    /// within them.
    pub ceilings: JobCeilings,
    /// Host id of the sandbox's root when running as host root.
    pub root_mapped_id: u32,
    /// Where to create the staging directory.
    pub runtime_dir: PathBuf,
    /// One network namespace per sandbox (default) rather than one shared by all.
    pub net_per_sandbox: bool,
    /// The network of a job that does not ask for one; the sandboxes built ahead of demand
    /// are built for it.
    pub network_default: Network,
    /// Cap on the bytes of collected files per job.
    pub collect_max_bytes: u64,
    /// Use cgroup v2 when delegated (`Some(probe source)`), never (`None`).
    pub cgroup: Option<CgroupSource>,
    /// Warm a Python interpreter in the zygote for jobs with `"runtime": "python"`.
    pub python: Option<runtime::python::PythonSettings>,
}

/// Concurrent sandboxes when told nothing: one per CPU (one in all when the count is unknown).
pub fn default_slots() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
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
            slots: default_slots(),
            root: RootSource::Allowlist(DEFAULT_ALLOWLIST.iter().map(PathBuf::from).collect()),
            work_dir: DEFAULT_WORK_DIR.into(),
            defaults: EffectiveLimits::default(),
            ceilings: JobCeilings::default(),
            root_mapped_id: DEFAULT_ROOT_MAPPED_ID,
            runtime_dir: std::env::temp_dir(),
            net_per_sandbox: true,
            network_default: Network::default(),
            collect_max_bytes: 8 * 1024 * 1024,
            cgroup: Some(CgroupSource::default()),
            python: None,
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
    ZygoteStart(SetupError),
    #[error("zygote set-up failed: {0}")]
    ZygoteFailed(String),
    #[error("the zygote exited during start-up")]
    ZygoteGone,
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("raising the open files limit (RLIMIT_NOFILE) to its hard limit: {0}")]
    OpenFilesLimit(nix::errno::Errno),
}

/// How the node enforces each limit on this host.
#[derive(Debug, Clone)]
pub struct Mechanisms {
    pub cgroup: cgroup::Delegation,
    pub seccomp_instructions: usize,
    pub identity: String,
    /// The warm Python runtime.
    pub python: runtime::python::PythonRuntime,
}

pub(super) struct Inner {
    pub(super) control: OwnedFd,
    pub(super) waiters: Waiters,
    pub(super) launchers: Launchers,
    pub(super) alive: Arc<AtomicBool>,
    /// Shared with the runtime's engine: together they run at most `slots` jobs.
    pub(super) slots: Arc<Semaphore>,
    pub(super) config: EngineConfig,
    pub(super) cgroups: Option<cgroup::Tree>,
    pub(super) mechanisms: Mechanisms,
    pub(super) staging: PathBuf,
    pub(super) zygote: Mutex<std::process::Child>,
    /// The environment the warm interpreter was initialised in.
    pub(super) warm_env: Vec<(String, String)>,
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

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit, before the zygote inherits it.
///
/// Descriptors sent over a Unix socket count, while they are in flight, against the sending
/// process's user, and a send fails with ETOOMANYREFS once that count is over the sender's
/// `RLIMIT_NOFILE`. Every sandbox maps to one host uid (the node's own when it runs rootless),
/// so a job that keeps descriptors in flight (up to its own `open_files`, plus one message)
/// raises the count for every process of that uid. The engine, the zygote and each launcher
/// pass every job its descriptors: with a soft limit below the jobs' maximum (1024 is a common
/// default), one job made every other job of the node fail to start.
fn raise_open_files_limit() -> Result<(), EngineError> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(EngineError::OpenFilesLimit)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(EngineError::OpenFilesLimit)?;
    }
    Ok(())
}

/// Request ids, unique in the process: two engines may share a cgroup tree, whose job
/// cgroups are named after them.
pub(super) static NEXT_REQ: AtomicU64 = AtomicU64::new(1);

/// A warm sandbox engine. Cheap to clone; all clones share one zygote.
///
/// With a warm runtime configured, the engine runs two zygotes: the interpreter lives in a
/// zygote of its own, which builds the sandboxes of jobs asking for the runtime, so every
/// other sandbox is forked from (and execs away) a small zygote without it. An interpreter in
/// the only zygote made every `/bin/true` sandbox cost about a third more CPU
/// (`docs/benchmarks.md`).
#[derive(Clone)]
pub struct Engine {
    pub(super) inner: Arc<Inner>,
    /// The engine of the runtime's zygote, for jobs with a `runtime`.
    pub(super) runtime: Option<Arc<Engine>>,
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
    ///
    /// With the runtime configured there are two zygotes; they start side by side, so the
    /// node waits for the slower one (the interpreter's warm-up), not for their sum.
    pub fn start(config: EngineConfig) -> Result<Engine, EngineError> {
        if config.python.is_none() {
            return Self::start_zygote(config, None, true);
        }
        let slots = Arc::new(Semaphore::new(config.slots));
        let plain = Self::spawn_zygote(config.clone(), Some(slots.clone()), false)?;
        let (plain, runtime) = std::thread::scope(|scope| {
            let plain = scope.spawn(move || plain.serve());
            let runtime = Self::start_zygote(config, Some(slots), true);
            let plain = plain
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (plain, runtime)
        });
        let (plain, runtime) = (plain?, runtime?);
        let mut inner = plain.inner;
        // Fresh, so not shared yet: what the node reports is the runtime's engine's.
        if let Some(inner) = Arc::get_mut(&mut inner) {
            inner.mechanisms.python = runtime.inner.mechanisms.python.clone();
        }
        Ok(Engine {
            inner,
            runtime: Some(Arc::new(runtime)),
        })
    }

    /// Starts the runtime's zygote alone, for an engine whose every job asks for the runtime
    /// (`forkbox run --runtime python`): such a job runs there warm, or cold when its command
    /// line cannot run warm, so no plain zygote is needed. Without the runtime configured it
    /// is [`Engine::start`].
    pub fn start_runtime_only(config: EngineConfig) -> Result<Engine, EngineError> {
        Self::start_zygote(config, None, true)
    }

    /// Starts one zygote: with the interpreter when `warm` (and configured), sharing `slots`
    /// with another engine when given.
    fn start_zygote(
        config: EngineConfig,
        slots: Option<Arc<Semaphore>>,
        warm: bool,
    ) -> Result<Engine, EngineError> {
        Self::spawn_zygote(config, slots, warm)?.serve()
    }

    /// The first half of a zygote's start: the host-side set-up (staging, cgroup tree),
    /// the zygote process and its configuration. What touches the node's own state happens
    /// here, one zygote at a time; [`Spawned::serve`] then only talks to that zygote.
    fn spawn_zygote(
        config: EngineConfig,
        slots: Option<Arc<Semaphore>>,
        warm: bool,
    ) -> Result<Spawned, EngineError> {
        if config.slots == 0 {
            return Err(EngineError::Config("slots must be at least 1".into()));
        }
        let mut config = config;
        // A maximum below a built-in default lowers the default: jobs that set nothing get it.
        config.defaults = config.ceilings.clamp_defaults(&config.defaults);
        if let RootSource::Image(dir) = &config.root {
            if !dir.join("bin").exists() && !dir.join("usr").is_dir() {
                return Err(EngineError::Config(format!(
                    "rootfs {} does not look like a root filesystem (no bin or usr)",
                    dir.display()
                )));
            }
        }
        raise_open_files_limit()?;
        let staging = staging::make_staging(&config.runtime_dir).map_err(
            |staging::StagingError { path, source }| EngineError::Staging { path, source },
        )?;
        // Before any child starts: the zygote and every sandbox must begin in the node's
        // supervisor leaf, never in the delegated cgroup itself.
        let (delegation, cgroups) = cgroup_tree(config.cgroup.as_ref());
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
        // running jobs end; the zygote exits when the engine's channel closes. It stays in the
        // node's session: every sandbox's init leaves it for a session (and an autogroup) of
        // its own before anything else, and no sandbox can see the zygote, so no job reaches
        // the node's autogroup. A session of its own would also put the zygote in an
        // autogroup of its own, which the scheduler weighs as one against every other
        // session's: on a busy host that raised the spawn latency by half (docs/benchmarks.md).
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        sys::pass_fd(&mut command, std::os::fd::AsRawFd::as_raw_fd(&theirs), 3);
        let child = command.spawn().map_err(|source| EngineError::SpawnZygote {
            exe: config.zygote_exe.clone(),
            source,
        })?;
        drop(theirs);
        let pid = child.id();
        let guard = ZygoteGuard(Some(child));

        let warm_env = job_env(&Job::default(), &config.work_dir);
        let interpreter = config
            .python
            .as_ref()
            .filter(|_| warm)
            .map(|p| runtime::python::probe(&p.executable));
        let python_request = match (&interpreter, &config.python) {
            (Some(Ok(i)), Some(p)) => Some(runtime::python::WarmRequest {
                library: i.library.clone(),
                preload: p.preload.clone(),
                env: warm_env.clone(),
            }),
            _ => None,
        };
        let zcfg = ZygoteConfig {
            root: config.root.clone(),
            staging: staging.clone(),
            work_dir: config.work_dir.clone(),
            defaults: config.defaults,
            pool: config.slots + 1,
            net_per_sandbox: config.net_per_sandbox,
            network_default: config.network_default,
            cgroup_handshake: cgroups.is_some(),
            python: python_request,
            sandbox_id: identity::sandbox_id(),
            // Read here, in the node's network namespace, before the zygote leaves it.
            socket_buffer_max: sockets::buffer_max(Path::new("/proc")),
        };
        wire::send(ours.as_fd(), &zcfg, &[]).map_err(EngineError::Channel)?;
        Ok(Spawned {
            config,
            slots,
            staging,
            delegation,
            cgroups,
            ours,
            pid,
            guard,
            interpreter,
            warm_env,
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Whether `argv` (with the job's environment `env`) runs in the warm Python
    /// interpreter, and how; the error says why it runs cold.
    pub(super) fn warm_plan(
        &self,
        job: &Job,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<runtime::python::WarmPlan, String> {
        let inner = &self.inner;
        let (interpreter, info) = match &inner.mechanisms.python {
            runtime::python::PythonRuntime::Ready { interpreter, info } => (interpreter, info),
            runtime::python::PythonRuntime::Disabled => {
                return Err("this node has no warm Python runtime".into())
            }
            runtime::python::PythonRuntime::Unavailable(why) => {
                return Err(format!("the warm Python runtime is unavailable: {why}"))
            }
        };
        if job.argv.is_none() {
            return Err("a shell command (cmd) runs cold; give argv".into());
        }
        let RootSource::Allowlist(allowlist) = &inner.config.root else {
            return Err("the warm interpreter runs only on the host allowlist root".into());
        };
        let work = &inner.config.work_dir;
        let cwd = match &job.cwd {
            Some(c) if c.starts_with('/') => c.clone(),
            Some(c) => format!("{}/{c}", work.trim_end_matches('/')),
            None => work.clone(),
        };
        let cx = runtime::python::Context {
            env,
            warm_env: &inner.warm_env,
            files: &job.files,
            cwd: &cwd,
            work_dir: work,
            allowlist,
            interpreter,
            modules: &info.modules,
        };
        runtime::python::plan(argv, &cx, &|p| std::fs::canonicalize(p).ok())
    }

    /// The zygote's host pid: every sandbox is a child of it, so its CPU time with its reaped
    /// children's is what the sandboxes cost (benchmarks read it from `/proc`).
    pub fn zygote_pid(&self) -> Option<u32> {
        self.inner.zygote.lock().ok().map(|c| c.id())
    }

    /// Whether the zygotes still serve; once one is gone its runs fail with `error`.
    pub fn is_alive(&self) -> bool {
        self.inner.alive.load(Ordering::Acquire)
            && self.runtime.as_ref().is_none_or(|r| r.is_alive())
    }

    /// The host pid of the warm runtime's zygote, when it has one of its own.
    pub fn runtime_zygote_pid(&self) -> Option<u32> {
        self.runtime.as_ref().and_then(|r| r.zygote_pid())
    }

    /// How limits and identity are enforced on this host.
    pub fn mechanisms(&self) -> &Mechanisms {
        &self.inner.mechanisms
    }
}

impl Engine {
    pub(super) fn send(&self, msg: ToZygote) {
        let _ = wire::send(self.inner.control.as_fd(), &msg, &[]);
    }
}

/// A zygote spawned and configured, not yet serving: [`Spawned::serve`] finishes its start.
struct Spawned {
    config: EngineConfig,
    slots: Option<Arc<Semaphore>>,
    staging: PathBuf,
    delegation: cgroup::Delegation,
    cgroups: Option<cgroup::Tree>,
    ours: OwnedFd,
    pid: u32,
    guard: ZygoteGuard,
    interpreter: Option<Result<runtime::python::Interpreter, String>>,
    warm_env: Vec<(String, String)>,
}

impl Spawned {
    /// The second half: the zygote's id maps, then its *ready* (after its namespaces, the
    /// seccomp compilation and, for the runtime's, the interpreter's warm-up).
    fn serve(self) -> Result<Engine, EngineError> {
        let ours = self.ours;
        expect(&ours, |m| matches!(m, FromZygote::NeedMaps))?;
        let identity = identity::write_zygote_maps(self.pid, self.config.root_mapped_id).map_err(
            |e| match e {
                identity::IdentityError::IdMap { path, source } => {
                    EngineError::IdMap { path, source }
                }
                e @ (identity::IdentityError::HostRootMapped
                | identity::IdentityError::NoSandboxId(_)) => EngineError::Config(e.to_string()),
            },
        )?;
        wire::send(ours.as_fd(), &ToZygote::MapsWritten, &[]).map_err(EngineError::Channel)?;
        let (seccomp_instructions, warmed) =
            match expect(&ours, |m| matches!(m, FromZygote::Ready { .. }))? {
                FromZygote::Ready {
                    seccomp_instructions,
                    python,
                } => (seccomp_instructions, python),
                _ => unreachable!("checked by expect"),
            };
        let python = match self.interpreter {
            None => runtime::python::PythonRuntime::Disabled,
            Some(i) => runtime::python::PythonRuntime::from_parts(i, warmed),
        };

        let waiters: Waiters = Arc::default();
        let launchers: Launchers = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let reader = ours.try_clone().map_err(|e| {
            EngineError::Channel(nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0)))
        })?;
        spawn_event_reader(reader, waiters.clone(), launchers.clone(), alive.clone());
        let slots = self
            .slots
            .unwrap_or_else(|| Arc::new(Semaphore::new(self.config.slots)));
        Ok(Engine {
            runtime: None,
            inner: Arc::new(Inner {
                control: ours,
                waiters,
                launchers,
                alive,
                slots,
                mechanisms: Mechanisms {
                    cgroup: self.delegation,
                    seccomp_instructions,
                    identity,
                    python,
                },
                warm_env: self.warm_env,
                config: self.config,
                cgroups: self.cgroups,
                staging: self.staging,
                zygote: Mutex::new(self.guard.take()),
            }),
        })
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
        })) => Err(EngineError::ZygoteStart(error)),
        Ok(Some(other)) => Err(EngineError::ZygoteFailed(format!(
            "unexpected message {:?}",
            other.message
        ))),
        Ok(None) => Err(EngineError::ZygoteGone),
        Err(e) => Err(EngineError::Channel(e)),
    }
}

/// Probes for cgroup v2 delegation and, when delegated, moves this process into the
/// supervisor leaf. A tree that cannot be prepared is reported as unavailable with the reason.
fn cgroup_tree(source: Option<&CgroupSource>) -> (cgroup::Delegation, Option<cgroup::Tree>) {
    let Some(src) = source else {
        let off = cgroup::Delegation::Unavailable("disabled by configuration".into());
        return (off, None);
    };
    let delegation = cgroup::probe(&src.mountinfo, &src.self_cgroup).delegation;
    let cgroup::Delegation::Delegated(dir) = &delegation else {
        return (delegation, None);
    };
    match cgroup::Tree::prepare(dir, std::process::id()) {
        Ok(tree) => (delegation, Some(tree)),
        Err(e) => {
            tracing::warn!("cgroup v2 limits unavailable, rlimit fallback: {e}");
            (cgroup::Delegation::Unavailable(e.to_string()), None)
        }
    }
}
