//! The memory a sandbox's pipes hold, counted by its init for the memory budget (`memory`)
//! where no cgroup charges it.
//!
//! The kernel charges pipe buffers to the host user that made them (`fs.pipe-user-pages-soft`
//! and `-hard`, global, not per namespace), and every sandbox of a node runs as the same host
//! user; no `/proc/<pid>` file shows what a pipe holds. So the init looks at every descriptor
//! of every process of its pid namespace (at most every [`RESCAN`]): each one that is a pipe or
//! a FIFO (seen once however many descriptors name it) it takes a copy of with `pidfd_getfd` (it is root of
//! the sandbox's user namespace and an ancestor of every process, so the kernel's ptrace check
//! lets it) and asks for its capacity (`F_GETPIPE_SZ`) and what waits in it (`FIONREAD`). A
//! pipe with bytes in it counts its whole capacity (a page per write is possible, with
//! `O_DIRECT`: the bytes alone would undercount), an empty one the page the kernel keeps for
//! the next write. A pipe that cannot be asked counts at `fs.pipe-max-size`, the most an
//! unprivileged process can give one (fail closed).
//!
//! What it cannot see: a pipe that no process holds, in flight in a Unix socket's queue
//! (`SCM_RIGHTS`). The kernel bounds descriptors in flight per host user by the sender's
//! `RLIMIT_NOFILE` (the job's `open_files`), and a pipe grows past its default 16 pages only
//! while the host user's pipes hold less than `fs.pipe-user-pages-soft` (2 pages each beyond
//! it), so what hides there is at most that much.

use std::collections::HashSet;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg};
use nix::sys::stat::stat;
use nix::unistd::Pid;

use super::procfs;
use super::sockets::Counted;
use crate::sandbox::kernel::sys;

/// What an empty pipe keeps: one page, for its next write.
const PAGE: u64 = 4096;
/// How long one walk's figure stands at least. A walk costs a `readlink` per descriptor of
/// the sandbox (a `stat` more for a path, four calls more per pipe), so it is not made at
/// every check of the budget: what a job can put in pipes is bounded anyway (see above),
/// unlike what it can put in sockets. A walk that took longer than a tenth of this stands ten
/// times its own length, so the walks take at most a tenth of a CPU however many descriptors
/// the job opens (a thousand took 17 to 20 ms in a debug build on 2 loaded cores).
pub const RESCAN: Duration = Duration::from_millis(100);

/// Counts the pipes the processes of a sandbox hold.
#[derive(Debug)]
pub struct PipeCount {
    proc: PathBuf,
    /// The most one pipe can hold, in bytes.
    largest: u64,
    /// Until when the last walk's figure stands, and that figure.
    last: Option<(Instant, Counted)>,
}

/// What one pipe holds, from its capacity and its queued bytes, or the worst case (apart)
/// when it could not be asked.
fn pipe_bytes(asked: Result<(u64, u64), Errno>, largest: u64) -> Counted {
    let seen = |seen| Counted { seen, unseen: 0 };
    match asked {
        Ok((_, 0)) => seen(PAGE),
        Ok((capacity, _)) => seen(capacity),
        // Closed, or its process gone, since the listing: it holds nothing of this process.
        Err(Errno::EBADF | Errno::ESRCH) => seen(0),
        Err(_) => Counted {
            seen: 0,
            unseen: largest,
        },
    }
}

impl PipeCount {
    /// A count of the pipes of the processes listed in `proc` (the sandbox's own `/proc`).
    pub fn new(proc: &Path) -> PipeCount {
        let largest = std::fs::read_to_string(proc.join("sys/fs/pipe-max-size"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            // Unreadable: the kernel's default maximum (fail closed would be no bound at all).
            .unwrap_or(1 << 20);
        PipeCount {
            proc: proc.to_owned(),
            largest,
            last: None,
        }
    }

    /// What the pipes of every process but the caller hold, in bytes; the figure of the last
    /// walk while it stands (see [`RESCAN`]). What a pipe that could not be asked may hold
    /// is apart (`unseen`).
    pub fn used_bytes(&mut self) -> Counted {
        let now = Instant::now();
        match self.last {
            Some((until, bytes)) if now < until => bytes,
            _ => {
                let bytes = self.walk();
                self.last = Some((now + RESCAN.max(now.elapsed() * 10), bytes));
                bytes
            }
        }
    }

    fn walk(&self) -> Counted {
        let me = std::process::id();
        let mut seen = HashSet::new();
        let mut bytes = Counted::default();
        for process in procfs::processes(&self.proc).filter(|p| p.pid != me) {
            let fds = self.proc.join(process.pid.to_string()).join("fd");
            let mut pidfd: Option<Result<OwnedFd, Errno>> = None;
            for entry in std::fs::read_dir(&fds).into_iter().flatten().flatten() {
                let Some(fd) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<RawFd>().ok())
                else {
                    continue;
                };
                let Some(pipe) = std::fs::read_link(entry.path())
                    .ok()
                    .and_then(|target| pipe_of(&target, &entry.path()))
                else {
                    continue;
                };
                if !seen.insert(pipe) {
                    continue;
                }
                let pidfd =
                    pidfd.get_or_insert_with(|| sys::pidfd_open(Pid::from_raw(process.pid as i32)));
                let pipe = pipe_bytes(ask(pidfd, fd), self.largest);
                bytes.seen = bytes.seen.saturating_add(pipe.seen);
                bytes.unseen = bytes.unseen.saturating_add(pipe.unseen);
            }
        }
        bytes
    }
}

/// Which pipe a descriptor is, from its link's `target`: `pipe:[<inode>]` for a pipe; for a
/// path, the file it names when that is a FIFO (the link `fd` followed); `None` for
/// anything else (sockets, anonymous inodes, files), which no `stat` is spent on.
fn pipe_of(target: &Path, fd: &Path) -> Option<Pipe> {
    let text = target.as_os_str().to_str().unwrap_or("");
    if let Some(inode) = text
        .strip_prefix("pipe:[")
        .and_then(|r| r.strip_suffix(']'))
    {
        return inode.parse().ok().map(Pipe::Anonymous);
    }
    if !target.is_absolute() {
        return None;
    }
    let st = stat(fd).ok()?;
    (st.st_mode & libc::S_IFMT == libc::S_IFIFO).then_some(Pipe::Named(st.st_dev, st.st_ino))
}

/// A pipe, seen once however many descriptors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Pipe {
    Anonymous(u64),
    Named(u64, u64),
}

