//! The sandbox init: pid 1 of each sandbox's pid namespace.
//!
//! It is cloned by the zygote ahead of demand, builds its root while no job waits for it, and
//! forks the launcher: the process that receives the job from the zygote, writes the input
//! files, takes the last isolation steps and execs the program. The init then reaps every
//! process of the sandbox, reports the program's exit and the collected files, and exits, which
//! makes the kernel kill anything still alive in the pid namespace.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use forkbox_queue::FileData;
use nix::errno::Errno;
use nix::sys::resource::{setrlimit, Resource};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::rootfs::{self, RootPlan};
use super::sys::{self, Forked, SockFilter};
use super::wire::{self, FromInit, Payload, Report, ToInit, ZygoteConfig};

/// Exit code of a program whose command was not found (as in a shell).
const EXIT_NOT_FOUND: i32 = 127;
/// Exit code of a program found but not executable.
const EXIT_NOT_EXECUTABLE: i32 = 126;

/// What the zygote prepares once for every program: the compiled seccomp filter and the
/// capability range to drop (read from /proc before any sandbox exists).
pub struct Hardening {
    pub seccomp: Vec<SockFilter>,
    pub last_capability: libc::c_ulong,
}

/// Prefix of the exec timestamp the program writes to the exec-notify pipe just before exec.
pub const EXEC_MARK: char = '@';

/// Prefix of a failure before exec that the job's own input caused (its files, its working
/// directory): the job is `invalid`, since running it again would fail the same way.
pub const JOB_FAULT_MARK: char = '!';

/// An exec-notify message: the program's exec timestamp, or why it never ran.
pub fn parse_exec_note(bytes: &[u8]) -> Result<i64, String> {
    let text = String::from_utf8_lossy(bytes);
    match text
        .strip_prefix(EXEC_MARK)
        .and_then(|t| t.parse::<i64>().ok())
    {
        Some(ns) => Ok(ns),
        None if text.is_empty() => Err("the sandbox exited before its program started".into()),
        None => Err(text.into_owned()),
    }
}

/// Runs the init; never returns.
pub fn main(sock: OwnedFd, cfg: &ZygoteConfig, hardening: &Hardening) -> ! {
    match serve(&sock, cfg) {
        Err(error) => {
            // The zygote relays this as the reason the job did not run.
            let _ = wire::send(sock.as_fd(), &FromInit::SetupFailed { error }, &[]);
            sys::exit_now(1)
        }
        Ok(Side::Launcher { handoff, setup_w }) => {
            launch(&sock, &handoff, &setup_w, cfg, hardening)
        }
        Ok(Side::Init {
            launcher,
            handoff,
            setup_r,
        }) => {
            // The job channel is the launcher's alone: when it dies, whoever sends it a job
            // sees the channel closed at once, instead of a message nobody will read.
            drop(sock);
            supervise(launcher, handoff, setup_r, cfg)
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
    },
}

fn serve(sock: &OwnedFd, cfg: &ZygoteConfig) -> Result<Side, String> {
    // The zygote may run at a raised priority; the sandbox must not inherit it.
    sys::set_nice(0).map_err(|e| format!("reset priority: {e}"))?;
    // Our parent is the zygote; if it dies, so do we (and with us the whole sandbox).
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(|e| format!("set pdeathsig: {e}"))?;
    // Nothing of the zygote's descriptors (other sandboxes' sockets, the engine's channel)
    // may stay reachable from here.
    sys::close_all_except(sock.as_raw_fd()).map_err(|e| format!("close inherited fds: {e}"))?;
    // The uid/gid maps of our user namespace are written by the zygote; until then we have
    // no identity inside it.
    match wire::recv::<ToInit>(sock.as_fd()) {
        Ok(Some(wire::Received {
            message: ToInit::MapsWritten,
            ..
        })) => {}
        _ => return Err("user namespace: the zygote did not write the id maps".into()),
    }
    nix::unistd::sethostname("forkbox").map_err(|e| format!("sethostname: {e}"))?;
    let plan = RootPlan {
        source: &cfg.root,
        staging: &cfg.staging,
        work_dir: &cfg.work_dir,
        disk_mb: cfg.defaults.disk_mb,
    };
    rootfs::enter(&plan).map_err(|e| e.to_string())?;

    // The launcher is forked now, while no job waits: it receives the job (from the engine, or
    // from the zygote) and becomes the program, so a spawn costs no fork. It reports a failed
    // isolation step (or its exec time) through `setup`, and hands the init what it needs for
    // the report through `handoff`.
    let (setup_r, setup_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    let (handoff_init, handoff_launcher) =
        wire::seqpacket_pair().map_err(|e| format!("socketpair: {e}"))?;
    Ok(
        match sys::fork_single_threaded().map_err(|e| format!("fork launcher: {e}"))? {
            Forked::Child => Side::Launcher {
                handoff: handoff_launcher,
                setup_w,
            },
            Forked::Parent { pid, .. } => Side::Init {
                launcher: pid,
                handoff: handoff_init,
                setup_r,
            },
        },
    )
}

/// What the launcher hands the init once it has its job.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Handoff {
    collect: Vec<String>,
    collect_max_bytes: u64,
    /// The job's tmpfs size when it differs from the pre-built one. Remounting needs the
    /// capabilities the launcher has already dropped, so the init does it and answers with
    /// a [`Resized`] before the launcher goes on.
    resize_disk_mb: Option<u64>,
}

/// The init's answer to a resize request: an error message, or none.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Resized {
    error: Option<String>,
}

