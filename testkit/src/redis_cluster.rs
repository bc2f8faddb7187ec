//! A private Redis Cluster: primaries and replicas on free 127.0.0.1 ports.
//!
//! Tests of the cluster client need a real cluster they own. [`RedisCluster::start`] starts
//! one [`RedisServer`] per node with `cluster-enabled yes` (each with its own data directory
//! and cluster bus port), joins them with `redis-cli --cluster create --cluster-replicas`, and
//! returns once every node reports `cluster_state:ok` with all 16384 slots served and every
//! replica in sync with its primary. [`RedisCluster::kill_primary_of`] SIGKILLs the primary
//! of a slot and [`RedisCluster::wait_failed_over`] waits until its replica has taken the
//! slots over, which is how tests simulate a primary crash. Dropping the cluster kills every
//! node and removes their directories.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use forkbox_private_redis::{
    parse_nodes, NodeView, RedisServer, RedisServerError, RedisServerOptions, ServerTls, SLOTS,
};

/// How long joining the nodes and the first `cluster_state:ok` may take.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a failover may take (a few node timeouts).
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// Node timeout: short, so that a killed primary is replaced within a few seconds.
const NODE_TIMEOUT_MS: u64 = 1_000;

/// Why the cluster could not be created or did not reach the awaited state.
#[derive(Debug, thiserror::Error)]
pub enum RedisClusterError {
    #[error(transparent)]
    Server(#[from] RedisServerError),
    #[error("running {binary}: {source}")]
    Cli {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("redis-cli --cluster create failed ({status}): {output}")]
    Create {
        status: std::process::ExitStatus,
        output: String,
    },
    #[error("the cluster did not reach {awaited} within {timeout:?}; last view: {last}")]
    NotReady {
        awaited: &'static str,
        timeout: Duration,
        last: String,
    },
    #[error("no live node serves slot {0}")]
    NoOwner(u16),
}

/// A running cluster owned by this process. Dropping it kills every node.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    cli: PathBuf,
    /// redis-cli's TLS arguments when the nodes speak TLS only.
    cli_tls: Vec<std::ffi::OsString>,
}

impl RedisCluster {
    /// Starts `primaries` primaries with `replicas` replicas each (at least 3 primaries: the
    /// minimum `redis-cli --cluster create` accepts).
    pub fn start(primaries: usize, replicas: usize) -> Result<RedisCluster, RedisClusterError> {
        RedisCluster::start_with(primaries, replicas, NODE_TIMEOUT_MS)
    }

    /// [`RedisCluster::start`] with another `cluster-node-timeout` (how long a node may be
    /// unreachable before it counts as failed and its replica takes over).
    pub fn start_with(
        primaries: usize,
        replicas: usize,
        node_timeout_ms: u64,
    ) -> Result<RedisCluster, RedisClusterError> {
        RedisCluster::start_nodes(primaries, replicas, node_timeout_ms, None)
    }

    /// [`RedisCluster::start`] with nodes that speak TLS only, to clients, to each other
    /// (`tls-cluster`) and to their replicas (`tls-replication`).
    pub fn start_tls(
        primaries: usize,
        replicas: usize,
        tls: ServerTls,
    ) -> Result<RedisCluster, RedisClusterError> {
        RedisCluster::start_nodes(primaries, replicas, NODE_TIMEOUT_MS, Some(tls))
    }

