//! The sandbox init: pid 1 of each sandbox's pid namespace.
//!
//! It is cloned by the zygote ahead of demand, builds its root while no job waits for it, and
//! forks the launcher (`launcher.rs`): the process that receives the job, writes the input
//! files, takes the last isolation steps and execs the program. The init then reaps every
//! process of the sandbox, reports the program's exit and the collected files, and exits, which
//! makes the kernel kill anything still alive in the pid namespace.
//!
//! Its steps, in order: [`serve`] builds the sandbox (session, priority, OOM rank,
//! parent-death signal, descriptors, the id maps, hostname, root, ipc limits, the user
//! namespace's counts, the working directory) and forks the launcher; [`supervise`] takes the
//! report pipe, adjusts the sandbox to the job, reaps, and reports.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::identity;
use super::launcher;
use super::wire::{self, ExecNote, FromInit, Handoff, Report, Resized, ZygoteConfig};
use crate::sandbox::isolate::budget::{self, CpuBudget};
use crate::sandbox::isolate::collect;
use crate::sandbox::isolate::counts;
use crate::sandbox::isolate::hardening::Hardening;
use crate::sandbox::isolate::held;
use crate::sandbox::isolate::ipc;
use crate::sandbox::isolate::limits;
use crate::sandbox::isolate::memory::MemoryBudget;
use crate::sandbox::isolate::rootfs::{self, RootPlan};
use crate::sandbox::isolate::setup_error::SetupError;
use crate::sandbox::kernel::clock;
use crate::sandbox::kernel::sys::{self, Forked, SingleThreaded};

/// Runs the init; never returns.
pub fn main(one: SingleThreaded, sock: OwnedFd, cfg: &ZygoteConfig, hardening: &Hardening) -> ! {
    match serve(&one, &sock, cfg) {
        Err(error) => {
            // The zygote relays this as the reason the job did not run.
            let _ = wire::send(sock.as_fd(), &FromInit::SetupFailed { error }, &[]);
            sys::exit_now(1)
        }
        Ok(Side::Launcher { handoff, setup_w }) => launcher::main(
            launcher::Channels {
                sock,
                handoff,
                setup_w,
            },
            cfg,
            hardening,
        ),
        Ok(Side::Init {
            launcher,
            handoff,
            setup_r,
            work,
            sysctls,
        }) => {
            // The job channel is the launcher's alone: when it dies, whoever sends it a job
            // sees the channel closed at once, instead of a message nobody will read.
            drop(sock);
            supervise(&one, launcher, handoff, setup_r, &work, &sysctls, hardening)
        }
    }
}

/// Which side of the launcher's fork this is, with that side's ends of the channel the job's
/// report is handed over on and of the pipe the launcher reports a failed isolation step (or
/// its exec time) through.
enum Side {
    Launcher {
        handoff: OwnedFd,
        setup_w: OwnedFd,
    },
    Init {
        launcher: Pid,
        handoff: OwnedFd,
        setup_r: OwnedFd,
        /// The working directory, where collecting starts.
        work: OwnedFd,
        /// The writable `/proc/sys` (see `rootfs::enter`), the init's alone.
        sysctls: OwnedFd,
    },
}

