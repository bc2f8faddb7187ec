//! The job's memory as one budget for the whole sandbox, kept by its init where no cgroup
//! keeps it.
//!
//! `RLIMIT_DATA` bounds each process's writable private memory on its own. It does not count
//! shared anonymous memory (`MAP_SHARED|MAP_ANONYMOUS`, a shared mapping of `/dev/zero`), stack
//! mappings (`MAP_GROWSDOWN`), the page tables of a large reservation touched sparsely, nor
//! the sum over a job's processes: each of those reached gigabytes under a limit of 128 MiB. So
//! the init also sums, over every process of its pid namespace but itself, the anonymous and
//! shared memory each holds (its proportional share, `Pss_Anon` + `Pss_Shmem` of
//! `/proc/<pid>/smaps_rollup`, so pages a fork shares count once; `RssAnon` + `RssShmem` of
//! `/proc/<pid>/status` where that cannot be read) and its page tables (`VmPTE`), and kills
//! the sandbox once the sum passes the job's `memory_mb`. The highest sum seen is the job's
//! peak.
//!
//! A check costs two reads per live process, so it is made only as often as the budget could
//! run out: no faster than [`FILL_BYTES_PER_S`] from the last sum, at least [`MIN_CHECK`] and
//! at most [`MAX_CHECK`] after the last. A job that fills memory at that rate is stopped at
//! most `MIN_CHECK × FILL_BYTES_PER_S` (80 MiB) past its limit, plus what it fills while the
//! init waits for a CPU (on a loaded host, more: 144 MiB of page tables past 128 MiB was
//! measured on 2 cores at a load average of 27).
//! The seccomp policy refuses the direct ways to the first two kinds (`MAP_GROWSDOWN`, and
//! `MAP_SHARED` with `MAP_ANONYMOUS`), so what is left for this budget to catch is the
//! indirect ones.
//!
//! The sandbox's sockets and pipes count too (`sockets`, `pipes`): what their buffers hold is
//! in no process's memory, and a job can park gigabytes there. They are asked only while the
//! processes alone are within the budget, so a job past it by its processes is killed no later
//! than before; past it with them, everything is read again and the lower sum counts, so that
//! a socket freed between two steps of one reading (which then counts at its worst case)
//! kills nothing. What cannot be seen (a socket no dump lists, a pipe that cannot be asked)
//! counts at its worst case against the budget, so that it fails closed, but not in the peak:
//! the peak is what the job was seen to hold, never a bound of what it might have.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::pipes::PipeCount;
use super::procfs::{self, field_kb};
use super::sockets::SocketCount;

/// The shortest time between two checks.
pub const MIN_CHECK: Duration = Duration::from_millis(10);
/// The longest time between two checks.
pub const MAX_CHECK: Duration = Duration::from_millis(100);
/// The fastest a job is taken to fill memory: page faults on several CPUs at once.
pub const FILL_BYTES_PER_S: u64 = 8 << 30;

/// The sandbox's memory budget and where its processes are seen.
#[derive(Debug)]
pub struct MemoryBudget {
    limit_kb: u64,
    proc: PathBuf,
    peak_kb: u64,
    /// The sockets of the sandbox's network namespace and the pipes its processes hold, when
    /// they are counted.
    buffers: Option<(SocketCount, PipeCount)>,
}

impl MemoryBudget {
    /// A budget of `limit_mb` for the processes listed in `proc` (the sandbox's own `/proc`).
    pub fn new(limit_mb: u64, proc: &Path) -> MemoryBudget {
        MemoryBudget {
            limit_kb: limit_mb.saturating_mul(1024),
            proc: proc.to_owned(),
            peak_kb: 0,
            buffers: None,
        }
    }

    /// The same budget counting also the sockets of the caller's network namespace (the
    /// sandbox's, for its init), which `proc` must show, and the pipes of its processes;
    /// `host_socket_max` is the host's largest socket buffer (`sockets::buffer_max`), for a
    /// kernel that shows it in no other namespace.
    pub fn with_buffers(limit_mb: u64, proc: &Path, host_socket_max: Option<u64>) -> MemoryBudget {
        MemoryBudget {
            buffers: Some((
                SocketCount::new(proc, host_socket_max),
                PipeCount::new(proc),
            )),
            ..MemoryBudget::new(limit_mb, proc)
        }
    }

    /// The most the sandbox was seen to hold at one check so far, in KiB: the worst case of
    /// buffers that could not be seen counts against the budget, not here.
    pub fn peak_kb(&self) -> u64 {
        self.peak_kb
    }

    /// The memory, in KiB, that the processes of the sandbox hold now, the calling process's
    /// own excepted, and its sockets and pipes where they are counted, with the worst case of
    /// those that could not be seen. Past the budget by the processes alone, the buffers are
    /// not asked (the kill comes sooner); past it with them, everything is read again and the
    /// lower sum counts.
    pub fn used_kb(&mut self) -> u64 {
        let processes = self.processes_kb();
        let (kb, seen_kb) = if processes >= self.limit_kb || self.buffers.is_none() {
            (processes, processes)
        } else {
            let first = self.with_buffers_kb(processes);
            if first.0 >= self.limit_kb {
                let processes = self.processes_kb();
                first.min(self.with_buffers_kb(processes))
            } else {
                first
            }
        };
        self.peak_kb = self.peak_kb.max(seen_kb);
        kb
    }

