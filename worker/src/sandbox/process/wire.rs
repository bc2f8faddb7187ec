//! Messages between the engine, the zygote and each sandbox init.
//!
//! All three talk over `SOCK_SEQPACKET` socket pairs: one message is one datagram (no framing
//! to get wrong), descriptors travel with it as `SCM_RIGHTS`, and a closed peer reads as an
//! empty message. Messages are small JSON objects; the job itself (files can be megabytes)
//! travels in a sealed memfd so the single-threaded zygote never copies it. Every message is
//! typed, one enum per direction; the one that travels on pipes instead, the launcher's
//! [`ExecNote`] (its exec time, or the [`SetupError`] that stopped it), is one JSON value
//! written at once and read until the pipe closes.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use forkbox_queue::schema::{EffectiveLimits, Job, Network};
use nix::errno::Errno;
use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::sandbox::isolate::rootfs::RootSource;
use crate::sandbox::isolate::setup_error::SetupError;
use crate::sandbox::kernel::sys;

/// Largest control message; jobs travel in memfds, so this is generous.
const MAX_MESSAGE: usize = 64 * 1024;
/// Most descriptors carried by one message (a dispatch carries six).
const MAX_FDS: usize = 8;

/// Sent once by the engine when the zygote starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ZygoteConfig {
    pub root: RootSource,
    /// A host directory with the empty mount points `root` (the zygote's root template, or an
    /// image's overlay) and `layers` (each sandbox's disk), mounted on only in the zygote's and
    /// the sandboxes' own mount namespaces, so the host never sees those mounts.
    pub staging: PathBuf,
    pub work_dir: String,
    pub defaults: EffectiveLimits,
    /// How many pre-warmed sandboxes to keep ready.
    pub pool: usize,
    /// Give each sandbox its own network namespace, instead of sharing the zygote's.
    pub net_per_sandbox: bool,
    /// The network of the sandboxes built ahead of demand; a job asking for the other mode
    /// gets a sandbox built for it.
    #[serde(default)]
    pub network_default: Network,
    /// The engine places each init into a cgroup before the program starts.
    pub cgroup_handshake: bool,
    /// Warm the Python runtime before the first sandbox.
    #[serde(default)]
    pub python: Option<crate::sandbox::runtime::python::WarmRequest>,
    /// The id, in the zygote's user namespace, of every sandbox's root (`identity::sandbox_id`).
    pub sandbox_id: u32,
    /// The largest socket buffer the host allows (`sockets::buffer_max` in the engine's
    /// network namespace), `None` where it cannot be read: the memory budget's worst case of a
    /// socket, for a kernel that shows it in no sandbox's namespace.
    #[serde(default)]
    pub socket_buffer_max: Option<u64>,
}

/// Engine → zygote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToZygote {
    /// The uid/gid maps of the zygote's user namespace are written.
    MapsWritten,
    /// Run a job. Carries [payload, stdin, stdout, stderr, report] descriptors.
    Spawn {
        req: u64,
        timeout_ms: u64,
        network: Network,
        /// For a staged job: the watchdog's deadline before the program's exec (the compile
        /// stage's limit and a margin), in case its launcher is stopped or killed.
        #[serde(default)]
        stage_ms: Option<u64>,
        /// A session's sandbox: long-lived, outside the engine's slots, so it does not count
        /// against the sandboxes the zygote keeps ready for jobs; the zygote reports its host
        /// pids (`Assigned`) even without a cgroup handshake.
        #[serde(default)]
        session: bool,
    },
    /// The engine is handing job `req` to the launcher of `sandbox` itself (see
    /// [`FromZygote::Launcher`]). Carries the read end of the job's exec-notify pipe. Sent
    /// before the job goes to the launcher, so the zygote knows the sandbox is taken, and
    /// watches for its exec, before its program can start.
    Started {
        req: u64,
        sandbox: u64,
        timeout_ms: u64,
        #[serde(default)]
        stage_ms: Option<u64>,
        /// A session's sandbox (see `Spawn`).
        #[serde(default)]
        session: bool,
    },
    /// Kill a job's sandbox now (output cap, cancellation).
    Kill { req: u64 },
    /// The init of `req` was placed into its cgroup and may start the program.
    Release { req: u64 },
}

