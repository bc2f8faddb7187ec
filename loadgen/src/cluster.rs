//! Worker nodes the load generator starts (`--spawn-workers`), optionally one per simulated
//! host, and kills on purpose (`--kill-worker-at`) or at the end.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// The `forkbox` binary: `FORKBOX_BIN`, else next to this executable, else the workspace's
/// `target/{release,debug}`.
pub fn forkbox_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FORKBOX_BIN") {
        return Some(PathBuf::from(p));
    }
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join("forkbox"));
            // Integration tests run from target/<profile>/deps.
            if let Some(up) = dir.parent() {
                candidates.push(up.join("forkbox"));
            }
        }
    }
    let root = crate::workspace_root();
    for profile in ["release", "debug"] {
        candidates.push(root.join("target").join(profile).join("forkbox"));
    }
    candidates.into_iter().find(|p| p.is_file())
}

/// How to start each worker.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub bin: PathBuf,
    pub redis_url: String,
    pub queue: String,
    pub slots: u32,
    pub visibility_timeout_ms: Option<u64>,
    pub extra_args: Vec<String>,
    /// Where each worker's stdout and stderr go (`worker-N.log`).
    pub log_dir: PathBuf,
}

#[derive(Debug)]
pub struct WorkerNode {
    pub name: String,
    pub netns: Option<String>,
    child: Child,
    pub killed: bool,
}

impl WorkerNode {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// The running nodes. Dropping the fleet kills every node.
#[derive(Debug, Default)]
pub struct Fleet {
    pub nodes: Vec<WorkerNode>,
}

impl WorkerConfig {
    /// The command line of a worker, run inside `netns` when given. The Redis URL is not on it
    /// (every local user reads command lines, and the URL may hold a password): the worker
    /// gets it in its environment, `FORKBOX_REDIS_URL`.
    pub fn command(&self, netns: Option<&str>) -> Vec<String> {
        let mut argv = Vec::new();
        if let Some(ns) = netns {
            // `ip netns exec` execs the command after setns, so the pid we hold is the worker's.
            argv.extend(["ip", "netns", "exec", ns].map(String::from));
        }
        argv.push(self.bin.display().to_string());
        argv.extend(
            [
                "worker",
                "--queues",
                &self.queue,
                "--slots",
                &self.slots.to_string(),
                "--metrics-addr",
                "127.0.0.1:0",
            ]
            .map(String::from),
        );
        if let Some(v) = self.visibility_timeout_ms {
            argv.push("--visibility-timeout-ms".into());
            argv.push(v.to_string());
        }
        argv.extend(self.extra_args.iter().cloned());
        argv
    }
}

fn spawn_node(cfg: &WorkerConfig, name: &str, netns: Option<&str>) -> anyhow::Result<WorkerNode> {
    let argv = cfg.command(netns);
    let log_path = cfg.log_dir.join(format!("{name}.log"));
    let log =
        File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .env(crate::orphans::OWNER_ENV, forkbox_queue::owner::tag())
        .env("FORKBOX_REDIS_URL", &cfg.redis_url)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", argv.join(" ")))?;
    Ok(WorkerNode {
        name: name.to_owned(),
        netns: netns.map(str::to_owned),
        child,
        killed: false,
    })
}

impl Fleet {
    /// Starts `count` workers, worker `n` in `netns[n % netns.len()]` when namespaces are given.
    pub fn start(
        cfg: &WorkerConfig,
        run: &str,
        count: usize,
        netns: &[String],
    ) -> anyhow::Result<Fleet> {
        std::fs::create_dir_all(&cfg.log_dir)?;
        let mut fleet = Fleet::default();
        for n in 0..count {
            let ns = (!netns.is_empty()).then(|| netns[n % netns.len()].as_str());
            fleet
                .nodes
                .push(spawn_node(cfg, &format!("lg-{run}-w{n}"), ns)?);
        }
        Ok(fleet)
    }

