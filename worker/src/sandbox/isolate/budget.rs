//! The job's CPU time as one budget for the whole sandbox, kept by its init where no cgroup
//! keeps it.
//!
//! `RLIMIT_CPU` bounds each process on its own, so a job of N processes could use N times its
//! `cpu_ms`. The init sees every process of its pid namespace in its `/proc` and sums their CPU
//! time: each live process's own and that of the children it reaped (`utime`, `stime`,
//! `cutime`, `cstime` of `/proc/<pid>/stat`), and what the init itself reaped (its own
//! `cutime` and `cstime`). A CPU second used by the job is in exactly one of those at any time,
//! except for a child that is never waited for (its parent ignores `SIGCHLD` or sets
//! `SA_NOCLDWAIT`): the kernel drops its time when it exits. So each check also counts the time
//! last seen of every process gone since the previous check, less what the counters of
//! children grew by meanwhile: a lower bound of the time dropped. Past the budget the init kills
//! the sandbox.
//!
//! A check costs one read per live process, so it is made only as often as the budget could
//! run out: the sandbox uses at most one CPU second per second on each CPU, so the next check is
//! due when what is left of the budget, spread over every CPU, has elapsed, at least
//! [`MIN_CHECK`] and at most [`MAX_CHECK`] after the last (so that a child not waited for is
//! seen before it exits unless it lives shorter than that). A job whose budget cannot run out
//! before its deadline has no budget kept at all. One that burns is stopped at most
//! `CPUs × MIN_CHECK` (plus the init's wake-up delay) past its budget.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::memory::{self, MemoryBudget};
use super::procfs;

/// The shortest time between two checks.
pub const MIN_CHECK: Duration = Duration::from_millis(25);
/// The longest time between two checks.
pub const MAX_CHECK: Duration = Duration::from_millis(100);

/// One process as a check saw it: its pid and start time (so that a reused pid is another
/// process), and its CPU time in clock ticks, all of it and its reaped children's alone.
type Seen = HashMap<(u32, u64), (u64, u64)>;

/// The sandbox's CPU budget and where its processes are seen.
#[derive(Debug)]
pub struct CpuBudget {
    limit_us: u64,
    proc: PathBuf,
    cpus: u64,
    ticks_per_s: u64,
    /// The processes of the last check.
    seen: Seen,
    /// Ticks of processes that exited without being waited for (a lower bound).
    dropped: u64,
}

impl CpuBudget {
    /// A budget of `limit_ms` for the processes listed in `proc` (the sandbox's own `/proc`),
    /// or `None` when it cannot run out within `timeout_ms` of wall time.
    pub fn new(limit_ms: u64, timeout_ms: u64, proc: &Path) -> Option<CpuBudget> {
        let budget = CpuBudget::unchecked(limit_ms, proc);
        (limit_ms < timeout_ms.saturating_mul(budget.cpus)).then_some(budget)
    }

    fn unchecked(limit_ms: u64, proc: &Path) -> CpuBudget {
        let cpus = std::fs::read_to_string(proc.join("stat"))
            .map(|s| count_cpus(&s))
            .unwrap_or(0);
        let ticks_per_s = procfs::ticks_per_s();
        CpuBudget {
            limit_us: limit_ms.saturating_mul(1000),
            proc: proc.to_owned(),
            // Unknown: as many CPUs as a machine may have, so checks come early, not late.
            cpus: if cpus == 0 { 1024 } else { cpus },
            ticks_per_s,
            seen: Seen::new(),
            dropped: 0,
        }
    }