/// Zygote → engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FromZygote {
    /// The zygote entered its user namespace; the engine must write its maps.
    NeedMaps,
    /// The zygote is set up and serving.
    Ready {
        seccomp_instructions: usize,
        /// The warm Python runtime, when asked for: what was loaded, or why it is unusable.
        #[serde(default)]
        python: Option<Result<crate::sandbox::runtime::python::WarmInfo, String>>,
    },
    /// The zygote could not be set up: the step that failed and why.
    StartFailed { error: SetupError },
    /// A sandbox was assigned (cgroup handshake, or a session's sandbox): the host pids of its
    /// init and of the launcher that becomes the program, both to be placed in the job's
    /// cgroup (and a session's usage read from the init's `/proc`).
    Assigned { req: u64, pids: Vec<i32> },
    /// The sandbox is gone.
    Exited(Exit),
    /// A ready sandbox the engine may hand a job to itself. Carries the job channel to its
    /// launcher, over which the engine sends [`ToInit::Run`] after [`ToZygote::Started`].
    /// `pids` are the host pids of its init and its launcher, for the job's cgroup; `network`
    /// is the mode its seccomp program and namespace were built for.
    Launcher {
        sandbox: u64,
        pids: Vec<i32>,
        network: Network,
    },
    /// A sandbox given to the engine ended before it got a job.
    LauncherGone { sandbox: u64 },
}

/// How a sandbox ended, as seen from the zygote.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Exit {
    pub req: u64,
    /// When the program was exec'd, if it was.
    pub exec_ns: Option<i64>,
    pub exit_ns: i64,
    pub timed_out: bool,
    pub killed: bool,
    pub overshoot_ns: Option<i64>,
    pub cpu_us: u64,
    pub max_rss_kb: u64,
    /// Which isolation step failed and why; the program did not run.
    pub error: Option<SetupError>,
}

/// Zygote → init; `Run` and `Release` go to the launcher, from the zygote or the engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToInit {
    MapsWritten,
    /// Carries [payload, stdin, stdout, stderr, report, exec-notify] descriptors, with a
    /// staged job's compile-stage report pipe before exec-notify.
    Run {
        wait_for_release: bool,
    },
    Release,
}

/// Init → zygote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FromInit {
    Ready,
    SetupFailed { error: SetupError },
}

/// Launcher → init, once it has its job. Carries the report pipe.
#[derive(Debug, Serialize, Deserialize)]
pub struct Handoff {
    pub collect: Vec<String>,
    pub collect_max_bytes: u64,
    /// The job's tmpfs size when it differs from the pre-built one. Remounting needs the
    /// capabilities the launcher has already dropped, so the init does it and answers with
    /// a [`Resized`] before the launcher goes on.
    pub resize_disk_mb: Option<u64>,
    /// The job's memory limit when it differs from the one the ipc limits were set for
    /// (see `ipc`); set by the init like the disk size, answered by the same [`Resized`].
    pub ipc_memory_mb: Option<u64>,
    /// The job's CPU time for the whole sandbox, when the init keeps it (no cgroup does).
    #[serde(default)]
    pub cpu_budget_ms: Option<u64>,
    /// The job's wall-clock limit: a budget that cannot run out before it is not kept.
    #[serde(default)]
    pub timeout_ms: u64,
    /// Whether the init counts what the job holds outside its processes into its peak
    /// (`held.rs`): only when `RLIMIT_DATA` bounds it, since a cgroup's `memory.peak` has it.
    #[serde(default)]
    pub count_held: bool,
    /// The job's memory for the whole sandbox, when the init keeps it (no cgroup does; see
    /// `memory`).
    #[serde(default)]
    pub memory_budget_mb: Option<u64>,
    /// The host's largest socket buffer, for the memory budget (`ZygoteConfig`).
    #[serde(default)]
    pub socket_buffer_max: Option<u64>,
}

impl Handoff {
    /// Whether the launcher waits for the init to adjust the sandbox to its job.
    pub fn needs_answer(&self) -> bool {
        self.resize_disk_mb.is_some() || self.ipc_memory_mb.is_some()
    }
}

/// Init → launcher: the answer to a resize request, the step that failed or none.
#[derive(Debug, Serialize, Deserialize)]
pub struct Resized {
    pub error: Option<SetupError>,
}

/// What the launcher writes on the exec-notify pipe (to the zygote, whose watchdog starts at
/// the exec) and on the set-up pipe (to its init): the program's exec time, or why the
/// program never ran. One note per job, written in one `write` and followed by the pipe's
/// close (at the exec, or the launcher's exit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecNote {
    /// The program is exec'd now (CLOCK_MONOTONIC).
    Exec { ns: i64 },
    /// A step before the exec failed; the launcher exits.
    Failed(SetupError),
}

