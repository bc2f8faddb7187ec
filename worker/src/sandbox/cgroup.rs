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

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup: {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
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
    pub fn prepare(dir: &Path, pid: u32) -> Result<Tree, CgroupError> {
        let supervisor = dir.join("supervisor");
        fs::create_dir_all(&supervisor).map_err(io("mkdir", &supervisor))?;
        let procs = supervisor.join("cgroup.procs");
        fs::write(&procs, pid.to_string()).map_err(io("write", &procs))?;
        let control = dir.join("cgroup.subtree_control");
        let enable: Vec<String> = CONTROLLERS.iter().map(|c| format!("+{c}")).collect();
        fs::write(&control, enable.join(" ")).map_err(io("write", &control))?;
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
        job.write("pids.max", &limits.pids.to_string())?;
        // One CPU's worth of bandwidth per job; total CPU time is bounded by RLIMIT_CPU.
        job.write("cpu.max", "100000 100000")?;
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
}

impl JobCgroup {
    fn write(&self, file: &str, value: &str) -> Result<(), CgroupError> {
        let path = self.dir.join(file);
        fs::write(&path, value).map_err(io("write", &path))
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Moves a process (the sandbox's init, before its program starts) into the cgroup.
    pub fn add(&self, pid: i32) -> Result<(), CgroupError> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// Reads the accounting and removes the cgroup.
    pub fn finish(self) -> Result<Accounting, CgroupError> {
        let peak = fs::read_to_string(self.dir.join("memory.peak"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        let events = fs::read_to_string(self.dir.join("memory.events")).unwrap_or_default();
        let oom_killed = events.lines().any(|l| {
            let mut it = l.split_whitespace();
            it.next() == Some("oom_kill")
                && it.next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0) > 0
        });
        // On cgroupfs, rmdir succeeds with the interface files present; a plain directory
        // (the test tree) needs its files removed first.
        if fs::remove_dir(&self.dir).is_err() {
            fs::remove_dir_all(&self.dir).map_err(io("rmdir", &self.dir))?;
        }
        Ok(Accounting {
            memory_peak_kb: peak.map(|b| b / 1024),
            oom_killed,
        })
    }
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
        job.add(99).unwrap();
        assert_eq!(fs::read_to_string(dir.join("cgroup.procs")).unwrap(), "99");
        // What the kernel would write after an OOM kill.
        fs::write(dir.join("memory.peak"), "268435456\n").unwrap();
        fs::write(
            dir.join("memory.events"),
            "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n",
        )
        .unwrap();
        let acct = job.finish().unwrap();
        assert_eq!(
            acct,
            Accounting {
                memory_peak_kb: Some(262144),
                oom_killed: true
            }
        );
        assert!(!dir.exists());
    }

    #[test]
    fn no_oom_kill_means_no_memory_limit() {
        let f = fake("cpu memory pids");
        let tree = Tree::prepare(&f.node, 1).unwrap();
        let job = tree
            .create_job("job-1", &EffectiveLimits::default())
            .unwrap();
        fs::write(job.path().join("memory.events"), "oom 0\noom_kill 0\n").unwrap();
        assert!(!job.finish().unwrap().oom_killed);
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
                println!("SKIPPED: cgroup v2 delegation on this host: {reason}")
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
