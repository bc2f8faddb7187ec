//! The zygote: a single-threaded process that clones sandboxes ahead of demand and watches them.
//!
//! It is exec'd fresh by the engine (never forked from the multi-threaded node), enters its own
//! user, mount, network, ipc and uts namespaces once, compiles the seccomp program once, and then
//! runs one epoll loop over: the engine's channel, each warming sandbox's socket, each running
//! sandbox's exec-notify pipe, pidfd and deadline timerfd. Keeping a pool of fully built
//! sandboxes (namespaces entered, root pivoted, waiting for a job) takes all set-up off the
//! spawn critical path; the loop only hands descriptors over. The deadline is an absolute
//! CLOCK_MONOTONIC timerfd armed at the program's exec, and the kill goes through the init's
//! pidfd, so the watchdog's precision is the scheduler's, not a polling tick's.

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use forkbox_queue::schema::Network;
use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::unistd::Pid;

use super::identity;
use super::watchdog::Deadline;
use super::wire::{self, ExecNote, Exit, FromInit, FromZygote, ToInit, ToZygote, ZygoteConfig};
use crate::sandbox::isolate::hardening::Hardening;
use crate::sandbox::isolate::netns::{NetFactory, NetNs};
use crate::sandbox::isolate::setup_error::SetupError;
use crate::sandbox::isolate::{limits, seccomp, usage};
use crate::sandbox::kernel::clock::mono_ns;
use crate::sandbox::kernel::sys::{self, Forked, SingleThreaded};
use crate::sandbox::kernel::syscalls::{Host, Syscalls};

/// Entry point of `forkbox __zygote`: the engine's channel is descriptor 3.
pub fn main() -> ! {
    let control = match sys::take_inherited(3) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("forkbox zygote: no engine channel on fd 3 ({e}); this command is internal");
            sys::exit_now(2)
        }
    };
    let code = match start(&control) {
        Ok((one, cfg, hardening)) => {
            Zygote::new(one, control, cfg, hardening).run();
            0
        }
        Err(error) => {
            let _ = wire::send(control.as_fd(), &FromZygote::StartFailed { error }, &[]);
            1
        }
    };
    sys::exit_now(code)
}

fn start(control: &OwnedFd) -> Result<(SingleThreaded, ZygoteConfig, ByNetwork), SetupError> {
    // Every sandbox is a fork of this process.
    let one = SingleThreaded::check()
        .ok_or_else(|| SetupError::new("zygote: must be single-threaded"))?;
    // While this process still holds the node's capabilities (before its user namespace):
    // with CAP_SYS_RESOURCE this makes 0 the lowest oom_score_adj any sandbox can go back to.
    // It fails only where lowering needs the capability (a node held above 0), and then the
    // floor its sandboxes inherit is that higher value: no job can go lower either way.
    let _ = limits::floor_oom_score();
    let cfg: ZygoteConfig = match wire::recv(control.as_fd()) {
        Ok(Some(m)) => m.message,
        other => {
            return Err(SetupError::text(
                "zygote: no configuration from the engine",
                format!("{:?}", other.err()),
            ))
        }
    };
    // The engine writes the maps; until then the zygote has no identity in its namespace.
    identity::enter_user_namespace(control)?;
    own_namespaces(&Host)?;
    // In the zygote's own (private) mount namespace, so only its sandboxes see it.
    crate::sandbox::isolate::rootfs::build_template(&cfg.root, &cfg.staging, &cfg.work_dir)?;
    // The watchdog's kills should not queue behind the jobs it watches. Only possible with
    // privilege; sandboxes go back to the normal priority as their first step.
    super::priority::raise_zygote();
    let hardening = ByNetwork::compile()?;
    // Before the first sandbox, so that every one of them is a fork of the warm interpreter.
    let python = cfg
        .python
        .as_ref()
        .map(crate::sandbox::runtime::python::warm_up);
    let ready = FromZygote::Ready {
        seccomp_instructions: hardening.get(cfg.network_default).seccomp.len(),
        python,
    };
    wire::send(control.as_fd(), &ready, &[])
        .map_err(|e| SetupError::errno("zygote: report ready", e))?;
    Ok((one, cfg, hardening))
}

/// What every sandbox of one network mode hardens itself with: the modes differ in the socket
/// families their seccomp programs allow (`seccomp::socket_families`). Both are compiled once,
/// before any sandbox exists.
struct ByNetwork {
    none: Hardening,
    loopback: Hardening,
}