/// The init's side: wait for the program, then report. Never returns.
fn supervise(launcher: Pid, handoff: OwnedFd, setup_r: OwnedFd, cfg: &ZygoteConfig) -> ! {
    let received = wire::recv::<Handoff>(handoff.as_fd()).ok().flatten();
    if let Some(mb) = received.as_ref().and_then(|r| r.message.resize_disk_mb) {
        let error = rootfs::resize(mb).err().map(|e| e.to_string());
        let _ = wire::send(handoff.as_fd(), &Resized { error }, &[]);
    }
    let (exit_code, signal) = reap(launcher);
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
    let (exec_ns, setup_error) = match parse_exec_note(&notes) {
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
        exec_ns,
        setup_error,
        exit_code,
        signal,
        exit_ns: Some(super::mono_ns()),
        ..Report::default()
    };
    if !handoff.collect.is_empty() {
        match collect(
            Path::new(&cfg.work_dir),
            &handoff.collect,
            handoff.collect_max_bytes,
        ) {
            Ok(files) => out.files = files,
            Err(e) => out.collect_error = Some(e),
        }
    }
    let bytes = serde_json::to_vec(&out).unwrap_or_default();
    // Closing the report ends the job for the engine: it need not wait for this process and
    // its namespaces to be torn down.
    let _ = fs::File::from(report).write_all(&bytes);
    sys::exit_now(0)
}

struct JobFds {
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    /// Close-on-exec pipe: the zygote sees EOF at the program's exec, or an error message.
    exec_notify: OwnedFd,
}

/// Reports a failure that stops the job before its program runs, then exits.
fn abort_job(fds: &JobFds, setup_w: &OwnedFd, message: &str) -> ! {
    let _ = nix::unistd::write(setup_w, message.as_bytes());
    let _ = nix::unistd::write(&fds.exec_notify, message.as_bytes());
    sys::exit_now(1)
}

/// The isolation steps that do not depend on the job, taken by the launcher before it
/// announces itself ready. Order: no_new_privs before seccomp (the kernel requires it
/// unprivileged) and before exec; capabilities dropped before seccomp, which may deny capset;
/// the filter last. Loading the filter (the kernel compiles it) is the costliest of them, and
/// none of it is on the spawn path. From here on the launcher handles the job's input (files,
/// paths, the working directory) with no capabilities and under the filter.
fn harden(hardening: &Hardening) -> Result<(), String> {
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    sys::drop_all_capabilities(hardening.last_capability)
        .map_err(|e| format!("drop capabilities: {e}"))?;
    sys::install_seccomp(&hardening.seccomp).map_err(|e| format!("seccomp: {e}"))
}

