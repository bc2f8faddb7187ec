//! The worker's settings: one type that is both `forkbox worker`'s flags and its `--config` file.
//!
//! Each setting comes from, in order of precedence: the flag, its environment variable
//! (`FORKBOX_REDIS_URL`, `FORKBOX_QUEUES`, `FORKBOX_SLOTS`, ...), the TOML file given with
//! `--config`, and the built-in default, which [`NodeConfig::new`] and the engine's
//! configuration name once. The file uses the flags' names with underscores; unknown keys are
//! rejected. A few keys are the file's alone (`result_ttl_s`, `results_maxlen`,
//! `skip_completed_on_read`), a few the command line's (`--config`, `--rootfs`, `--allow`,
//! `--shared-net`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use forkbox::node::config::{self, NodeConfig};
use serde::Deserialize;

use super::opts::{QueueList, RedisTlsOpts, SandboxOpts};

/// Why the `--config` file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("reading config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
}

/// Every setting of a worker node; unset ones are `None` (or `false`).
#[derive(Debug, Clone, Default, Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    /// Redis URL: redis://[USER:PASSWORD@]HOST:PORT[/DB], rediss://... for TLS (see
    /// --redis-ca), redis+unix:///PATH; %-encode @ : / # ? % in a password
    /// [default: redis://127.0.0.1:6379].
    #[arg(long, env = "FORKBOX_REDIS_URL", value_name = "URL")]
    pub redis: Option<String>,
    #[command(flatten)]
    #[serde(flatten)]
    pub redis_tls: RedisTlsOpts,
    /// --redis names a Redis Cluster: one or more comma-separated seed URLs
    /// (redis://h1:7000,redis://h2:7000).
    #[arg(long, env = "FORKBOX_CLUSTER")]
    #[serde(default)]
    pub cluster: bool,
    /// Queues in priority order, highest first [default: default].
    #[arg(long, env = "FORKBOX_QUEUES", value_name = "Q1,Q2")]
    pub queues: Option<QueueList>,
    /// Partitions of each queue (streams spread over a cluster's shards; docs/protocol.md).
    /// Must match what the queue was created with: a mismatch is refused [default: 1].
    #[arg(long, env = "FORKBOX_PARTITIONS", value_name = "N")]
    pub partitions: Option<usize>,
    /// Jobs run at once [default: the number of CPUs].
    #[arg(long, env = "FORKBOX_SLOTS")]
    pub slots: Option<usize>,
    /// Jobs read ahead of a free slot, so the next one starts without a Redis round trip;
    /// they wait on this node even when another is idle, so use it for full queues (batch
    /// runs), not for latency-bound ones [default: 0].
    #[arg(long, env = "FORKBOX_PREFETCH", value_name = "N")]
    pub prefetch: Option<usize>,
    /// Serve /metrics and /healthz here (port 0 picks one; the log says which) [default: none].
    #[arg(long, env = "FORKBOX_METRICS_ADDR", value_name = "ADDR:PORT")]
    pub metrics_addr: Option<SocketAddr>,
    /// Seconds running jobs get to finish after SIGTERM/SIGINT [default: 30].
    #[arg(long, env = "FORKBOX_GRACE", value_name = "SECS")]
    pub grace: Option<f64>,
    /// Entries idle this long are reclaimed from dead workers [default: 30000].
    #[arg(long, env = "FORKBOX_VISIBILITY_TIMEOUT_MS", value_name = "MS")]
    pub visibility_timeout_ms: Option<u64>,
    /// Deliveries before an entry is dead-lettered, unless the job sets its own [default: 3].
    #[arg(long, env = "FORKBOX_MAX_ATTEMPTS")]
    pub max_attempts: Option<u32>,
    /// Consumer name; must be unique per process [default: <hostname>-<pid>].
    #[arg(long, env = "FORKBOX_NAME")]
    pub name: Option<String>,
    /// Job payloads larger than this are dead-lettered unread [default: 10485760].
    #[arg(long, env = "FORKBOX_MAX_JOB_BYTES")]
    pub max_job_bytes: Option<usize>,
    /// How long results are kept, in seconds (file only; `QueueConfig::result_ttl_s`).
    #[arg(skip)]
    pub result_ttl_s: Option<u64>,
    /// Cap on the results stream (file only; `QueueConfig::results_maxlen`).
    #[arg(skip)]
    pub results_maxlen: Option<u64>,
    /// File only; see `QueueConfig::skip_completed_on_read`.
    #[arg(skip)]
    pub skip_completed_on_read: Option<bool>,
    /// Largest `max_attempts` a job may set [default: 10].
    #[arg(long, env = "FORKBOX_MAX_JOB_ATTEMPTS", value_name = "N")]
    pub max_job_attempts: Option<u32>,
    /// Largest `result_ttl_s` a job may set [default: 604800].
    #[arg(long, env = "FORKBOX_MAX_RESULT_TTL_S", value_name = "SECS")]
    pub max_result_ttl_s: Option<u64>,
    /// Results longer than this (JSON) are stored cut, with the truncation flags set
    /// [default: 33554432; never above what Redis takes in one value].
    #[arg(long, env = "FORKBOX_MAX_RESULT_BYTES", value_name = "BYTES")]
    pub max_result_bytes: Option<usize>,
    /// Serve from a Redis whose maxmemory-policy is not noeviction. Such a Redis evicts job
    /// streams and results at its memory limit, and jobs are lost.
    #[arg(long, env = "FORKBOX_ALLOW_EVICTION")]
    #[serde(default)]
    pub allow_eviction: bool,
    /// A runtime catalogue (TOML) over the built-in one: its entries replace the built-in
    /// ones of the same name and add new languages (see docs/operations.md).
    #[arg(long, env = "FORKBOX_RUNTIMES", value_name = "FILE")]
    pub runtimes: Option<PathBuf>,
    /// Sessions live on this node at most; a create past it ends with an error naming the
    /// limit [default: 8].
    #[arg(long, env = "FORKBOX_MAX_SESSIONS", value_name = "N")]
    pub max_sessions: Option<usize>,
    /// The sum of the live sessions' memory_mb may not pass this [default: a quarter of the
    /// host's memory].
    #[arg(long, env = "FORKBOX_SESSION_MEMORY_MB", value_name = "MB")]
    pub session_memory_mb: Option<u64>,
    /// Largest session.ttl_s a session may ask (and set_timeout set) [default: 3600].
    #[arg(long, env = "FORKBOX_MAX_SESSION_TTL", value_name = "SECS")]
    pub max_session_ttl: Option<u64>,
    /// Largest session.idle_s a session may ask [default: 600].
    #[arg(long, env = "FORKBOX_MAX_SESSION_IDLE", value_name = "SECS")]
    pub max_session_idle: Option<u64>,
    /// Session sandboxes kept opened ahead of demand, of the shapes (limits, network,
    /// runtime) creates asked for last, so a create only hands one over; they count against
    /// --max-sessions and --session-memory-mb and give way to sessions; 0: none [default: 1].
    #[arg(long, env = "FORKBOX_SESSION_POOL", value_name = "N")]
    pub session_pool: Option<usize>,
    /// Checkpoints one session may hold at once (each a stopped copy of its interpreter in its
    /// sandbox and a copy of its disk on this host) [default: 8].
    #[arg(long, env = "FORKBOX_MAX_SESSION_CHECKPOINTS", value_name = "N")]
    pub max_session_checkpoints: Option<usize>,
    /// TOML file with any of the settings above (keys as the flags, with underscores).
    #[arg(long, env = "FORKBOX_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub sandbox: SandboxOpts,
}

