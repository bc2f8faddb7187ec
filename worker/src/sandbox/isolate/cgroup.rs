//! cgroup v2 limits, where the host delegates a subtree to the node.
//!
//! Delegation means: the node's own cgroup (from `/proc/self/cgroup`, under the cgroup2 mount
//! found in `/proc/self/mountinfo`) lists `memory`, `pids` and `cpu` in `cgroup.controllers`,
//! and the node may write there (systemd's `Delegate=yes` gives exactly that). The node then
//! moves itself into a `supervisor` leaf (the "no internal processes" rule), enables the
//! controllers for its children and gives every job a child cgroup with memory.max,
//! memory.swap.max=0, pids.max and cpu.max, reading memory.peak and memory.events afterwards so
//! an out-of-memory kill is reported as `memory_limit`. All host paths are parameters, so the
//! logic is tested on a fake tree.

use std::fs;
use std::path::{Path, PathBuf};

use forkbox_queue::schema::EffectiveLimits;

/// Controllers the node needs.
pub const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// A job's CPU bandwidth: 100 ms of CPU per 100 ms period, one CPU.
pub const CPU_MAX: &str = "100000 100000";

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup: {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cgroup: {dir} holds other processes ({}) besides this node, so its controllers cannot \
         be enabled for job cgroups: run the node as the only process of its cgroup (a systemd \
         unit with Delegate=yes; see docs/operations.md)",
        others.join(", ")
    )]
    NotALeafOwner { dir: PathBuf, others: Vec<String> },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Whether cgroup v2 can enforce limits here, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delegation {
    /// The node's cgroup directory, with every needed controller available and writable.
    Delegated(PathBuf),
    /// Why not; limits fall back to rlimits.
    Unavailable(String),
}

/// Per-controller availability, for `forkbox check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub dir: Option<PathBuf>,
    pub controllers: Vec<(&'static str, bool)>,
    pub writable: bool,
    pub delegation: Delegation,
}

/// Finds the node's cgroup v2 directory and what it offers.
pub fn probe(mountinfo: &Path, proc_self_cgroup: &Path) -> Probe {
    let unavailable = |reason: String| Probe {
        dir: None,
        controllers: CONTROLLERS.iter().map(|c| (*c, false)).collect(),
        writable: false,
        delegation: Delegation::Unavailable(reason),
    };
    let Some(mount) = fs::read_to_string(mountinfo)
        .ok()
        .and_then(|m| cgroup2_mount(&m))
    else {
        return unavailable("no cgroup2 filesystem is mounted".into());
    };
    let Some(rel) = fs::read_to_string(proc_self_cgroup).ok().and_then(|c| {
        c.lines().find_map(|l| {
            l.strip_prefix("0::")
                .map(|p| p.trim_start_matches('/').to_owned())
        })
    }) else {
        return unavailable(
            "this process has no cgroup v2 membership (/proc/self/cgroup has no 0:: line)".into(),
        );
    };
    let dir = mount.join(rel);
    let available = fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let controllers: Vec<_> = CONTROLLERS
        .iter()
        .map(|c| (*c, available.split_whitespace().any(|a| a == *c)))
        .collect();
    let writable = nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).is_ok()
        && nix::unistd::access(
            &dir.join("cgroup.subtree_control"),
            nix::unistd::AccessFlags::W_OK,
        )
        .is_ok();
    let missing: Vec<_> = controllers
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(c, _)| *c)
        .collect();
    let delegation = if !missing.is_empty() {
        Delegation::Unavailable(format!(
            "controllers {} are not available in {} (not delegated; bound elsewhere or not enabled by the parent)",
            missing.join(", "),
            dir.display()
        ))
    } else if !writable {
        Delegation::Unavailable(format!(
            "{} is not writable by this user (no Delegate=yes)",
            dir.display()
        ))
    } else {
        Delegation::Delegated(dir.clone())
    };
    Probe {
        dir: Some(dir),
        controllers,
        writable,
        delegation,
    }
}