/// The capacity of descriptor `fd` of the process behind `pidfd`, a pipe, and what waits in it.
/// A descriptor that is no pipe any more (the process put something else at its number since
/// its link was read) is not gone: it counts at the worst case.
fn ask(pidfd: &Result<OwnedFd, Errno>, fd: RawFd) -> Result<(u64, u64), Errno> {
    let pidfd = pidfd.as_ref().map_err(|e| *e)?;
    let pipe = sys::pidfd_getfd(pidfd, fd)?;
    let not_gone = |e: Errno| if e == Errno::EBADF { Errno::EINVAL } else { e };
    let capacity = fcntl(pipe.as_raw_fd(), FcntlArg::F_GETPIPE_SZ).map_err(not_gone)?;
    let queued = sys::pipe_queued(&pipe).map_err(not_gone)?;
    Ok((capacity.max(0) as u64, queued))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_counts_its_capacity_once_it_holds_bytes() {
        let seen = |seen| Counted { seen, unseen: 0 };
        assert_eq!(pipe_bytes(Ok((1 << 20, 1)), 1 << 20), seen(1 << 20));
        assert_eq!(pipe_bytes(Ok((65536, 65536)), 1 << 20), seen(65536));
        assert_eq!(pipe_bytes(Ok((65536, 0)), 1 << 20), seen(PAGE));
        // Gone since the listing: nothing; not to be asked: the worst case, apart.
        assert_eq!(pipe_bytes(Err(Errno::EBADF), 1 << 20), seen(0));
        assert_eq!(pipe_bytes(Err(Errno::ESRCH), 1 << 20), seen(0));
        assert_eq!(
            pipe_bytes(Err(Errno::EPERM), 1 << 20),
            Counted {
                seen: 0,
                unseen: 1 << 20
            }
        );
    }

    #[test]
    fn pipes_and_fifos_are_known_by_their_inode_and_nothing_else_is_stat_ed() {
        let dir = tempfile::tempdir().unwrap();
        let none = Path::new("/nonexistent");
        assert_eq!(
            pipe_of(Path::new("pipe:[4242]"), none),
            Some(Pipe::Anonymous(4242))
        );
        assert_eq!(pipe_of(Path::new("socket:[4242]"), none), None);
        assert_eq!(pipe_of(Path::new("anon_inode:[eventfd]"), none), None);
        assert_eq!(pipe_of(Path::new("pipe:[x]"), none), None);
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let st = stat(&fifo).unwrap();
        assert_eq!(
            pipe_of(&fifo, &fifo),
            Some(Pipe::Named(st.st_dev, st.st_ino))
        );
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(pipe_of(&file, &file), None);
    }

    /// What the pipes of a `sleep` with this stdio hold.
    fn counted(stdio: [std::process::Stdio; 3]) -> u64 {
        let [stdin, stdout, stderr] = stdio;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap();
        let proc = tempfile::tempdir().unwrap();
        let pid = child.id().to_string();
        std::os::unix::fs::symlink(Path::new("/proc").join(&pid), proc.path().join(&pid)).unwrap();
        let counted = PipeCount::new(proc.path()).used_bytes();
        assert_eq!(counted.unseen, 0);
        let counted = counted.seen;
        child.kill().unwrap();
        child.wait().unwrap();
        counted
    }

    /// Against the kernel: a child holding a pipe with a byte in it (twice, as stdin and as
    /// stdout) counts that pipe's capacity once; an empty one, a page; beside what a child
    /// without them holds (what the test harness lets it inherit).
    #[test]
    fn a_process_s_pipes_count_once_each() {
        use std::process::Stdio;
        let alone = counted([Stdio::null(), Stdio::null(), Stdio::null()]);
        let (r, w) = nix::unistd::pipe().unwrap();
        nix::unistd::write(&w, b"x").unwrap();
        let (empty_r, _empty_w) = nix::unistd::pipe().unwrap();
        let held = counted([Stdio::from(r), Stdio::from(w), Stdio::from(empty_r)]);
        assert_eq!(held - alone, 65536 + PAGE);
    }
}
