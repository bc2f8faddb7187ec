//! The launcher: forked by each sandbox's init ahead of demand, it becomes the job's program.
//!
//! Its steps, in order (see [`main`]): harden itself (no_new_privs, capabilities, seccomp)
//! before any job exists; announce the sandbox ready; receive the job (from the engine or the
//! zygote) and, with a cgroup handshake, wait for its release; read the payload; hand the
//! report pipe to its init, which adjusts the disk and ipc limits if the job needs others;
//! write the job's files; make its working directory; then the last steps before exec
//! ([`exec_program`]): session, stdio, directory, umask, rlimits, signal dispositions,
//! close-on-exec, the exec note, exec. A failure at any step is written as the job's exec
//! note and the launcher exits: the program never runs (fail closed).

use std::ffi::CString;
use std::fs;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::wire::{self, ExecNote, FromInit, Handoff, Payload, Resized, ToInit, ZygoteConfig};
use crate::sandbox::isolate::hardening::{self, Hardening};
use crate::sandbox::isolate::limits;
use crate::sandbox::isolate::setup_error::SetupError;
use crate::sandbox::kernel::clock;
use crate::sandbox::kernel::sys;

/// Exit code of a program whose command was not found (as in a shell).
const EXIT_NOT_FOUND: i32 = 127;
/// Exit code of a program found but not executable.
const EXIT_NOT_EXECUTABLE: i32 = 126;

/// The launcher's channels to the rest of the sandbox.
pub(super) struct Channels {
    /// To the zygote (or, for `Run`, the engine): ready, the job.
    pub sock: OwnedFd,
    /// To the init: the report pipe, resize requests.
    pub handoff: OwnedFd,
    /// To the init: the job's exec note, for its report.
    pub setup_w: OwnedFd,
}

/// Runs the launcher; never returns. The steps, in order.
pub(super) fn main(ch: Channels, cfg: &ZygoteConfig, hardening: &Hardening) -> ! {
    // Before any job exists, so the job's input is only ever handled under the filter.
    let ready = hardening::harden(hardening)
        .and_then(|()| crate::sandbox::runtime::python::prepare().map_err(SetupError::new));
    if let Err(error) = ready {
        // Fail closed: this sandbox never takes a job; the zygote fails the next one with
        // the reason.
        let _ = wire::send(ch.sock.as_fd(), &FromInit::SetupFailed { error }, &[]);
        sys::exit_now(1);
    }
    if wire::send(ch.sock.as_fd(), &FromInit::Ready, &[]).is_err() {
        sys::exit_now(1);
    }
    let (job, payload_fd, report, stage_fd) = receive_job(&ch);
    let payload = job.or_abort(read_payload(payload_fd));
    // The report pipe goes to the init before any of the job's input is touched.
    job.or_abort(hand_report_over(&ch.handoff, report, &payload, cfg));
    let work = Path::new(&cfg.work_dir);
    job.or_abort(write_files(work, &payload).map_err(SetupError::of_job));
    let cwd = job.or_abort(make_cwd(work, &payload));
    if let Some(plan) = &payload.compile {
        // Fail closed: a stage nobody can hear of must not run, nor the program without it.
        let Some(stage_fd) = stage_fd else {
            job.abort(SetupError::new(
                "compile stage: no report pipe was handed over",
            ))
        };
        // A staged job: the compile stage first, in the working directory; the program runs
        // only if it succeeded. A first byte on the stage's pipe says it started, so a stage
        // that kills this process is told from a sandbox that failed before it.
        let _ = nix::unistd::write(&stage_fd, b"\n");
        let compiled = job.or_abort(super::stage::compile(
            plan,
            &payload.env,
            &cwd,
            payload.memory,
            resolve,
        ));
        super::stage::report_compiled(&stage_fd, &compiled, plan.limits.output_bytes);
        if !compiled.succeeded() {
            job.abort(SetupError::new("the compile stage did not succeed").of_job());
        }
        // The program starts under its own limits, not the compiler's.
        job.or_abort(super::stage::await_run_limits(&stage_fd));
        drop(stage_fd);
    }
    exec_program(&job, &payload, &cwd, &ch.handoff)
}

struct JobFds {
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    /// Close-on-exec pipe: the zygote sees EOF at the program's exec, after the exec note.
    exec_notify: OwnedFd,
}

/// A job the launcher has taken: from here on every failure is the job's exec note.
struct Taken<'a> {
    fds: JobFds,
    setup_w: &'a OwnedFd,
}