/// The launcher: hardens itself, announces the sandbox ready, waits for its job, prepares it
/// and execs it.
fn launch(
    sock: &OwnedFd,
    handoff: &OwnedFd,
    setup_w: &OwnedFd,
    cfg: &ZygoteConfig,
    hardening: &Hardening,
) -> ! {
    if let Err(error) = harden(hardening) {
        // Fail closed: this sandbox never takes a job; the zygote fails the next one with
        // the reason.
        let _ = wire::send(sock.as_fd(), &FromInit::SetupFailed { error }, &[]);
        sys::exit_now(1);
    }
    if wire::send(sock.as_fd(), &FromInit::Ready, &[]).is_err() {
        sys::exit_now(1);
    }
    let (wait_for_release, fds) = match wire::recv::<ToInit>(sock.as_fd()) {
        Ok(Some(wire::Received {
            message: ToInit::Run { wait_for_release },
            fds,
            ..
        })) if fds.len() == 6 => (wait_for_release, fds),
        // The zygote is shutting down or retired this sandbox.
        _ => sys::exit_now(0),
    };
    let [payload_fd, stdin, stdout, stderr, report, exec_notify]: [OwnedFd; 6] =
        fds.try_into().unwrap_or_else(|_| sys::exit_now(1));
    let fds = JobFds {
        stdin,
        stdout,
        stderr,
        exec_notify,
    };
    if wait_for_release {
        match wire::recv::<ToInit>(sock.as_fd()) {
            Ok(Some(wire::Received {
                message: ToInit::Release,
                ..
            })) => {}
            _ => sys::exit_now(0),
        }
    }
    let mut raw = Vec::new();
    let payload: Payload = match fs::File::from(payload_fd).read_to_end(&mut raw) {
        Ok(_) => match serde_json::from_slice(&raw) {
            Ok(p) => p,
            Err(e) => abort_job(&fds, setup_w, &format!("read job: {e}")),
        },
        Err(e) => abort_job(&fds, setup_w, &format!("read job: {e}")),
    };
    drop(raw);
    let resize_disk_mb =
        (payload.limits.disk_mb != cfg.defaults.disk_mb).then_some(payload.limits.disk_mb);
    let handed = Handoff {
        collect: payload.job.collect.clone(),
        collect_max_bytes: payload.collect_max_bytes,
        resize_disk_mb,
    };
    if let Err(e) = wire::send(handoff.as_fd(), &handed, &[report.as_fd()]) {
        abort_job(&fds, setup_w, &format!("hand the report over: {e}"));
    }
    drop(report);
    if resize_disk_mb.is_some() {
        match wire::recv::<Resized>(handoff.as_fd()) {
            Ok(Some(wire::Received {
                message: Resized { error: None },
                ..
            })) => {}
            Ok(Some(wire::Received {
                message: Resized { error: Some(e) },
                ..
            })) => abort_job(&fds, setup_w, &e),
            _ => abort_job(&fds, setup_w, "resize the disk: the init did not answer"),
        }
    }
    let work = Path::new(&cfg.work_dir);
    if let Err(e) = write_files(work, &payload) {
        abort_job(&fds, setup_w, &format!("{JOB_FAULT_MARK}{e}"));
    }
    let cwd = match &payload.job.cwd {
        Some(c) if c.starts_with('/') => PathBuf::from(c),
        Some(c) => work.join(c),
        None => work.to_owned(),
    };
    if cwd.starts_with(work) {
        if let Err(e) = fs::create_dir_all(&cwd) {
            let e = format!("{JOB_FAULT_MARK}cwd {}: {e}", cwd.display());
            abort_job(&fds, setup_w, &e);
        }
    }
    exec_program(&fds, setup_w, &payload, &cwd)
}

/// Waits for the program, then kills and reaps everything else in the sandbox.
fn reap(main_pid: Pid) -> (Option<i32>, Option<i32>) {
    let mut result = (None, None);
    loop {
        match waitpid(None, None) {
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
    result
}

fn write_files(work: &Path, payload: &Payload) -> Result<(), String> {
    for (rel, data) in &payload.job.files {
        let path = work.join(rel);
        let bytes = data.to_bytes().map_err(|e| format!("files.{rel}: {e}"))?;
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| format!("files.{rel}: {e}"))?;
        }
        fs::write(&path, bytes).map_err(|e| format!("files.{rel}: {e}"))?;
    }
    Ok(())
}