    fn start_nodes(
        primaries: usize,
        replicas: usize,
        node_timeout_ms: u64,
        tls: Option<ServerTls>,
    ) -> Result<RedisCluster, RedisClusterError> {
        let cli_tls = match &tls {
            Some(t) => vec![
                "--tls".into(),
                "--cacert".into(),
                t.ca.clone().into_os_string(),
                "--cert".into(),
                t.cert.clone().into_os_string(),
                "--key".into(),
                t.key.clone().into_os_string(),
            ],
            None => Vec::new(),
        };
        let options = RedisServerOptions {
            cluster_node_timeout_ms: Some(node_timeout_ms),
            temp_prefix: "forkbox-redis-cluster-".into(),
            tls,
            ..RedisServerOptions::default()
        };
        let mut nodes = Vec::new();
        for _ in 0..primaries * (1 + replicas) {
            nodes.push(RedisServer::start_with(options.clone())?);
        }
        let cli = std::env::var_os("FORKBOX_REDIS_CLI")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("redis-cli"));
        let cluster = RedisCluster {
            nodes,
            cli,
            cli_tls,
        };
        cluster.create(replicas)?;
        cluster.wait_until(
            "cluster_state:ok with every slot served",
            CREATE_TIMEOUT,
            |c| c.all_ok() && c.replicas_synced(),
        )?;
        Ok(cluster)
    }

    /// Three primaries, one replica each.
    pub fn start_default() -> Result<RedisCluster, RedisClusterError> {
        RedisCluster::start(3, 1)
    }

    /// `redis://127.0.0.1:<port>/` of every node, in start order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The seed list as the command-line tools take it: every node's URL, comma-separated.
    pub fn seeds(&self) -> String {
        self.urls().join(",")
    }

    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// The cluster as the first live node sees it.
    pub fn view(&self) -> Vec<NodeView> {
        self.live_ports()
            .into_iter()
            .find_map(|p| self.cli_query(p, &["cluster", "nodes"]))
            .map(|text| parse_nodes(&text))
            .unwrap_or_default()
    }

    /// Index (in [`RedisCluster::nodes`]) of the live primary serving `slot`.
    pub fn primary_of(&self, slot: u16) -> Result<usize, RedisClusterError> {
        // A killed node stays a primary in the others' view until they notice (the node
        // timeout): only a running one counts.
        self.view()
            .iter()
            .filter(|n| n.primary && !n.failed && n.serves(slot))
            .filter_map(|n| self.index_of_port(n.port))
            .find(|&i| self.nodes[i].pid().is_some())
            .ok_or(RedisClusterError::NoOwner(slot))
    }

    /// SIGKILLs the primary serving `slot`; returns its index.
    pub fn kill_primary_of(&mut self, slot: u16) -> Result<usize, RedisClusterError> {
        let i = self.primary_of(slot)?;
        self.nodes[i].kill()?;
        Ok(i)
    }

    /// Waits until a live primary serves `slot` again and every live node reports
    /// `cluster_state:ok` (after [`RedisCluster::kill_primary_of`]: its replica was promoted).
    pub fn wait_failed_over(&self, slot: u16) -> Result<usize, RedisClusterError> {
        self.wait_until("a live primary for the slot", FAILOVER_TIMEOUT, |c| {
            c.all_ok() && c.primary_of(slot).is_ok()
        })?;
        self.primary_of(slot)
    }

    /// Restarts node `i` (same port and directory: it rejoins, as a replica when its slots
    /// were taken over) and waits until the cluster is whole again.
    pub fn restart_node(&mut self, i: usize) -> Result<(), RedisClusterError> {
        self.nodes[i].restart()?;
        self.wait_until("the restarted node back in sync", FAILOVER_TIMEOUT, |c| {
            c.all_ok() && c.replicas_synced()
        })
    }

    fn create(&self, replicas: usize) -> Result<(), RedisClusterError> {
        let mut cmd = Command::new(&self.cli);
        cmd.args(&self.cli_tls).args(["--cluster", "create"]);
        for n in &self.nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port()));
        }
        cmd.arg("--cluster-replicas")
            .arg(replicas.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null());
        let out = run_bounded(&mut cmd, CREATE_TIMEOUT, &self.cli)?;
        if !out.status.success() {
            return Err(RedisClusterError::Create {
                status: out.status,
                output: String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr),
            });
        }
        Ok(())
    }

    fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.pid().is_some())
            .map(RedisServer::port)
            .collect()
    }

    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// Every live node: `cluster_state:ok`, all slots assigned and served, and its view has a
    /// live primary for every slot.
    fn all_ok(&self) -> bool {
        self.live_ports().into_iter().all(|p| {
            let Some(info) = self.cli_query(p, &["cluster", "info"]) else {
                return false;
            };
            let ok = info.contains("cluster_state:ok")
                && info.contains(&format!("cluster_slots_ok:{SLOTS}"));
            let Some(nodes) = self.cli_query(p, &["cluster", "nodes"]) else {
                return false;
            };
            let served: u32 = parse_nodes(&nodes)
                .iter()
                .filter(|n| n.primary && !n.failed)
                .flat_map(|n| n.slots.iter().map(|&(a, b)| u32::from(b - a) + 1))
                .sum();
            ok && served == u32::from(SLOTS)
        })
    }

    /// Every live replica has its link to its primary up.
    fn replicas_synced(&self) -> bool {
        self.live_ports().into_iter().all(|p| {
            let Some(info) = self.cli_query(p, &["info", "replication"]) else {
                return false;
            };
            info.contains("role:master") || info.contains("master_link_status:up")
        })
    }

    fn wait_until(
        &self,
        awaited: &'static str,
        timeout: Duration,
        done: impl Fn(&RedisCluster) -> bool,
    ) -> Result<(), RedisClusterError> {
        let deadline = Instant::now() + timeout;
        loop {
            if done(self) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let last = self
                    .live_ports()
                    .first()
                    .and_then(|&p| self.cli_query(p, &["cluster", "nodes"]))
                    .unwrap_or_default();
                return Err(RedisClusterError::NotReady {
                    awaited,
                    timeout,
                    last,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn cli_query(&self, port: u16, args: &[&str]) -> Option<String> {
        let mut cmd = Command::new(&self.cli);
        cmd.args(&self.cli_tls)
            .args(["-h", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .args(args)
            .stdin(Stdio::null());
        let out = run_bounded(&mut cmd, Duration::from_secs(5), &self.cli).ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Runs `cmd` to completion, killing it after `timeout`.
fn run_bounded(
    cmd: &mut Command,
    timeout: Duration,
    binary: &std::path::Path,
) -> Result<std::process::Output, RedisClusterError> {
    let err = |source| RedisClusterError::Cli {
        binary: binary.to_owned(),
        source,
    };
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(err)?;
    let deadline = Instant::now() + timeout;
    while child.try_wait().map_err(err)?.is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().map_err(err)
}