/// The mount point of the cgroup2 filesystem in a mountinfo table.
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        Some(PathBuf::from(left.split_whitespace().nth(4)?))
    })
}

/// A delegated subtree prepared for jobs.
#[derive(Debug, Clone)]
pub struct Tree {
    dir: PathBuf,
}

impl Tree {
    /// Moves `pid` (the node) into a `supervisor` leaf and enables the controllers for jobs.
    /// Called before the node starts any child, so they all live in the leaf. The kernel
    /// refuses to enable controllers for the children of a cgroup that holds processes (other
    /// than the root cgroup), so another process left in `dir` fails this with the reason.
    pub fn prepare(dir: &Path, pid: u32) -> Result<Tree, CgroupError> {
        let supervisor = dir.join("supervisor");
        fs::create_dir_all(&supervisor).map_err(io("mkdir", &supervisor))?;
        let procs = supervisor.join("cgroup.procs");
        fs::write(&procs, pid.to_string()).map_err(io("write", &procs))?;
        let control = dir.join("cgroup.subtree_control");
        let enable: Vec<String> = CONTROLLERS.iter().map(|c| format!("+{c}")).collect();
        if let Err(source) = fs::write(&control, enable.join(" ")) {
            if source.raw_os_error() == Some(libc::EBUSY) {
                let others = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                return Err(CgroupError::NotALeafOwner {
                    dir: dir.to_owned(),
                    others: others.split_whitespace().map(str::to_owned).collect(),
                });
            }
            return Err(CgroupError::Io {
                op: "write",
                path: control,
                source,
            });
        }
        Ok(Tree {
            dir: dir.to_owned(),
        })
    }

    /// Creates the cgroup of one job with its limits.
    pub fn create_job(
        &self,
        name: &str,
        limits: &EffectiveLimits,
    ) -> Result<JobCgroup, CgroupError> {
        let dir = self.dir.join(name);
        fs::create_dir(&dir).map_err(io("mkdir", &dir))?;
        let job = JobCgroup { dir };
        let mib = 1024 * 1024;
        job.write("memory.max", &(limits.memory_mb * mib).to_string())?;
        job.write("memory.swap.max", "0")?;
        // An out-of-memory kill takes the whole job, not one process of it at random.
        job.write("memory.oom.group", "1")?;
        job.write("pids.max", &limits.pids.to_string())?;
        // One CPU's worth of bandwidth per job; its total CPU time is bounded through
        // cpu.stat by the engine (and per process by RLIMIT_CPU).
        job.write("cpu.max", CPU_MAX)?;
        Ok(job)
    }
}

/// One job's cgroup.
#[derive(Debug)]
pub struct JobCgroup {
    dir: PathBuf,
}

/// What the cgroup saw of a finished job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Accounting {
    pub memory_peak_kb: Option<u64>,
    pub oom_killed: bool,
    /// The job's memory reached `memory.max` with nothing left to reclaim and the kernel
    /// went to its OOM path (memory.events `oom`, raised only for the cgroup over its limit and
    /// its ancestors). That path usually kills in the job (`oom_killed` too); where it killed
    /// nothing (memory freed meanwhile, a victim already exiting, nothing killable) the job ran
    /// on, and a system call of it may have failed with `ENOMEM`.
    pub out_of_memory: bool,
    /// CPU time of every process the job ran (cpu.stat `usage_usec`).
    pub cpu_us: Option<u64>,
}

impl JobCgroup {
    fn write(&self, file: &str, value: &str) -> Result<(), CgroupError> {
        let path = self.dir.join(file);
        fs::write(&path, value).map_err(io("write", &path))
    }

