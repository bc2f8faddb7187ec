//! The only place in Forkbox that calls the kernel through `unsafe`.
//!
//! Everything here is a thin, typed wrapper over one system call (or a fixed sequence of them)
//! that `nix` does not cover safely: `clone3` with a pidfd, `pidfd_send_signal`, `pidfd_open`,
//! `pidfd_getfd`, a pipe's `FIONREAD`, `wait4`,
//! capability dropping, loading a pre-compiled seccomp program, `close_range`, bringing `lo` up,
//! `openat2` and `mount_setattr`, and `fork` in a process known to be single-threaded (with
//! the measurement forks of `process::copy_cost`, whose children run nothing). Each block
//! states why it is sound.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

use nix::errno::Errno;
use nix::unistd::Pid;

/// Result of a fork or clone: the parent learns the child; the child, a single-threaded copy
/// of its parent, gets the proof of it.
pub enum Forked {
    Parent { pid: Pid, pidfd: Option<OwnedFd> },
    Child(SingleThreaded),
}

/// Proof that the calling process has one thread, which is what makes forking it sound (a
/// child inherits no lock held by a thread it does not have). Made only by [`check`], which
/// counts the threads, or by a fork, whose child has one; not `Send`, so it cannot reach
/// another thread. The processes that hold one (the zygote, each init, their forks) never
/// start a thread.
///
/// [`check`]: SingleThreaded::check
pub struct SingleThreaded {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl SingleThreaded {
    /// The proof, when the calling process has one thread.
    pub fn check() -> Option<SingleThreaded> {
        (thread_count() == Some(1)).then(SingleThreaded::new)
    }

    fn new() -> SingleThreaded {
        SingleThreaded {
            _not_send: std::marker::PhantomData,
        }
    }

    /// `clone3` into new `namespaces`, with a pidfd (see [`clone_into_namespaces`]).
    pub fn clone_into_namespaces(&self, namespaces: libc::c_int) -> Result<Forked, Errno> {
        // SAFETY: `self` proves the process single-threaded.
        unsafe { clone_into_namespaces(namespaces) }
    }

    /// A plain fork (see [`fork_single_threaded`]).
    pub fn fork(&self) -> Result<Forked, Errno> {
        // SAFETY: `self` proves the process single-threaded.
        unsafe { fork_single_threaded() }
    }

    /// Forks a child that exits at once, the address ranges `without` marked `MADV_DONTFORK`
    /// around the fork so that the child gets no copy of them (marked back `MADV_DOFORK`
    /// before this returns, whatever happened). Returns the child, for the caller to reap.
    /// What this costs is what a process that inherits the rest of this address space, and
    /// never touches the ranges, costs to make and to end: a measurement, not a sandbox.
    pub fn fork_and_exit_without(&self, without: &[(usize, usize)]) -> Result<Pid, Errno> {
        let marked = without
            .iter()
            .try_for_each(|&(start, end)| advise(start, end, libc::MADV_DONTFORK));
        let forked = marked.and_then(|()| {
            // SAFETY: a raw fork (no CLONE_VM: the child gets a copy-on-write copy of what is
            // not marked). The child runs nothing but the `exit_group` below: it touches
            // neither the ranges it lacks nor any lock (the caller is single-threaded anyway,
            // `self` proves it), and never returns into the caller's code.
            let ret = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) };
            match ret {
                -1 => Err(Errno::last()),
                0 => {
                    // SAFETY: ends the child at once; nothing is unwound or flushed.
                    unsafe { libc::syscall(libc::SYS_exit_group, 0) };
                    unreachable!("exit_group returned")
                }
                pid => Ok(Pid::from_raw(pid as i32)),
            }
        });
        for &(start, end) in without {
            let _ = advise(start, end, libc::MADV_DOFORK);
        }
        forked
    }

    /// Forks a child that enters the `namespaces` of the process behind `pidfd` (one `setns`
    /// through the pidfd) and exits: 0 when it entered them, 1 when the kernel refused. Like
    /// [`fork_and_exit_without`](Self::fork_and_exit_without), a measurement.
    pub fn fork_enter_and_exit(
        &self,
        pidfd: &OwnedFd,
        namespaces: libc::c_int,
    ) -> Result<Pid, Errno> {
        let fd = pidfd.as_raw_fd();
        // SAFETY: a raw fork, as in `fork_and_exit_without`; the child makes two system calls
        // on integers (the descriptor is its inherited copy) and never returns.
        let ret = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) };
        match ret {
            -1 => Err(Errno::last()),
            0 => {
                // SAFETY: integer-only system calls; the child ends with the second.
                unsafe {
                    let entered = libc::setns(fd, namespaces) == 0;
                    libc::syscall(libc::SYS_exit_group, if entered { 0 } else { 1 });
                }
                unreachable!("exit_group returned")
            }
            pid => Ok(Pid::from_raw(pid as i32)),
        }
    }
}