impl ByNetwork {
    fn compile() -> Result<ByNetwork, SetupError> {
        let last_capability = sys::last_capability();
        let of = |network| -> Result<Hardening, SetupError> {
            Ok(Hardening {
                seccomp: seccomp::compile_for(network)
                    .map_err(|e| SetupError::text("compile the seccomp policy", e))?,
                last_capability,
            })
        };
        Ok(ByNetwork {
            none: of(Network::None)?,
            loopback: of(Network::Loopback)?,
        })
    }

    fn get(&self, network: Network) -> &Hardening {
        match network {
            Network::None => &self.none,
            Network::Loopback => &self.loopback,
        }
    }
}

/// The zygote's own namespaces, made after its user namespace so that they are owned by it:
/// mount (every mount made private before anything else, so nothing the sandboxes mount
/// propagates to the host), network (loopback up), ipc and uts (its hostname).
fn own_namespaces(k: &impl Syscalls) -> Result<(), SetupError> {
    let ns = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS;
    k.unshare(ns)
        .map_err(|e| SetupError::errno("unshare mount/net/ipc/uts namespaces", e))?;
    k.mount(
        None,
        Path::new("/"),
        None,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None,
    )
    .map_err(|e| SetupError::errno("make-rprivate", e).at("/"))?;
    k.loopback_up()
        .map_err(|e| SetupError::errno("bring up lo", e))?;
    k.sethostname("forkbox")
        .map_err(|e| SetupError::errno("sethostname", e))?;
    Ok(())
}

/// The zygote's epoll set and what each of its tokens refers to.
struct Poll {
    epoll: Epoll,
    tokens: HashMap<u64, Source>,
    next_token: u64,
}

impl Poll {
    /// Fails when the kernel refuses the watch: ENOSPC once the host user's
    /// `fs.epoll.max_user_watches` are taken, which every sandbox of the node shares. A source
    /// that is not watched is never heard from, so every caller fails closed.
    fn watch(&mut self, fd: BorrowedFd<'_>, source: Source) -> nix::Result<()> {
        let token = self.next_token;
        self.next_token += 1;
        // Epoll keeps the number, not a reference: every source is unwatched before its close.
        self.epoll
            .add(fd, EpollEvent::new(EpollFlags::EPOLLIN, token))?;
        self.tokens.insert(token, source);
        Ok(())
    }

    fn unwatch(&mut self, fd: BorrowedFd<'_>, source: Source) {
        let _ = self.epoll.delete(fd);
        self.tokens.retain(|_, s| *s != source);
    }
}

/// What an epoll token refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Control,
    InitSocket(i32),
    ExecNotify(i32),
    Deadline(i32),
    Exit(i32),
}

#[derive(Debug, PartialEq, Eq)]
enum Phase {
    Warming,
    /// Ready, in the zygote's queue.
    Ready,
    /// Ready, given to the engine, which hands it a job itself.
    Handed,
    Running,
}

struct Sandbox {
    /// Names the sandbox to the engine: unlike the pid, never reused.
    id: u64,
    pid: Pid,
    pidfd: OwnedFd,
    sock: OwnedFd,
    phase: Phase,
    req: u64,
    timeout_ms: u64,
    exec_notify: Option<OwnedFd>,
    notify_bytes: Vec<u8>,
    deadline: Option<Deadline>,
    exit: Exit,
    setup_error: Option<SetupError>,
    /// Host pid of the launcher (learned from its ready message's credentials).
    launcher: Option<i32>,
    /// What its processes had used when it was killed from outside (see `usage.rs`).
    used_at_kill: Option<sys::Usage>,
    /// A staged job runs here: its usage at a kill is its program's, not the compiler's.
    staged: bool,
    /// The network it was built for.
    network: Network,
    /// A session's sandbox: long-lived and outside the engine's slots, so not counted as a
    /// running job when the zygote decides whether to build spares.
    session: bool,
    /// Its `none` network namespace, handed back to the factory once the sandbox is gone.
    netns: Option<NetNs>,
}

impl Sandbox {
    /// Reads what the sandbox's processes have used, before a kill from outside makes the
    /// kernel drop it.
    fn note_usage(&mut self) {
        if self.phase == Phase::Running && self.used_at_kill.is_none() {
            self.used_at_kill = usage::sandbox_proc(self.pid.as_raw()).map(|p| usage::used(&p));
        }
    }