    #[cfg(test)]
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Moves a process (the sandbox's init, before its program starts) into the cgroup.
    pub fn add(&self, pid: i32) -> Result<(), CgroupError> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// Kills every process of the job at once (`cgroup.kill`, Linux 5.14+).
    pub fn kill(&self) -> Result<(), CgroupError> {
        self.write("cgroup.kill", "1")
    }

    /// CPU time used so far by every process of the job, from cpu.stat.
    pub fn cpu_usage_us(&self) -> Option<u64> {
        let stat = fs::read_to_string(self.dir.join("cpu.stat")).ok()?;
        stat_field(&stat, "usage_usec")
    }

    /// What this cgroup becomes when a staged job's program starts: the run stage's limits.
    pub fn run_stage(&self, limits: &EffectiveLimits) -> RunStage {
        RunStage {
            dir: self.dir.clone(),
            memory_mb: limits.memory_mb,
            pids: limits.pids,
        }
    }

    /// Reads the accounting and removes the cgroup.
    pub fn finish(self) -> Result<Accounting, CgroupError> {
        let cpu_us = self.cpu_usage_us();
        let peak = fs::read_to_string(self.dir.join("memory.peak"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        let events = fs::read_to_string(self.dir.join("memory.events")).unwrap_or_default();
        let oom_killed = stat_field(&events, "oom_kill").unwrap_or(0) > 0;
        let out_of_memory = stat_field(&events, "oom").unwrap_or(0) > 0;
        self.remove()?;
        Ok(Accounting {
            memory_peak_kb: peak.map(|b| b / 1024),
            oom_killed,
            out_of_memory,
            cpu_us,
        })
    }
}

/// A staged job's cgroup between its stages: it held the larger of the two stages' memory and
/// processes while the compiler ran; the program gets its own.
#[derive(Debug, Clone)]
pub struct RunStage {
    dir: PathBuf,
    memory_mb: u64,
    pids: u64,
}

impl RunStage {
    /// Sets `memory.max` and `pids.max` to the run stage's, and returns `memory.peak` opened
    /// to count from now where the kernel can (Linux 6.12: a write to it resets the peak seen
    /// through that descriptor), so the program's peak is not the compiler's.
    pub fn apply(&self) -> Result<Option<fs::File>, CgroupError> {
        let job = JobCgroup {
            dir: self.dir.clone(),
        };
        job.write("memory.max", &(self.memory_mb * 1024 * 1024).to_string())?;
        job.write("pids.max", &self.pids.to_string())?;
        let peak = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.dir.join("memory.peak"))
            .and_then(|mut f| {
                std::io::Write::write_all(&mut f, b"reset\n")?;
                Ok(f)
            });
        Ok(peak.ok())
    }
}

/// A peak read through a `memory.peak` descriptor [`RunStage::apply`] reset, in KiB.
pub fn reset_peak_kb(peak: &fs::File) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 32];
    let n = peak.read_at(&mut buf, 0).ok()?;
    let bytes: u64 = std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()?;
    Some(bytes / 1024)
}

impl JobCgroup {
    /// Removes the cgroup. The job is over: anything still in it (a process the kernel has
    /// not finished tearing down, or one that escaped the sandbox's teardown) is killed through
    /// `cgroup.kill` and the removal retried for a while.
    fn remove(&self) -> Result<(), CgroupError> {
        let mut tries = 0;
        loop {
            match fs::remove_dir(&self.dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < REMOVE_TRIES => {
                    if tries == 0 {
                        let _ = fs::write(self.dir.join("cgroup.kill"), "1");
                    }
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                // A plain directory (the test tree) needs its files removed first; on
                // cgroupfs rmdir succeeds with the interface files present.
                Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                    return fs::remove_dir_all(&self.dir).map_err(io("rmdir", &self.dir));
                }
                Err(e) => return Err(io("rmdir", &self.dir)(e)),
            }
        }
    }
}

/// How often an emptied cgroup's removal is tried, 5 ms apart.
const REMOVE_TRIES: u32 = 400;

