//! Messages between the engine, the zygote and each sandbox init.
//!
//! All three talk over `SOCK_SEQPACKET` socket pairs: one message is one datagram (no framing
//! to get wrong), descriptors travel with it as `SCM_RIGHTS`, and a closed peer reads as an
//! empty message. Messages are small JSON objects; the job itself (files can be megabytes)
//! travels in a sealed memfd so the single-threaded zygote never copies it.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use forkbox_queue::schema::{EffectiveLimits, Job};
use nix::errno::Errno;
use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::sys;

/// Largest control message; jobs travel in memfds, so this is generous.
const MAX_MESSAGE: usize = 64 * 1024;
/// Most descriptors carried by one message (a dispatch carries six).
const MAX_FDS: usize = 8;

/// Where the sandbox root comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RootSource {
    /// Host directories exposed read-only at the same path (symlinks are recreated).
    Allowlist(Vec<PathBuf>),
    /// An unpacked root filesystem used as the single lower layer.
    Image(PathBuf),
}

/// Sent once by the engine when the zygote starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ZygoteConfig {
    pub root: RootSource,
    /// An empty host directory the inits mount their staging tmpfs on (in their own mount
    /// namespaces, so the host never sees those mounts).
    pub staging: PathBuf,
    pub work_dir: String,
    pub defaults: EffectiveLimits,
    /// How many pre-warmed sandboxes to keep ready.
    pub pool: usize,
    /// Give each sandbox its own network namespace (only `lo`), instead of sharing the zygote's.
    pub net_per_sandbox: bool,
    /// The engine places each init into a cgroup before the program starts.
    pub cgroup_handshake: bool,
}

/// Engine → zygote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToZygote {
    /// The uid/gid maps of the zygote's user namespace are written.
    MapsWritten,
    /// Run a job. Carries [payload, stdin, stdout, stderr, report] descriptors.
    Spawn { req: u64, timeout_ms: u64 },
    /// The engine is handing job `req` to the launcher of `sandbox` itself (see
    /// [`FromZygote::Launcher`]). Carries the read end of the job's exec-notify pipe. Sent
    /// before the job goes to the launcher, so the zygote knows the sandbox is taken, and
    /// watches for its exec, before its program can start.
    Started {
        req: u64,
        sandbox: u64,
        timeout_ms: u64,
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
    Ready { seccomp_instructions: usize },
    /// The zygote could not be set up.
    StartFailed { error: String },
    /// A sandbox was assigned (cgroup handshake only): the host pids of its init and of the
    /// launcher that becomes the program, both to be placed in the job's cgroup.
    Assigned { req: u64, pids: Vec<i32> },
    /// The sandbox is gone.
    Exited(Exit),
    /// A ready sandbox the engine may hand a job to itself. Carries the job channel to its
    /// launcher, over which the engine sends [`ToInit::Run`] after [`ToZygote::Started`].
    /// `pids` are the host pids of its init and its launcher, for the job's cgroup.
    Launcher { sandbox: u64, pids: Vec<i32> },
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
    pub error: Option<String>,
}

/// Zygote → init; `Run` and `Release` go to the launcher, from the zygote or the engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToInit {
    MapsWritten,
    /// Carries [payload, stdin, stdout, stderr, report, exec-notify] descriptors.
    Run {
        wait_for_release: bool,
    },
    Release,
}

/// Init → zygote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FromInit {
    Ready,
    SetupFailed { error: String },
}

/// The job as the init needs it, written into a memfd by the engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Payload {
    pub job: Job,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub limits: EffectiveLimits,
    pub collect_max_bytes: u64,
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
    /// Why the program never ran (an isolation step failed between fork and exec).
    pub setup_error: Option<String>,
    pub files: std::collections::BTreeMap<String, forkbox_queue::FileData>,
    pub collect_error: Option<String>,
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
                            for fd in raw {
                                fds.push(sys::adopt_fd(fd)?);
                            }
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
