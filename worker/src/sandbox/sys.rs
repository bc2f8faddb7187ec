//! The only place in Forkbox that calls the kernel through `unsafe`.
//!
//! Everything here is a thin, typed wrapper over one system call (or a fixed sequence of them)
//! that `nix` does not cover safely: `clone3` with a pidfd, `pidfd_send_signal`, `wait4`,
//! capability dropping, loading a pre-compiled seccomp program, `close_range`, bringing `lo` up,
//! and `fork` in a process known to be single-threaded. Each block states why it is sound.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Command;

use nix::errno::Errno;
use nix::unistd::Pid;

/// Result of `clone_into_namespaces` / `fork_single_threaded`.
pub enum Forked {
    Parent { pid: Pid, pidfd: Option<OwnedFd> },
    Child,
}

/// `clone3(flags | CLONE_PIDFD)` with fork semantics (no shared memory, child continues on a
/// copy of the caller's stack). Must only be called from a single-threaded process.
pub fn clone_into_namespaces(namespaces: libc::c_int) -> Result<Forked, Errno> {
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
    // fork(2). The callers are the zygote and the sandbox init, both single-threaded, so no lock
    // can be held by a thread that does not exist in the child.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match ret {
        -1 => Err(Errno::last()),
        0 => Ok(Forked::Child),
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

/// Plain fork for a process known to be single-threaded (the sandbox init).
pub fn fork_single_threaded() -> Result<Forked, Errno> {
    // SAFETY: only called from the sandbox init, which never starts threads, so the child
    // inherits no lock held by another thread and may allocate freely.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Parent { child } => Ok(Forked::Parent {
            pid: child,
            pidfd: None,
        }),
        nix::unistd::ForkResult::Child => Ok(Forked::Child),
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

/// Resource usage of a reaped child.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub cpu_us: u64,
    pub max_rss_kb: u64,
}

/// `wait4(pid, WNOHANG)`: `None` while the child still runs.
pub fn wait4_nohang(pid: Pid) -> Result<Option<(i32, Usage)>, Errno> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data; zeroed is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointers to locals for the duration of the call.
    let ret = unsafe {
        libc::wait4(
            pid.as_raw(),
            &mut status,
            libc::WNOHANG | libc::__WALL,
            &mut ru,
        )
    };
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

/// Takes ownership of an inherited descriptor number.
pub fn adopt_fd(fd: RawFd) -> Result<OwnedFd, Errno> {
    // SAFETY: F_GETFD only queries the descriptor; it fails with EBADF when it is not open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        return Err(Errno::last());
    }
    // SAFETY: the descriptor is open and, by the caller's contract, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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
pub fn close_all_except(keep: RawFd) -> Result<(), Errno> {
    let close = |first: u32, last: u32| -> Result<(), Errno> {
        if first > last {
            return Ok(());
        }
        // SAFETY: integer-only syscall closing descriptors this process owns; the caller (a
        // freshly cloned init) holds no Rust object wrapping them other than `keep`.
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

/// Borrows a descriptor number for the duration of one call (epoll registration).
pub fn borrow_fd(fd: RawFd) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: callers pass descriptors they own and keep open across the call that uses the
    // borrow; epoll_ctl does not retain the reference.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
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