/// `madvise(advice)` over `[start, end)` of this process, for the advice that change only what
/// a later fork's child gets (`MADV_DONTFORK`, `MADV_DOFORK`), never what this process sees.
fn advise(start: usize, end: usize, advice: libc::c_int) -> Result<(), Errno> {
    if advice != libc::MADV_DONTFORK && advice != libc::MADV_DOFORK {
        return Err(Errno::EINVAL);
    }
    // SAFETY: these two advice only set or clear VM_DONTCOPY on the mappings of the range: the
    // contents and protections of this process's memory are unchanged, so no reference into
    // it is invalidated. An unmapped or unaligned range fails with an errno.
    let ret = unsafe {
        libc::madvise(
            start as *mut libc::c_void,
            end.saturating_sub(start),
            advice,
        )
    };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// `clone3(flags | CLONE_PIDFD)` with fork semantics (no shared memory, child continues on a
/// copy of the caller's stack).
///
/// # Safety
///
/// The calling process must be single-threaded: the child is a copy of the calling thread
/// alone, and any lock another thread held would stay held in it for ever. Use
/// [`SingleThreaded::clone_into_namespaces`].
pub(crate) unsafe fn clone_into_namespaces(namespaces: libc::c_int) -> Result<Forked, Errno> {
    #[repr(C)]
    #[derive(Default)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
        set_tid: u64,
        set_tid_size: u64,
        cgroup: u64,
    }
    let mut pidfd: RawFd = -1;
    let args = CloneArgs {
        flags: namespaces as u64 | libc::CLONE_PIDFD as u64,
        pidfd: &mut pidfd as *mut RawFd as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    };
    // SAFETY: `args` is a valid, fully initialised clone_args of the size passed; without
    // CLONE_VM the child gets a copy-on-write copy of our address space and stack, exactly like
    // fork(2). The caller is single-threaded (this function's contract), so no lock can be held
    // by a thread that does not exist in the child.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match ret {
        -1 => Err(Errno::last()),
        0 => Ok(Forked::Child(SingleThreaded::new())),
        pid => {
            // SAFETY: with CLONE_PIDFD the kernel stored a fresh pidfd that nothing else owns.
            let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
            Ok(Forked::Parent {
                pid: Pid::from_raw(pid as i32),
                pidfd: Some(pidfd),
            })
        }
    }
}

/// Plain fork.
///
/// # Safety
///
/// The calling process must be single-threaded, as for [`clone_into_namespaces`]. Use
/// [`SingleThreaded::fork`].
pub(crate) unsafe fn fork_single_threaded() -> Result<Forked, Errno> {
    // SAFETY: the caller is single-threaded (this function's contract), so the child inherits
    // no lock held by another thread and may allocate freely.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Parent { child } => Ok(Forked::Parent {
            pid: child,
            pidfd: None,
        }),
        nix::unistd::ForkResult::Child => Ok(Forked::Child(SingleThreaded::new())),
    }
}

/// Sends SIGKILL through a pidfd, so a recycled pid can never be hit.
pub fn pidfd_kill(pidfd: &OwnedFd) -> Result<(), Errno> {
    // SAFETY: plain syscall on an fd we own; null siginfo is allowed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// A duplicate of descriptor `fd` of the process behind `pidfd` (`pidfd_getfd`; the kernel
/// asks for ptrace access to it), close-on-exec.
pub fn pidfd_getfd(pidfd: &OwnedFd, fd: RawFd) -> Result<OwnedFd, Errno> {
    // SAFETY: integer-only syscall on a pidfd we own; on success it returns a new descriptor.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if got < 0 {
        return Err(Errno::last());
    }
    // SAFETY: pidfd_getfd just returned this descriptor, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(got as RawFd) })
}

/// The bytes waiting in a pipe (`FIONREAD`).
pub fn pipe_queued(pipe: &OwnedFd) -> Result<u64, Errno> {
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through a valid pointer to a local.
    let ret = unsafe { libc::ioctl(pipe.as_raw_fd(), libc::FIONREAD, &mut queued) };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(queued.max(0) as u64)
    }
}

/// Resource usage of a reaped child.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub cpu_us: u64,
    pub max_rss_kb: u64,
}

/// `wait4(pid)`, blocking until the child ends (EINTR retried): its raw wait status and usage.
pub fn wait4_blocking(pid: Pid) -> Result<(i32, Usage), Errno> {
    loop {
        match wait4_flags(pid, libc::__WALL) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(Some(done)) => return Ok(done),
            Ok(None) => continue,
        }
    }
}

/// `wait4(pid, WNOHANG)`: `None` while the child still runs.
pub fn wait4_nohang(pid: Pid) -> Result<Option<(i32, Usage)>, Errno> {
    wait4_flags(pid, libc::WNOHANG | libc::__WALL)
}