    /// `processes_kb` and the buffers: with the worst case of those not seen, and without.
    fn with_buffers_kb(&mut self, processes_kb: u64) -> (u64, u64) {
        let Some((sockets, pipes)) = self.buffers.as_mut() else {
            return (processes_kb, processes_kb);
        };
        let (sockets, pipes) = (sockets.used_bytes(), pipes.used_bytes());
        let seen = sockets.seen.saturating_add(pipes.seen);
        let unseen = sockets.unseen.saturating_add(pipes.unseen);
        let seen_kb = processes_kb.saturating_add(seen.div_ceil(1024));
        let kb = processes_kb.saturating_add(seen.saturating_add(unseen).div_ceil(1024));
        (kb, seen_kb)
    }

    fn processes_kb(&self) -> u64 {
        let me = std::process::id();
        let mut kb = 0u64;
        for process in procfs::processes(&self.proc).filter(|p| p.pid != me) {
            // A process gone since the listing holds nothing any more.
            let Some(status) = process.read("status") else {
                continue;
            };
            let rollup = process.read("smaps_rollup");
            kb = kb.saturating_add(process_kb(&status, rollup.as_deref()));
        }
        kb
    }

    /// How long until the budget could be used up, `None` once it is.
    pub fn next_check(&self, used_kb: u64) -> Option<Duration> {
        let left = self.limit_kb.checked_sub(used_kb).filter(|l| *l > 0)?;
        let micros = left.saturating_mul(1024).saturating_mul(1_000_000) / FILL_BYTES_PER_S;
        Some(Duration::from_micros(micros).clamp(MIN_CHECK, MAX_CHECK))
    }
}

/// What one process holds, in KiB: its share of anonymous and shared memory from its
/// `smaps_rollup` when that has them, its resident counts from `status` otherwise, and its
/// page tables.
fn process_kb(status: &str, rollup: Option<&str>) -> u64 {
    let tables = field_kb(status, "VmPTE:").unwrap_or(0);
    let shared = rollup.and_then(|r| Some(field_kb(r, "Pss_Anon:")? + field_kb(r, "Pss_Shmem:")?));
    let held = shared.unwrap_or_else(|| {
        field_kb(status, "RssAnon:").unwrap_or(0) + field_kb(status, "RssShmem:").unwrap_or(0)
    });
    held.saturating_add(tables)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tpython3\nVmRSS:\t  9000 kB\nRssAnon:\t  5000 kB\n\
                          RssFile:\t  3000 kB\nRssShmem:\t  1000 kB\nVmPTE:\t    64 kB\n";
    const ROLLUP: &str = "Rss:  9000 kB\nPss:  4000 kB\nPss_Anon:  2500 kB\n\
                          Pss_File:  1000 kB\nPss_Shmem:   500 kB\n";

    #[test]
    fn a_process_counts_its_share_of_anonymous_and_shared_memory_and_its_page_tables() {
        assert_eq!(process_kb(STATUS, Some(ROLLUP)), 2500 + 500 + 64);
        // No rollup (or one without the shares): the resident counts of status.
        assert_eq!(process_kb(STATUS, None), 5000 + 1000 + 64);
        assert_eq!(process_kb(STATUS, Some("Rss: 1 kB\n")), 5000 + 1000 + 64);
        assert_eq!(process_kb("Name:\tx\n", None), 0);
    }

    #[test]
    fn every_process_but_the_caller_counts_and_the_peak_is_kept() {
        let proc = tempfile::tempdir().unwrap();
        let put = |pid: &str, status: &str, rollup: Option<&str>| {
            let dir = proc.path().join(pid);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("status"), status).unwrap();
            if let Some(r) = rollup {
                std::fs::write(dir.join("smaps_rollup"), r).unwrap();
            }
        };
        put(&std::process::id().to_string(), STATUS, Some(ROLLUP));
        put("50", STATUS, Some(ROLLUP));
        put("51", STATUS, None);
        std::fs::create_dir(proc.path().join("self")).unwrap();
        let mut budget = MemoryBudget::new(16, proc.path());
        assert_eq!(budget.used_kb(), 3064 + 6064);
        std::fs::remove_dir_all(proc.path().join("51")).unwrap();
        assert_eq!(budget.used_kb(), 3064);
        assert_eq!(budget.peak_kb(), 3064 + 6064);
    }

    #[test]
    fn checks_come_when_the_budget_could_run_out() {
        let budget = MemoryBudget::new(1024, Path::new("/nonexistent"));
        // 1 GiB left at 8 GiB/s: an eighth of a second, at most MAX_CHECK.
        assert_eq!(budget.next_check(0), Some(MAX_CHECK));
        // 40 MiB left: 4.9 ms, at least MIN_CHECK.
        assert_eq!(budget.next_check(1024 * 1024 - 40 * 1024), Some(MIN_CHECK));
        // 512 MiB left: 62.5 ms.
        assert_eq!(
            budget.next_check(512 * 1024),
            Some(Duration::from_micros(62_500))
        );
        assert_eq!(budget.next_check(1024 * 1024), None);
        assert_eq!(budget.next_check(2048 * 1024), None);
    }
}
