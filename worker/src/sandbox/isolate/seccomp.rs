//! The seccomp policy: declarative tables, compiled once per zygote.
//!
//! An allow list: a job may make the calls of [`ALLOWED`] (the calls Docker's default profile
//! allows a container without capabilities, less those refused below), and a few more whose
//! arguments are checked ([`ARGUMENT_RULES`], and the socket table). Any other call fails with
//! ENOSYS, as on a kernel built without it, so that libc and runtimes take the fallback they
//! have for an old kernel; a call a future kernel adds is refused until it is listed.
//! Syscalls from a foreign ABI (i386 via `int 0x80`, x32 numbers with bit 30 set) fail with
//! EPERM: the filter only allows the native ABI, so no rule can be bypassed through a twin
//! number.
//!
//! Some calls fail with EPERM, so programs see an ordinary error ([`DENIED`]): those that
//! change the kernel's view of the world (mounts, namespaces, modules, clocks, keyrings), open
//! a large attack surface that untrusted code has no business with (bpf, io_uring,
//! userfaultfd, perf), or reach other processes or the host's memory policy (`kcmp`,
//! `pidfd_getfd`, `process_madvise`, `process_mrelease`, the NUMA calls), which Docker's
//! profile refuses without capabilities, and a few recent calls of the same kind (`mseal`,
//! `cachestat`, `futex_waitv`, landlock).
//!
//! Some calls are refused only for some arguments: `clone` with any namespace flag (a new user
//! namespace would hand the child every capability over namespaces of its own), sockets of
//! any family but Unix, IPv4, IPv6 and netlink (the others are either not namespaced, such as
//! vsock, or old protocol code loaded on demand as a module, host-wide), `fcntl`'s
//! `F_NOTIFY` (dnotify: a watch on a shared host directory, like inotify's, would show which
//! files the host and other jobs open; it fails with EINVAL, as on a kernel without dnotify),
//! `mmap` of memory `RLIMIT_DATA` does not count (stack and shared anonymous mappings,
//! [`MMAP_REFUSED`]; ENOMEM, as at a memory limit), and `personality` other than the personas
//! Docker's profile allows.
//! A few calls fail with ENOSYS on purpose, because programs fall back when they see it
//! ([`UNAVAILABLE`]): `clone3` (whose flags sit in memory, out of the filter's reach; libc
//! then uses `clone`), inotify (see dnotify; and the instance quota is one for every sandbox
//! of the node), memfd (its pages are outside the job's disk and, without cgroups, outside
//! every limit), and the kernel's asynchronous I/O (`io_setup`: its contexts come from one
//! host-wide pool, `fs.aio-max-nr`, that a single job could take whole).

use std::io::{Read, Seek};

use forkbox_queue::schema::Network;
use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};

use crate::sandbox::kernel::sys::SockFilter;

/// Syscalls allowed whatever their arguments: Docker's default profile for a container
/// without capabilities, on x86_64, less the calls this policy refuses ([`DENIED`],
/// [`UNAVAILABLE`]) and those whose arguments it checks ([`ARGUMENT_RULES`], the socket table).
pub const ALLOWED: &[&str] = &[
    "accept",
    "accept4",
    "access",
    "alarm",
    "arch_prctl",
    "bind",
    "brk",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "clock_getres",
    "clock_gettime",
    "clock_nanosleep",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchown",
    "fchownat",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstatfs",
    "fsync",
    "ftruncate",
    "futex",
    "futimesat",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "geteuid",
    "getgid",
    "getgroups",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresuid",
    "getrlimit",
    "get_robust_list",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "get_thread_area",
    "gettid",
    "gettimeofday",
    "getuid",
    "getxattr",
    "inotify_add_watch",
    "inotify_rm_watch",
    "ioctl",
    "ioprio_get",
    "ioprio_set",
    "kill",
    "lchown",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listxattr",
    "llistxattr",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "madvise",
    "membarrier",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "modify_ldt",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedsend",
    "mq_unlink",
    "mremap",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "nanosleep",
    "newfstatat",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "pselect6",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recvfrom",
    "recvmmsg",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_tgsigqueueinfo",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "sendfile",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setfsgid",
    "setfsuid",
    "setgid",
    "setgroups",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setresgid",
    "setresuid",
    "setreuid",
    "setrlimit",
    "set_robust_list",
    "setsid",
    "setsockopt",
    "set_thread_area",
    "set_tid_address",
    "setuid",
    "setxattr",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "splice",
    "stat",
    "statfs",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_settime",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_settime",
    "times",
    "tkill",
    "truncate",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "write",
    "writev",
];

/// Allowed calls newer than the syscall tables of the libseccomp the node may be built with,
/// by number (the same on every architecture since Linux 5.1). glibc calls `fchmodat2` for
/// `fchmodat` with `AT_SYMLINK_NOFOLLOW`.
pub const ALLOWED_BY_NUMBER: &[(&str, i32)] = &[("fchmodat2", 452)];