fn serve(one: &SingleThreaded, sock: &OwnedFd, cfg: &ZygoteConfig) -> Result<Side, SetupError> {
    // A session of its own, and with it an autogroup of its own: the scheduler weighs each
    // autogroup as one, and whoever can write `/proc/<pid>/autogroup` of a member sets the
    // nice of all of it. The job sees this process as its pid 1, so its autogroup must hold
    // nothing but the sandbox (the program starts yet another session).
    nix::unistd::setsid().map_err(|e| SetupError::errno("setsid", e))?;
    // The zygote may run at a raised priority; the sandbox must not inherit it.
    super::priority::reset_for_sandbox().map_err(|e| SetupError::errno("reset priority", e))?;
    // When the host runs out of memory, the sandbox goes first.
    limits::rank_first_for_oom().map_err(|e| SetupError::io("raise oom_score_adj", &e))?;
    // Our parent is the zygote; if it dies, so do we (and with us the whole sandbox).
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| SetupError::errno("set pdeathsig", e))?;
    // Nothing of the zygote's descriptors (other sandboxes' sockets, the engine's channel)
    // may stay reachable from here.
    sys::close_inherited(one, sock).map_err(|e| SetupError::errno("close inherited fds", e))?;
    // The uid/gid maps of our user namespace are written by the zygote; until then we have
    // no identity inside it.
    identity::await_sandbox_maps(sock)?;
    identity::become_sandbox_root()?;
    // The parent-death signal was set again there: make sure the zygote did not die before
    // it was (its end of our socket closes when it exits).
    if wire::peer_gone(sock.as_fd()) {
        return Err(SetupError::new(
            "the zygote exited while the sandbox was set up",
        ));
    }
    nix::unistd::sethostname("forkbox").map_err(|e| SetupError::errno("sethostname", e))?;
    let plan = RootPlan {
        source: &cfg.root,
        staging: &cfg.staging,
        work_dir: &cfg.work_dir,
        disk_mb: cfg.defaults.disk_mb,
    };
    let sysctls = rootfs::enter(&plan)?;
    // Limits for the default job now, while no job waits; a job with another memory limit
    // has them set again before it starts (see `supervise`).
    ipc::bound(&sysctls, cfg.defaults.memory_mb)?;
    // Before the launcher exists: none of the job's objects counts only against the host uid.
    counts::bound(&sysctls)?;
    // Opened while no job has run: nothing it plants on the way to the working directory can
    // redirect where collecting starts.
    let work: OwnedFd = fs::File::open(&cfg.work_dir)
        .map_err(|e| SetupError::io("open", &e).at(&cfg.work_dir))?
        .into();

    // The launcher is forked now, while no job waits: it receives the job (from the engine, or
    // from the zygote) and becomes the program, so a spawn costs no fork. It reports a failed
    // isolation step (or its exec time) through `setup`, and hands the init what it needs for
    // the report through `handoff`.
    let (setup_r, setup_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| SetupError::errno("pipe", e))?;
    let (handoff_init, handoff_launcher) =
        wire::seqpacket_pair().map_err(|e| SetupError::errno("socketpair", e))?;
    Ok(
        match one
            .fork()
            .map_err(|e| SetupError::errno("fork launcher", e))?
        {
            Forked::Child(_) => {
                drop(work);
                drop(sysctls);
                Side::Launcher {
                    handoff: handoff_launcher,
                    setup_w,
                }
            }
            Forked::Parent { pid, .. } => Side::Init {
                launcher: pid,
                handoff: handoff_init,
                setup_r,
                work,
                sysctls,
            },
        },
    )
}