    /// The CPU time, in microseconds, that the processes of the sandbox have used, the
    /// calling process's own excepted.
    pub fn used_us(&mut self) -> u64 {
        let me = std::process::id();
        let mut now = Seen::new();
        let mut ticks = 0u64;
        for process in procfs::processes(&self.proc) {
            let pid = process.pid;
            // A process gone since the listing has been reaped: its time is counted by
            // whoever reaped it.
            let Some(stat) = process.read("stat") else {
                continue;
            };
            if let Some(([utime, stime, cutime, cstime], start)) = procfs::cpu_fields(&stat) {
                let own = if pid == me { 0 } else { utime + stime };
                let (all, children) = (own + cutime + cstime, cutime + cstime);
                ticks = ticks.saturating_add(all);
                now.insert((pid, start), (all, children));
            }
        }
        // What the processes gone since the last check had used is now in the counters of
        // whoever waited for them, which grew by at least that much, or it was dropped.
        let gone: u64 = self
            .seen
            .iter()
            .filter(|(key, _)| !now.contains_key(key))
            .map(|(_, (all, _))| all)
            .sum();
        let grown: u64 = now
            .iter()
            .map(|(key, (_, children))| {
                children.saturating_sub(self.seen.get(key).map_or(0, |(_, c)| *c))
            })
            .sum();
        self.dropped = self.dropped.saturating_add(gone.saturating_sub(grown));
        self.seen = now;
        ticks.saturating_add(self.dropped).saturating_mul(1_000_000) / self.ticks_per_s
    }

    /// How long until the budget could be used up, `None` once it is: at the fastest, every
    /// CPU busy with the job.
    pub fn next_check(&self, used_us: u64) -> Option<Duration> {
        let left = self.limit_us.checked_sub(used_us).filter(|l| *l > 0)?;
        Some(Duration::from_micros(left / self.cpus).clamp(MIN_CHECK, MAX_CHECK))
    }
}

/// The number of CPUs listed in a `/proc/stat` (`cpu0`, `cpu1`, ...).
fn count_cpus(stat: &str) -> u64 {
    stat.lines()
        .filter(|l| {
            l.strip_prefix("cpu")
                .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        })
        .count() as u64
}

/// `waitpid(-1)` for the init that also keeps the budgets (CPU time, and memory: see
/// `memory`): while no child has changed state it sleeps on `SIGCHLD` (through a signalfd)
/// until the next check is due.
pub struct Waiter {
    cpu: Option<CpuBudget>,
    memory: Option<MemoryBudget>,
    sigchld: Option<SignalFd>,
    due: Instant,
    exceeded: Option<Exceeded>,
}

/// Which budget the sandbox was killed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    Cpu,
    Memory,
}