fn wait4_flags(pid: Pid, flags: libc::c_int) -> Result<Option<(i32, Usage)>, Errno> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data; zeroed is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointers to locals for the duration of the call.
    let ret = unsafe { libc::wait4(pid.as_raw(), &mut status, flags, &mut ru) };
    match ret {
        -1 => Err(Errno::last()),
        0 => Ok(None),
        _ => {
            let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
            let usage = Usage {
                cpu_us: tv(ru.ru_utime) + tv(ru.ru_stime),
                max_rss_kb: ru.ru_maxrss as u64,
            };
            Ok(Some((status, usage)))
        }
    }
}

/// The highest capability number this kernel knows (read once, before any sandbox exists).
pub fn last_capability() -> libc::c_ulong {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// Empties the bounding, ambient, effective, permitted and inheritable capability sets.
pub fn drop_all_capabilities(last: libc::c_ulong) -> Result<(), Errno> {
    for cap in 0..=last {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } == -1 {
            let e = Errno::last();
            if e != Errno::EINVAL {
                return Err(e);
            }
        }
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    } == -1
    {
        return Err(Errno::last());
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: 0x2008_0522,
        pid: 0,
    }; // _LINUX_CAPABILITY_VERSION_3
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and a two-element data array are exactly what capset v3 reads.
    if unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) } == -1 {
        return Err(Errno::last());
    }
    Ok(())
}

/// One seccomp-BPF instruction, as the kernel and libseccomp lay it out.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SockFilter {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// Installs a compiled seccomp program on the calling thread. Requires no_new_privs.
pub fn install_seccomp(program: &[SockFilter]) -> Result<(), Errno> {
    #[repr(C)]
    struct SockFprog {
        len: libc::c_ushort,
        filter: *const SockFilter,
    }
    let len = libc::c_ushort::try_from(program.len()).map_err(|_| Errno::E2BIG)?;
    let prog = SockFprog {
        len,
        filter: program.as_ptr(),
    };
    // SAFETY: `prog` points at `program`, which outlives the call; the kernel copies it.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const SockFprog,
        )
    };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// Marks every fd from `first` upwards close-on-exec.
pub fn cloexec_from(first: u32) -> Result<(), Errno> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: integer-only syscall; it only sets flags on our own descriptors.
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> Result<(), Errno> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is plain data; zeroed is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name and writes the flags union of a valid ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } == -1 {
        return Err(Errno::last());
    }
    // SAFETY: the flags member of the union was just written by the kernel.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: as above, SIOCSIFFLAGS reads a valid ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } == -1 {
        return Err(Errno::last());
    }
    Ok(())
}

