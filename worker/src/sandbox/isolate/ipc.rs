//! Bounds on the memory a job can hold through its ipc namespace, for hosts without cgroups.
//!
//! SysV shared memory, SysV message queues, SysV semaphores and POSIX message queues live in
//! kernel memory that no rlimit counts: a segment nobody has attached, a message nobody has
//! received, stay with the namespace. Each sandbox has an ipc namespace of its own, whose
//! limits are sysctls its root could raise (the kernel lets a user namespace's root write the
//! ipc sysctls of namespaces it owns), so the init sets them from the job's memory limit, and
//! the job's `/proc/sys` is read-only (see `rootfs`). The shares of `memory_mb`:
//!
//! | object | limit | worst-case kernel memory |
//! |---|---|---|
//! | SysV shared memory | `shmall` = half, one segment at most half | memory_mb / 2 |
//! | SysV message queues | 16 queues of `msgmnb` bytes | memory_mb / 4 (a message costs at least 64 bytes, and a queue holds at most `msgmnb` of them) |
//! | SysV semaphores | 4096 in 128 sets | about 0.5 MiB |
//! | POSIX message queues | 8 queues of 10 messages of 2 KiB | 32 KiB (`RLIMIT_MSGQUEUE`, see `limits`) |

use std::ffi::CString;
use std::os::fd::OwnedFd;

use nix::errno::Errno;

use super::setup_error::SetupError;
use crate::sandbox::kernel::sys;

/// Message queues per namespace.
const MSG_QUEUES: u64 = 16;
/// The kernel memory one queued message costs at least (its header, rounded up to the
/// smallest slab it comes from), against the one byte of the queue's budget it may use: a
/// queue may hold as many messages as it has bytes.
const MSG_WORST_BYTES: u64 = 64;
/// The smallest queue worth having (the kernel's own default).
const MSG_QUEUE_MIN_BYTES: u64 = 16_384;
/// Largest single SysV message (the kernel's default).
const MSG_MAX_BYTES: u64 = 8192;
/// SysV shared memory segments per namespace.
const SHM_SEGMENTS: u64 = 128;
/// `kernel.sem`: semaphores per set, in all, operations per call, sets.
const SEM: &str = "250 4096 32 128";

/// A sysctl the init could not set.
#[derive(Debug, thiserror::Error)]
#[error("set ipc limit {path} to {value}: {errno}")]
pub struct IpcError {
    pub path: &'static str,
    pub value: String,
    pub errno: Errno,
}

impl From<IpcError> for SetupError {
    fn from(e: IpcError) -> SetupError {
        SetupError::errno(format!("set ipc limit {} to {}", e.path, e.value), e.errno)
    }
}

/// The ipc sysctls (paths beneath `/proc/sys`) and their values for a job of `memory_mb`, on
/// a machine with pages of `page_bytes`.
pub fn limits(memory_mb: u64, page_bytes: u64) -> Vec<(&'static str, String)> {
    let memory = memory_mb.saturating_mul(1 << 20);
    let shm = memory / 2;
    let queue =
        (memory / 4 / MSG_QUEUES / MSG_WORST_BYTES).clamp(MSG_QUEUE_MIN_BYTES, i32::MAX as u64);
    vec![
        ("kernel/shmmax", shm.to_string()),
        ("kernel/shmall", (shm / page_bytes).to_string()),
        ("kernel/shmmni", SHM_SEGMENTS.to_string()),
        ("kernel/msgmni", MSG_QUEUES.to_string()),
        ("kernel/msgmnb", queue.to_string()),
        ("kernel/msgmax", MSG_MAX_BYTES.min(queue).to_string()),
        ("kernel/sem", SEM.to_owned()),
        ("fs/mqueue/queues_max", "8".to_owned()),
        ("fs/mqueue/msg_max", "10".to_owned()),
        // Small enough that a queue of the default sizes fits the job's `RLIMIT_MSGQUEUE`.
        ("fs/mqueue/msgsize_max", "2048".to_owned()),
    ]
}

/// Sets the calling process's ipc namespace's limits for a job of `memory_mb`, through
/// `sysctls`, a descriptor of a writable `/proc/sys`.
pub fn bound(sysctls: &OwnedFd, memory_mb: u64) -> Result<(), IpcError> {
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as u64);
    for (path, value) in limits(memory_mb, page) {
        let fail = |errno| IpcError {
            path,
            value: value.clone(),
            errno,
        };
        let c = CString::new(path).map_err(|_| fail(Errno::EINVAL))?;
        sys::write_file_at(sysctls, &c, value.as_bytes()).map_err(fail)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_limit_reads_as_a_set_up_error() {
        let e = IpcError {
            path: "kernel/shmmax",
            value: "1024".into(),
            errno: Errno::EACCES,
        };
        assert_eq!(
            SetupError::from(e).to_string(),
            "set ipc limit kernel/shmmax to 1024: EACCES: Permission denied"
        );
    }

    fn value(limits: &[(&str, String)], path: &str) -> u64 {
        limits
            .iter()
            .find(|(p, _)| *p == path)
            .unwrap_or_else(|| panic!("{path} not set"))
            .1
            .parse()
            .unwrap()
    }

    #[test]
    fn limits_are_shares_of_the_memory_limit() {
        let l = limits(64, 4096);
        assert_eq!(value(&l, "kernel/shmmax"), 32 << 20);
        assert_eq!(value(&l, "kernel/shmall"), (32 << 20) / 4096);
        assert_eq!(value(&l, "kernel/msgmni"), 16);
        // 16 queues, each holding at most msgmnb messages of 64 bytes: a quarter of 64 MiB.
        let queue = value(&l, "kernel/msgmnb");
        assert_eq!(queue * 16 * 64, 16 << 20);
        assert_eq!(value(&l, "kernel/msgmax"), 8192);
        let big = limits(4096, 4096);
        assert_eq!(value(&big, "kernel/msgmnb") * 16 * 64, 1 << 30);
        assert_eq!(value(&big, "kernel/shmall") * 4096, 2 << 30);
    }

    #[test]
    fn small_and_huge_limits_stay_in_the_kernel_ranges() {
        let tiny = limits(1, 4096);
        assert_eq!(value(&tiny, "kernel/msgmnb"), MSG_QUEUE_MIN_BYTES);
        assert_eq!(value(&tiny, "kernel/msgmax"), 8192);
        assert_eq!(value(&tiny, "kernel/shmall"), 128);
        let huge = limits(u64::MAX, 65536);
        assert_eq!(value(&huge, "kernel/msgmnb"), i32::MAX as u64);
        assert!(value(&huge, "kernel/shmmax") > 0);
    }

    #[test]
    fn every_ipc_limit_is_set() {
        let paths: Vec<&str> = limits(512, 4096).into_iter().map(|(p, _)| p).collect();
        for p in [
            "kernel/shmmax",
            "kernel/shmall",
            "kernel/shmmni",
            "kernel/msgmnb",
            "kernel/msgmax",
            "kernel/msgmni",
            "kernel/sem",
            "fs/mqueue/queues_max",
            "fs/mqueue/msg_max",
            "fs/mqueue/msgsize_max",
        ] {
            assert!(paths.contains(&p), "{p}");
        }
    }
}
