//! The two stages of a staged job, inside its sandbox.
//!
//! The launcher runs the compile stage as a child it watches: every few milliseconds it
//! checks the stage's wall clock, CPU time, memory and output against the stage's own limits
//! and kills everything the stage started at the first one past (the zygote's watchdog bounds
//! the launcher itself meanwhile). The stage's stdout and stderr go to unnamed files on the
//! job's disk; the launcher reports the stage, with its output, to the engine on a pipe of its
//! own ([`report_compiled`]). If the stage exited 0, the program runs as another child of the
//! launcher, which waits for it and tells the init its usage ([`run_usage`]), so the run
//! stage's peak is its own, not the compiler's. Between the two the launcher waits for the
//! engine to narrow the sandbox's cgroup from the larger of the stages' limits to the run
//! stage's ([`await_run_limits`]).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::wire::{self, CompilePlan, RunUsage, StageKill, StageReport};
use crate::sandbox::isolate::limits::{self, MemoryEnforcement};
use crate::sandbox::isolate::setup_error::SetupError;
use crate::sandbox::kernel::clock::mono_ns;
use crate::sandbox::kernel::sys::{self, Forked, SingleThreaded};
use forkbox_queue::schema::{Outcome, StageOutcome, StageStatus};

/// How long past a compile stage's own limit the zygote's watchdog kills the sandbox, should
/// the launcher not have ended the stage (stopped or killed by it).
pub(crate) const WATCHDOG_MARGIN_MS: u64 = 2000;
/// How often the launcher checks a running compile stage.
const CHECK_EVERY: Duration = Duration::from_millis(5);
/// Exit code of a stage whose command was not found (as in a shell).
const EXIT_NOT_FOUND: i32 = 127;

/// A finished compile stage: how it ended, and its output files.
pub(super) struct Compiled {
    pub report: StageReport,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

impl Compiled {
    pub fn succeeded(&self) -> bool {
        succeeded(&self.report)
    }
}

/// Whether a stage's report says it succeeded (the program runs after it).
pub(crate) fn succeeded(report: &StageReport) -> bool {
    report.exit_code == Some(0) && report.killed.is_none()
}

/// A job's peak memory under a cgroup, whose `memory.peak` (`cgroup_kb`) holds a staged job's
/// compiler too: for a program whose own figures its launcher told (`run_measured`), the
/// cgroup's peak counted from its start (`since_run_kb`) where the kernel can reset it, else
/// none, so the outcome takes the program's own; otherwise the cgroup's.
pub(crate) fn run_peak_kb(
    cgroup_kb: Option<u64>,
    since_run_kb: Option<u64>,
    run_measured: bool,
) -> Option<u64> {
    if run_measured {
        since_run_kb
    } else {
        cgroup_kb
    }
}

/// Runs the compile stage in `cwd` and returns once it and everything it started are gone.
pub(super) fn compile(
    plan: &CompilePlan,
    env: &[(String, String)],
    cwd: &Path,
    memory: MemoryEnforcement,
    resolve: Resolve,
) -> Result<Compiled, SetupError> {
    let stdout = unnamed_file()?;
    let stderr = unnamed_file()?;
    // Empty standard input: the job's is the run stage's.
    let (stdin, stdin_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| SetupError::errno("compile stage: pipe", e))?;
    drop(stdin_w);
    let one = SingleThreaded::check()
        .ok_or_else(|| SetupError::new("compile stage: the launcher is not single-threaded"))?;
    let start_ns = mono_ns();
    let child = match one.fork() {
        Ok(Forked::Child(_)) => {
            let stdio = [stdin.as_raw_fd(), stdout.as_raw_fd(), stderr.as_raw_fd()];
            let fail = |step: &str, e: Errno| -> ! {
                let _ = nix::unistd::write(
                    stderr.as_fd(),
                    format!("forkbox: compile stage: {step}: {}\n", e.desc()).as_bytes(),
                );
                sys::exit_now(EXIT_NOT_FOUND - 1)
            };
            if let Err(e) = enter(stdio, cwd, &plan.limits, memory) {
                fail("set-up", e)
            }
            exec(&plan.argv, env, resolve)
        }
        Ok(Forked::Parent { pid, .. }) => pid,
        Err(e) => return Err(SetupError::errno("fork the compile stage", e)),
    };
    drop(stdin);
    let report = watch(child, plan, start_ns, [&stdout, &stderr]);
    Ok(Compiled {
        report,
        stdout,
        stderr,
    })
}

/// A file on the job's disk with no name: the stage writes to it, the init reads it back.
fn unnamed_file() -> Result<OwnedFd, SetupError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o600)
        .open("/tmp")
        .map(OwnedFd::from)
        .map_err(|e| SetupError::io("compile stage: an output file in /tmp", &e))
}