/// Syscalls denied with EPERM inside every sandbox.
pub const DENIED: &[&str] = &[
    // Mount table and root changes.
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    // Namespaces.
    "unshare",
    "setns",
    // Other processes' memory.
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    // Kernel attack surface.
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "lookup_dcookie",
    // Keyrings are not namespaced.
    "keyctl",
    "add_key",
    "request_key",
    // File handles bypass path-based confinement.
    "open_by_handle_at",
    "name_to_handle_at",
    // Machine-wide state.
    "reboot",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "swapon",
    "swapoff",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "syslog",
    "iopl",
    "ioperm",
    "quotactl",
    "quotactl_fd",
    "vhangup",
    // Filesystem-wide event monitoring (inotify is in `UNAVAILABLE`).
    "fanotify_init",
    // Other processes, and the host's memory placement: refused by Docker's default profile
    // without CAP_SYS_PTRACE or CAP_SYS_NICE.
    "kcmp",
    "pidfd_getfd",
    "process_madvise",
    "process_mrelease",
    "get_mempolicy",
    "set_mempolicy",
    "mbind",
    "migrate_pages",
    "move_pages",
    // Recent attack surface no runtime needs: waits on many futexes, sealing mappings,
    // the page cache's state of any file, unprivileged sandboxing of its own.
    "futex_waitv",
    "landlock_create_ruleset",
    "landlock_add_rule",
    "landlock_restrict_self",
];

/// Calls newer than the syscall tables of the libseccomp the node may be built with, denied
/// with EPERM by number (the same on every architecture since Linux 5.1).
pub const DENIED_BY_NUMBER: &[(&str, i32)] = &[
    ("set_mempolicy_home_node", 450),
    ("cachestat", 451),
    // Read the mount table of any namespace the caller can name.
    ("statmount", 457),
    ("listmount", 458),
    ("mseal", 462),
    // `open_tree` with mount attributes.
    ("open_tree_attr", 467),
];

#[cfg(test)]
/// Syscalls that fail with ENOSYS, as on a kernel without them, so programs take the fallback
/// they have for that case: `clone` for `clone3`, polling for inotify, a file in `/dev/shm`
/// (on the job's disk) for memfd, threads (glibc's POSIX aio) for the kernel's aio.
pub const UNAVAILABLE: &[&str] = &[
    "clone3",
    "inotify_init",
    "inotify_init1",
    "memfd_create",
    "memfd_secret",
    "io_setup",
    "io_destroy",
    "io_submit",
    "io_cancel",
    "io_getevents",
    "io_pgetevents",
];

/// `fcntl`'s dnotify command, which fails with EINVAL.
pub const F_NOTIFY: u64 = libc::F_NOTIFY as u64;

/// The `clone` flags that create namespaces; `clone` with any of them fails with EPERM.
/// CLONE_NEWTIME shares its bit with the exit signal byte, where no valid signal sets it.
pub const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWTIME as u64,
];

/// `mmap` flags refused with ENOMEM, as (mask, value) pairs over the flags (the fourth
/// argument): memory that `RLIMIT_DATA` does not count. A stack mapping (`MAP_GROWSDOWN`)
/// is not a data mapping, so a job could map gigabytes of it; shared anonymous memory
/// (`MAP_SHARED` or `MAP_SHARED_VALIDATE` with `MAP_ANONYMOUS`) is shmem, which no rlimit
/// counts. The mapping type is the low four bits. Without cgroups the init's memory budget
/// (`memory`) also counts both, and the ways to them no filter sees (a shared mapping of
/// `/dev/zero`); these rules refuse the common way outright, before any page is touched.
pub const MMAP_REFUSED: &[(u64, u64)] = &[
    (libc::MAP_GROWSDOWN as u64, libc::MAP_GROWSDOWN as u64),
    (
        0x0f | libc::MAP_ANONYMOUS as u64,
        libc::MAP_SHARED as u64 | libc::MAP_ANONYMOUS as u64,
    ),
    (
        0x0f | libc::MAP_ANONYMOUS as u64,
        libc::MAP_SHARED_VALIDATE as u64 | libc::MAP_ANONYMOUS as u64,
    ),
];

/// The socket families a job may use (`socket` and `socketpair`); any other fails with
/// EAFNOSUPPORT, as for a family the kernel lacks. The largest must be the last.
pub const SOCKET_FAMILIES: &[u64] = &[
    libc::AF_UNIX as u64,
    libc::AF_INET as u64,
    libc::AF_INET6 as u64,
    libc::AF_NETLINK as u64,
];

/// The socket families a job with no network (`"network": "none"`) may use: Unix alone.
/// Without an IPv4, IPv6, netlink or packet socket a job cannot change its network
/// namespace's state (counters, routes, flow labels, TIME_WAIT), which is what lets one such
/// namespace serve one sandbox after another (`netns`). The others fail with EAFNOSUPPORT, as
/// on a kernel built without them: runtimes take their "no IPv4/IPv6" paths and report
/// "Address family not supported by protocol", which names the cause, where EACCES would
/// read as a file permission problem.
pub const UNIX_ONLY_FAMILIES: &[u64] = &[libc::AF_UNIX as u64];

/// The socket families allowed under a job's network mode. The largest must be the last.
pub fn socket_families(network: Network) -> &'static [u64] {
    match network {
        Network::None => UNIX_ONLY_FAMILIES,
        Network::Loopback => SOCKET_FAMILIES,
    }
}