impl Waiter {
    /// Blocks `SIGCHLD` (it is read from a signalfd instead) and schedules the first check.
    pub fn new(cpu: Option<CpuBudget>, memory: Option<MemoryBudget>) -> Waiter {
        let mut mask = SigSet::empty();
        mask.add(Signal::SIGCHLD);
        // Without the signalfd, waiting falls back to a check every MIN_CHECK.
        let sigchld = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None)
            .and_then(|()| {
                SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            })
            .ok();
        let first = [
            cpu.as_ref().and_then(|b| b.next_check(0)),
            memory.as_ref().and_then(|b| b.next_check(0)),
        ];
        let due = Instant::now() + first.into_iter().flatten().min().unwrap_or(Duration::ZERO);
        Waiter {
            cpu,
            memory,
            sigchld,
            due,
            exceeded: None,
        }
    }

    /// Which budget was used up (and the sandbox killed for it), if one was.
    pub fn exceeded(&self) -> Option<Exceeded> {
        self.exceeded
    }

    /// The highest memory the sandbox's processes held together at a check, in KiB.
    pub fn memory_peak_kb(&self) -> u64 {
        self.memory.as_ref().map_or(0, MemoryBudget::peak_kb)
    }

    /// The next child that changed state, as `waitpid(-1, 0)` gives it.
    pub fn wait_any(&mut self) -> nix::Result<WaitStatus> {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {}
                other => return other,
            }
            let now = Instant::now();
            if self.exceeded.is_none() && now >= self.due {
                self.check();
                continue;
            }
            let wait = if self.exceeded.is_some() {
                PollTimeout::NONE
            } else {
                let ms = (self.due - now).as_millis().clamp(1, i32::MAX as u128) as i32;
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
            };
            match &self.sigchld {
                Some(fd) => {
                    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                    match nix::poll::poll(&mut fds, wait) {
                        Ok(_) | Err(Errno::EINTR) => while let Ok(Some(_)) = fd.read_signal() {},
                        Err(e) => return Err(e),
                    }
                }
                None => std::thread::sleep(memory::MIN_CHECK.min(MIN_CHECK)),
            }
        }
    }

    /// Checks each budget; past one, kills every process of the namespace but the init.
    fn check(&mut self) {
        let cpu = self.cpu.as_mut().map(|budget| {
            // Past the budget, seen twice, so that a child's time seen both in it and in the
            // parent that reaped it meanwhile cannot count twice.
            let mut used = budget.used_us();
            if budget.next_check(used).is_none() {
                used = budget.used_us();
            }
            budget.next_check(used)
        });
        let memory = self.memory.as_mut().map(|budget| {
            let used = budget.used_kb();
            budget.next_check(used)
        });
        self.exceeded = match (cpu, memory) {
            (Some(None), _) => Some(Exceeded::Cpu),
            (_, Some(None)) => Some(Exceeded::Memory),
            _ => None,
        };
        if self.exceeded.is_some() {
            let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
            return;
        }
        let next = [cpu.flatten(), memory.flatten()]
            .into_iter()
            .flatten()
            .min();
        self.due = Instant::now() + next.unwrap_or(MAX_CHECK);
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.sigchld.take().is_some() {
            let mut mask = SigSet::empty();
            mask.add(Signal::SIGCHLD);
            let _ = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&mask), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpus_are_counted_from_their_own_lines() {
        assert_eq!(
            count_cpus("cpu  1 2 3\ncpu0 1 2\ncpu1 3 4\nintr 5\ncpufreq 1\n"),
            2
        );
    }

    #[test]
    fn checks_come_when_the_budget_could_run_out() {
        let mut budget = CpuBudget {
            limit_us: 1_000_000,
            cpus: 2,
            ..CpuBudget::unchecked(1000, Path::new("/nonexistent"))
        };
        assert_eq!(budget.next_check(0), Some(MAX_CHECK));
        assert_eq!(budget.next_check(880_000), Some(Duration::from_millis(60)));
        assert_eq!(budget.next_check(990_000), Some(MIN_CHECK));
        assert_eq!(budget.next_check(1_000_000), None);
        assert_eq!(budget.next_check(2_000_000), None);
        assert_eq!(budget.used_us(), 0);
        // A budget the deadline comes before is not kept.
        assert!(CpuBudget::new(1000, 500, Path::new("/nonexistent")).is_some());
        assert!(CpuBudget::new(600_000, 500, Path::new("/nonexistent")).is_none());
    }

    #[test]
    fn every_process_counts_with_its_reaped_children_but_the_caller_only_with_its_own() {
        let proc = tempfile::tempdir().unwrap();
        let stat = |pid: &str, times: &str, start: u32| {
            let dir = proc.path().join(pid);
            std::fs::create_dir_all(&dir).unwrap();
            let line = format!("{pid} (a b) c) S 1 1 1 0 -1 0 0 0 0 0 {times} 20 0 1 0 {start} 9");
            std::fs::write(dir.join("stat"), line).unwrap();
        };
        let me = std::process::id().to_string();
        stat(&me, "1000 1000 7 3", 1);
        stat("50", "20 30 1 1", 2);
        stat("51", "0 0 0 0", 3);
        std::fs::create_dir(proc.path().join("77")).unwrap();
        std::fs::create_dir(proc.path().join("self")).unwrap();
        std::fs::write(proc.path().join("stat"), "cpu  1\ncpu0 1\ncpu1 1\ncpu2 1\n").unwrap();
        let budget = CpuBudget::unchecked(1000, proc.path());
        assert_eq!(budget.cpus, 3);
        let mut budget = CpuBudget {
            ticks_per_s: 100,
            ..budget
        };
        // (7 + 3) + (20 + 30 + 1 + 1) ticks of 10 ms.
        assert_eq!(budget.used_us(), 620_000);
        // 50 exits and we wait for it: its 52 ticks move into our children's counters.
        std::fs::remove_dir_all(proc.path().join("50")).unwrap();
        stat(&me, "1000 1000 59 3", 1);
        assert_eq!(budget.used_us(), 620_000);
        // 51 uses 40 ticks, then exits without being waited for, and a new process gets its
        // pid: the kernel dropped the 40 ticks, the budget keeps them.
        stat("51", "30 10 0 0", 3);
        assert_eq!(budget.used_us(), 1_020_000);
        stat("51", "1 0 0 0", 4);
        assert_eq!(budget.used_us(), 1_030_000);
    }
}