/// Makes `fd` the child's descriptor `target` when `command` is spawned.
pub fn pass_fd(command: &mut Command, fd: RawFd, target: RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only calls dup2 and fcntl,
    // which are async-signal-safe and allocate nothing.
    unsafe {
        command.pre_exec(move || {
            if fd == target {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags == -1 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) == -1 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(fd, target) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Writes `contents` to the existing file `path` beneath the directory `dir` (which may be an
/// `O_PATH` descriptor), with one `write`, as sysctl files want.
pub fn write_file_at(dir: &OwnedFd, path: &std::ffi::CStr, contents: &[u8]) -> Result<(), Errno> {
    // SAFETY: `path` is NUL-terminated and outlives the call; `dir` is an open descriptor.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            path.as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd == -1 {
        return Err(Errno::last());
    }
    // SAFETY: openat just returned this descriptor, which nothing else owns.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    let written = nix::unistd::write(&file, contents)?;
    if written != contents.len() {
        return Err(Errno::EIO);
    }
    Ok(())
}

/// Takes ownership of a descriptor number, once it is known to be open.
///
/// # Safety
///
/// Nothing else in the process may own `fd` (no `OwnedFd`, `File` or other wrapper, and no
/// later call of this function with the same number): it would be closed twice, the second
/// time perhaps closing an unrelated descriptor that reused the number.
pub(crate) unsafe fn adopt_fd(fd: RawFd) -> Result<OwnedFd, Errno> {
    // SAFETY: F_GETFD only queries the descriptor; it fails with EBADF when it is not open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        return Err(Errno::last());
    }
    // SAFETY: the descriptor is open and, by this function's contract, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Takes ownership of a descriptor this process inherited at exec as number `fd` (the
/// engine's channel of the zygote). Each number is taken at most once (a second take fails
/// with `EBUSY`), and only numbers below 64, which nothing in the process opens before its
/// entry point takes them.
pub fn take_inherited(fd: RawFd) -> Result<OwnedFd, Errno> {
    static TAKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let bit = u32::try_from(fd)
        .ok()
        .and_then(|n| 1u64.checked_shl(n))
        .ok_or(Errno::EBADF)?;
    if TAKEN.fetch_or(bit, std::sync::atomic::Ordering::AcqRel) & bit != 0 {
        return Err(Errno::EBUSY);
    }
    // SAFETY: an inherited number, taken once (checked above) before anything else could wrap
    // it.
    unsafe { adopt_fd(fd) }
}

/// Takes ownership of the descriptors of an `SCM_RIGHTS` message, as `recvmsg` returned them:
/// the kernel installed each as a new descriptor of this process, which nothing else knows.
/// Callers pass each message's rights once, straight from `recvmsg`.
pub fn adopt_received(rights: Vec<RawFd>) -> Result<Vec<OwnedFd>, Errno> {
    // SAFETY: fresh descriptors from the kernel, owned by nobody yet (see above).
    rights
        .into_iter()
        .map(|fd| unsafe { adopt_fd(fd) })
        .collect()
}

/// Terminates the process at once, without running destructors or atexit handlers (used by
/// forked children, which must never unwind into the parent's code).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit is always safe to call.
    unsafe { libc::_exit(code) }
}

/// The thread count of the calling process, from /proc/self/stat.
pub fn thread_count() -> Option<usize> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split_whitespace().nth(17)?.parse().ok()
}

/// Closes every descriptor from 3 upwards except `keep`.
///
/// # Safety
///
/// No object that owns one of the descriptors closed may be used or dropped afterwards (it
/// would act on a closed number, or on whatever reused it).
pub(crate) unsafe fn close_all_except(keep: RawFd) -> Result<(), Errno> {
    let close = |first: u32, last: u32| -> Result<(), Errno> {
        if first > last {
            return Ok(());
        }
        // SAFETY: integer-only syscall closing descriptors this process owns; by this
        // function's contract no object wrapping them is used or dropped afterwards.
        let ret = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
        if ret == -1 {
            Err(Errno::last())
        } else {
            Ok(())
        }
    };
    let keep = keep as u32;
    close(3, keep.saturating_sub(1))?;
    close(keep + 1, u32::MAX)
}

/// The first step of a process the zygote cloned: closes every descriptor it inherited but
/// `keep`. Their owners (the zygote's objects) live on only in this process's copy of the
/// zygote's memory, which it never returns to: `proof` is the clone's child's, and the init's
/// entry point, which never returns, holds no descriptor but `keep`.
pub fn close_inherited(_proof: &SingleThreaded, keep: &OwnedFd) -> Result<(), Errno> {
    // SAFETY: see above: nothing that owns a closed descriptor is used or dropped again.
    unsafe { close_all_except(keep.as_raw_fd()) }
}

/// The calling process's nice value.
pub fn nice() -> Result<i32, Errno> {
    // `getpriority` may return -1 as a value: only a changed errno tells an error.
    Errno::clear();
    // SAFETY: integer-only call that reads this process's priority.
    let value = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    match Errno::last_raw() {
        0 => Ok(value),
        _ => Err(Errno::last()),
    }
}

/// Sets the calling process's nice value.
pub fn set_nice(value: i32) -> Result<(), Errno> {
    // SAFETY: integer-only call that affects this process alone.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, value) } == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// `openat2(dir, path, flags)` resolved beneath `dir`, with no symlink or magic link at any
/// component and no mount crossed (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
/// RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`, Linux 5.6).
pub fn open_beneath(
    dir: BorrowedFd<'_>,
    path: &OsStr,
    flags: nix::fcntl::OFlag,
) -> Result<OwnedFd, Errno> {
    use nix::fcntl::{OpenHow, ResolveFlag};
    let how = OpenHow::new().flags(flags).resolve(
        ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_MAGICLINKS
            | ResolveFlag::RESOLVE_NO_XDEV,
    );
    let fd = nix::fcntl::openat2(dir.as_raw_fd(), path, how)?;
    // SAFETY: openat2 just returned this descriptor, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `MOUNT_ATTR_RDONLY`, `MOUNT_ATTR_NOSUID` and `MOUNT_ATTR_NODEV` of `linux/mount.h`.
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;

/// Sets the mount attributes `set` on the mount at `path` and on every mount beneath it
/// (`mount_setattr` with `AT_RECURSIVE`, Linux 5.12), in one step.
pub fn mount_setattr_recursive(path: &Path, set: u64) -> Result<(), Errno> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let path = CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `path` is a NUL-terminated string and `attr` a fully initialised mount_attr of
    // the size passed; the kernel only reads both during the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_RECURSIVE as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// How many SysV shared memory segments and message queues the calling process's ipc
/// namespace holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SysvCounts {
    pub segments: u64,
    pub queues: u64,
}

/// [`SysvCounts`] of the calling process's ipc namespace: `shmctl(SHM_INFO)` and
/// `msgctl(MSG_INFO)`, one system call each, where reading `/proc/sysvipc` opens and formats a
/// table.
pub fn sysv_counts() -> Result<SysvCounts, Errno> {
    /// `SHM_INFO`, which libc does not name.
    const SHM_INFO: libc::c_int = 14;
    /// The kernel's `struct shm_info`, which `SHM_INFO` fills.
    #[repr(C)]
    #[derive(Default)]
    struct ShmInfo {
        used_ids: libc::c_int,
        shm_tot: libc::c_ulong,
        shm_rss: libc::c_ulong,
        shm_swp: libc::c_ulong,
        swap_attempts: libc::c_ulong,
        swap_successes: libc::c_ulong,
    }
    let mut shm = ShmInfo::default();
    // SAFETY: with SHM_INFO the kernel writes one `struct shm_info`, which `ShmInfo` lays out
    // field for field, to the pointer, and keeps nothing; the id argument is ignored.
    let ret = unsafe { libc::syscall(libc::SYS_shmctl, 0, SHM_INFO, &mut shm as *mut ShmInfo) };
    if ret < 0 {
        return Err(Errno::last());
    }
    // SAFETY: `msginfo` is plain integers, for which all zeroes is a valid value.
    let mut msg: libc::msginfo = unsafe { std::mem::zeroed() };
    // SAFETY: with MSG_INFO the kernel writes one `struct msginfo` (libc's, the same layout)
    // to the pointer and keeps nothing; the id argument is ignored.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_msgctl,
            0,
            libc::MSG_INFO,
            &mut msg as *mut libc::msginfo,
        )
    };
    if ret < 0 {
        return Err(Errno::last());
    }
    Ok(SysvCounts {
        segments: shm.used_ids.max(0) as u64,
        queues: msg.msgpool.max(0) as u64,
    })
}

/// Gives every signal, real-time ones included, its default disposition and unblocks them all,
/// as a freshly started program expects. Ignored signals survive `execve` (the node's runtime
/// ignores SIGPIPE, and the zygote and launcher inherit that), so without this a job's
/// `yes | head -1` would see EPIPE instead of dying of SIGPIPE.
pub fn default_signals() -> Result<(), Errno> {
    // The kernel's sigaction for SIG_DFL: handler 0, no flags, no restorer, an empty mask. All
    // zeroes, whatever the field order.
    let default = [0u64; 4];
    for signal in 1..=64 {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction reads `default` (32 readable bytes, outliving the call) and
        // writes nothing (null old action); SIG_DFL installs no handler, so no code of ours
        // can run in signal context. The caller is the single-threaded launcher on its way
        // to execve. glibc's wrapper refuses its two reserved signals, the raw call does not.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                default.as_ptr(),
                std::ptr::null_mut::<u64>(),
                8usize,
            )
        };
        if ret == -1 {
            return Err(Errno::last());
        }
    }
    nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&nix::sys::signal::SigSet::empty()),
        None,
    )
}