    /// Fails when a worker exited on its own (a worker that cannot start would otherwise show
    /// up as a run where every job is lost).
    pub fn check_alive(&mut self, log_dir: &Path) -> anyhow::Result<()> {
        for node in &mut self.nodes {
            if node.killed {
                continue;
            }
            if let Some(status) = node.child.try_wait()? {
                let log = std::fs::read_to_string(log_dir.join(format!("{}.log", node.name)))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                anyhow::bail!(
                    "worker {} exited ({status}); its log ends with:\n{}",
                    node.name,
                    tail.join("\n")
                );
            }
        }
        Ok(())
    }

    /// SIGKILLs the first live worker; returns its name and pid.
    pub fn kill_one(&mut self) -> anyhow::Result<(String, u32)> {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| !n.killed)
            .context("no live worker to kill")?;
        let pid = node.pid();
        node.child.kill().context("SIGKILL to a worker")?;
        let _ = node.child.wait();
        node.killed = true;
        Ok((node.name.clone(), pid))
    }

    /// SIGTERM to every worker (a graceful drain), SIGKILL to those still running after
    /// `grace`.
    pub fn stop(&mut self, grace: Duration) {
        for node in self.nodes.iter().filter(|n| !n.killed) {
            let _ = Command::new("kill")
                .args(["-TERM", &node.pid().to_string()])
                .stderr(Stdio::null())
                .status();
        }
        let deadline = Instant::now() + grace;
        for node in &mut self.nodes {
            if node.killed {
                continue;
            }
            loop {
                match node.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        let _ = node.child.kill();
                        let _ = node.child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
            node.killed = true;
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for node in self.nodes.iter_mut().filter(|n| !n.killed) {
            let _ = node.child.kill();
            let _ = node.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_command_line() {
        let cfg = WorkerConfig {
            bin: "/x/forkbox".into(),
            redis_url: "redis://:secret@10.213.5.1:7000/".into(),
            queue: "lg".into(),
            slots: 4,
            visibility_timeout_ms: Some(2000),
            extra_args: vec!["--log-format".into(), "json".into()],
            log_dir: "/tmp".into(),
        };
        assert_eq!(
            cfg.command(Some("fbl-ab-0")).join(" "),
            "ip netns exec fbl-ab-0 /x/forkbox worker --queues lg --slots 4 --metrics-addr 127.0.0.1:0 \
             --visibility-timeout-ms 2000 --log-format json"
        );
        let plain = WorkerConfig {
            visibility_timeout_ms: None,
            extra_args: Vec::new(),
            ..cfg
        };
        assert_eq!(plain.command(None)[0], "/x/forkbox");
    }

    #[test]
    fn fleet_kills_and_stops_its_processes() {
        let dir = tempfile::tempdir().unwrap();
        let sleeper = dir.path().join("fake-forkbox");
        std::fs::write(&sleeper, "#!/bin/sh\nexec sleep 30\n").unwrap();
        let st = Command::new("chmod")
            .arg("+x")
            .arg(&sleeper)
            .status()
            .unwrap();
        assert!(st.success());
        let cfg = WorkerConfig {
            bin: sleeper,
            redis_url: "redis://127.0.0.1:1/".into(),
            queue: "q".into(),
            slots: 1,
            visibility_timeout_ms: None,
            extra_args: Vec::new(),
            log_dir: dir.path().join("logs"),
        };
        let mut fleet = Fleet::start(&cfg, "t", 2, &[]).unwrap();
        fleet.check_alive(&cfg.log_dir).unwrap();
        let (name, pid) = fleet.kill_one().unwrap();
        assert_eq!(name, "lg-t-w0");
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        let other = fleet.nodes[1].pid();
        fleet.stop(Duration::from_secs(2));
        assert!(!Path::new(&format!("/proc/{other}")).exists());
        assert!(fleet.kill_one().is_err());
    }
}