impl Taken<'_> {
    /// Writes the job's exec note to the zygote (its watchdog) and to the init (its report).
    fn note(&self, note: &ExecNote) {
        let bytes = note.encode();
        let _ = nix::unistd::write(&self.fds.exec_notify, &bytes);
        let _ = nix::unistd::write(self.setup_w, &bytes);
    }

    /// Reports a failure that stops the job before its program runs, then exits.
    fn abort(&self, error: SetupError) -> ! {
        self.note(&ExecNote::Failed(error));
        sys::exit_now(1)
    }

    fn or_abort<T>(&self, r: Result<T, SetupError>) -> T {
        r.unwrap_or_else(|e| self.abort(e))
    }
}

/// Waits for the job's descriptors and, with a cgroup handshake, for its release; returns
/// the job with its payload and report descriptors. Exits when the sandbox is retired.
fn receive_job(ch: &Channels) -> (Taken<'_>, OwnedFd, OwnedFd, Option<OwnedFd>) {
    let (wait_for_release, fds) = match wire::recv::<ToInit>(ch.sock.as_fd()) {
        Ok(Some(wire::Received {
            message: ToInit::Run { wait_for_release },
            fds,
            ..
        })) if fds.len() == 6 || fds.len() == 7 => (wait_for_release, fds),
        // The zygote is shutting down or retired this sandbox.
        _ => sys::exit_now(0),
    };
    // A staged job's compile-stage report pipe comes before exec-notify.
    let mut fds = fds.into_iter();
    let mut next = || fds.next().unwrap_or_else(|| sys::exit_now(1));
    let (payload_fd, stdin, stdout, stderr, report) = (next(), next(), next(), next(), next());
    let mut rest: Vec<OwnedFd> = fds.collect();
    let exec_notify = rest.pop().unwrap_or_else(|| sys::exit_now(1));
    let stage_fd = rest.pop();
    let job = Taken {
        fds: JobFds {
            stdin,
            stdout,
            stderr,
            exec_notify,
        },
        setup_w: &ch.setup_w,
    };
    if wait_for_release {
        // The engine places the sandbox in the job's cgroup first: limits apply before the
        // program runs.
        match wire::recv::<ToInit>(ch.sock.as_fd()) {
            Ok(Some(wire::Received {
                message: ToInit::Release,
                ..
            })) => {}
            _ => sys::exit_now(0),
        }
    }
    (job, payload_fd, report, stage_fd)
}

fn read_payload(payload_fd: OwnedFd) -> Result<Payload, SetupError> {
    let mut raw = Vec::new();
    fs::File::from(payload_fd)
        .read_to_end(&mut raw)
        .map_err(|e| SetupError::io("read job", &e))?;
    serde_json::from_slice(&raw).map_err(|e| SetupError::text("read job", e))
}

/// Hands the init the report pipe and what it needs for the report; when the job needs
/// another disk size or memory limit, waits for the init to adjust the sandbox (remounting
/// and the writable `/proc/sys` need what the launcher has dropped).
fn hand_report_over(
    handoff: &OwnedFd,
    report: OwnedFd,
    payload: &Payload,
    cfg: &ZygoteConfig,
) -> Result<(), SetupError> {
    let resize_disk_mb =
        (payload.limits.disk_mb != cfg.defaults.disk_mb).then_some(payload.limits.disk_mb);
    // The sandbox as a whole holds both stages of a staged job: the larger memory, the CPU
    // times and wall clocks together (the launcher holds the compile stage to its own).
    let (memory_mb, cpu_ms, timeout_ms) = match &payload.compile {
        Some(plan) => (
            payload.limits.memory_mb.max(plan.limits.memory_mb),
            payload.limits.cpu_ms.saturating_add(plan.limits.cpu_ms),
            payload.job.timeout_ms().saturating_add(plan.timeout_ms),
        ),
        None => (
            payload.limits.memory_mb,
            payload.limits.cpu_ms,
            payload.job.timeout_ms(),
        ),
    };
    let handed = Handoff {
        collect: payload.job.collect.clone(),
        collect_max_bytes: payload.collect_max_bytes,
        resize_disk_mb,
        ipc_memory_mb: (memory_mb != cfg.defaults.memory_mb).then_some(memory_mb),
        // With a cgroup, the job's CPU time is kept there.
        cpu_budget_ms: (!cfg.cgroup_handshake).then_some(cpu_ms),
        timeout_ms,
        count_held: payload.memory == limits::MemoryEnforcement::DataRlimit,
        memory_budget_mb: (payload.memory == limits::MemoryEnforcement::DataRlimit)
            .then_some(memory_mb),
        socket_buffer_max: cfg.socket_buffer_max,
    };
    wire::send(handoff.as_fd(), &handed, &[report.as_fd()])
        .map_err(|e| SetupError::errno("hand the report over", e))?;
    drop(report);
    if !handed.needs_answer() {
        return Ok(());
    }
    match wire::recv::<Resized>(handoff.as_fd()) {
        Ok(Some(wire::Received {
            message: Resized { error: None },
            ..
        })) => Ok(()),
        Ok(Some(wire::Received {
            message: Resized { error: Some(e) },
            ..
        })) => Err(e),
        _ => Err(SetupError::text(
            "adjust the sandbox",
            "the init did not answer",
        )),
    }
}