    /// Kills a running sandbox (and with it the whole pid namespace).
    fn kill(&mut self) {
        self.note_usage();
        let _ = sys::pidfd_kill(&self.pidfd);
    }

    /// Kills a running sandbox that cannot be watched to its end; its outcome says why.
    fn fail_closed(&mut self, error: SetupError) {
        self.kill();
        self.exit.killed = true;
        self.exit.error = Some(error);
    }
}

struct Request {
    req: u64,
    timeout_ms: u64,
    stage_ms: Option<u64>,
    session: bool,
    network: Network,
    fds: Vec<OwnedFd>,
}

struct Zygote {
    /// This process has one thread, so it may clone sandboxes.
    one: SingleThreaded,
    control: OwnedFd,
    cfg: ZygoteConfig,
    hardening: ByNetwork,
    poll: Poll,
    sandboxes: HashMap<i32, Sandbox>,
    ready: VecDeque<i32>,
    next_id: u64,
    by_req: HashMap<u64, i32>,
    pending: VecDeque<Request>,
    /// Makes each sandbox's network namespace and keeps the free `none` ones (with
    /// `net_per_sandbox`).
    net: NetFactory,
    /// The last warm-up failure: while set, sandboxes are only built on demand, so a broken
    /// host fails each job with the reason instead of spinning.
    broken: Option<SetupError>,
}