impl WorkerSettings {
    /// Reads a `--config` file.
    pub fn load(path: &Path) -> Result<WorkerSettings, SettingsError> {
        let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
            path: path.to_owned(),
            source,
        })?;
        WorkerSettings::parse(&text).map_err(|message| SettingsError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses the text of a `--config` file.
    pub fn parse(text: &str) -> Result<WorkerSettings, String> {
        toml::from_str(text).map_err(|e: toml::de::Error| {
            // The sandbox keys are read from a buffered copy of the table (they are flattened),
            // so toml can point at neither the key nor its line: find the key by reading each
            // one alone.
            let whole = e
                .span()
                .is_none_or(|s| s.start == 0 && s.end >= text.trim_end().len());
            whole
                .then(|| faulty_key(text))
                .flatten()
                .unwrap_or_else(|| e.to_string().trim_end().to_owned())
        })
    }

    /// These settings (the command line's) over those of the `--config` file they name, if any.
    pub fn with_file(self) -> Result<WorkerSettings, SettingsError> {
        match &self.config {
            Some(path) => {
                let file = WorkerSettings::load(path)?;
                Ok(self.over(file))
            }
            None => Ok(self),
        }
    }

    /// These settings where given, else `file`'s.
    pub fn over(self, file: WorkerSettings) -> WorkerSettings {
        // Taken apart in full, so that a new setting cannot be left out of the merge.
        let WorkerSettings {
            redis,
            redis_tls,
            cluster,
            queues,
            partitions,
            slots,
            prefetch,
            metrics_addr,
            grace,
            visibility_timeout_ms,
            max_attempts,
            name,
            max_job_bytes,
            result_ttl_s,
            results_maxlen,
            skip_completed_on_read,
            max_job_attempts,
            max_result_ttl_s,
            max_result_bytes,
            allow_eviction,
            runtimes,
            max_sessions,
            session_memory_mb,
            max_session_ttl,
            max_session_idle,
            session_pool,
            max_session_checkpoints,
            config: _,
            sandbox,
        } = file;
        WorkerSettings {
            redis: self.redis.or(redis),
            redis_tls: self.redis_tls.over(redis_tls),
            cluster: self.cluster || cluster,
            queues: self.queues.or(queues),
            partitions: self.partitions.or(partitions),
            slots: self.slots.or(slots),
            prefetch: self.prefetch.or(prefetch),
            metrics_addr: self.metrics_addr.or(metrics_addr),
            grace: self.grace.or(grace),
            visibility_timeout_ms: self.visibility_timeout_ms.or(visibility_timeout_ms),
            max_attempts: self.max_attempts.or(max_attempts),
            name: self.name.or(name),
            max_job_bytes: self.max_job_bytes.or(max_job_bytes),
            result_ttl_s: self.result_ttl_s.or(result_ttl_s),
            results_maxlen: self.results_maxlen.or(results_maxlen),
            skip_completed_on_read: self.skip_completed_on_read.or(skip_completed_on_read),
            max_job_attempts: self.max_job_attempts.or(max_job_attempts),
            max_result_ttl_s: self.max_result_ttl_s.or(max_result_ttl_s),
            max_result_bytes: self.max_result_bytes.or(max_result_bytes),
            allow_eviction: self.allow_eviction || allow_eviction,
            runtimes: self.runtimes.or(runtimes),
            max_sessions: self.max_sessions.or(max_sessions),
            session_memory_mb: self.session_memory_mb.or(session_memory_mb),
            max_session_ttl: self.max_session_ttl.or(max_session_ttl),
            max_session_idle: self.max_session_idle.or(max_session_idle),
            session_pool: self.session_pool.or(session_pool),
            max_session_checkpoints: self.max_session_checkpoints.or(max_session_checkpoints),
            config: self.config,
            sandbox: self.sandbox.over(sandbox),
        }
    }

    /// The node's configuration: these settings over the defaults, validated.
    pub fn node_config(&self) -> anyhow::Result<NodeConfig> {
        let redis = self
            .redis
            .clone()
            .unwrap_or_else(|| config::DEFAULT_REDIS_URL.to_owned());
        let mut c = NodeConfig::new(redis);
        c.redis_tls = self.redis_tls.tls();
        c.cluster = self.cluster;
        if let Some(q) = self.queues.clone() {
            c.queues = q.into_vec();
        }
        set(&mut c.partitions, self.partitions);
        set(&mut c.slots, self.slots);
        set(&mut c.prefetch, self.prefetch);
        c.metrics_addr = self.metrics_addr;
        if let Some(g) = self.grace {
            anyhow::ensure!(
                g.is_finite() && g >= 0.0,
                "--grace must be a number of seconds >= 0"
            );
            c.grace = Duration::from_secs_f64(g);
        }
        set(
            &mut c.queue.visibility_timeout_ms,
            self.visibility_timeout_ms,
        );
        set(&mut c.queue.max_attempts, self.max_attempts);
        set(&mut c.name, self.name.clone());
        set(&mut c.queue.max_job_bytes, self.max_job_bytes);
        set(&mut c.queue.result_ttl_s, self.result_ttl_s);
        set(&mut c.queue.results_maxlen, self.results_maxlen);
        set(
            &mut c.queue.skip_completed_on_read,
            self.skip_completed_on_read,
        );
        let mut engine = forkbox::sandbox::EngineConfig::default();
        self.sandbox.apply_ceilings(&mut engine);
        c.ceilings = engine.ceilings;
        c.collect_max_bytes = engine.collect_max_bytes;
        set(&mut c.ceilings.max_attempts, self.max_job_attempts);
        set(&mut c.ceilings.result_ttl_s, self.max_result_ttl_s);
        set(&mut c.queue.max_result_bytes, self.max_result_bytes);
        c.allow_eviction = self.allow_eviction;
        c.runtimes = forkbox::runtimes::Catalogue::load(self.runtimes.as_deref())?;
        set(&mut c.sessions.max_sessions, self.max_sessions);
        set(&mut c.sessions.memory_mb, self.session_memory_mb);
        set(&mut c.sessions.ceilings.ttl_s, self.max_session_ttl);
        set(&mut c.sessions.ceilings.idle_s, self.max_session_idle);
        set(&mut c.sessions.pool, self.session_pool);
        set(
            &mut c.sessions.max_checkpoints,
            self.max_session_checkpoints,
        );
        // A maximum below a default lowers the default, as for the limits.
        c.queue.max_attempts = c.queue.max_attempts.min(c.ceilings.max_attempts);
        c.queue.result_ttl_s = c.queue.result_ttl_s.min(c.ceilings.result_ttl_s);
        c.validate()?;
        Ok(c)
    }
}