impl ExecNote {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an exec note always encodes")
    }

    /// The exec time in everything read from a pipe until its close, or why the program
    /// never ran: nothing read means the launcher died before it could say.
    pub fn decode(bytes: &[u8]) -> Result<i64, SetupError> {
        if bytes.is_empty() {
            return Err(SetupError::new(
                "the sandbox exited before its program started",
            ));
        }
        match serde_json::from_slice(bytes) {
            Ok(ExecNote::Exec { ns }) => Ok(ns),
            Ok(ExecNote::Failed(error)) => Err(error),
            Err(e) => Err(SetupError::text("exec note", e)),
        }
    }
}

/// The job as the init needs it, written into a memfd by the engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Payload {
    pub job: Job,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub limits: EffectiveLimits,
    /// What bounds the program's memory: its cgroup, or `RLIMIT_DATA`.
    #[serde(default)]
    pub memory: crate::sandbox::isolate::limits::MemoryEnforcement,
    pub collect_max_bytes: u64,
    /// Run the program in the sandbox's warm interpreter instead of exec'ing it.
    #[serde(default)]
    pub warm: Option<crate::sandbox::runtime::python::WarmPlan>,
    /// A compile stage the launcher runs before the program (`stage.rs`).
    #[serde(default)]
    pub compile: Option<CompilePlan>,
}

/// The compile stage of a staged job, as the launcher runs it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompilePlan {
    pub argv: Vec<String>,
    /// The stage's limits (the sandbox-wide ones are the job's).
    pub limits: EffectiveLimits,
    pub timeout_ms: u64,
}

/// Why the launcher killed a compile stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageKill {
    Timeout,
    Cpu,
    Memory,
    Output,
}

/// How a compile stage ended, as the launcher reports it to the engine (on a pipe of its own:
/// it must reach the engine even when the sandbox is killed from outside later).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StageReport {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub killed: Option<StageKill>,
    pub duration_ns: i64,
    /// CPU time and peak RSS of the stage's processes, counted up to a kill.
    pub cpu_us: u64,
    pub max_rss_kb: u64,
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    #[serde(default)]
    pub stdout_truncated: bool,
    #[serde(default)]
    pub stderr_truncated: bool,
}

/// Launcher → init, once the run stage of a staged job (the launcher's child) ended: its own
/// CPU time and peak, apart from the compile stage's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunUsage {
    pub cpu_us: u64,
    pub max_rss_kb: u64,
}

/// What the init reports to the engine after the program exits.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// When the program was exec'd (CLOCK_MONOTONIC).
    pub exec_ns: Option<i64>,
    /// When the program's exit was reaped (CLOCK_MONOTONIC).
    pub exit_ns: Option<i64>,
    /// CPU time and peak RSS of everything the init reaped.
    pub cpu_us: u64,
    pub max_rss_kb: u64,
    /// What the job still held outside its processes when it ended (its disk's files, SysV
    /// shared memory and message queues: `held.rs`).
    #[serde(default)]
    pub held_kb: u64,
    /// Why the program never ran (an isolation step failed between fork and exec).
    pub setup_error: Option<SetupError>,
    pub files: std::collections::BTreeMap<String, forkbox_queue::FileData>,
    /// Collected files cut short by the collect cap.
    #[serde(default)]
    pub files_truncated: Vec<String>,
    pub collect_error: Option<String>,
    /// The init killed the sandbox because its processes together used up the job's CPU time.
    #[serde(default)]
    pub cpu_budget_exceeded: bool,
    /// The init killed the sandbox because its processes together held more than the job's
    /// memory (`memory`).
    #[serde(default)]
    pub memory_budget_exceeded: bool,
    /// The most the sandbox's processes held together at one of the init's checks, in KiB
    /// (anonymous and shared memory and page tables; 0 when no budget was kept).
    #[serde(default)]
    pub memory_counted_kb: u64,
    /// For a staged job: the run stage's own CPU time and peak, as its launcher saw them.
    #[serde(default)]
    pub run: Option<RunUsage>,
}

/// A message and the descriptors that came with it.
pub struct Received<T> {
    pub message: T,
    pub fds: Vec<OwnedFd>,
    /// The sender's pid in our pid namespace, on sockets with `SO_PASSCRED` (see
    /// [`pass_credentials`]).
    pub sender_pid: Option<i32>,
}