/// The child's last steps before exec, as the launcher's for the program: a session of its
/// own, stdio, the directory, umask, the stage's rlimits, default signals, close-on-exec.
fn enter(
    stdio: [RawFd; 3],
    cwd: &Path,
    limits: &forkbox_queue::EffectiveLimits,
    memory: MemoryEnforcement,
) -> Result<(), Errno> {
    nix::unistd::setsid()?;
    for (target, fd) in stdio.into_iter().enumerate() {
        nix::unistd::dup2(fd, target as RawFd)?;
    }
    nix::unistd::chdir(cwd)?;
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    limits::apply_rlimits(limits, memory).map_err(|e| e.errno)?;
    sys::default_signals()?;
    sys::cloexec_from(3)
}

/// The program's candidate paths for a `PATH` (the launcher's `resolve`).
pub(super) type Resolve = fn(&str, &str) -> Vec<std::path::PathBuf>;

/// Execs `argv` through the `PATH` of `env`; exits 127 (not found) or 126 when it cannot.
pub(super) fn exec(argv: &[String], env: &[(String, String)], resolve: Resolve) -> ! {
    let to_c = |s: &str| CString::new(s.as_bytes()).ok();
    let args: Option<Vec<CString>> = argv.iter().map(|a| to_c(a)).collect();
    let envp: Vec<CString> = env
        .iter()
        .filter_map(|(k, v)| to_c(&format!("{k}={v}")))
        .collect();
    let path_var = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or("", |(_, v)| v.as_str());
    let (Some(args), Some(program)) = (args, argv.first()) else {
        sys::exit_now(EXIT_NOT_FOUND - 1)
    };
    let mut last = Errno::ENOENT;
    for path in resolve(program, path_var) {
        let Some(c) = to_c(&path.to_string_lossy()) else {
            continue;
        };
        let Err(e) = nix::unistd::execve(&c, &args, &envp);
        if e != Errno::ENOENT && e != Errno::ENOTDIR {
            last = e;
        }
    }
    let (code, what) = match last {
        Errno::ENOENT => (EXIT_NOT_FOUND, "command not found".to_owned()),
        e => (EXIT_NOT_FOUND - 1, e.desc().to_owned()),
    };
    let _ = nix::unistd::write(
        std::io::stderr().as_fd(),
        format!("forkbox: {program}: {what}\n").as_bytes(),
    );
    sys::exit_now(code)
}

/// Waits for the stage, killing it at the first of its limits it passes; then ends whatever it
/// left running.
fn watch(child: Pid, plan: &CompilePlan, start_ns: i64, out: [&OwnedFd; 2]) -> StageReport {
    let deadline_ns = start_ns.saturating_add((plan.timeout_ms as i64).saturating_mul(1_000_000));
    let cap = plan.limits.output_bytes;
    let mut seen = Sample::default();
    let mut killed = None;
    let ended = loop {
        match sys::wait4_nohang(child) {
            Ok(Some(done)) => break Some(done),
            Ok(None) => {}
            Err(Errno::EINTR) => continue,
            Err(_) => break None,
        }
        if killed.is_none() {
            let now = sample(Path::new("/proc"));
            seen.fold(&now);
            let written = out.iter().map(|f| file_size(f)).max().unwrap_or(0);
            killed = stage_kill(plan, &now, written, mono_ns() >= deadline_ns);
            if killed.is_some() {
                end_stage(Path::new("/proc"));
            }
        }
        std::thread::sleep(CHECK_EVERY);
    };
    let end_ns = mono_ns();
    // Background processes of the stage end with it: the program must start alone.
    end_stage(Path::new("/proc"));
    let written = out.iter().map(|f| file_size(f)).max().unwrap_or(0);
    if killed.is_none() && written > cap {
        killed = Some(StageKill::Output);
    }
    let (status, usage) = ended.unwrap_or_default();
    StageReport {
        exit_code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        killed,
        duration_ns: end_ns - start_ns,
        cpu_us: usage.cpu_us.max(seen.cpu_us),
        max_rss_kb: usage.max_rss_kb.max(seen.peak_kb),
        ..StageReport::default()
    }
}