impl Zygote {
    fn new(
        one: SingleThreaded,
        control: OwnedFd,
        cfg: ZygoteConfig,
        hardening: ByNetwork,
    ) -> Zygote {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).unwrap_or_else(|e| {
            eprintln!("forkbox zygote: epoll: {e}");
            sys::exit_now(1)
        });
        let net = NetFactory::new(cfg.pool).unwrap_or_else(|e| {
            eprintln!("forkbox zygote: {e}");
            sys::exit_now(1)
        });
        let mut z = Zygote {
            one,
            control,
            cfg,
            hardening,
            poll: Poll {
                epoll,
                tokens: HashMap::new(),
                next_token: 1,
            },
            sandboxes: HashMap::new(),
            ready: VecDeque::new(),
            next_id: 1,
            by_req: HashMap::new(),
            pending: VecDeque::new(),
            net,
            broken: None,
        };
        if let Err(e) = z.poll.watch(z.control.as_fd(), Source::Control) {
            // Unwatched, the engine's channel would never be read, nor its close seen.
            eprintln!("forkbox zygote: epoll: watch the engine's channel: {e}");
            sys::exit_now(1)
        }
        z
    }

    fn run(mut self) {
        self.replenish();
        let mut events = [EpollEvent::empty(); 64];
        loop {
            let n = match self.poll.epoll.wait(&mut events, EpollTimeout::NONE) {
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    eprintln!("forkbox zygote: epoll_wait: {e}");
                    return;
                }
            };
            // Deadlines first: a kill must never wait behind other work of the same wake-up.
            // Then the engine's messages: a sandbox the engine took is announced there before
            // its job starts, so that must be known before the sandbox's exit is handled.
            let mut ready: Vec<Source> = events[..n]
                .iter()
                .filter_map(|e| self.poll.tokens.get(&e.data()).copied())
                .collect();
            ready.sort_by_key(|s| match s {
                Source::Deadline(_) => 0,
                Source::Control => 1,
                _ => 2,
            });
            for source in ready {
                match source {
                    Source::Control => {
                        if !self.on_control() {
                            self.shutdown();
                            return;
                        }
                    }
                    Source::InitSocket(pid) => self.on_init_message(pid),
                    Source::ExecNotify(pid) => self.on_exec_notify(pid),
                    Source::Deadline(pid) => self.on_deadline(pid),
                    Source::Exit(pid) => self.on_exit(pid),
                }
            }
            self.dispatch();
            self.replenish();
        }
    }

    fn shutdown(&mut self) {
        for sb in self.sandboxes.values() {
            let _ = sys::pidfd_kill(&sb.pidfd);
        }
    }

    /// Handles every message the engine has queued; false when the engine is gone.
    fn on_control(&mut self) -> bool {
        loop {
            if !self.on_control_message() {
                return false;
            }
            if !wire::has_message(self.control.as_fd()) {
                return true;
            }
        }
    }

    /// Handles one engine message; false when the engine is gone.
    fn on_control_message(&mut self) -> bool {
        let msg = match wire::recv::<ToZygote>(self.control.as_fd()) {
            Ok(Some(m)) => m,
            Ok(None) => return false,
            Err(Errno::EAGAIN) => return true,
            Err(e) => {
                eprintln!("forkbox zygote: engine channel: {e}");
                return false;
            }
        };
        match msg.message {
            ToZygote::Spawn {
                req,
                timeout_ms,
                network,
                stage_ms,
                session,
            } => {
                self.pending.push_back(Request {
                    req,
                    timeout_ms,
                    stage_ms,
                    session,
                    network,
                    fds: msg.fds,
                });
            }
            ToZygote::Started {
                req,
                sandbox,
                timeout_ms,
                stage_ms,
                session,
            } => self.on_started(req, sandbox, (timeout_ms, stage_ms), session, msg.fds),
            ToZygote::Kill { req } => {
                if let Some(pos) = self.pending.iter().position(|r| r.req == req) {
                    self.pending.remove(pos);
                    self.report(Exit {
                        req,
                        exit_ns: mono_ns(),
                        killed: true,
                        ..Exit::default()
                    });
                } else if let Some(sb) = self
                    .by_req
                    .get(&req)
                    .and_then(|pid| self.sandboxes.get_mut(pid))
                {
                    sb.exit.killed = true;
                    sb.kill();
                }
            }
            ToZygote::Release { req } => {
                if let Some(sb) = self
                    .by_req
                    .get(&req)
                    .and_then(|pid| self.sandboxes.get(pid))
                {
                    let _ = wire::send(sb.sock.as_fd(), &ToInit::Release, &[]);
                }
            }
            ToZygote::MapsWritten => {}
        }
        true
    }

    fn report(&self, exit: Exit) {
        let _ = wire::send(self.control.as_fd(), &FromZygote::Exited(exit), &[]);
    }

    /// The engine handed job `req` to a sandbox it was given: from now on it runs, and the
    /// exec-notify pipe in `fds` arms its watchdog.
    fn on_started(
        &mut self,
        req: u64,
        sandbox: u64,
        (timeout_ms, stage_ms): (u64, Option<u64>),
        session: bool,
        fds: Vec<OwnedFd>,
    ) {
        let found = self
            .sandboxes
            .iter()
            .find(|(_, sb)| sb.id == sandbox && sb.phase == Phase::Handed)
            .map(|(pid, _)| *pid);
        let (Some(pid), Some(notify_r)) = (found, fds.into_iter().next()) else {
            // It ended meanwhile (its end was reported as `LauncherGone`); the engine sees its
            // job channel closed too.
            self.report(Exit {
                req,
                exit_ns: mono_ns(),
                error: Some(SetupError::new("the sandbox ended before its job started")),
                ..Exit::default()
            });
            return;
        };
        self.start_running(pid, req, (timeout_ms, stage_ms), session, notify_r);
    }

    /// Sandbox `pid` has job `req`: it runs from now on, and its exec-notify pipe arms its
    /// watchdog.
    fn start_running(
        &mut self,
        pid: i32,
        req: u64,
        (timeout_ms, stage_ms): (u64, Option<u64>),
        session: bool,
        notify_r: OwnedFd,
    ) {
        let Some(sb) = self.sandboxes.get_mut(&pid) else {
            return;
        };
        if let Some(ms) = stage_ms {
            // A staged job's compile stage runs before the exec: its launcher bounds it, and
            // this deadline bounds the launcher (the exec re-arms it for the program).
            match Deadline::arm(mono_ns(), ms) {
                Ok(deadline) => match self.poll.watch(deadline.as_fd(), Source::Deadline(pid)) {
                    Ok(()) => sb.deadline = Some(deadline),
                    Err(e) => sb.fail_closed(SetupError::errno(
                        "watch the compile stage's deadline (epoll_ctl)",
                        e,
                    )),
                },
                Err(e) => sb.fail_closed(e),
            }
        }
        sb.phase = Phase::Running;
        sb.session = session;
        sb.staged = stage_ms.is_some();
        sb.req = req;
        sb.timeout_ms = timeout_ms;
        sb.exit.req = req;
        if let Err(e) = self.poll.watch(notify_r.as_fd(), Source::ExecNotify(pid)) {
            // The exec notice arms the watchdog: unheard, the program would have no deadline.
            sb.fail_closed(SetupError::errno(
                "watch the program's start (epoll_ctl)",
                e,
            ));
        }
        sb.exec_notify = Some(notify_r);
        self.by_req.insert(req, pid);
    }

    /// How many sandboxes run a job (sessions take no slot, so they are not counted).
    fn running_jobs(&self) -> usize {
        self.sandboxes
            .values()
            .filter(|s| s.phase == Phase::Running && !s.session)
            .count()
    }

    /// How many sandboxes built for `network` are in `phase`.
    fn count_of(&self, phase: Phase, network: Network) -> usize {
        self.sandboxes
            .values()
            .filter(|s| s.phase == phase && s.network == network)
            .count()
    }

    /// How many jobs for `network` wait in the zygote's queue.
    fn pending_of(&self, network: Network) -> usize {
        self.pending.iter().filter(|r| r.network == network).count()
    }

    fn network_of(&self, pid: i32) -> Option<Network> {
        self.sandboxes.get(&pid).map(|sb| sb.network)
    }

    /// Gives a ready sandbox to the engine, which then hands it a job (after placing it in
    /// the job's cgroup, if any) without a trip through the zygote. Kept here instead while
    /// jobs wait in the zygote's own queue.
    fn hand_to_engine(&mut self, pid: i32) -> bool {
        let Some(network) = self.network_of(pid) else {
            return false;
        };
        if self.pending_of(network) > 0 {
            return false;
        }
        let Some(sb) = self.sandboxes.get_mut(&pid) else {
            return false;
        };
        let Some(launcher) = sb.launcher else {
            // Without the launcher's pid the program could not be placed in its cgroup.
            return false;
        };
        let launcher = FromZygote::Launcher {
            sandbox: sb.id,
            pids: vec![pid, launcher],
            network: sb.network,
        };
        if wire::send(self.control.as_fd(), &launcher, &[sb.sock.as_fd()]).is_err() {
            return false;
        }
        sb.phase = Phase::Handed;
        true
    }

    /// Hands pending jobs to ready sandboxes built for their network, oldest first, then the
    /// sandboxes still ready to the engine.
    fn dispatch(&mut self) {
        loop {
            // The oldest job for which a sandbox of its network is ready.
            let found = self.pending.iter().enumerate().find_map(|(i, r)| {
                self.ready
                    .iter()
                    .position(|pid| self.network_of(*pid) == Some(r.network))
                    .map(|at| (i, at))
            });
            let Some((i, at)) = found else {
                break;
            };
            let pid = self.ready.remove(at).expect("found above");
            let request = self.pending.remove(i).expect("found above");
            let (notify_r, notify_w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
                Ok(p) => p,
                Err(e) => {
                    self.ready.push_front(pid);
                    self.report(Exit {
                        req: request.req,
                        exit_ns: mono_ns(),
                        error: Some(SetupError::errno("exec-notify pipe", e)),
                        ..Exit::default()
                    });
                    continue;
                }
            };
            let handshake = self.cfg.cgroup_handshake;
            let sb = self.sandboxes.get_mut(&pid).expect("ready sandboxes exist");
            let mut fds: Vec<_> = request.fds.iter().map(|f| f.as_fd()).collect();
            fds.push(notify_w.as_fd());
            if wire::send(
                sb.sock.as_fd(),
                &ToInit::Run {
                    wait_for_release: handshake,
                },
                &fds,
            )
            .is_err()
            {
                // That sandbox died while idle; its exit is handled by its pidfd. Try another.
                self.pending.insert(i, request);
                continue;
            }
            drop(fds);
            drop(request.fds);
            drop(notify_w);
            let sb_launcher = sb.launcher;
            self.start_running(
                pid,
                request.req,
                (request.timeout_ms, request.stage_ms),
                request.session,
                notify_r,
            );
            // A session's usage is read from its init's `/proc`: the engine needs its pid.
            if handshake || request.session {
                let _ = wire::send(
                    self.control.as_fd(),
                    &FromZygote::Assigned {
                        req: request.req,
                        pids: [Some(pid), sb_launcher].into_iter().flatten().collect(),
                    },
                    &[],
                );
            }
        }
        // What is left ready and wanted by no job waiting here goes to the engine.
        for pid in std::mem::take(&mut self.ready) {
            if !self.hand_to_engine(pid) {
                self.ready.push_back(pid);
            }
        }
    }

    /// Records a sandbox for `network` that could not be built and fails the oldest job
    /// waiting for one with the reason (fail closed); false when no such job was waiting.
    fn fail_next_pending(&mut self, network: Network, error: SetupError) -> bool {
        self.broken = Some(error.clone());
        let Some(i) = self.pending.iter().position(|r| r.network == network) else {
            return false;
        };
        let r = self.pending.remove(i).expect("found above");
        self.report(Exit {
            req: r.req,
            exit_ns: mono_ns(),
            error: Some(error),
            ..Exit::default()
        });
        true
    }

    /// Keeps `pool` sandboxes built or being built, and one being built for every job waiting
    /// in the zygote's own queue.
    ///
    /// Building a sandbox (mounts, namespace set-up, the expedited RCU grace periods they
    /// trigger) disturbs whatever runs on the other cores. So while jobs run and the ready
    /// sandboxes already cover every slot still free (the engine never runs more than
    /// `pool - 1` jobs at once), building waits until a job is over or a spare is taken: a
    /// short job then runs undisturbed, and any request the slots allow still finds a sandbox.
    ///
    /// Sandboxes given to the engine count as spares, but not for a job waiting here: the
    /// engine sent it here because it had none at that moment, and only the engine can use
    /// them, so counting them could leave the job waiting for ever.
    ///
    /// The pool is built for the node's default network; a job asking for the other one waits
    /// here for a sandbox built for it (a sandbox's seccomp program, loaded before any job
    /// exists, fixes its network).
    fn replenish(&mut self) {
        let default = self.cfg.network_default;
        // Sessions take no slot: a long-lived one must not lower the spares kept for jobs.
        let running = self.running_jobs();
        let handed = self.count_of(Phase::Handed, default);
        let free_slots = (self.cfg.pool - 1).saturating_sub(running).max(1);
        let ready = |z: &Self, network| z.count_of(Phase::Ready, network);
        if self.pending.is_empty() && running > 0 && ready(self, default) + handed >= free_slots {
            return;
        }
        loop {
            let own = ready(self, default) + self.count_of(Phase::Warming, default);
            let waiting = self.pending_of(default);
            let enough = if self.broken.is_some() {
                own >= waiting.min(1)
            } else {
                own + handed >= self.cfg.pool && own >= waiting
            };
            if enough {
                break;
            }
            if let Err(error) = self.clone_sandbox(default) {
                if !self.fail_next_pending(default, error) {
                    return;
                }
            }
        }
        let other = match default {
            Network::None => Network::Loopback,
            Network::Loopback => Network::None,
        };
        while ready(self, other) + self.count_of(Phase::Warming, other) < self.pending_of(other) {
            if let Err(error) = self.clone_sandbox(other) {
                if !self.fail_next_pending(other, error) {
                    return;
                }
            }
        }
    }

    fn clone_sandbox(&mut self, network: Network) -> Result<(), SetupError> {
        let (ours, theirs) =
            wire::seqpacket_pair().map_err(|e| SetupError::errno("socketpair", e))?;
        wire::pass_credentials(&ours).map_err(|e| SetupError::errno("SO_PASSCRED", e))?;
        let flags = libc::CLONE_NEWUSER
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWIPC
            | libc::CLONE_NEWUTS;
        // The sandbox's network namespace is not created by the clone but by the zygote (see
        // `netns`), and entered around the clone so the child starts in it.
        let net = if self.cfg.net_per_sandbox {
            Some(self.net.take(network)?)
        } else {
            None
        };
        let cloned = match &net {
            Some(ns) => self.net.clone_into(&self.one, ns, flags),
            None => self
                .one
                .clone_into_namespaces(flags)
                .map_err(|e| SetupError::errno("clone sandbox namespaces", e)),
        };
        // A loopback namespace is held by the sandbox's processes alone from here, and goes
        // when they do; a `none` one comes back to the factory then.
        let netns = net.filter(|_| network == Network::None);
        let (pid, pidfd) = match cloned {
            Err(e) => return Err(e),
            Ok(Forked::Child(one)) => {
                drop(ours);
                super::init::main(one, theirs, &self.cfg, self.hardening.get(network))
            }
            Ok(Forked::Parent { pid, pidfd }) => (pid, pidfd.expect("clone3 returns a pidfd")),
        };
        drop(theirs);
        if let Err(e) = identity::write_sandbox_maps(pid, &ours, self.cfg.sandbox_id) {
            self.abandon(pid, &pidfd);
            return Err(e);
        }
        let raw = pid.as_raw();
        let watched = self
            .poll
            .watch(ours.as_fd(), Source::InitSocket(raw))
            .and_then(|()| self.poll.watch(pidfd.as_fd(), Source::Exit(raw)));
        if let Err(e) = watched {
            self.poll.unwatch(ours.as_fd(), Source::InitSocket(raw));
            self.abandon(pid, &pidfd);
            return Err(SetupError::errno("watch the sandbox (epoll_ctl)", e));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.sandboxes.insert(
            raw,
            Sandbox {
                id,
                pid,
                pidfd,
                sock: ours,
                phase: Phase::Warming,
                req: 0,
                timeout_ms: 0,
                exec_notify: None,
                notify_bytes: Vec::new(),
                deadline: None,
                exit: Exit::default(),
                setup_error: None,
                launcher: None,
                used_at_kill: None,
                staged: false,
                network,
                session: false,
                netns,
            },
        );
        Ok(())
    }

    /// Kills and reaps a sandbox that could not be set up.
    fn abandon(&mut self, pid: Pid, pidfd: &OwnedFd) {
        let _ = sys::pidfd_kill(pidfd);
        let _ = nix::sys::wait::waitpid(pid, None);
    }

    fn on_init_message(&mut self, pid: i32) {
        let Some(sb) = self.sandboxes.get_mut(&pid) else {
            return;
        };
        let msg = wire::recv::<FromInit>(sb.sock.as_fd());
        match msg {
            Ok(Some(wire::Received {
                message: FromInit::Ready,
                sender_pid,
                ..
            })) => {
                // Ready comes from the launcher, the process that becomes the program.
                sb.launcher = sender_pid;
                sb.phase = Phase::Ready;
                self.broken = None;
                if !self.hand_to_engine(pid) {
                    self.ready.push_back(pid);
                }
            }
            Ok(Some(wire::Received {
                message: FromInit::SetupFailed { error },
                ..
            })) => {
                sb.setup_error = Some(error);
            }
            _ => {}
        }
        if let Some(sb) = self.sandboxes.get(&pid) {
            self.poll.unwatch(sb.sock.as_fd(), Source::InitSocket(pid));
        }
    }

    fn on_exec_notify(&mut self, pid: i32) {
        let Some(sb) = self.sandboxes.get_mut(&pid) else {
            return;
        };
        let Some(fd) = sb.exec_notify.as_ref() else {
            return;
        };
        let mut buf = [0u8; 4096];
        match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) => {}
            Ok(n) => {
                sb.notify_bytes.extend_from_slice(&buf[..n]);
                return;
            }
            Err(Errno::EINTR | Errno::EAGAIN) => return,
            Err(_) => {}
        }
        let timeout_ms = sb.timeout_ms;
        let stamp = ExecNote::decode(&sb.notify_bytes);
        if let Some(fd) = sb.exec_notify.take() {
            self.poll.unwatch(fd.as_fd(), Source::ExecNotify(pid));
        }
        let exec_ns = match stamp {
            Ok(ns) => ns,
            Err(reason) => {
                sb.exit.error = Some(reason);
                return;
            }
        };
        sb.exit.exec_ns = Some(exec_ns);
        if let Some(stage) = sb.deadline.take() {
            // The compile stage's deadline gives way to the program's.
            self.poll.unwatch(stage.as_fd(), Source::Deadline(pid));
        }
        // Fail closed: a program without a deadline is killed at once, and its outcome says
        // why.
        match Deadline::arm(exec_ns, timeout_ms) {
            Ok(deadline) => match self.poll.watch(deadline.as_fd(), Source::Deadline(pid)) {
                Ok(()) => sb.deadline = Some(deadline),
                Err(e) => sb.fail_closed(SetupError::errno(
                    "watch the watchdog's deadline (epoll_ctl)",
                    e,
                )),
            },
            Err(e) => sb.fail_closed(e),
        }
    }

    fn on_deadline(&mut self, pid: i32) {
        let Some(sb) = self.sandboxes.get_mut(&pid) else {
            return;
        };
        let Some(deadline) = sb.deadline.take() else {
            return;
        };
        sb.exit.timed_out = true;
        sb.note_usage();
        sb.exit.overshoot_ns = Some(deadline.expire(&sb.pidfd));
        self.poll.unwatch(deadline.as_fd(), Source::Deadline(pid));
    }

    fn on_exit(&mut self, pid: i32) {
        let Some(sb) = self.sandboxes.get(&pid) else {
            return;
        };
        let handed = sb.phase == Phase::Handed;
        let usage = match sys::wait4_nohang(sb.pid) {
            Ok(Some((_, usage))) => usage,
            Ok(None) => return,
            Err(_) => sys::Usage::default(),
        };
        if handed && wire::has_message(self.control.as_fd()) {
            // The engine may have taken it, and its job run to the end, before the message
            // saying so was read: read it now (a closed channel is seen again by the loop).
            let _ = self.on_control();
        }
        let mut sb = self.sandboxes.remove(&pid).expect("present above");
        // The init's exit is reported once every process of its pid namespace is gone, so
        // only a socket in flight can still hold the namespace's state: checked there.
        if let Some(ns) = sb.netns.take() {
            self.net.give_back(ns);
        }
        for (fd, source) in [
            (Some(sb.pidfd.as_fd()), Source::Exit(pid)),
            (Some(sb.sock.as_fd()), Source::InitSocket(pid)),
            (
                sb.exec_notify.as_ref().map(|f| f.as_fd()),
                Source::ExecNotify(pid),
            ),
            (
                sb.deadline.as_ref().map(|d| d.as_fd()),
                Source::Deadline(pid),
            ),
        ] {
            if let Some(fd) = fd {
                self.poll.unwatch(fd, source);
            }
        }
        self.ready.retain(|p| *p != pid);
        match sb.phase {
            Phase::Running => {
                self.by_req.remove(&sb.req);
                let mut exit = std::mem::take(&mut sb.exit);
                exit.exit_ns = mono_ns();
                // Killed from outside, the job's processes were reaped by the kernel, not by
                // the init: what they used is in the figures read before the kill.
                let used = sb.used_at_kill.unwrap_or_default();
                exit.cpu_us = usage.cpu_us.max(used.cpu_us);
                exit.max_rss_kb = match sb.used_at_kill {
                    // The init's own figures hold the compile stage's peak.
                    Some(used) if sb.staged => used.max_rss_kb,
                    _ => usage.max_rss_kb.max(used.max_rss_kb),
                };
                if let Some(fd) = sb.exec_notify.take() {
                    // The exit can be seen before the exec notification; every writer is gone
                    // now, so this read cannot block.
                    let _ =
                        std::io::Read::read_to_end(&mut fs::File::from(fd), &mut sb.notify_bytes);
                }
                if exit.exec_ns.is_none() && exit.error.is_none() {
                    match ExecNote::decode(&sb.notify_bytes) {
                        Ok(stamp) => exit.exec_ns = Some(stamp),
                        Err(_) if exit.killed => {}
                        Err(reason) => exit.error = Some(reason),
                    }
                }
                self.report(exit);
            }
            Phase::Warming => {
                // A sandbox that could not be built: fail closed, and say why.
                let error = sb
                    .setup_error
                    .unwrap_or_else(|| SetupError::new("sandbox init exited during set-up"));
                self.fail_next_pending(sb.network, error);
            }
            Phase::Ready | Phase::Handed => {
                // It was built and then ended while it waited (killed from outside): nothing
                // is wrong with building them, so no job fails; another is built instead.
                if sb.phase == Phase::Handed {
                    let gone = FromZygote::LauncherGone { sandbox: sb.id };
                    let _ = wire::send(self.control.as_fd(), &gone, &[]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use nix::mount::MsFlags;
    use nix::sched::CloneFlags;

    use super::own_namespaces;
    use crate::sandbox::kernel::syscalls::recording::{Call, Recorder};

    #[test]
    fn the_zygote_makes_its_mounts_private_before_anything_else() {
        let k = Recorder::default();
        own_namespaces(&k).unwrap();
        assert_eq!(
            k.calls(),
            vec![
                Call::Unshare(
                    CloneFlags::CLONE_NEWNS
                        | CloneFlags::CLONE_NEWNET
                        | CloneFlags::CLONE_NEWIPC
                        | CloneFlags::CLONE_NEWUTS
                ),
                Call::Mount {
                    source: None,
                    target: "/".into(),
                    fstype: None,
                    flags: MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                },
                Call::LoopbackUp,
                Call::Sethostname("forkbox".into()),
            ]
        );
    }

    #[test]
    fn a_refused_step_stops_the_zygote_naming_it() {
        let k = Recorder {
            fail: Some(|c| matches!(c, Call::Mount { .. })),
            ..Recorder::default()
        };
        let e = own_namespaces(&k).unwrap_err();
        assert_eq!(
            e.to_string(),
            "make-rprivate /: EPERM: Operation not permitted"
        );
        // Nothing after the refused step ran.
        assert_eq!(k.calls().len(), 2);
    }
}