/// The calls whose family argument (the first) is checked against [`socket_families`].
pub const SOCKET_CALLS: &[&str] = &["socket", "socketpair"];

#[cfg(test)]
/// The calls allowed only for some arguments, besides the socket table ([`SOCKET_CALLS`]):
/// each refuses what its rules match and allows the rest.
pub const ARGUMENT_RULES: &[&str] = &["clone", "fcntl", "mmap", "personality"];

/// The personas `personality` may set (or, 0xffffffff, only read), as in Docker's default
/// profile: Linux, its 32-bit flavour, and both with `UNAME26`. Any other fails with ENOSYS.
pub const PERSONAS: &[u64] = &[0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

#[cfg(test)]
/// [`verdict_for`] a job with a loopback network.
pub fn verdict(name: &str, args: &[u64; 6]) -> Option<i32> {
    verdict_for(Network::Loopback, name, args)
}

#[cfg(test)]
/// What the policy does with one call under a network mode: the errno it fails with, or none
/// when it is allowed. The reference the compiled program is tested against, written from the
/// tables alone.
pub fn verdict_for(network: Network, name: &str, args: &[u64; 6]) -> Option<i32> {
    if DENIED.contains(&name) || DENIED_BY_NUMBER.iter().any(|&(n, _)| n == name) {
        return Some(libc::EPERM);
    }
    let refused = |refuse: bool, errno: i32| refuse.then_some(errno);
    match name {
        "clone" => refused(
            NAMESPACE_FLAGS.iter().any(|f| args[0] & f != 0),
            libc::EPERM,
        ),
        // The command is an unsigned int: only the low half of the register reaches the
        // kernel.
        "fcntl" => refused(args[1] & 0xffff_ffff == F_NOTIFY, libc::EINVAL),
        "mmap" => refused(
            MMAP_REFUSED.iter().any(|&(m, v)| args[3] & m == v),
            libc::ENOMEM,
        ),
        "personality" => refused(!PERSONAS.contains(&args[0]), libc::ENOSYS),
        _ if SOCKET_CALLS.contains(&name) => refused(
            !socket_families(network).contains(&args[0]),
            libc::EAFNOSUPPORT,
        ),
        _ if ALLOWED.contains(&name) || ALLOWED_BY_NUMBER.iter().any(|&(n, _)| n == name) => None,
        // `UNAVAILABLE`, and every call not listed.
        _ => Some(libc::ENOSYS),
    }
}

/// Every call denied with EPERM, with its native number: [`DENIED`] through libseccomp's
/// tables, then [`DENIED_BY_NUMBER`].
pub fn denied_numbers() -> Result<Vec<(&'static str, i32)>, SeccompError> {
    let mut calls = DENIED
        .iter()
        .map(|&name| {
            ScmpSyscall::from_name(name)
                .map(|nr| (name, i32::from(nr)))
                .map_err(|_| SeccompError::UnknownSyscall(name))
        })
        .collect::<Result<Vec<_>, _>>()?;
    calls.extend_from_slice(DENIED_BY_NUMBER);
    Ok(calls)
}

/// Why the policy could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp: unknown syscall {0:?} in the policy")]
    UnknownSyscall(&'static str),
    #[error("seccomp: {0}")]
    Libseccomp(#[from] libseccomp::error::SeccompError),
    #[error("seccomp: exporting the BPF program: {0}")]
    Export(#[from] std::io::Error),
    #[error("seccomp: exported program has {0} bytes, not a whole number of instructions")]
    Malformed(usize),
}

/// The rules of [`ARGUMENT_RULES`]. For each call, a refusing rule per case and one allowing
/// rule for the rest: libseccomp tests a call's refusing rules before its allowing ones (the
/// program is checked against [`verdict`] by the tests), and a rule without conditions would
/// override every conditional one of its call.
fn add_argument_rules(ctx: &mut ScmpFilterContext) -> Result<(), SeccompError> {
    let syscall = |name: &'static str| {
        ScmpSyscall::from_name(name).map_err(|_| SeccompError::UnknownSyscall(name))
    };
    // The mask drops the high half, which the kernel ignores too.
    let fcntl = syscall("fcntl")?;
    ctx.add_rule_conditional(
        ScmpAction::Errno(libc::EINVAL),
        fcntl,
        &[ScmpArgCompare::new(
            1,
            ScmpCompareOp::MaskedEqual(0xffff_ffff),
            F_NOTIFY,
        )],
    )?;
    ctx.add_rule_conditional(
        ScmpAction::Allow,
        fcntl,
        &[ScmpArgCompare::new(1, ScmpCompareOp::NotEqual, F_NOTIFY)],
    )?;
    let mmap = syscall("mmap")?;
    for &(mask, value) in MMAP_REFUSED {
        ctx.add_rule_conditional(
            ScmpAction::Errno(libc::ENOMEM),
            mmap,
            &[ScmpArgCompare::new(
                3,
                ScmpCompareOp::MaskedEqual(mask),
                value,
            )],
        )?;
    }
    // Whatever is not refused above has no MAP_GROWSDOWN.
    ctx.add_rule_conditional(
        ScmpAction::Allow,
        mmap,
        &[ScmpArgCompare::new(
            3,
            ScmpCompareOp::MaskedEqual(libc::MAP_GROWSDOWN as u64),
            0,
        )],
    )?;
    // One rule per flag: the filter compares an argument with one mask and one value, and
    // rules of one call are alternatives. Only the low half of the flags reaches the kernel,
    // which is where the masks look.
    let clone = syscall("clone")?;
    for &flag in NAMESPACE_FLAGS {
        let has_flag = ScmpArgCompare::new(0, ScmpCompareOp::MaskedEqual(flag), flag);
        ctx.add_rule_conditional(ScmpAction::Errno(libc::EPERM), clone, &[has_flag])?;
    }
    let any_namespace = NAMESPACE_FLAGS.iter().fold(0, |all, f| all | f);
    ctx.add_rule_conditional(
        ScmpAction::Allow,
        clone,
        &[ScmpArgCompare::new(
            0,
            ScmpCompareOp::MaskedEqual(any_namespace),
            0,
        )],
    )?;
    let personality = syscall("personality")?;
    for &persona in PERSONAS {
        ctx.add_rule_conditional(
            ScmpAction::Allow,
            personality,
            &[ScmpArgCompare::new(0, ScmpCompareOp::Equal, persona)],
        )?;
    }
    Ok(())
}

/// The rules of the socket table ([`SOCKET_CALLS`], [`socket_families`] of `network`).
fn add_socket_rules(ctx: &mut ScmpFilterContext, network: Network) -> Result<(), SeccompError> {
    // The family is an int: a value with any bit set above the largest allowed family, in
    // either half of the register, is refused, so the kernel's truncation to 32 bits cannot
    // turn a refused 64-bit value into an allowed family. Below it, each gap is refused, and
    // each allowed family allowed.
    let families = socket_families(network);
    let largest = *families.last().expect("some family is allowed");
    for &name in SOCKET_CALLS {
        let call = ScmpSyscall::from_name(name).map_err(|_| SeccompError::UnknownSyscall(name))?;
        let refuse = ScmpAction::Errno(libc::EAFNOSUPPORT);
        ctx.add_rule_conditional(
            refuse,
            call,
            &[ScmpArgCompare::new(0, ScmpCompareOp::Greater, largest)],
        )?;
        for family in 0..=largest {
            let action = if families.contains(&family) {
                ScmpAction::Allow
            } else {
                refuse
            };
            ctx.add_rule_conditional(
                action,
                call,
                &[ScmpArgCompare::new(0, ScmpCompareOp::Equal, family)],
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
/// [`compile_for`] a job with a loopback network.
pub fn compile() -> Result<Vec<SockFilter>, SeccompError> {
    compile_for(Network::Loopback)
}

/// Compiles the policy for one network mode ([`verdict_for`]) into a BPF program for the
/// native architecture. A sandbox's mode is fixed when its launcher loads the program, before
/// any job exists.
pub fn compile_for(network: Network) -> Result<Vec<SockFilter>, SeccompError> {
    // Calls not listed fail with ENOSYS, `UNAVAILABLE` among them.
    let mut ctx = ScmpFilterContext::new_filter(ScmpAction::Errno(libc::ENOSYS))?;
    ctx.set_act_badarch(ScmpAction::Errno(libc::EPERM))?;
    // The sandbox sets no_new_privs itself, just before loading the program.
    ctx.set_ctl_nnp(false)?;
    // A binary search over syscall numbers instead of one comparison per listed call: the
    // kernel runs the program once per syscall number when it is loaded (to cache the calls
    // it always allows), inside every sandbox, so its length is paid on every spawn. Where
    // libseccomp or the kernel lacks the option, the linear program enforces the same policy.
    let _ = ctx.set_ctl_optimize(2);
    let syscall = |name: &'static str| {
        ScmpSyscall::from_name(name).map_err(|_| SeccompError::UnknownSyscall(name))
    };
    for name in ALLOWED {
        ctx.add_rule(ScmpAction::Allow, syscall(name)?)?;
    }
    for &(_, nr) in ALLOWED_BY_NUMBER {
        ctx.add_rule(ScmpAction::Allow, ScmpSyscall::from(nr))?;
    }
    for name in DENIED {
        ctx.add_rule(ScmpAction::Errno(libc::EPERM), syscall(name)?)?;
    }
    for &(_, nr) in DENIED_BY_NUMBER {
        ctx.add_rule(ScmpAction::Errno(libc::EPERM), ScmpSyscall::from(nr))?;
    }
    add_argument_rules(&mut ctx)?;
    add_socket_rules(&mut ctx, network)?;
    let fd = nix::sys::memfd::memfd_create(
        c"forkbox-seccomp",
        nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut file = std::fs::File::from(fd);
    ctx.export_bpf(&mut file)?;
    file.rewind()?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    const INSN: usize = std::mem::size_of::<SockFilter>();
    if bytes.is_empty() || bytes.len() % INSN != 0 {
        return Err(SeccompError::Malformed(bytes.len()));
    }
    Ok(bytes
        .chunks_exact(INSN)
        .map(|c| SockFilter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const X86_64: u32 = 0xc000_003e;

    /// The calls with argument rules: every call of theirs runs the filter.
    fn argument_call(name: &str) -> bool {
        ARGUMENT_RULES.contains(&name) || SOCKET_CALLS.contains(&name)
    }
    const ALLOW: u32 = 0x7fff_0000;

    fn errno(e: i32) -> u32 {
        0x0005_0000 | e as u32
    }

    fn nr(name: &str) -> u32 {
        i32::from(ScmpSyscall::from_name(name).unwrap()) as u32
    }

    #[test]
    fn every_listed_name_is_a_real_syscall_and_unique() {
        let mut seen = std::collections::HashSet::new();
        for name in ALLOWED
            .iter()
            .chain(DENIED)
            .chain(UNAVAILABLE)
            .chain(SOCKET_CALLS)
            .chain(ARGUMENT_RULES)
        {
            assert!(
                ScmpSyscall::from_name(name).is_ok(),
                "{name} is not a syscall"
            );
            assert!(seen.insert(name), "{name} listed twice");
        }
        assert!(SOCKET_FAMILIES.windows(2).all(|w| w[0] < w[1]));
        for (name, nr) in DENIED_BY_NUMBER.iter().chain(ALLOWED_BY_NUMBER) {
            assert!(seen.insert(name), "{name} listed twice");
            // A libseccomp that knows the call must agree on its number.
            if let Ok(known) = ScmpSyscall::from_name(name) {
                assert_eq!(i32::from(known), *nr, "{name}");
            }
        }
    }

    #[test]
    fn design_minimum_is_covered() {
        let required = "mount umount2 pivot_root ptrace bpf reboot kexec_load kexec_file_load \
            init_module finit_module delete_module unshare setns keyctl add_key request_key \
            perf_event_open userfaultfd open_by_handle_at name_to_handle_at process_vm_readv \
            process_vm_writev swapon swapoff acct settimeofday clock_settime clock_adjtime adjtimex \
            syslog iopl ioperm quotactl io_uring_setup io_uring_enter io_uring_register \
            lookup_dcookie vhangup fsopen fsmount move_mount open_tree fspick mount_setattr \
            fanotify_init quotactl_fd";
        for name in required.split_whitespace() {
            assert!(
                DENIED.contains(&name),
                "{name} missing from the refused calls"
            );
        }
        // What Docker's default profile refuses without capabilities.
        for name in "kcmp get_mempolicy set_mempolicy mbind migrate_pages move_pages \
            pidfd_getfd process_madvise process_mrelease futex_waitv landlock_create_ruleset \
            landlock_add_rule landlock_restrict_self"
            .split_whitespace()
        {
            assert!(
                DENIED.contains(&name),
                "{name} missing from the refused calls"
            );
        }
        for name in [
            "statmount",
            "listmount",
            "open_tree_attr",
            "set_mempolicy_home_node",
            "cachestat",
            "mseal",
        ] {
            assert!(DENIED_BY_NUMBER.iter().any(|&(n, _)| n == name), "{name}");
        }
        for name in [
            "clone3",
            "inotify_init",
            "inotify_init1",
            "memfd_create",
            "io_setup",
            "io_submit",
        ] {
            assert!(UNAVAILABLE.contains(&name), "{name} missing");
        }
    }

    /// The policy's verdicts on the calls it is about, spelt out by hand.
    #[test]
    fn verdicts_on_namespace_flags_and_socket_families() {
        let clone = |flags: u64| verdict("clone", &[flags, 0, 0, 0, 0, 0]);
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        let fork = (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD) as u64;
        let vfork = (libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD) as u64;
        for allowed in [0, thread, fork, vfork] {
            assert_eq!(clone(allowed), None, "{allowed:#x}");
        }
        for flag in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWCGROUP,
            libc::CLONE_NEWTIME,
        ] {
            let flag = flag as u64;
            assert_eq!(clone(flag), Some(libc::EPERM), "{flag:#x}");
            assert_eq!(clone(flag | fork), Some(libc::EPERM), "{flag:#x}");
            assert_eq!(clone(flag | 0xffff_ffff_0000_0000), Some(libc::EPERM));
        }
        assert_eq!(verdict("clone3", &[0; 6]), Some(libc::ENOSYS));
        // Not listed: ENOSYS, as on a kernel without the call.
        assert_eq!(verdict("sethostname", &[0; 6]), Some(libc::ENOSYS));
        assert_eq!(verdict("uselib", &[0; 6]), Some(libc::ENOSYS));
        assert_eq!(verdict("read", &[0; 6]), None);
        assert_eq!(verdict("fchmodat2", &[0; 6]), None);
        assert_eq!(verdict("kcmp", &[0; 6]), Some(libc::EPERM));
        assert_eq!(verdict("mseal", &[0; 6]), Some(libc::EPERM));
        let personality = |p: u64| verdict("personality", &[p, 0, 0, 0, 0, 0]);
        for allowed in [0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff] {
            assert_eq!(personality(allowed), None, "{allowed:#x}");
        }
        // READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, and a query with the high half set.
        for refused in [0x40_0000, 0x4_0000, 1 << 32 | 0xffff_ffff, 1 << 32] {
            assert_eq!(personality(refused), Some(libc::ENOSYS), "{refused:#x}");
        }
        let mmap = |flags: i32| verdict("mmap", &[0, 1 << 30, 3, flags as u64, u64::MAX, 0]);
        for refused in [
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            libc::MAP_SHARED_VALIDATE | libc::MAP_ANONYMOUS,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_GROWSDOWN,
            libc::MAP_PRIVATE | libc::MAP_GROWSDOWN,
        ] {
            assert_eq!(mmap(refused), Some(libc::ENOMEM), "{refused:#x}");
        }
        for allowed in [
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            libc::MAP_SHARED,
            libc::MAP_PRIVATE,
            libc::MAP_SHARED_VALIDATE,
        ] {
            assert_eq!(mmap(allowed), None, "{allowed:#x}");
        }
        let fcntl = |cmd: u64| verdict("fcntl", &[3, cmd, 0, 0, 0, 0]);
        assert_eq!(fcntl(F_NOTIFY), Some(libc::EINVAL));
        assert_eq!(fcntl(F_NOTIFY | 1 << 32), Some(libc::EINVAL));
        for allowed in [
            libc::F_GETFL,
            libc::F_SETFL,
            libc::F_SETLK,
            libc::F_DUPFD_CLOEXEC,
        ] {
            assert_eq!(fcntl(allowed as u64), None, "{allowed}");
        }
        let socket = |family: u64| verdict("socket", &[family, 1, 0, 0, 0, 0]);
        for family in [
            libc::AF_UNIX,
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK,
        ] {
            assert_eq!(socket(family as u64), None);
        }
        for family in [
            libc::AF_VSOCK,
            libc::AF_PACKET,
            libc::AF_ALG,
            libc::AF_BLUETOOTH,
            libc::AF_KEY,
            libc::AF_RDS,
            libc::AF_TIPC,
            libc::AF_UNSPEC,
        ] {
            assert_eq!(socket(family as u64), Some(libc::EAFNOSUPPORT), "{family}");
        }
        // The kernel reads an int: the high half must not smuggle a family past the filter.
        assert_eq!(
            socket(1 << 32 | libc::AF_VSOCK as u64),
            Some(libc::EAFNOSUPPORT)
        );
        assert_eq!(
            socket(1 << 32 | libc::AF_INET as u64),
            Some(libc::EAFNOSUPPORT)
        );
    }

    /// Runs a classic BPF seccomp program over (arch, nr, args); returns the action and the
    /// number of instructions executed. Only the instructions a libseccomp export uses are
    /// known.
    fn run(prog: &[SockFilter], arch: u32, nr: u32, args: &[u64; 6]) -> (u32, usize) {
        let (mut pc, mut acc, mut x, mut steps) = (0usize, 0u32, 0u32, 0usize);
        let mut mem = [0u32; 16];
        loop {
            let i = prog[pc];
            steps += 1;
            let jump = |taken: bool| pc + 1 + usize::from(if taken { i.jt } else { i.jf });
            pc = match i.code {
                // BPF_LD | BPF_W | BPF_ABS: a word of seccomp_data (nr, arch, ip, args).
                0x20 => {
                    acc = match i.k {
                        0 => nr,
                        4 => arch,
                        k @ 16..=63 if k % 4 == 0 => {
                            let arg = args[(k as usize - 16) / 8];
                            // Little endian: the low half of each argument comes first.
                            if (k - 16) % 8 == 0 {
                                arg as u32
                            } else {
                                (arg >> 32) as u32
                            }
                        }
                        k => panic!("load of seccomp_data offset {k}"),
                    };
                    pc + 1
                }
                0x60 => {
                    acc = mem[i.k as usize];
                    pc + 1
                }
                0x61 => {
                    x = mem[i.k as usize];
                    pc + 1
                }
                0x02 => {
                    mem[i.k as usize] = acc;
                    pc + 1
                }
                0x03 => {
                    mem[i.k as usize] = x;
                    pc + 1
                }
                0x07 => {
                    x = acc;
                    pc + 1
                }
                0x87 => {
                    acc = x;
                    pc + 1
                }
                0x54 => {
                    acc &= i.k;
                    pc + 1
                }
                0x15 => jump(acc == i.k),
                0x25 => jump(acc > i.k),
                0x35 => jump(acc >= i.k),
                0x45 => jump(acc & i.k != 0),
                0x1d => jump(acc == x),
                0x2d => jump(acc > x),
                0x3d => jump(acc >= x),
                0x05 => pc + 1 + i.k as usize,
                0x06 => return (i.k, steps),
                c => panic!("instruction {c:#x} at {pc}"),
            };
        }
    }

    fn expected(name: Option<&str>, args: &[u64; 6]) -> u32 {
        // A number without a name is no call this policy lists.
        match name.map_or(Some(libc::ENOSYS), |n| verdict(n, args)) {
            Some(e) => errno(e),
            None => ALLOW,
        }
    }

    /// Argument vectors that probe every comparison the policy makes: each namespace flag
    /// alone and with thread or fork flags, garbage in the high halves, and every value of
    /// the first argument up to well past the largest socket family.
    fn probes() -> Vec<[u64; 6]> {
        let mut v = vec![[0; 6], [u64::MAX; 6]];
        for &f in NAMESPACE_FLAGS {
            v.push([f, 0, 0, 0, 0, 0]);
            v.push([f | 0x3d0f00, 0, 0, 0, 0, 0]);
            v.push([f | 0xffff_ffff_0000_0000, 0, 0, 0, 0, 0]);
        }
        for first in 0..80u64 {
            v.push([first, 1, 0, 0, 0, 0]);
            v.push([first | 1 << 32, 1, 0, 0, 0, 0]);
            v.push([first | 0xffff_ffff_0000_0000, 1, 0, 0, 0, 0]);
        }
        v.push([0x3d0f00 | libc::SIGCHLD as u64, 0, 0, 0, 0, 0]);
        for cmd in [
            F_NOTIFY,
            F_NOTIFY | 1 << 32,
            F_NOTIFY | 1 << 63,
            F_NOTIFY + 1,
        ] {
            v.push([3, cmd, 0, 0, 0, 0]);
        }
        v.push([0x7fff_ffff, 0, 0, 0, 0, 0]);
        for &p in PERSONAS {
            for q in [p, p + 1, p.wrapping_sub(1), p | 1 << 32, p | 0x40_0000] {
                v.push([q, 0, 0, 0, 0, 0]);
            }
        }
        // Every mapping type with and without MAP_ANONYMOUS and MAP_GROWSDOWN, with other
        // flags and with the high half set.
        for kind in 0..16u64 {
            for extra in [
                0,
                0x20,
                0x100,
                0x120,
                0x4000 | 0x20,
                1 << 32,
                1 << 32 | 0x20,
            ] {
                v.push([0, 4096, 3, kind | extra, u64::MAX, 0]);
            }
        }
        v
    }

    #[test]
    fn program_matches_the_policy_for_every_call_and_argument_probe() {
        let prog = compile().unwrap();
        let mut names: std::collections::HashMap<u32, String> = (0..1024)
            .filter_map(|n| {
                ScmpSyscall::from(n)
                    .get_name()
                    .ok()
                    .map(|name| (n as u32, name))
            })
            .collect();
        for &(name, nr) in DENIED_BY_NUMBER.iter().chain(ALLOWED_BY_NUMBER) {
            names.insert(nr as u32, name.to_owned());
        }
        let probes = probes();
        let mut longest_unconditional = 0;
        for nr in 0..1024u32 {
            let name = names.get(&nr).map(String::as_str);
            for args in &probes {
                let (action, steps) = run(&prog, X86_64, nr, args);
                assert_eq!(
                    action,
                    expected(name, args),
                    "syscall {nr} {name:?} {args:x?}"
                );
                if !name.is_some_and(argument_call) {
                    longest_unconditional = longest_unconditional.max(steps);
                }
            }
            // The x32 twin of every number, and any other architecture, are refused.
            assert_eq!(
                run(&prog, X86_64, nr | 0x4000_0000, &[0; 6]).0,
                errno(libc::EPERM)
            );
            assert_eq!(run(&prog, 0x4000_0003, nr, &[0; 6]).0, errno(libc::EPERM));
        }
        // A binary search: a linear list would walk past every listed number.
        assert!(
            longest_unconditional < (ALLOWED.len() + DENIED.len()) / 8,
            "{longest_unconditional} instructions for one syscall"
        );
        // The calls the argument rules are about, by hand, through the program itself.
        let clone = nr("clone");
        let newuser = [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0];
        assert_eq!(run(&prog, X86_64, clone, &newuser).0, errno(libc::EPERM));
        let thread = [0x3d0f00, 0, 0, 0, 0, 0];
        assert_eq!(run(&prog, X86_64, clone, &thread).0, ALLOW);
        assert_eq!(
            run(&prog, X86_64, nr("clone3"), &[0; 6]).0,
            errno(libc::ENOSYS)
        );
        let vsock = [libc::AF_VSOCK as u64, 1, 0, 0, 0, 0];
        let inet = [libc::AF_INET as u64, 1, 0, 0, 0, 0];
        assert_eq!(
            run(&prog, X86_64, nr("socket"), &vsock).0,
            errno(libc::EAFNOSUPPORT)
        );
        assert_eq!(run(&prog, X86_64, nr("socket"), &inet).0, ALLOW);
        let fcntl = nr("fcntl");
        let notify = [3, F_NOTIFY, 0, 0, 0, 0];
        assert_eq!(run(&prog, X86_64, fcntl, &notify).0, errno(libc::EINVAL));
        let getfl = [3, libc::F_GETFL as u64, 0, 0, 0, 0];
        assert_eq!(run(&prog, X86_64, fcntl, &getfl).0, ALLOW);
        assert_eq!(
            run(&prog, X86_64, nr("io_setup"), &[0; 6]).0,
            errno(libc::ENOSYS)
        );
        assert_eq!(run(&prog, X86_64, 457, &[0; 6]).0, errno(libc::EPERM));
        // Numbers no kernel has yet, or past the table: ENOSYS.
        for unknown in [600, 1023, 0x3fff_ffff] {
            assert_eq!(run(&prog, X86_64, unknown, &[0; 6]).0, errno(libc::ENOSYS));
        }
        assert_eq!(run(&prog, X86_64, 452, &[0; 6]).0, ALLOW, "fchmodat2");
    }

    /// The kernel caches, per syscall number, the calls a filter allows whatever the
    /// arguments, and then runs no filter for them. It finds them by running the program with
    /// the arguments unknown: every call without an argument rule must be decided without
    /// loading an argument, or every one of its calls would run the program.
    #[test]
    fn calls_without_argument_rules_never_read_an_argument() {
        let prog = compile().unwrap();
        let poison = [0xdead_beef_dead_beef_u64; 6];
        for nr in 0..1024u32 {
            let name = ScmpSyscall::from(nr as i32).get_name().ok();
            if name.as_deref().is_some_and(argument_call) {
                continue;
            }
            // Any argument load changes the outcome's dependence on `args`; run with two
            // different vectors and also trap loads directly.
            let loads = args_loaded(&prog, X86_64, nr);
            assert!(!loads, "syscall {nr} {name:?} reads an argument");
            assert_eq!(
                run(&prog, X86_64, nr, &[0; 6]).0,
                run(&prog, X86_64, nr, &poison).0
            );
        }
    }

    /// Whether the program loads an argument on its way to a verdict for `nr`.
    fn args_loaded(prog: &[SockFilter], arch: u32, nr: u32) -> bool {
        let mut pc = 0usize;
        let mut acc = 0u32;
        loop {
            let i = prog[pc];
            let jump = |taken: bool| pc + 1 + usize::from(if taken { i.jt } else { i.jf });
            pc = match i.code {
                0x20 if i.k >= 16 => return true,
                0x20 => {
                    acc = if i.k == 0 { nr } else { arch };
                    pc + 1
                }
                0x54 => {
                    acc &= i.k;
                    pc + 1
                }
                0x15 => jump(acc == i.k),
                0x25 => jump(acc > i.k),
                0x35 => jump(acc >= i.k),
                0x45 => jump(acc & i.k != 0),
                0x05 => pc + 1 + i.k as usize,
                0x06 => return false,
                // Anything else defeats the kernel's emulation as surely as a load.
                _ => return true,
            };
        }
    }

    #[test]
    fn program_compiles_and_checks_the_architecture_first() {
        let prog = compile().unwrap();
        assert!(prog.len() > ALLOWED.len());
        // First instruction loads seccomp_data.arch (offset 4).
        assert_eq!(prog[0].code, 0x20);
        assert_eq!(prog[0].k, 4);
        // The x32 guard: a comparison against 0x40000000 somewhere in the program.
        assert!(prog.iter().any(|i| i.k == 0x4000_0000), "no x32 guard");
    }

    /// Each network mode's program refuses exactly the socket families its table leaves out,
    /// for every probe of the first argument, and decides every other call as the loopback
    /// program does.
    #[test]
    fn each_network_mode_allows_its_socket_families_alone() {
        let loopback = compile_for(Network::Loopback).unwrap();
        for network in Network::ALL {
            let prog = compile_for(network).unwrap();
            for call in SOCKET_CALLS {
                for args in probes() {
                    let want = match verdict_for(network, call, &args) {
                        Some(e) => errno(e),
                        None => ALLOW,
                    };
                    assert_eq!(
                        run(&prog, X86_64, nr(call), &args).0,
                        want,
                        "{call} {args:x?}"
                    );
                }
            }
            for n in 0..1024u32 {
                let name = ScmpSyscall::from(n as i32).get_name().ok();
                if name.as_deref().is_some_and(|n| SOCKET_CALLS.contains(&n)) {
                    continue;
                }
                for args in [[0; 6], [libc::AF_INET as u64, 1, 0, 0, 0, 0]] {
                    assert_eq!(
                        run(&prog, X86_64, n, &args).0,
                        run(&loopback, X86_64, n, &args).0,
                        "syscall {n} {name:?}"
                    );
                }
            }
        }
        let none = compile_for(Network::None).unwrap();
        let family = |f: i32| [f as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
        assert_eq!(
            run(&none, X86_64, nr("socket"), &family(libc::AF_UNIX)).0,
            ALLOW
        );
        assert_eq!(
            run(&none, X86_64, nr("socketpair"), &family(libc::AF_UNIX)).0,
            ALLOW
        );
        for f in [
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK,
            libc::AF_PACKET,
            libc::AF_VSOCK,
            libc::AF_UNSPEC,
        ] {
            for call in SOCKET_CALLS {
                assert_eq!(
                    run(&none, X86_64, nr(call), &family(f)).0,
                    errno(libc::EAFNOSUPPORT),
                    "{call} family {f}"
                );
            }
        }
        // A refused family with garbage above the 32 bits the kernel reads is still refused.
        let high = [1 << 32 | libc::AF_INET as u64, 1, 0, 0, 0, 0];
        assert_eq!(
            run(&none, X86_64, nr("socket"), &high).0,
            errno(libc::EAFNOSUPPORT)
        );
    }
}