fn write_files(work: &Path, payload: &Payload) -> Result<(), SetupError> {
    for (rel, data) in &payload.job.files {
        let path = work.join(rel);
        let step = || format!("files.{rel}");
        let bytes = data.to_bytes().map_err(|e| SetupError::text(step(), e))?;
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| SetupError::io(step(), &e))?;
        }
        fs::write(&path, bytes).map_err(|e| SetupError::io(step(), &e))?;
    }
    Ok(())
}

/// The job's working directory, made if it lies in the work directory (the job's fault if
/// that fails).
fn make_cwd(work: &Path, payload: &Payload) -> Result<PathBuf, SetupError> {
    let cwd = match &payload.job.cwd {
        Some(c) if c.starts_with('/') => PathBuf::from(c),
        Some(c) => work.join(c),
        None => work.to_owned(),
    };
    if cwd.starts_with(work) {
        fs::create_dir_all(&cwd).map_err(|e| {
            SetupError::io("cwd", &e)
                .at(cwd.display().to_string())
                .of_job()
        })?;
    }
    Ok(cwd)
}

/// The program's side of the fork: the last isolation steps, then exec.
fn exec_program(job: &Taken<'_>, payload: &Payload, cwd: &Path, handoff: &OwnedFd) -> ! {
    let fds = &job.fds;
    let fail = |error: SetupError| -> ! { job.abort(error) };
    let step = |name: &str, r: Result<(), Errno>| {
        if let Err(e) = r {
            fail(SetupError::errno(name, e));
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
        fail(
            SetupError::errno("cwd", e)
                .at(cwd.display().to_string())
                .of_job(),
        );
    }
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    job.or_abort(limits::apply_rlimits(&payload.limits, payload.memory).map_err(SetupError::from));
    step("signal dispositions", sys::default_signals());
    // no_new_privs, the capability drop and the filter were taken by `hardening`. Every
    // descriptor but stdio is marked close-on-exec last, after the last use of the ones we
    // were given.
    step("close descriptors", sys::cloexec_from(3));
    let argv = match to_cstrings(&payload.argv) {
        Ok(a) => a,
        Err(e) => fail(e),
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
    if payload.warm.is_some() && !crate::sandbox::runtime::python::is_loaded() {
        fail(SetupError::new(
            "the warm interpreter is not loaded in this sandbox",
        ));
    }
    // The deadline starts here; the zygote may notice the exec a little later.
    job.note(&ExecNote::Exec {
        ns: clock::mono_ns(),
    });
    if payload.compile.is_some() {
        // A staged job's program runs as this process's child, so its usage is its own.
        let closing = [
            0,
            1,
            2,
            fds.stdin.as_raw_fd(),
            fds.stdout.as_raw_fd(),
            fds.stderr.as_raw_fd(),
            fds.exec_notify.as_raw_fd(),
            job.setup_w.as_raw_fd(),
        ];
        super::stage::run_child((&payload.argv, &payload.env), resolve, handoff, &closing)
    }
    if let Some(plan) = &payload.warm {
        // In place of execve: the program runs in this process's warm interpreter.
        crate::sandbox::runtime::python::run(plan, &payload.env)
    }
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

fn to_cstrings(items: &[String]) -> Result<Vec<CString>, SetupError> {
    items
        .iter()
        .map(|s| {
            CString::new(s.as_bytes())
                .map_err(|_| SetupError::new(format!("argument {s:?} contains NUL")))
        })
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
}