/// The first key of a config file that does not read as a setting, with its line and why.
fn faulty_key(text: &str) -> Option<String> {
    let table: BTreeMap<toml::Spanned<String>, toml::Value> = toml::from_str(text).ok()?;
    table.into_iter().find_map(|(key, value)| {
        let alone = toml::Table::from_iter([(key.get_ref().clone(), value)]);
        let e = toml::Value::Table(alone)
            .try_into::<WorkerSettings>()
            .err()?;
        let line = text[..key.span().start].matches('\n').count() + 1;
        Some(format!("line {line}: {}: {}", key.get_ref(), e.message()))
    })
}

/// Overrides a default with a given setting.
fn set<T>(into: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *into = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    use crate::cmd::{Cli, Command};

    impl WorkerSettings {
        /// The node configuration of `forkbox worker` with these flags.
        fn resolve(self) -> anyhow::Result<NodeConfig> {
            self.with_file()?.node_config()
        }

        /// The sandbox options of `forkbox worker` with these flags.
        fn sandbox_opts(self) -> anyhow::Result<SandboxOpts> {
            Ok(self.with_file()?.sandbox)
        }
    }

    /// The worker arguments that `forkbox worker FLAGS` parses into.
    fn worker_args(flags: &[&str]) -> WorkerSettings {
        let mut argv = vec!["x", "worker"];
        argv.extend_from_slice(flags);
        let Command::Worker(args) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("parsed as worker")
        };
        args
    }

    #[test]
    fn file_keys_parse_and_unknown_keys_are_rejected() {
        let c = WorkerSettings::parse(
            "redis = \"redis://r:1/\"\nqueues = \"high, default\"\nslots = 3\n\
             metrics_addr = \"127.0.0.1:0\"\ngrace = 2.5\nvisibility_timeout_ms = 5000\n",
        )
        .unwrap();
        assert_eq!(c.redis.as_deref(), Some("redis://r:1/"));
        assert_eq!(c.queues.unwrap().into_vec(), ["high", "default"]);
        assert_eq!(c.slots, Some(3));
        assert_eq!(c.grace, Some(2.5));
        let c = WorkerSettings::parse("queues = [\"a\", \"b\"]").unwrap();
        assert_eq!(c.queues.unwrap().into_vec(), ["a", "b"]);
        let e = WorkerSettings::parse("slot = 3").unwrap_err();
        assert!(e.contains("unknown field `slot`"), "{e}");
    }

    /// A config file holding `toml`: the directory that keeps it, and its path.
    fn config_file(toml: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(&path, toml).unwrap();
        let path = path.to_str().unwrap().to_owned();
        (dir, path)
    }

    #[test]
    fn the_redis_tls_settings_come_from_flags_and_the_file() {
        let (_dir, path) = config_file(
            "redis = \"rediss://r:1/\"\nredis_ca = \"/file/ca.pem\"\nredis_cert = \"/file/c.pem\"\n\
             redis_key = \"/file/c.key\"\n",
        );
        let c = worker_args(&["--config", &path, "--redis-ca", "/flag/ca.pem"])
            .with_file()
            .unwrap();
        assert_eq!(
            c.redis_tls.tls(),
            forkbox_queue::RedisTls {
                ca: Some("/flag/ca.pem".into()),
                cert: Some("/file/c.pem".into()),
                key: Some("/file/c.key".into()),
            }
        );
        assert!(WorkerSettings::parse("redis_cafile = \"x\"").is_err());
        // The files are read at start, so a missing one is named before any job.
        let e = worker_args(&[
            "--redis",
            "rediss://r:1/",
            "--redis-ca",
            "/nonexistent/ca.pem",
        ])
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(e.contains("--redis-ca /nonexistent/ca.pem"), "{e}");
        // TLS settings with a plain URL are refused, not ignored.
        let e = worker_args(&["--redis", "redis://r:1/", "--redis-ca", "/ca.pem"])
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains("not rediss://"), "{e}");
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let (_dir, path) = config_file(
            "redis = \"redis://file:1/\"\nslots = 7\nprefetch = 2\nqueues = [\"high\", \"low\"]\n",
        );
        let c = worker_args(&["--config", &path, "--slots", "3"])
            .resolve()
            .unwrap();
        assert_eq!(c.slots, 3);
        assert_eq!(c.prefetch, 2);
        assert_eq!(c.redis_url, "redis://file:1/");
        assert_eq!(c.queues, ["high", "low"]);
        assert_eq!(c.grace, Duration::from_secs(30));
    }

    #[test]
    fn network_default_comes_from_the_flag_else_the_file_else_none() {
        use forkbox_queue::Network;
        let (_dir, path) = config_file("network_default = \"loopback\"\n");
        let parse = |flags: &[&str]| {
            worker_args(flags)
                .sandbox_opts()
                .unwrap()
                .engine_config(1)
                .network_default
        };
        assert_eq!(parse(&["--config", &path]), Network::Loopback);
        let flag = ["--config", &path, "--network-default", "none"];
        assert_eq!(parse(&flag), Network::None);
        assert_eq!(parse(&[]), Network::None);
        let e = WorkerSettings::parse("network_default = \"host\"\n").unwrap_err();
        assert!(
            e.contains("network_default") && e.contains("loopback"),
            "{e}"
        );
    }

    #[test]
    fn python_preload_comes_from_the_flag_else_the_file() {
        let (_dir, path) = config_file("python_preload = [\"json\", \"numpy\"]\n");
        let parse = |extra: &[&str]| {
            let mut flags = vec!["--config", path.as_str()];
            flags.extend_from_slice(extra);
            worker_args(&flags).sandbox_opts().unwrap().python_preload
        };
        assert_eq!(
            parse(&[]),
            Some(vec!["json".to_owned(), "numpy".to_owned()])
        );
        assert_eq!(
            parse(&["--python-preload", "none"]),
            Some(vec!["none".to_owned()])
        );
        let off = crate::cmd::opts::python_settings(Some(&["none".to_owned()]));
        assert_eq!(off, None);
        let default = crate::cmd::opts::python_settings(None).unwrap();
        assert!(default.preload.contains(&"json".to_owned()));
    }

    #[test]
    fn seed_lists_need_cluster_from_the_flag_or_the_file() {
        let parse = |flags: &[&str]| worker_args(flags).resolve();
        let seeds = "redis://h1:7000,redis://h2:7000";
        let err = parse(&["--redis", seeds]).unwrap_err().to_string();
        assert!(err.contains("redis") && err.contains("--cluster"), "{err}");
        let c = parse(&["--redis", seeds, "--cluster"]).unwrap();
        assert!(c.cluster);
        assert_eq!(
            c.endpoint().unwrap(),
            forkbox_queue::Endpoint::Cluster(vec![
                "redis://h1:7000".into(),
                "redis://h2:7000".into()
            ])
        );
        let (_dir, path) = config_file(&format!("redis = \"{seeds}\"\ncluster = true\n"));
        let c = parse(&["--config", &path]).unwrap();
        assert!(c.cluster && c.endpoint().unwrap().is_cluster());
    }

    #[test]
    fn session_capacity_comes_from_flags_over_the_file() {
        let (_dir, path) = config_file(
            "max_sessions = 3\nsession_memory_mb = 1024\nmax_session_ttl = 60\n\
             max_session_idle = 30\nsession_pool = 2\n",
        );
        let c = worker_args(&["--config", &path, "--max-sessions", "5"])
            .resolve()
            .unwrap();
        assert_eq!(c.sessions.max_sessions, 5);
        assert_eq!(c.sessions.memory_mb, 1024);
        assert_eq!(
            (c.sessions.ceilings.ttl_s, c.sessions.ceilings.idle_s),
            (60, 30)
        );
        assert_eq!(c.sessions.pool, 2);
        let c = worker_args(&["--config", &path, "--session-pool", "0"])
            .resolve()
            .unwrap();
        assert_eq!(c.sessions.pool, 0);
        let c = worker_args(&[]).resolve().unwrap();
        assert_eq!(c.sessions.pool, 1);
    }

    #[test]
    fn job_maximums_come_from_flags_over_the_file() {
        let (_dir, path) = config_file(
            "max_disk_mb = 512\nmax_pids = 32\nmax_job_attempts = 2\nmax_result_ttl_s = 60\n\
             max_result_bytes = 100000\nallow_eviction = true\n",
        );
        let c = worker_args(&["--config", &path, "--max-disk-mb", "128"])
            .resolve()
            .unwrap();
        assert_eq!(c.ceilings.limits.disk_mb, 128);
        assert_eq!(c.ceilings.limits.pids, 32);
        assert_eq!(c.ceilings.max_attempts, 2);
        assert_eq!(c.ceilings.result_ttl_s, 60);
        // Defaults above a maximum come down to it.
        assert_eq!(c.queue.max_attempts, 2);
        assert_eq!(c.queue.result_ttl_s, 60);
        assert_eq!(c.queue.max_result_bytes, 100_000);
        assert!(c.allow_eviction);
    }

    #[test]
    fn command_line_only_keys_are_not_file_keys() {
        for key in [
            "rootfs = \"/srv/root\"",
            "allow = [\"/usr\"]",
            "shared_net = true",
            "config = \"x\"",
        ] {
            let e = WorkerSettings::parse(key).unwrap_err();
            assert!(e.contains("unknown field"), "{key}: {e}");
        }
    }

    #[test]
    fn a_runtime_catalogue_file_is_a_key_and_a_flag() {
        let dir = tempfile::tempdir().unwrap();
        let catalogue = dir.path().join("rt.toml");
        std::fs::write(
            &catalogue,
            "[[language]]\nname = \"zig\"\nsource_file = \"main.zig\"\n\
             run = [\"zig\", \"run\", \"{source}\"]\nversion = [\"zig\", \"version\"]\n",
        )
        .unwrap();
        let (_cfg, path) = config_file(&format!("runtimes = {:?}\n", catalogue.to_str().unwrap()));
        let c = worker_args(&["--config", &path])
            .with_file()
            .unwrap()
            .node_config()
            .unwrap();
        assert_eq!(c.runtimes.find("zig").unwrap().run[0], "zig");
        assert!(
            c.runtimes.find("python3").is_some(),
            "over the built-in one"
        );
        let c = worker_args(&[]).node_config().unwrap();
        assert!(c.runtimes.find("zig").is_none());
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "[[language]]\nname = 1\n").unwrap();
        let e = worker_args(&["--runtimes", bad.to_str().unwrap()])
            .node_config()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("runtime catalogue ") && e.contains("bad.toml"),
            "{e}"
        );
    }

    #[test]
    fn every_file_key_reaches_the_node_config() {
        let (_dir, path) = config_file(
            "redis = \"redis://f:2/\"\nqueues = \"a, b\"\nslots = 5\nprefetch = 1\n\
             partitions = 2\nmetrics_addr = \"127.0.0.1:9\"\ngrace = 1.5\nvisibility_timeout_ms = 900\n\
             max_attempts = 2\nname = \"n1\"\nmax_job_bytes = 4096\nresult_ttl_s = 50\n\
             results_maxlen = 77\nskip_completed_on_read = false\nmax_result_bytes = 70000\n\
             max_job_attempts = 4\nmax_result_ttl_s = 100\nallow_eviction = true\n\
             python_preload = \"json, re\"\nmax_timeout_ms = 1000\nmax_memory_mb = 100\n\
             max_pids = 10\nmax_cpu_ms = 2000\nmax_output_bytes = 3000\nmax_disk_mb = 20\n\
             max_file_size_mb = 3\nmax_open_files = 40\nmax_collect_bytes = 5000\n\
             network_default = \"loopback\"\n",
        );
        let settings = worker_args(&["--config", &path]).with_file().unwrap();
        assert_eq!(
            settings.sandbox.python_preload,
            Some(vec!["json".to_owned(), "re".to_owned()])
        );
        assert_eq!(
            settings.sandbox.engine_config(1).network_default,
            forkbox_queue::Network::Loopback
        );
        let c = settings.node_config().unwrap();
        assert_eq!(c.redis_url, "redis://f:2/");
        assert_eq!(c.queues, ["a", "b"]);
        assert_eq!((c.partitions, c.slots, c.prefetch), (2, 5, 1));
        assert_eq!(c.metrics_addr, Some("127.0.0.1:9".parse().unwrap()));
        assert_eq!(c.grace, Duration::from_millis(1500));
        assert_eq!(c.name, "n1");
        let q = &c.queue;
        assert_eq!((q.visibility_timeout_ms, q.max_attempts), (900, 2));
        assert_eq!(
            (q.max_job_bytes, q.result_ttl_s, q.results_maxlen),
            (4096, 50, 77)
        );
        assert!(!q.skip_completed_on_read);
        assert_eq!(q.max_result_bytes, 70_000);
        assert_eq!((c.ceilings.max_attempts, c.ceilings.result_ttl_s), (4, 100));
        assert!(c.allow_eviction);
        assert_eq!(c.ceilings.timeout_ms, 1000);
        let l = &c.ceilings.limits;
        assert_eq!(
            (l.memory_mb, l.pids, l.cpu_ms, l.output_bytes),
            (100, 10, 2000, 3000)
        );
        assert_eq!((l.disk_mb, l.file_size_mb, l.open_files), (20, 3, 40));
        assert_eq!(c.collect_max_bytes, 5000);
    }

    #[test]
    fn a_bad_sandbox_key_is_named_with_its_line() {
        let e = WorkerSettings::parse("slots = 2\nmax_pids = -1\n").unwrap_err();
        assert!(
            e.contains("line 2: max_pids: invalid value: integer `-1`"),
            "{e}"
        );
        let e = WorkerSettings::parse("slots = 2\n\nslot = 3\n").unwrap_err();
        assert!(e.contains("line 3: slot: unknown field `slot`"), "{e}");
        let e = WorkerSettings::parse("python_preload = 3\n").unwrap_err();
        assert!(e.contains("line 1: python_preload: "), "{e}");
        // Keys toml can point at keep its own message.
        let e = WorkerSettings::parse("slots = 2\nprefetch = \"x\"\n").unwrap_err();
        assert!(e.contains("line 2, column 12"), "{e}");
    }
}