/// Which limit of the stage (if any) its processes are past: the wall clock, then output,
/// CPU time and memory.
fn stage_kill(plan: &CompilePlan, now: &Sample, written: u64, late: bool) -> Option<StageKill> {
    let l = &plan.limits;
    if late {
        Some(StageKill::Timeout)
    } else if written > l.output_bytes {
        Some(StageKill::Output)
    } else if now.cpu_us >= l.cpu_ms.saturating_mul(1000) {
        Some(StageKill::Cpu)
    } else if now.rss_kb > l.memory_mb.saturating_mul(1024) {
        Some(StageKill::Memory)
    } else {
        None
    }
}

fn file_size(fd: &OwnedFd) -> u64 {
    nix::sys::stat::fstat(fd.as_raw_fd()).map_or(0, |st| st.st_size.max(0) as u64)
}

/// What the stage's processes (every process of the sandbox but its init and the launcher)
/// use at one look.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Sample {
    /// Their CPU time with that of the children they waited for.
    cpu_us: u64,
    /// Their resident memory together.
    rss_kb: u64,
    /// The largest peak RSS of one of them.
    peak_kb: u64,
}

impl Sample {
    fn fold(&mut self, now: &Sample) {
        self.cpu_us = self.cpu_us.max(now.cpu_us);
        self.rss_kb = self.rss_kb.max(now.rss_kb);
        self.peak_kb = self.peak_kb.max(now.peak_kb);
    }
}

fn stage_pids(proc: &Path) -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir(proc)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|pid| *pid != 1 && *pid != me)
                .collect()
        })
        .unwrap_or_default()
}

fn sample(proc: &Path) -> Sample {
    let tick_us = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .map_or(10_000, |t| 1_000_000 / t as u64);
    let mut out = Sample::default();
    for pid in stage_pids(proc) {
        let dir = proc.join(pid.to_string());
        if let Ok(stat) = std::fs::read_to_string(dir.join("stat")) {
            out.cpu_us += stat_cpu_ticks(&stat) * tick_us;
        }
        if let Ok(status) = std::fs::read_to_string(dir.join("status")) {
            out.rss_kb += status_kb(&status, "VmRSS:");
            out.peak_kb = out.peak_kb.max(status_kb(&status, "VmHWM:"));
        }
    }
    out
}

/// utime + stime + cutime + cstime of a `/proc/<pid>/stat` line, in clock ticks.
fn stat_cpu_ticks(stat: &str) -> u64 {
    let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return 0;
    };
    // After the command: state is field 3; utime..cstime are fields 14..17.
    after
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum()
}

