//! What a sandbox's processes have used, read by the zygote just before it kills the sandbox.
//!
//! A kill from outside (the watchdog's deadline, the output cap, a cancel) goes to the init,
//! and the whole pid namespace dies with it: the kernel reaps the job's processes itself and
//! drops their CPU time and peak memory, so the zygote's `wait4` of the init sees only the
//! init's own. Just before such a kill the zygote reads the sandbox's own `/proc` (through the
//! init's root): every process's CPU time and that of the children it reaped (`utime`, `stime`,
//! `cutime`, `cstime`, the init's included), and the largest peak resident size (`VmHWM`), the
//! same figures a report gives when the job ends by itself. Children never waited for that
//! already exited are not in it (a lower bound, as in `budget.rs`).

use std::path::{Path, PathBuf};

use super::procfs;
use crate::sandbox::kernel::sys::Usage;

/// The `/proc` the sandbox whose init has host pid `init` mounted for itself, when it is one
/// (a job cannot replace it: the mount is the init's, and the job holds no capability).
pub(crate) fn sandbox_proc(init: i32) -> Option<PathBuf> {
    let proc = PathBuf::from(format!("/proc/{init}/root/proc"));
    let fs = nix::sys::statfs::statfs(&proc).ok()?;
    (fs.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC).then_some(proc)
}

/// The bytes the disk of the sandbox whose init has host pid `init` holds now: its `/tmp`,
/// which is a directory of the one tmpfs behind `/work` and `/dev/shm` too (`rootfs.rs`).
/// `None` when that is not a tmpfs (the sandbox is gone).
pub(crate) fn sandbox_disk_bytes(init: i32) -> Option<u64> {
    let fs = nix::sys::statfs::statfs(&PathBuf::from(format!("/proc/{init}/root/tmp"))).ok()?;
    (fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC).then(|| {
        let used = fs.blocks().saturating_sub(fs.blocks_free());
        used.saturating_mul(fs.block_size() as u64)
    })
}

/// The CPU time and the largest peak resident size of the processes listed in `proc`.
pub(crate) fn used(proc: &Path) -> Usage {
    let mut ticks = 0u64;
    let mut max_rss_kb = 0u64;
    for process in procfs::processes(proc) {
        // A process gone since the listing was reaped: its time is in its parent's counters.
        if let Some((times, _)) = process.read("stat").and_then(|s| procfs::cpu_fields(&s)) {
            ticks = ticks.saturating_add(times.iter().sum());
        }
        if let Some(kb) = process
            .read("status")
            .and_then(|s| procfs::field_kb(&s, "VmHWM:"))
        {
            max_rss_kb = max_rss_kb.max(kb);
        }
    }
    Usage {
        cpu_us: ticks.saturating_mul(1_000_000) / procfs::ticks_per_s(),
        max_rss_kb,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(proc: &Path, pid: &str, times: &str, hwm_kb: Option<u64>) {
        let dir = proc.join(pid);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("stat"),
            format!("{pid} (a (b)) S 1 1 1 0 -1 0 0 0 0 0 {times} 20 0 1 0 5 99\n"),
        )
        .unwrap();
        let hwm = hwm_kb.map_or(String::new(), |kb| format!("VmHWM:\t  {kb} kB\n"));
        std::fs::write(
            dir.join("status"),
            format!("Name:\ta\nVmPeak:\t 999999 kB\n{hwm}VmRSS:\t 5 kB\n"),
        )
        .unwrap();
    }

    #[test]
    fn every_process_and_its_reaped_children_count_and_the_largest_peak() {
        let proc = tempfile::tempdir().unwrap();
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .unwrap()
            .unwrap() as u64;
        // The init (its reaped children in cutime), the program, and a kernel-thread-like
        // entry with no memory line.
        process(proc.path(), "1", "1 1 30 8", Some(900));
        process(proc.path(), "2", "250 50 0 0", Some(65_600));
        process(proc.path(), "7", "0 10 0 0", None);
        // Not processes.
        std::fs::create_dir(proc.path().join("sys")).unwrap();
        std::fs::write(proc.path().join("stat"), "cpu 1 2 3\n").unwrap();
        let u = used(proc.path());
        assert_eq!(u.cpu_us, 350 * 1_000_000 / ticks);
        assert_eq!(u.max_rss_kb, 65_600);
        let none = used(&proc.path().join("missing"));
        assert_eq!((none.cpu_us, none.max_rss_kb), (0, 0));
    }

    #[test]
    fn only_a_proc_filesystem_is_read() {
        assert!(sandbox_proc(std::process::id() as i32).is_some());
        assert!(sandbox_proc(i32::MAX).is_none());
    }
}