/// The program's side of the fork: the last isolation steps, then exec.
fn exec_program(fds: &JobFds, setup_w: &OwnedFd, payload: &Payload, cwd: &Path) -> ! {
    let fail = |message: &str| -> ! { abort_job(fds, setup_w, message) };
    let step = |name: &str, r: Result<(), Errno>| {
        if let Err(e) = r {
            fail(&format!("{name}: {e}"));
        }
    };
    // A new session: no controlling terminal to inject input into.
    step("setsid", nix::unistd::setsid().map(drop));
    step(
        "stdin",
        nix::unistd::dup2(fds.stdin.as_raw_fd(), 0).map(drop),
    );
    step(
        "stdout",
        nix::unistd::dup2(fds.stdout.as_raw_fd(), 1).map(drop),
    );
    step(
        "stderr",
        nix::unistd::dup2(fds.stderr.as_raw_fd(), 2).map(drop),
    );
    if let Err(e) = nix::unistd::chdir(cwd) {
        fail(&format!("{JOB_FAULT_MARK}cwd {}: {e}", cwd.display()));
    }
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let l = &payload.limits;
    let mib = 1024 * 1024;
    let cpu_s = l.cpu_ms.div_ceil(1000);
    for (resource, soft, hard, name) in [
        (
            Resource::RLIMIT_AS,
            l.memory_mb * mib,
            l.memory_mb * mib,
            "rlimit memory",
        ),
        (Resource::RLIMIT_NPROC, l.pids, l.pids, "rlimit pids"),
        // SIGXCPU at the limit, SIGKILL a second later if it is caught.
        (Resource::RLIMIT_CPU, cpu_s, cpu_s + 1, "rlimit cpu"),
        (
            Resource::RLIMIT_FSIZE,
            l.file_size_mb * mib,
            l.file_size_mb * mib,
            "rlimit file size",
        ),
        (
            Resource::RLIMIT_NOFILE,
            l.open_files,
            l.open_files,
            "rlimit open files",
        ),
        (Resource::RLIMIT_CORE, 0, 0, "rlimit core"),
    ] {
        step(name, setrlimit(resource, soft, hard));
    }
    // no_new_privs, the capability drop and the filter were taken by `harden`. Every
    // descriptor but stdio is marked close-on-exec last, after the last use of the ones we
    // were given.
    step("close descriptors", sys::cloexec_from(3));
    let argv = match to_cstrings(&payload.argv) {
        Ok(a) => a,
        Err(e) => fail(&e),
    };
    let envp: Vec<CString> = payload
        .env
        .iter()
        .filter_map(|(k, v)| CString::new(format!("{k}={v}")).ok())
        .collect();
    let path_var = payload
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    let candidates = resolve(&payload.argv[0], path_var);
    // The deadline starts here; the zygote may notice the exec a little later.
    let stamp = format!("{EXEC_MARK}{}", super::mono_ns());
    let _ = nix::unistd::write(&fds.exec_notify, stamp.as_bytes());
    let _ = nix::unistd::write(setup_w, stamp.as_bytes());
    let mut last = Errno::ENOENT;
    for path in &candidates {
        let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        let Err(e) = nix::unistd::execve(&c, &argv, &envp);
        // Like execvp: keep looking past missing or unusable entries.
        if e != Errno::ENOENT && e != Errno::ENOTDIR {
            last = e;
        }
    }
    let (code, what) = match last {
        Errno::ENOENT => (EXIT_NOT_FOUND, "command not found".to_owned()),
        e => (EXIT_NOT_EXECUTABLE, e.desc().to_owned()),
    };
    let _ = nix::unistd::write(
        std::io::stderr().as_fd(),
        format!("forkbox: {}: {what}\n", payload.argv[0]).as_bytes(),
    );
    sys::exit_now(code)
}

fn to_cstrings(items: &[String]) -> Result<Vec<CString>, String> {
    items
        .iter()
        .map(|s| CString::new(s.as_bytes()).map_err(|_| format!("argument {s:?} contains NUL")))
        .collect()
}

/// Candidate paths for a program name, in `PATH` order (a name with a slash is used as is).
pub fn resolve(program: &str, path_var: &str) -> Vec<PathBuf> {
    if program.contains('/') {
        return vec![PathBuf::from(program)];
    }
    path_var
        .split(':')
        .map(|dir| {
            if dir.is_empty() {
                Path::new(".")
            } else {
                Path::new(dir)
            }
            .join(program)
        })
        .collect()
}

/// Reads the files of `/work` matching `patterns`, up to `max_bytes` in total.
fn collect(
    work: &Path,
    patterns: &[String],
    max_bytes: u64,
) -> Result<BTreeMap<String, FileData>, String> {
    let mut files = BTreeMap::new();
    let mut total = 0u64;
    for pattern in patterns {
        let full = work.join(pattern);
        let matches =
            glob::glob(&full.to_string_lossy()).map_err(|e| format!("collect {pattern:?}: {e}"))?;
        for path in matches.flatten() {
            // Only regular files, and never through a symlink planted by the program.
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            let rel = path
                .strip_prefix(work)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            if files.contains_key(&rel) {
                continue;
            }
            total += meta.len();
            if total > max_bytes {
                return Err(format!("collected files exceed {max_bytes} bytes at {rel}"));
            }
            let bytes = fs::read(&path).map_err(|e| format!("collect {rel}: {e}"))?;
            files.insert(rel, FileData::from_bytes(bytes));
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_follows_path_order() {
        assert_eq!(
            resolve("/bin/sh", "/usr/bin"),
            vec![PathBuf::from("/bin/sh")]
        );
        assert_eq!(resolve("./a", "/x"), vec![PathBuf::from("./a")]);
        assert_eq!(
            resolve("py", "/usr/local/bin:/usr/bin:"),
            vec![
                PathBuf::from("/usr/local/bin/py"),
                PathBuf::from("/usr/bin/py"),
                PathBuf::from("./py")
            ]
        );
    }

    #[test]
    fn collect_reads_matching_regular_files_only() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("out")).unwrap();
        fs::write(dir.path().join("out/a.txt"), "A").unwrap();
        fs::write(dir.path().join("out/b.bin"), [0xffu8]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("out/link.txt")).unwrap();
        let got = collect(dir.path(), &["out/*.txt".into(), "out/*".into()], 100).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got["out/a.txt"], FileData::Text("A".into()));
        assert!(matches!(got["out/b.bin"], FileData::Base64(_)));
        let err = collect(dir.path(), &["out/*".into()], 1).unwrap_err();
        assert!(err.contains("exceed 1 bytes"), "{err}");
    }
}