/// The init's side: wait for the program, then report. Never returns.
fn supervise(
    one: &SingleThreaded,
    launcher: Pid,
    handoff: OwnedFd,
    setup_r: OwnedFd,
    work: &OwnedFd,
    sysctls: &OwnedFd,
    hardening: &Hardening,
) -> ! {
    let received = wire::recv::<Handoff>(handoff.as_fd()).ok().flatten();
    if let Some(h) = received
        .as_ref()
        .map(|r| &r.message)
        .filter(|h| h.needs_answer())
    {
        let resized = h
            .resize_disk_mb
            .map_or(Ok(()), |mb| rootfs::resize(mb).map_err(SetupError::from));
        let bounded = h.ipc_memory_mb.map_or(Ok(()), |mb| {
            ipc::bound(sysctls, mb).map_err(SetupError::from)
        });
        let error = resized.and(bounded).err();
        let _ = wire::send(handoff.as_fd(), &Resized { error }, &[]);
    }
    let budget = received
        .as_ref()
        .and_then(|r| r.message.cpu_budget_ms.map(|ms| (ms, r.message.timeout_ms)))
        .and_then(|(ms, timeout_ms)| CpuBudget::new(ms, timeout_ms, Path::new("/proc")));
    let memory = received.as_ref().and_then(|r| {
        let mb = r.message.memory_budget_mb?;
        let host_socket_max = r.message.socket_buffer_max;
        Some(MemoryBudget::with_buffers(
            mb,
            Path::new("/proc"),
            host_socket_max,
        ))
    });
    let reaped = reap(launcher, budget, memory);
    let (exit_code, signal) = (reaped.exit_code, reaped.signal);
    // A staged job's program was the launcher's child: its own peak, apart from the compiler's.
    let run_usage = super::stage::run_usage(&handoff);
    let Some(wire::Received {
        message: handoff,
        fds,
        ..
    }) = received
    else {
        // The launcher stopped before taking a job (retired sandbox, or a failure it reported
        // through the exec-notify pipe).
        sys::exit_now(0)
    };
    let Some(report) = fds.into_iter().next() else {
        sys::exit_now(0)
    };
    let mut notes = Vec::new();
    let _ = fs::File::from(setup_r).read_to_end(&mut notes);
    let (exec_ns, setup_error) = match ExecNote::decode(&notes) {
        Ok(ns) => (Some(ns), None),
        Err(reason) => (None, Some(reason)),
    };
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).ok();
    let mut out = Report {
        cpu_us: usage.map_or(0, |u| {
            let us =
                |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
            us(u.user_time()) + us(u.system_time())
        }),
        max_rss_kb: usage.map_or(0, |u| u.max_rss() as u64),
        // Every process is gone: what the job holds outside them stays until the namespaces go.
        held_kb: if handoff.count_held {
            held::held_kb(Path::new("/tmp"), Path::new("/proc"))
        } else {
            0
        },
        exec_ns,
        setup_error,
        exit_code,
        signal,
        exit_ns: Some(clock::mono_ns()),
        cpu_budget_exceeded: reaped.exceeded == Some(budget::Exceeded::Cpu),
        memory_budget_exceeded: reaped.exceeded == Some(budget::Exceeded::Memory),
        memory_counted_kb: reaped.memory_peak_kb,
        ..Report::default()
    };
    if let Some(run) = run_usage {
        // The sandbox-wide figures hold the compile stage too: the program's are its own.
        out.cpu_us = run.cpu_us;
        out.max_rss_kb = run.max_rss_kb;
        out.memory_counted_kb = 0;
        out.run = Some(run);
    }
    if !handoff.collect.is_empty() {
        let collected = collect::collect_as_job(
            one,
            work,
            &handoff.collect,
            handoff.collect_max_bytes,
            hardening,
        );
        out.files = collected.files;
        out.files_truncated = collected.truncated;
        out.collect_error = collected.error;
    }
    let bytes = serde_json::to_vec(&out).unwrap_or_default();
    // Closing the report ends the job for the engine: it need not wait for this process and
    // its namespaces to be torn down.
    let _ = fs::File::from(report).write_all(&bytes);
    sys::exit_now(0)
}

/// How the program ended, and whether the sandbox was killed for a budget.
struct Reaped {
    exit_code: Option<i32>,
    signal: Option<i32>,
    exceeded: Option<budget::Exceeded>,
    memory_peak_kb: u64,
}

/// Waits for the program, then kills and reaps everything else in the sandbox. With a CPU or
/// memory budget, the sandbox is killed as a whole once its processes together have used one
/// up; the result says which.
fn reap(main_pid: Pid, cpu: Option<CpuBudget>, memory: Option<MemoryBudget>) -> Reaped {
    let mut result = (None, None);
    let mut budget = (cpu.is_some() || memory.is_some()).then(|| budget::Waiter::new(cpu, memory));
    loop {
        let next = match &mut budget {
            Some(waiter) => waiter.wait_any(),
            None => waitpid(None, None),
        };
        match next {
            Ok(WaitStatus::Exited(pid, code)) if pid == main_pid => {
                result = (Some(code), None);
                break;
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == main_pid => {
                result = (None, Some(sig as i32));
                break;
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    // Background children die with the program: their files must settle before collection.
    // Every process of the namespace descends from us, so with no child left there is none
    // (the common case), and the machine-wide walk of `kill(-1)` is skipped.
    if !matches!(
        waitpid(None, Some(WaitPidFlag::WNOHANG)),
        Err(Errno::ECHILD)
    ) {
        let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
        while !matches!(waitpid(None, None), Err(Errno::ECHILD)) {}
    }
    Reaped {
        exit_code: result.0,
        signal: result.1,
        exceeded: budget.as_ref().and_then(budget::Waiter::exceeded),
        memory_peak_kb: budget.as_ref().map_or(0, budget::Waiter::memory_peak_kb),
    }
}