/// `PyStatus` as returned by value from CPython's initialisation API (stable since 3.8).
#[repr(C)]
struct PyStatus {
    kind: libc::c_int,
    func: *const libc::c_char,
    err_msg: *const libc::c_char,
    exitcode: libc::c_int,
}

/// Room for a `PyConfig`, which CPython fills and reads itself. Its layout changes between
/// versions, so it is never read here; 16 KiB is many times its size in every release.
const PY_CONFIG_BYTES: usize = 16 * 1024;

/// The entry points of an embedded CPython, resolved from its shared library once (by the
/// zygote, before any sandbox exists) and valid in every process forked from it.
#[derive(Clone, Copy)]
pub struct Libpython {
    init_python_config: unsafe extern "C" fn(*mut u8),
    initialize_from_config: unsafe extern "C" fn(*const u8) -> PyStatus,
    config_clear: unsafe extern "C" fn(*mut u8),
    run_simple_string: unsafe extern "C" fn(*const libc::c_char, *mut libc::c_void) -> libc::c_int,
    after_fork_child: unsafe extern "C" fn(),
}

impl Libpython {
    /// `dlopen`s the library (`RTLD_GLOBAL`, so the extension modules it imports later resolve
    /// their `Py*` symbols against it) and resolves the five functions used.
    pub fn load(path: &std::ffi::CStr) -> Result<Libpython, String> {
        // SAFETY: `path` is NUL-terminated; loading runs the library's constructors, which for
        // libpython only register its own state (no threads start until Py_Initialize).
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            return Err(format!("dlopen {}: {}", path.to_string_lossy(), dl_error()));
        }
        let symbol = |name: &std::ffi::CStr| -> Result<*mut libc::c_void, String> {
            // SAFETY: `handle` is a live handle from dlopen and `name` is NUL-terminated.
            let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
            if p.is_null() {
                Err(format!("{}: {}", name.to_string_lossy(), dl_error()))
            } else {
                Ok(p)
            }
        };
        // SAFETY: each symbol is the CPython function of that name, whose C signature is the
        // one transmuted to (documented in the C API reference, unchanged since 3.8); the
        // library is never unloaded, so the pointers stay valid.
        unsafe {
            Ok(Libpython {
                init_python_config: std::mem::transmute::<
                    *mut libc::c_void,
                    unsafe extern "C" fn(*mut u8),
                >(symbol(c"PyConfig_InitPythonConfig")?),
                initialize_from_config: std::mem::transmute::<
                    *mut libc::c_void,
                    unsafe extern "C" fn(*const u8) -> PyStatus,
                >(symbol(c"Py_InitializeFromConfig")?),
                config_clear: std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn(*mut u8)>(
                    symbol(c"PyConfig_Clear")?,
                ),
                run_simple_string: std::mem::transmute::<
                    *mut libc::c_void,
                    unsafe extern "C" fn(*const libc::c_char, *mut libc::c_void) -> libc::c_int,
                >(symbol(c"PyRun_SimpleStringFlags")?),
                after_fork_child: std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn()>(
                    symbol(c"PyOS_AfterFork_Child")?,
                ),
            })
        }
    }

    /// Initialises the interpreter with the configuration `python3` itself uses (the "Python
    /// configuration": locale coercion, UTF-8 mode rules, environment variables honoured),
    /// from the process environment as it is now. The signal dispositions CPython changes
    /// (SIGINT handler, SIGPIPE and SIGXFSZ ignored) are put back as they were: they would be
    /// inherited by every cold program exec'd from a sandbox; the warm job sets them again.
    pub fn initialize(&self) -> Result<(), String> {
        let signals = [libc::SIGINT, libc::SIGPIPE, libc::SIGXFSZ];
        // SAFETY: sigaction is plain data; zeroed is a valid (SIG_DFL) value.
        let mut saved: [libc::sigaction; 3] = unsafe { std::mem::zeroed() };
        for (sig, slot) in signals.iter().zip(saved.iter_mut()) {
            // SAFETY: reads the current disposition into a valid struct.
            if unsafe { libc::sigaction(*sig, std::ptr::null(), slot) } == -1 {
                return Err(format!("sigaction: {}", Errno::last()));
            }
        }
        let mut config = vec![0u64; PY_CONFIG_BYTES / 8];
        let ptr = config.as_mut_ptr() as *mut u8;
        // SAFETY: `ptr` points to zeroed, 8-aligned memory larger than PyConfig, which these
        // functions initialise, read and free the strings of; it outlives every call. The
        // process is single-threaded (the zygote), as Py_Initialize requires.
        let status = unsafe {
            (self.init_python_config)(ptr);
            let status = (self.initialize_from_config)(ptr);
            (self.config_clear)(ptr);
            status
        };
        for (sig, slot) in signals.iter().zip(saved.iter()) {
            // SAFETY: restores a disposition read above.
            unsafe { libc::sigaction(*sig, slot, std::ptr::null_mut()) };
        }
        if status.kind != 0 {
            let text = |p: *const libc::c_char| {
                if p.is_null() {
                    String::new()
                } else {
                    // SAFETY: CPython's status strings are static, NUL-terminated literals.
                    unsafe { std::ffi::CStr::from_ptr(p) }
                        .to_string_lossy()
                        .into_owned()
                }
            };
            return Err(format!(
                "Py_InitializeFromConfig: {} {} (exit code {})",
                text(status.func),
                text(status.err_msg),
                status.exitcode
            ));
        }
        Ok(())
    }

    /// Runs Python source in `__main__` (`PyRun_SimpleStringFlags`): 0, or -1 after printing
    /// the exception; an uncaught `SystemExit` finalises the interpreter and exits the process.
    pub fn run(&self, code: &std::ffi::CStr) -> i32 {
        // SAFETY: the interpreter was initialised by `initialize` in this process or in the
        // one it was forked from (then `after_fork_child` ran first), this thread holds the
        // GIL (it never released it), and `code` is NUL-terminated.
        unsafe { (self.run_simple_string)(code.as_ptr(), std::ptr::null_mut()) }
    }

    /// CPython's bookkeeping after a fork (locks, thread states, `os.register_at_fork`
    /// hooks such as the `random` module's reseed), called once in a forked process before it
    /// runs any Python code.
    pub fn after_fork_child(&self) {
        // SAFETY: called in the single-threaded child of the process that initialised the
        // interpreter, on the thread that holds the GIL, before any other Python call.
        unsafe { (self.after_fork_child)() }
    }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local NUL-terminated message or null.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated, valid until the next dl call on this thread.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Closes every descriptor from `first` upwards (the warm runtime's stand-in for the
/// close-on-exec a real exec would act on).
pub fn close_from(first: u32) -> Result<(), Errno> {
    // SAFETY: integer-only syscall; the caller never uses the closed descriptors again (it
    // runs the job's program and exits without returning to the code that owns them).
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// A pidfd for `pid` (`pidfd_open`): a handle that keeps naming the same process, so a signal
/// through it can never reach a process that recycled the number.
pub fn pidfd_open(pid: Pid) -> Result<OwnedFd, Errno> {
    // SAFETY: integer-only syscall; on success it returns a fresh descriptor nobody owns.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0u32) };
    if ret == -1 {
        return Err(Errno::last());
    }
    // SAFETY: the descriptor was just made by the kernel for us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) })
}

/// Sends `signal` (0: only checks that the process lives) through a pidfd.
pub fn pidfd_signal(pidfd: &OwnedFd, signal: libc::c_int) -> Result<(), Errno> {
    // SAFETY: plain syscall on an fd we own; a null siginfo is allowed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// A process this thread traces: seized (`PTRACE_SEIZE`) and stopped. Ptrace belongs to the
/// thread that seized, so a `Tracee` is not `Send`: every call of one copy is made by the
/// thread that made it. Dropping it detaches (a process that was in a group stop when seized
/// stays stopped: the kernel puts it back into the stop on detach).
pub struct Tracee {
    pid: Pid,
    pidfd: OwnedFd,
    attached: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

/// The x86 extended state buffer: large enough for AVX-512 and AMX tiles.
const XSTATE_MAX: usize = 16 * 1024;
/// `NT_X86_XSTATE`, the regset of the whole extended state (`XSAVE` layout).
const NT_X86_XSTATE: libc::c_int = 0x202;

impl Tracee {
    /// Seizes `pid` and stops it (`PTRACE_INTERRUPT`); with the signal of the stop it reports:
    /// a stop signal (SIGSTOP...) for a process that was in a group stop, SIGTRAP for one
    /// that ran. The pid is pinned by a pidfd taken
    /// first and checked alive once seized: a live process's number is never reused, so the
    /// process seized is the one the pidfd names. `exit_kill`: the process is killed if this
    /// thread's process ends while it is seized (for a process left half made otherwise).
    pub fn seize(pid: Pid, exit_kill: bool) -> Result<(Tracee, libc::c_int), Errno> {
        use nix::sys::ptrace;
        let pidfd = pidfd_open(pid)?;
        let options = if exit_kill {
            ptrace::Options::PTRACE_O_EXITKILL
        } else {
            ptrace::Options::empty()
        };
        ptrace::seize(pid, options)?;
        let tracee = Tracee {
            pid,
            pidfd,
            attached: true,
            _not_send: std::marker::PhantomData,
        };
        pidfd_signal(&tracee.pidfd, 0)?;
        ptrace::interrupt(pid)?;
        let stop = tracee.wait_stop()?;
        Ok((tracee, stop))
    }

    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Waits for the next stop; the signal it reports. A process that ended is `ESRCH`.
    fn wait_stop(&self) -> Result<libc::c_int, Errno> {
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        loop {
            match waitpid(self.pid, Some(WaitPidFlag::__WALL)) {
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e),
                Ok(WaitStatus::Stopped(_, sig)) => return Ok(sig as libc::c_int),
                Ok(WaitStatus::PtraceEvent(_, sig, _)) => return Ok(sig as libc::c_int),
                Ok(WaitStatus::PtraceSyscall(_)) => return Ok(libc::SIGTRAP),
                Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => return Err(Errno::ESRCH),
                Ok(_) => continue,
            }
        }
    }

    pub fn regs(&self) -> Result<libc::user_regs_struct, Errno> {
        nix::sys::ptrace::getregs(self.pid)
    }

    pub fn set_regs(&self, regs: &libc::user_regs_struct) -> Result<(), Errno> {
        nix::sys::ptrace::setregs(self.pid, *regs)
    }

    /// The whole extended FPU/vector state (`NT_X86_XSTATE`), as many bytes as the CPU has.
    pub fn xstate(&self) -> Result<Vec<u8>, Errno> {
        let mut buf = vec![0u8; XSTATE_MAX];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: the iovec points to `buf`, alive and `iov_len` bytes long for the call; the
        // kernel writes at most that much and shortens `iov_len` to what it wrote.
        let ret = unsafe {
            libc::ptrace(
                libc::PTRACE_GETREGSET,
                self.pid.as_raw(),
                NT_X86_XSTATE as usize,
                &mut iov as *mut libc::iovec,
            )
        };
        if ret == -1 {
            return Err(Errno::last());
        }
        buf.truncate(iov.iov_len);
        Ok(buf)
    }

    /// Sets the extended state from a buffer [`xstate`](Tracee::xstate) returned.
    pub fn set_xstate(&self, state: &[u8]) -> Result<(), Errno> {
        let mut copy = state.to_vec();
        let mut iov = libc::iovec {
            iov_base: copy.as_mut_ptr().cast(),
            iov_len: copy.len(),
        };
        // SAFETY: the iovec points to `copy`, alive and `iov_len` bytes long; the kernel only
        // reads it (and validates the XSAVE header itself).
        let ret = unsafe {
            libc::ptrace(
                libc::PTRACE_SETREGSET,
                self.pid.as_raw(),
                NT_X86_XSTATE as usize,
                &mut iov as *mut libc::iovec,
            )
        };
        if ret == -1 {
            Err(Errno::last())
        } else {
            Ok(())
        }
    }

    /// The blocked-signal mask (`PTRACE_GETSIGMASK`).
    pub fn sigmask(&self) -> Result<u64, Errno> {
        let mut mask: u64 = 0;
        // SAFETY: the kernel writes 8 bytes (the size passed) into `mask`, a live local.
        let ret = unsafe {
            libc::ptrace(
                libc::PTRACE_GETSIGMASK,
                self.pid.as_raw(),
                std::mem::size_of::<u64>(),
                &mut mask as *mut u64,
            )
        };
        if ret == -1 {
            Err(Errno::last())
        } else {
            Ok(mask)
        }
    }

    pub fn set_sigmask(&self, mask: u64) -> Result<(), Errno> {
        // SAFETY: the kernel reads 8 bytes (the size passed) from `mask`, a live local.
        let ret = unsafe {
            libc::ptrace(
                libc::PTRACE_SETSIGMASK,
                self.pid.as_raw(),
                std::mem::size_of::<u64>(),
                &mask as *const u64,
            )
        };
        if ret == -1 {
            Err(Errno::last())
        } else {
            Ok(())
        }
    }

    /// The 8 bytes at `addr` of the tracee's memory.
    pub fn peek(&self, addr: u64) -> Result<u64, Errno> {
        nix::sys::ptrace::read(self.pid, addr as nix::sys::ptrace::AddressType).map(|w| w as u64)
    }

    /// Resumes for one instruction (`PTRACE_SINGLESTEP`, any pending signal suppressed) and
    /// waits for the next stop; the signal it reports. A stop other than the step's trap (a
    /// group stop reported first) may come before the instruction ran: the caller looks at
    /// the instruction pointer.
    pub fn step(&self) -> Result<libc::c_int, Errno> {
        nix::sys::ptrace::step(self.pid, None)?;
        self.wait_stop()
    }

    /// Sends `signal` through the pidfd.
    pub fn signal(&self, signal: libc::c_int) -> Result<(), Errno> {
        pidfd_signal(&self.pidfd, signal)
    }

    /// Detaches; the process goes back to the group stop it was in, if the group is stopped.
    /// Its pidfd, to signal it afterwards.
    pub fn detach(mut self) -> Result<OwnedFd, Errno> {
        let pidfd = self.pidfd.try_clone().map_err(|_| Errno::EMFILE)?;
        self.attached = false;
        nix::sys::ptrace::detach(self.pid, None)?;
        Ok(pidfd)
    }
}

impl Drop for Tracee {
    fn drop(&mut self) {
        if self.attached {
            let _ = nix::sys::ptrace::detach(self.pid, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::IntoRawFd;

    use super::*;

    #[test]
    fn an_inherited_number_is_taken_once() {
        // A descriptor nobody owns any more, as one inherited at exec.
        let raw = std::fs::File::open("/dev/null").unwrap().into_raw_fd();
        assert!(raw < 64, "fd {raw}");
        let taken = take_inherited(raw).expect("first take");
        assert_eq!(take_inherited(raw).unwrap_err(), Errno::EBUSY);
        drop(taken);
        assert_eq!(take_inherited(64).unwrap_err(), Errno::EBADF);
        assert_eq!(take_inherited(-1).unwrap_err(), Errno::EBADF);
    }

    #[test]
    fn sysv_counts_see_each_segment_and_queue() {
        // In an ipc namespace of this thread's own where allowed (root), so that no other
        // process's objects come and go between the readings.
        let fresh = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWIPC).is_ok();
        let before = sysv_counts().expect("counts");
        // SAFETY: shmget and msgget take integers and return an id or -1; nothing is mapped.
        let (shm, msg) = unsafe {
            (
                libc::shmget(libc::IPC_PRIVATE, 4096, 0o600 | libc::IPC_CREAT),
                libc::msgget(libc::IPC_PRIVATE, 0o600 | libc::IPC_CREAT),
            )
        };
        let made = Errno::last();
        let during = sysv_counts();
        // Removed before anything is asserted, so that a failure leaves nothing behind.
        // SAFETY: IPC_RMID with a null buffer removes the object; no memory is passed. An id
        // of -1 (not made) is refused with EINVAL.
        unsafe {
            libc::shmctl(shm, libc::IPC_RMID, std::ptr::null_mut());
            libc::msgctl(msg, libc::IPC_RMID, std::ptr::null_mut());
        }
        assert!(shm >= 0 && msg >= 0, "{made}");
        let during = during.expect("counts");
        let after = sysv_counts().expect("counts");
        let none = SysvCounts {
            segments: 0,
            queues: 0,
        };
        let one = SysvCounts {
            segments: 1,
            queues: 1,
        };
        if fresh {
            assert_eq!((before, during, after), (none, one, none));
        } else {
            assert!(during.segments > before.segments && during.queues > before.queues);
        }
    }

    #[test]
    fn no_proof_while_another_thread_runs() {
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || stop_rx.recv());
        assert!(SingleThreaded::check().is_none());
        drop(stop_tx);
        let _ = other.join();
    }
}