/// A field of a flat-keyed cgroup file (`memory.events`, `cpu.stat`).
fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key))
            .then(|| it.next()?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        _tmp: tempfile::TempDir,
        mountinfo: PathBuf,
        self_cgroup: PathBuf,
        node: PathBuf,
    }

    fn fake(controllers: &str) -> Fake {
        let tmp = tempfile::tempdir().unwrap();
        let mnt = tmp.path().join("cgroup");
        let node = mnt.join("system.slice/forkbox.service");
        fs::create_dir_all(&node).unwrap();
        fs::write(node.join("cgroup.controllers"), controllers).unwrap();
        fs::write(node.join("cgroup.subtree_control"), "").unwrap();
        let mountinfo = tmp.path().join("mountinfo");
        fs::write(
            &mountinfo,
            format!(
                "22 1 0:20 / /proc rw - proc proc rw\n35 22 0:30 / {} rw,nosuid - cgroup2 cgroup2 rw\n",
                mnt.display()
            ),
        )
        .unwrap();
        let self_cgroup = tmp.path().join("self_cgroup");
        fs::write(&self_cgroup, "0::/system.slice/forkbox.service\n").unwrap();
        Fake {
            _tmp: tmp,
            mountinfo,
            self_cgroup,
            node,
        }
    }

    #[test]
    fn delegated_tree_is_detected() {
        let f = fake("cpuset cpu io memory pids");
        let p = probe(&f.mountinfo, &f.self_cgroup);
        assert_eq!(p.delegation, Delegation::Delegated(f.node.clone()));
        assert!(p.controllers.iter().all(|(_, ok)| *ok));
    }

    #[test]
    fn missing_controllers_are_named() {
        let f = fake("cpu");
        let p = probe(&f.mountinfo, &f.self_cgroup);
        match p.delegation {
            Delegation::Unavailable(reason) => assert!(reason.contains("memory, pids"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            p.controllers,
            vec![("memory", false), ("pids", false), ("cpu", true)]
        );
    }

    #[test]
    fn no_cgroup2_mount_is_reported() {
        let f = fake("cpu memory pids");
        fs::write(&f.mountinfo, "22 1 0:20 / /proc rw - proc proc rw\n").unwrap();
        let p = probe(&f.mountinfo, &f.self_cgroup);
        assert_eq!(
            p.delegation,
            Delegation::Unavailable("no cgroup2 filesystem is mounted".into())
        );
    }

    #[test]
    fn a_staged_jobs_cgroup_takes_the_run_stages_limits() {
        let f = fake("cpu memory pids");
        let tree = Tree::prepare(&f.node, 4242).unwrap();
        let both = EffectiveLimits {
            memory_mb: 1024,
            pids: 256,
            ..EffectiveLimits::default()
        };
        let job = tree.create_job("job-8", &both).unwrap();
        let dir = job.path().to_owned();
        let run = job.run_stage(&EffectiveLimits {
            memory_mb: 64,
            pids: 16,
            ..both
        });
        // A kernel without the peak's reset: no descriptor, the limits set all the same.
        let peak = run.apply().unwrap();
        assert_eq!(
            fs::read_to_string(dir.join("memory.max")).unwrap(),
            "67108864"
        );
        assert_eq!(fs::read_to_string(dir.join("pids.max")).unwrap(), "16");
        assert!(peak.is_none(), "no memory.peak in the fake tree");
        // With one (the fake's plain file stands in for the kernel's): read from its start.
        fs::write(dir.join("memory.peak"), "").unwrap();
        let peak = run.apply().unwrap().expect("memory.peak opened");
        fs::write(dir.join("memory.peak"), "2097152\n").unwrap();
        assert_eq!(reset_peak_kb(&peak), Some(2048));
        // Gone (the job over): an error naming the file.
        job.finish().unwrap();
        let e = run.apply().unwrap_err().to_string();
        assert!(e.contains("memory.max"), "{e}");
    }

    #[test]
    fn job_cgroup_gets_limits_and_reports_oom() {
        let f = fake("cpu memory pids");
        let tree = Tree::prepare(&f.node, 4242).unwrap();
        assert_eq!(
            fs::read_to_string(f.node.join("supervisor/cgroup.procs")).unwrap(),
            "4242"
        );
        assert_eq!(
            fs::read_to_string(f.node.join("cgroup.subtree_control")).unwrap(),
            "+memory +pids +cpu"
        );
        let limits = EffectiveLimits {
            memory_mb: 256,
            pids: 32,
            ..EffectiveLimits::default()
        };
        let job = tree.create_job("job-7", &limits).unwrap();
        let dir = job.path().to_owned();
        assert_eq!(
            fs::read_to_string(dir.join("memory.max")).unwrap(),
            "268435456"
        );
        assert_eq!(
            fs::read_to_string(dir.join("memory.swap.max")).unwrap(),
            "0"
        );
        assert_eq!(fs::read_to_string(dir.join("pids.max")).unwrap(), "32");
        assert_eq!(
            fs::read_to_string(dir.join("cpu.max")).unwrap(),
            "100000 100000"
        );
        assert_eq!(
            fs::read_to_string(dir.join("memory.oom.group")).unwrap(),
            "1"
        );
        job.add(99).unwrap();
        assert_eq!(fs::read_to_string(dir.join("cgroup.procs")).unwrap(), "99");
        // What the kernel would write after an OOM kill.
        fs::write(dir.join("memory.peak"), "268435456\n").unwrap();
        fs::write(
            dir.join("memory.events"),
            "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n",
        )
        .unwrap();
        fs::write(
            dir.join("cpu.stat"),
            "usage_usec 2501000\nuser_usec 2500000\nsystem_usec 1000\n",
        )
        .unwrap();
        assert_eq!(job.cpu_usage_us(), Some(2_501_000));
        let acct = job.finish().unwrap();
        assert_eq!(
            acct,
            Accounting {
                memory_peak_kb: Some(262144),
                oom_killed: true,
                out_of_memory: true,
                cpu_us: Some(2_501_000),
            }
        );
        assert!(!dir.exists());
    }

    /// What memory.events says of the job: no OOM at all (the limit only reached and
    /// reclaimed); an OOM kill at its own limit; its limit reached with no kill (an allocation
    /// may have failed in it); a kill with no OOM of its own (the host's OOM killer, or the
    /// node's cgroup at its limit, took a process of the job).
    #[test]
    fn memory_events_tell_the_jobs_own_oom_from_one_outside_it() {
        let f = fake("cpu memory pids");
        let tree = Tree::prepare(&f.node, 1).unwrap();
        for (events, killed, out_of_memory) in [
            ("max 40\noom 0\noom_kill 0\n", false, false),
            ("max 9\noom 1\noom_kill 1\n", true, true),
            ("max 9\noom 2\noom_kill 0\n", false, true),
            ("max 0\noom 0\noom_kill 3\n", true, false),
        ] {
            let job = tree
                .create_job("job-1", &EffectiveLimits::default())
                .unwrap();
            fs::write(job.path().join("memory.events"), events).unwrap();
            let acct = job.finish().unwrap();
            assert_eq!(
                (acct.oom_killed, acct.out_of_memory),
                (killed, out_of_memory),
                "{events:?}"
            );
        }
    }

    /// The real host check: prints why it is skipped where nothing is delegated.
    #[test]
    fn host_delegation() {
        let p = probe(
            Path::new("/proc/self/mountinfo"),
            Path::new("/proc/self/cgroup"),
        );
        match p.delegation {
            Delegation::Unavailable(reason) => {
                forkbox_testkit::skipped(format!("cgroup v2 delegation on this host: {reason}"))
            }
            Delegation::Delegated(dir) => {
                // Only create and remove a scratch child: the node's own placement is not ours
                // to change from a unit test.
                let probe_dir = dir.join(format!("forkbox-probe-{}", std::process::id()));
                fs::create_dir(&probe_dir).unwrap();
                assert!(probe_dir.join("cgroup.procs").exists());
                fs::remove_dir(&probe_dir).unwrap();
            }
        }
    }
}