fn status_kb(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Kills every process of the stage (all but the init and the launcher) until none is left.
fn end_stage(proc: &Path) {
    for _ in 0..1000 {
        let pids = stage_pids(proc);
        if pids.is_empty() {
            return;
        }
        for pid in &pids {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        // The launcher reaps its own child; the others are the init's to reap.
        for pid in pids {
            let _ = sys::wait4_nohang(Pid::from_raw(pid));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Reports the compile stage to the engine on its socket (`stage`, shut for writing after), with
/// its output cut at `output_bytes` per stream.
pub(super) fn report_compiled(stage: &OwnedFd, compiled: &Compiled, output_bytes: u64) {
    let (stdout, stdout_truncated) = read_output(&compiled.stdout, output_bytes);
    let (stderr, stderr_truncated) = read_output(&compiled.stderr, output_bytes);
    let report = StageReport {
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
        ..compiled.report.clone()
    };
    let bytes = serde_json::to_vec(&report).unwrap_or_default();
    let mut written = 0;
    while written < bytes.len() {
        match nix::unistd::write(stage, &bytes[written..]) {
            Ok(n) => written += n,
            Err(Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    // The engine reads the report to its end before it answers.
    let _ = nix::sys::socket::shutdown(stage.as_raw_fd(), nix::sys::socket::Shutdown::Write);
}

/// The byte by which the engine says the sandbox now holds the run stage's limits.
pub(crate) const RUN_LIMITS_SET: u8 = b'1';

/// Waits until the engine has set the sandbox's limits to the run stage's (its cgroup's
/// memory and processes, which held the compiler's until now), told by [`RUN_LIMITS_SET`] on
/// the stage's socket. Anything else (the engine could not set them) stops the job: the
/// program never runs under the compiler's limits.
pub(super) fn await_run_limits(stage: &OwnedFd) -> Result<(), SetupError> {
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(stage.as_raw_fd(), &mut byte) {
            Ok(1) if byte[0] == RUN_LIMITS_SET => return Ok(()),
            Err(Errno::EINTR) => {}
            Ok(_) => {
                return Err(SetupError::new(
                    "the sandbox's limits could not be set to the run stage's",
                ))
            }
            Err(e) => return Err(SetupError::errno("wait for the run stage's limits", e)),
        }
    }
}

/// The run stage of a staged job: the program as the launcher's child, its exit mirrored as
/// the launcher's own and its usage told to the init. `closing` are the launcher's copies of
/// descriptors whose end must come with the program's (its stdio, the exec-notify pipe).
pub(super) fn run_child(
    (argv, env): (&[String], &[(String, String)]),
    resolve: Resolve,
    handoff: &OwnedFd,
    closing: &[RawFd],
) -> ! {
    let Some(one) = SingleThreaded::check() else {
        sys::exit_now(EXIT_NOT_FOUND - 1)
    };
    let child = match one.fork() {
        Ok(Forked::Child(_)) => exec(argv, env, resolve),
        Ok(Forked::Parent { pid, .. }) => pid,
        Err(_) => sys::exit_now(EXIT_NOT_FOUND - 1),
    };
    for fd in closing {
        let _ = nix::unistd::close(*fd);
    }
    let (status, usage) = sys::wait4_blocking(child).unwrap_or_default();
    let note = RunUsage {
        cpu_us: usage.cpu_us,
        max_rss_kb: usage.max_rss_kb,
    };
    let _ = wire::send(handoff.as_fd(), &note, &[]);
    if libc::WIFSIGNALED(status) {
        // Ended by a signal: so does the launcher, for the init to report it.
        let _ = sys::default_signals();
        if let Ok(sig) = Signal::try_from(libc::WTERMSIG(status)) {
            let _ = kill(Pid::this(), sig);
        }
        let _ = kill(Pid::this(), Signal::SIGKILL);
    }
    sys::exit_now(libc::WEXITSTATUS(status))
}

/// The init's side: the run stage's usage, if the launcher told it (read after it ended).
pub(super) fn run_usage(handoff: &OwnedFd) -> Option<RunUsage> {
    if !wire::has_message(handoff.as_fd()) {
        return None;
    }
    match wire::recv::<RunUsage>(handoff.as_fd()) {
        Ok(Some(r)) => Some(r.message),
        _ => None,
    }
}

/// A stage's output file, at most `cap` bytes of it, as text; and whether it was longer.
fn read_output(fd: &OwnedFd, cap: u64) -> (String, bool) {
    let size = file_size(fd);
    let want = size.min(cap) as usize;
    let mut buf = vec![0u8; want];
    let mut got = 0;
    while got < want {
        match nix::sys::uio::pread(fd, &mut buf[got..], got as i64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    buf.truncate(got);
    (String::from_utf8_lossy(&buf).into_owned(), size > cap)
}

/// The limits of a staged job's sandbox as a whole: the larger memory, pids and output of the
/// two stages, and their CPU times together.
pub(crate) fn sandbox_limits(
    run: &forkbox_queue::EffectiveLimits,
    plan: &CompilePlan,
) -> forkbox_queue::EffectiveLimits {
    let c = &plan.limits;
    forkbox_queue::EffectiveLimits {
        memory_mb: run.memory_mb.max(c.memory_mb),
        pids: run.pids.max(c.pids),
        cpu_ms: run.cpu_ms.saturating_add(c.cpu_ms),
        ..*run
    }
}

/// What the engine read on a stage's pipe: nothing (the stage never started), the report, or
/// only the start mark: the stage ended its launcher (killed it), which counts as the stage
/// killed by a signal of its own doing.
pub(crate) fn read_report(bytes: &[u8]) -> Option<StageReport> {
    if bytes.is_empty() {
        return None;
    }
    Some(serde_json::from_slice(bytes).unwrap_or(StageReport {
        signal: Some(libc::SIGKILL),
        ..StageReport::default()
    }))
}

/// The stage's result as the schema has it: its status from how it ended.
pub(super) fn stage_outcome(r: &StageReport) -> StageOutcome {
    let status = match (r.killed, r.exit_code, r.signal) {
        (Some(StageKill::Timeout), _, _) => StageStatus::Timeout,
        (Some(StageKill::Cpu), _, _) => StageStatus::CpuLimit,
        (Some(StageKill::Memory), _, _) => StageStatus::MemoryLimit,
        (Some(StageKill::Output), _, _) => StageStatus::OutputLimit,
        // RLIMIT_CPU's signals: the stage's own CPU limit, per process.
        (None, _, Some(s)) if s == libc::SIGXCPU => StageStatus::CpuLimit,
        (None, _, Some(_)) => StageStatus::Signaled,
        (None, Some(0), None) => StageStatus::Ok,
        (None, _, None) => StageStatus::Failed,
    };
    let exit_code = match (status, r.exit_code, r.signal) {
        (StageStatus::Timeout, _, _) => forkbox_queue::schema::EXIT_TIMEOUT,
        (_, _, Some(s)) => 128 + s,
        (_, Some(code), None) => code,
        (_, None, None) => 128 + libc::SIGKILL,
    };
    StageOutcome {
        status,
        exit_code,
        signal: r.signal,
        timed_out: status == StageStatus::Timeout,
        stdout: r.stdout.clone(),
        stderr: r.stderr.clone(),
        stdout_truncated: r.stdout_truncated,
        stderr_truncated: r.stderr_truncated,
        duration_ms: r.duration_ns.max(0) as f64 / 1e6,
        cpu_ms: r.cpu_us / 1000,
        max_rss_kb: r.max_rss_kb,
    }
}

/// How a staged job's sandbox ended, beside its outcome.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ended {
    /// The run's figures are the program's own (its launcher told them), not the sandbox's.
    pub run_measured: bool,
    /// The zygote's watchdog killed the sandbox.
    pub watchdog_killed: bool,
}

/// A staged job's outcome: the run stage's with the compile stage's added, or `compile_error`
/// when the stage did not succeed; a sandbox killed before the stage reported (its watchdog's
/// deadline) is a compile stage that timed out.
pub(crate) fn settle(
    run: Outcome,
    compiled: Option<StageReport>,
    plan: &CompilePlan,
    ended: Ended,
) -> Outcome {
    match compiled {
        // A report the launcher wrote (a stage always takes some time).
        Some(report) if report.duration_ns > 0 => {
            let stage = stage_outcome(&report);
            if stage.status == StageStatus::Ok {
                // Unless the program's own was measured, the sandbox's CPU time holds both
                // stages.
                let cpu_ms = if ended.run_measured {
                    run.cpu_ms
                } else {
                    run.cpu_ms.saturating_sub(stage.cpu_ms)
                };
                Outcome {
                    cpu_ms,
                    compile: Some(stage),
                    ..run
                }
            } else {
                Outcome::compile_error(stage)
            }
        }
        // Killed by the watchdog before the stage reported: its launcher was stopped.
        _ if ended.watchdog_killed => Outcome::compile_error(StageOutcome {
            status: StageStatus::Timeout,
            exit_code: forkbox_queue::schema::EXIT_TIMEOUT,
            signal: None,
            timed_out: true,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: plan.timeout_ms as f64,
            cpu_ms: run.cpu_ms,
            max_rss_kb: run.max_rss_kb,
        }),
        // Only the start mark: the stage killed its launcher.
        Some(started) => Outcome::compile_error(stage_outcome(&started)),
        None => run,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staged_programs_peak_is_its_own_not_the_compilers() {
        for (cgroup_kb, since_run_kb, run_measured, want) in [
            // A job without stages: the cgroup's peak.
            (Some(900_000), None, false, Some(900_000)),
            // The program's, counted from its start where the kernel resets the peak.
            (Some(900_000), Some(30_000), true, Some(30_000)),
            // Where it cannot: none, for the program's own figure to be taken.
            (Some(900_000), None, true, None),
            // The launcher did not live to tell: the sandbox's (both stages').
            (Some(900_000), Some(30_000), false, Some(900_000)),
        ] {
            assert_eq!(
                run_peak_kb(cgroup_kb, since_run_kb, run_measured),
                want,
                "{cgroup_kb:?} {since_run_kb:?} {run_measured}"
            );
        }
        let done = |exit_code, killed| StageReport {
            exit_code,
            killed,
            ..StageReport::default()
        };
        assert!(succeeded(&done(Some(0), None)));
        assert!(!succeeded(&done(Some(1), None)));
        assert!(!succeeded(&done(Some(0), Some(StageKill::Output))));
        assert!(!succeeded(&done(None, None)));
    }

    #[test]
    fn how_a_stage_ended_decides_its_status() {
        let r = |exit_code, signal, killed| StageReport {
            exit_code,
            signal,
            killed,
            ..StageReport::default()
        };
        for (report, status, code) in [
            (r(Some(0), None, None), StageStatus::Ok, 0),
            (r(Some(1), None, None), StageStatus::Failed, 1),
            (r(Some(127), None, None), StageStatus::Failed, 127),
            (
                r(None, Some(9), Some(StageKill::Timeout)),
                StageStatus::Timeout,
                124,
            ),
            (
                r(None, Some(9), Some(StageKill::Cpu)),
                StageStatus::CpuLimit,
                137,
            ),
            (
                r(None, Some(9), Some(StageKill::Memory)),
                StageStatus::MemoryLimit,
                137,
            ),
            (
                r(None, Some(9), Some(StageKill::Output)),
                StageStatus::OutputLimit,
                137,
            ),
            (
                r(Some(0), None, Some(StageKill::Output)),
                StageStatus::OutputLimit,
                0,
            ),
            (
                r(None, Some(libc::SIGXCPU), None),
                StageStatus::CpuLimit,
                152,
            ),
            (r(None, Some(11), None), StageStatus::Signaled, 139),
        ] {
            let out = stage_outcome(&report);
            assert_eq!((out.status, out.exit_code), (status, code), "{report:?}");
        }
        assert_eq!(read_report(b""), None);
        assert_eq!(read_report(b"\n").unwrap().signal, Some(libc::SIGKILL));
        assert_eq!(
            stage_outcome(&read_report(b"\n").unwrap()).status,
            StageStatus::Signaled
        );
        let whole = serde_json::to_vec(&r(Some(0), None, None)).unwrap();
        let mut marked = b"\n".to_vec();
        marked.extend(whole);
        assert_eq!(read_report(&marked).unwrap().exit_code, Some(0));
    }

    #[test]
    fn cpu_ticks_are_read_past_the_command_name() {
        let stat = "42 (cc1 (x) y) R 1 42 42 0 -1 4194304 100 0 0 0 7 3 2 1 20 0 1 0";
        assert_eq!(stat_cpu_ticks(stat), 13);
        assert_eq!(status_kb("Name:\tcc1\nVmHWM:\t  2048 kB\n", "VmHWM:"), 2048);
        assert_eq!(status_kb("Name:\tcc1\n", "VmRSS:"), 0);
    }

    #[test]
    fn the_first_limit_passed_kills_the_stage() {
        let plan = CompilePlan {
            argv: vec!["cc".into()],
            limits: forkbox_queue::EffectiveLimits {
                cpu_ms: 100,
                memory_mb: 1,
                output_bytes: 10,
                ..forkbox_queue::EffectiveLimits::default()
            },
            timeout_ms: 1000,
        };
        let at = |cpu_us, rss_kb| Sample {
            cpu_us,
            rss_kb,
            peak_kb: rss_kb,
        };
        for (sample, written, late, want) in [
            (at(0, 0), 0, false, None),
            (at(0, 0), 0, true, Some(StageKill::Timeout)),
            (at(0, 0), 11, false, Some(StageKill::Output)),
            (at(100_000, 0), 10, false, Some(StageKill::Cpu)),
            (at(99_999, 1025), 10, false, Some(StageKill::Memory)),
            (at(99_999, 1024), 10, false, None),
            (at(200_000, 4096), 99, true, Some(StageKill::Timeout)),
        ] {
            assert_eq!(
                stage_kill(&plan, &sample, written, late),
                want,
                "{sample:?} {written} {late}"
            );
        }
    }
}