/// Makes the kernel attach each sender's credentials to the messages read from `sock`.
pub fn pass_credentials(sock: &OwnedFd) -> Result<(), Errno> {
    socket::setsockopt(sock, socket::sockopt::PassCred, &true)
}

/// Sends one message with descriptors attached.
pub fn send<T: Serialize>(
    sock: BorrowedFd<'_>,
    message: &T,
    fds: &[BorrowedFd<'_>],
) -> Result<(), Errno> {
    let bytes = serde_json::to_vec(message).map_err(|_| Errno::EINVAL)?;
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs = if raw.is_empty() {
        vec![]
    } else {
        vec![ControlMessage::ScmRights(&raw)]
    };
    loop {
        match socket::sendmsg::<()>(
            sock.as_raw_fd(),
            &[IoSlice::new(&bytes)],
            &cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(_) => return Ok(()),
        }
    }
}

/// Whether a message (or the peer's close) is waiting on `sock`, without blocking.
pub fn has_message(sock: BorrowedFd<'_>) -> bool {
    let mut fds = [nix::poll::PollFd::new(sock, nix::poll::PollFlags::POLLIN)];
    matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0)
}

/// Whether the peer of `sock` has closed its end (the kernel closes it when the peer exits),
/// without blocking or reading.
pub fn peer_gone(sock: BorrowedFd<'_>) -> bool {
    let mut fds = [nix::poll::PollFd::new(sock, nix::poll::PollFlags::empty())];
    nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).is_ok()
        && fds[0]
            .revents()
            .is_some_and(|r| r.contains(nix::poll::PollFlags::POLLHUP))
}

/// Receives one message; `Ok(None)` when the peer has closed.
pub fn recv<T: DeserializeOwned>(sock: BorrowedFd<'_>) -> Result<Option<Received<T>>, Errno> {
    // Sized to the datagram: a fixed 64 KiB buffer would be zeroed on every call, and in a
    // freshly forked sandbox process each of its pages is a copy-on-write fault.
    let mut buf = vec![0u8; next_len(sock)?.min(MAX_MESSAGE)];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; MAX_FDS], libc::ucred);
    let (len, fds, sender_pid) = loop {
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        match socket::recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(msg) => {
                let mut fds = Vec::new();
                let mut sender_pid = None;
                for c in msg.cmsgs().map_err(|_| Errno::EBADMSG)? {
                    match c {
                        ControlMessageOwned::ScmRights(raw) => {
                            fds.extend(sys::adopt_received(raw)?);
                        }
                        ControlMessageOwned::ScmCredentials(creds) => {
                            sender_pid = Some(creds.pid())
                        }
                        _ => {}
                    }
                }
                if msg.flags.contains(MsgFlags::MSG_TRUNC)
                    || msg.flags.contains(MsgFlags::MSG_CTRUNC)
                {
                    return Err(Errno::EMSGSIZE);
                }
                break (msg.bytes, fds, sender_pid);
            }
        }
    };
    if len == 0 && fds.is_empty() {
        return Ok(None);
    }
    let message = serde_json::from_slice(&buf[..len]).map_err(|_| Errno::EBADMSG)?;
    Ok(Some(Received {
        message,
        fds,
        sender_pid,
    }))
}

/// The length of the next datagram, without taking it (0 once the peer has closed); waits
/// for one to arrive. A datagram longer than the buffer given makes the receive fail with
/// `EMSGSIZE` rather than arrive cut short.
fn next_len(sock: BorrowedFd<'_>) -> Result<usize, Errno> {
    loop {
        match socket::recv(
            sock.as_raw_fd(),
            &mut [],
            MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC,
        ) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// A connected `SOCK_SEQPACKET` pair, close-on-exec.
pub fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), Errno> {
    socket::socketpair(
        socket::AddressFamily::Unix,
        socket::SockType::SeqPacket,
        None,
        socket::SockFlag::SOCK_CLOEXEC,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::isolate::setup_error::Fault;

    #[test]
    fn a_closed_peer_is_seen_without_reading() {
        use std::os::fd::AsFd;
        let (a, b) = seqpacket_pair().unwrap();
        assert!(!peer_gone(a.as_fd()));
        send(b.as_fd(), &ToInit::MapsWritten, &[]).unwrap();
        // A message waiting is not a close.
        assert!(!peer_gone(a.as_fd()));
        drop(b);
        assert!(peer_gone(a.as_fd()));
    }

    #[test]
    fn exec_notes_round_trip() {
        let failed = SetupError::errno("cwd", Errno::ENOENT)
            .at("/nonexistent")
            .of_job();
        for note in [
            ExecNote::Exec { ns: 0 },
            ExecNote::Exec {
                ns: 1_234_567_890_123,
            },
            ExecNote::Failed(failed.clone()),
            ExecNote::Failed(SetupError::new("argument \"a\\u{0}\" contains NUL")),
            ExecNote::Failed(SetupError::text("read job", "EOF while parsing")),
        ] {
            let bytes = note.encode();
            let back: ExecNote = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(back, note);
            let decoded = ExecNote::decode(&bytes);
            match note {
                ExecNote::Exec { ns } => assert_eq!(decoded, Ok(ns)),
                ExecNote::Failed(e) => assert_eq!(decoded, Err(e)),
            }
        }
        // The fault and the errno survive as such, not as text.
        let Err(back) = ExecNote::decode(&ExecNote::Failed(failed).encode()) else {
            panic!("a failure decodes as one");
        };
        assert_eq!(back.fault, Fault::Job);
        assert_eq!(back.errno_value(), Some(Errno::ENOENT));
        assert_eq!(back.path.as_deref(), Some("/nonexistent"));
    }

    #[test]
    fn a_missing_or_garbled_note_is_a_failure_that_says_so() {
        let empty = ExecNote::decode(b"").unwrap_err();
        assert_eq!(
            empty.to_string(),
            "the sandbox exited before its program started"
        );
        assert_eq!(empty.fault, Fault::Sandbox);
        // Half a note (a launcher killed mid-write) or foreign bytes are not an exec time.
        let encoded = ExecNote::Exec { ns: 42 }.encode();
        for bytes in [&encoded[..encoded.len() - 1], b"@42".as_slice()] {
            let e = ExecNote::decode(bytes).unwrap_err();
            assert_eq!(e.step, "exec note", "{e}");
            assert_eq!(e.fault, Fault::Sandbox);
        }
    }

    /// The text users see: `<step>[ <path>][: <cause>]`, with each errno shown the way the
    /// call that failed reports it.
    #[test]
    fn set_up_errors_read_as_before() {
        let io = std::io::Error::from_raw_os_error(libc::ENOTDIR);
        let rows = [
            (
                SetupError::errno("stdin", Errno::EBADF),
                "stdin: EBADF: Bad file number",
            ),
            (
                SetupError::errno("cwd", Errno::ENOENT).at("/nonexistent"),
                "cwd /nonexistent: ENOENT: No such file or directory",
            ),
            (
                SetupError::io("cwd", &io).at("/work/sub/inner"),
                "cwd /work/sub/inner: Not a directory (os error 20)",
            ),
            (
                SetupError::io("files.a/b", &io),
                "files.a/b: Not a directory (os error 20)",
            ),
            (
                SetupError::io("read job", &std::io::Error::other("custom")),
                "read job: custom",
            ),
            (
                SetupError::text("adjust the sandbox", "the init did not answer"),
                "adjust the sandbox: the init did not answer",
            ),
            (
                SetupError::new("sandbox init exited during set-up"),
                "sandbox init exited during set-up",
            ),
            (
                crate::sandbox::isolate::limits::RlimitError {
                    name: "rlimit pids",
                    errno: Errno::EPERM,
                }
                .into(),
                "rlimit pids: EPERM: Operation not permitted",
            ),
        ];
        for (error, text) in rows {
            assert_eq!(error.to_string(), text);
            // The same text after the trip over a pipe.
            let Err(back) = ExecNote::decode(&ExecNote::Failed(error).encode()) else {
                panic!("{text}: decoded as an exec");
            };
            assert_eq!(back.to_string(), text);
        }
    }

    #[test]
    fn a_zygote_start_failure_travels_typed() {
        use std::os::fd::AsFd;
        let (a, b) = seqpacket_pair().unwrap();
        let error = SetupError::errno("make-rprivate", Errno::EPERM).at("/");
        send(
            a.as_fd(),
            &FromZygote::StartFailed {
                error: error.clone(),
            },
            &[],
        )
        .unwrap();
        match recv::<FromZygote>(b.as_fd()).unwrap().map(|r| r.message) {
            Some(FromZygote::StartFailed { error: got }) => {
                assert_eq!(got, error);
                assert_eq!(
                    got.to_string(),
                    "make-rprivate /: EPERM: Operation not permitted"
                );
                assert_eq!(got.fault, Fault::Sandbox);
            }
            other => panic!("{other:?}"),
        }
    }
}
