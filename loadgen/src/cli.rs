//! Command-line interface. Operators' scripts rely on these names; change them only with care.

use std::path::PathBuf;

use clap::{ArgGroup, Parser};
use serde::Serialize;

/// Drives a Forkbox cluster through Redis and reports throughput, latency, and lost or
/// duplicated jobs.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(
    name = "forkbox-loadgen",
    version,
    after_help = "Exit status: 0 when every job got exactly one result; 1 when a job was lost or \
                  duplicated, or the run failed; 130 when interrupted. The first Ctrl-C (or \
                  SIGTERM) stops sending and writes a partial report, a second abandons the run. \
                  Spawned workers, the load generator's own Redis and the simulated hosts are \
                  removed on every exit; after a SIGKILL, by the next run or --cleanup."
)]
#[command(group(ArgGroup::new("load").args(["concurrency", "rate", "ramp", "backlog"])))]
#[command(group(ArgGroup::new("length").args(["jobs", "duration"])))]
pub struct Args {
    /// Redis URL (`FORKBOX_REDIS_URL`, as for every forkbox command; the older
    /// `FORKBOX_REDIS` is still read, with a warning). Without it, the load generator starts
    /// its own redis-server (required by --hosts and --restart-redis-at).
    #[arg(long, env = "FORKBOX_REDIS_URL")]
    pub redis: Option<String>,
    /// PEM file of the CAs that sign Redis' certificate, for a rediss:// --redis (spawned
    /// workers get it too) [default: the system's roots].
    #[arg(long, env = "FORKBOX_REDIS_CA", value_name = "FILE")]
    pub redis_ca: Option<std::path::PathBuf>,
    /// PEM file of a client certificate for Redis (mutual TLS; with --redis-key).
    #[arg(
        long,
        env = "FORKBOX_REDIS_CERT",
        value_name = "FILE",
        requires = "redis_key"
    )]
    pub redis_cert: Option<std::path::PathBuf>,
    /// PEM file of the client certificate's private key (with --redis-cert).
    #[arg(
        long,
        env = "FORKBOX_REDIS_KEY",
        value_name = "FILE",
        requires = "redis_cert"
    )]
    pub redis_key: Option<std::path::PathBuf>,
    /// --redis names a Redis Cluster: one or more comma-separated seed URLs; spawned workers
    /// get --cluster too.
    #[arg(long, env = "FORKBOX_CLUSTER")]
    pub cluster: bool,
    /// Queue name.
    #[arg(long, default_value = "loadgen")]
    pub queue: String,
    /// Measure `forkbox gateway` at this URL (serving --queue on --redis) against enqueueing
    /// straight on Redis: --jobs requests per arm at --concurrency, alternating, in one run.
    #[arg(long, value_name = "URL", requires = "redis")]
    pub gateway: Option<String>,
    /// The gateway's pid, to report its CPU time per request.
    #[arg(long, value_name = "PID", requires = "gateway")]
    pub gateway_pid: Option<u32>,
    /// Partitions of the queue (docs/protocol.md "Partitioned queues"): jobs spread by id,
    /// spawned workers get the same --partitions. Must match the queue's recorded count.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = at_least_one)]
    pub partitions: usize,
    /// Send N jobs, then wait for their results.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub jobs: Option<u64>,
    /// Send jobs for SECS seconds, then wait for their results.
    #[arg(long, value_name = "SECS", value_parser = positive)]
    pub duration: Option<f64>,
    /// Closed loop: keep C jobs in flight (the default, with C = 2 × workers × slots).
    #[arg(long, value_name = "C", value_parser = at_least_one)]
    pub concurrency: Option<usize>,
    /// Open loop: send R jobs per second on a fixed schedule.
    #[arg(long, value_name = "R", value_parser = positive)]
    pub rate: Option<f64>,
    /// Step the rate up until p99 or the error rate crosses its bound; report the highest
    /// sustainable throughput.
    #[arg(long)]
    pub ramp: bool,
    /// Backlog: enqueue all --jobs N before any spawned worker starts, then measure how fast the
    /// workers drain the queue (a batch evaluation's case). Throughput counts from the first
    /// result to the last, so neither the enqueueing nor the workers' start-up is in it; latency
    /// includes the time each job waited in the queue. Without --spawn-workers, workers that
    /// are already running take jobs as soon as they land.
    #[arg(long)]
    pub backlog: bool,
    /// Workload mix, `KIND[:ARG][:WEIGHT],...` (kinds: noop, python, loopback, sleep, cpu,
    /// humaneval, hostile, jsonl:FILE), or a file holding one.
    #[arg(long, default_value = "noop")]
    pub mix: String,
    /// Run the python and humaneval jobs in this warm runtime (`python`).
    #[arg(long, value_name = "RUNTIME")]
    pub runtime: Option<forkbox_queue::Runtime>,
    /// The network of every job that sets none of its own (`none` or `loopback`; the
    /// `loopback` kind always asks for loopback) [default: the worker's].
    #[arg(long, value_name = "MODE")]
    pub network: Option<forkbox_queue::Network>,
    /// Start K local worker nodes.
    #[arg(long, value_name = "K", value_parser = at_least_one)]
    pub spawn_workers: Option<usize>,
    /// Slots per spawned worker.
    #[arg(long, value_name = "S", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub slots: u32,
    /// Put the spawned workers in H network namespaces (simulated hosts) reaching Redis over
    /// veth pairs and a bridge. Needs root.
    #[arg(long, value_name = "H", value_parser = at_least_one)]
    pub hosts: Option<usize>,
    /// Scaling run: measure with 1..K spawned workers (or --scale-steps) and report throughput
    /// against K.
    #[arg(long, requires = "spawn_workers")]
    pub scale: bool,
    /// Worker counts for --scale, e.g. 1,2,4.
    #[arg(long, value_delimiter = ',', requires = "scale", value_parser = at_least_one)]
    pub scale_steps: Option<Vec<usize>>,
    /// SIGKILL one spawned worker when this share of the run is done (e.g. 30%).
    #[arg(long, value_name = "PCT", value_parser = parse_pct)]
    pub kill_worker_at: Option<f64>,
    /// SIGKILL and restart the load generator's own Redis when this share of the run is done.
    #[arg(long, value_name = "PCT", value_parser = parse_pct)]
    pub restart_redis_at: Option<f64>,
    /// With --cluster: SIGKILL the cluster primary serving the most of the queue's partitions
    /// when this share of the run is done, for its replica to take over. The cluster's nodes
    /// must run on this machine (the primary's pid comes from INFO server).
    #[arg(long, value_name = "PCT", value_parser = parse_pct, requires = "cluster")]
    pub kill_redis_primary_at: Option<f64>,
    /// Visibility timeout passed to spawned workers (2000 by default when a fault is injected).
    #[arg(long, value_name = "MS")]
    pub visibility_timeout_ms: Option<u64>,
    /// End a phase when no result arrived for this long after the last send, or while jobs are
    /// in flight (the workers are gone or stuck; the unanswered jobs count as lost). Default:
    /// 30 s, or the longest job's time limit plus 10 s, or twice the visibility timeout plus
    /// 10 s, whichever is longest.
    #[arg(long, value_name = "SECS", value_parser = positive)]
    pub drain_timeout: Option<f64>,
    /// Noop jobs sent and awaited before measuring (default: 2 × workers × slots when workers
    /// are spawned, else 0).
    #[arg(long, value_name = "N")]
    pub warmup: Option<u64>,
    /// Write report.json, report.md, SVG plots and worker logs here.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// HumanEval data set (.jsonl or .jsonl.gz).
    #[arg(long, env = "FORKBOX_HUMANEVAL", value_name = "PATH")]
    pub humaneval: Option<PathBuf>,
    /// Extra argument for each spawned worker (repeatable).
    #[arg(long = "worker-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub worker_args: Vec<String>,
    /// Ramp: first rate (jobs/s).
    #[arg(long, default_value_t = 50.0, value_parser = positive)]
    pub ramp_start: f64,
    /// Ramp: rate added per step (default: --ramp-start).
    #[arg(long, value_parser = positive)]
    pub ramp_step: Option<f64>,
    /// Ramp: seconds per step.
    #[arg(long, default_value_t = 5.0, value_parser = positive)]
    pub ramp_step_secs: f64,
    /// Ramp: p99 bound in milliseconds.
    #[arg(long, default_value_t = 500.0, value_parser = positive)]
    pub ramp_p99_ms: f64,
    /// Ramp: bound on the share of jobs lost or with an unexpected result.
    #[arg(long, default_value_t = 0.01, value_parser = fraction)]
    pub ramp_max_error_rate: f64,
    /// Ramp: most steps.
    #[arg(long, default_value_t = 30, value_parser = at_least_one)]
    pub ramp_max_steps: usize,
    /// Run id, part of every job id and namespace name (default: random, 6 hex digits).
    #[arg(long)]
    pub run_id: Option<String>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Only remove what load generators killed outright (SIGKILL, out of memory) left behind:
    /// their workers, their own redis-server and their simulated hosts; then exit. Every run
    /// that starts workers, hosts or a Redis of its own does this first anyway.
    #[arg(long, conflicts_with_all = [
        "jobs", "duration", "concurrency", "rate", "ramp", "backlog", "spawn_workers", "hosts",
        "scale", "kill_worker_at", "restart_redis_at", "kill_redis_primary_at", "report", "warmup",
    ])]
    pub cleanup: bool,
}

impl Args {
    /// The TLS settings of a rediss:// --redis.
    pub fn redis_tls(&self) -> forkbox_queue::RedisTls {
        forkbox_queue::RedisTls {
            ca: self.redis_ca.clone(),
            cert: self.redis_cert.clone(),
            key: self.redis_key.clone(),
        }
    }

    /// The worker flags that carry [`Args::redis_tls`].
    pub fn redis_tls_flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        for (flag, path) in [
            ("--redis-ca", &self.redis_ca),
            ("--redis-cert", &self.redis_cert),
            ("--redis-key", &self.redis_key),
        ] {
            if let Some(p) = path {
                flags.push(flag.to_owned());
                flags.push(p.display().to_string());
            }
        }
        flags
    }

    /// Fills `--redis` from the deprecated `FORKBOX_REDIS` when neither the flag nor
    /// `FORKBOX_REDIS_URL` gave it; returns the warning to print when it did.
    pub fn take_deprecated_redis_env(&mut self, old: Option<String>) -> Option<&'static str> {
        match old.filter(|v| !v.is_empty()) {
            Some(url) if self.redis.is_none() && !self.cleanup => {
                self.redis = Some(url);
                Some("FORKBOX_REDIS is deprecated; set FORKBOX_REDIS_URL instead")
            }
            _ => None,
        }
    }
}

/// A count that must be at least 1 (jobs in flight, workers, hosts, steps).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

/// A rate, a duration or a bound: a finite number above 0.
fn positive(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        Ok(_) => Err("must be a number above 0".into()),
        Err(_) => Err(format!("{s:?} is not a number")),
    }
}

/// A share between 0 and 1.
fn fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        Ok(_) => Err("must be between 0 and 1".into()),
        Err(_) => Err(format!("{s:?} is not a number")),
    }
}

/// A share of the run in percent, `30%` or `30`; returned as a fraction.
pub fn parse_pct(s: &str) -> Result<f64, String> {
    let t = s.trim().trim_end_matches('%');
    let v: f64 = t
        .parse()
        .map_err(|_| format!("{s:?} is not a percentage (e.g. 30%)"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("{s:?} is not between 0% and 100%"));
    }
    Ok(v / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages() {
        assert_eq!(parse_pct("30%"), Ok(0.3));
        assert_eq!(parse_pct("50"), Ok(0.5));
        assert!(parse_pct("150%").is_err());
        assert!(parse_pct("x").is_err());
    }

    #[test]
    fn empty_or_endless_runs_are_refused_at_parse_time() {
        // Each of these used to start a run that did nothing (and reported success) or never
        // finished; the error names the flag.
        for (flag, value) in [
            ("--jobs", "0"),
            ("--duration", "0"),
            ("--duration", "-1"),
            ("--concurrency", "0"),
            ("--rate", "0"),
            ("--rate", "inf"),
            ("--spawn-workers", "0"),
            ("--slots", "0"),
            ("--hosts", "0"),
            ("--ramp-step-secs", "0"),
            ("--ramp-max-error-rate", "2"),
            ("--ramp-max-steps", "0"),
        ] {
            let e = Args::try_parse_from(["forkbox-loadgen", &format!("{flag}={value}")])
                .expect_err(flag)
                .to_string();
            assert!(e.contains(flag), "{flag} {value}: {e}");
        }
        let a = Args::try_parse_from(["x", "--duration", "0.5", "--rate", "20"]).unwrap();
        assert_eq!((a.duration, a.rate), (Some(0.5), Some(20.0)));
        let e = Args::try_parse_from([
            "x",
            "--spawn-workers",
            "2",
            "--scale",
            "--scale-steps",
            "0,2",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("at least 1"), "{e}");
    }

    #[test]
    fn issue_interface_parses() {
        let a = Args::try_parse_from([
            "forkbox-loadgen",
            "--redis",
            "redis://127.0.0.1:7000/",
            "--queue",
            "q",
            "--jobs",
            "500",
            "--concurrency",
            "8",
            "--mix",
            "noop:80,python:15,sleep:5",
            "--spawn-workers",
            "2",
            "--slots",
            "3",
            "--hosts",
            "2",
            "--kill-worker-at",
            "30%",
            "--restart-redis-at",
            "60%",
            "--report",
            "/tmp/r",
        ])
        .unwrap();
        assert_eq!(a.jobs, Some(500));
        assert_eq!(a.kill_worker_at, Some(0.3));
        assert_eq!(a.hosts, Some(2));
        // One load mode and one length at most.
        assert!(Args::try_parse_from(["x", "--rate", "5", "--concurrency", "2"]).is_err());
        assert!(Args::try_parse_from(["x", "--jobs", "5", "--duration", "2"]).is_err());
        assert!(Args::try_parse_from(["x", "--scale"]).is_err());
        let s = Args::try_parse_from([
            "x",
            "--spawn-workers",
            "4",
            "--scale",
            "--scale-steps",
            "1,2,4",
        ])
        .unwrap();
        assert_eq!(s.scale_steps, Some(vec![1, 2, 4]));
        // --cleanup runs alone, whatever the environment (FORKBOX_REDIS, FORKBOX_HUMANEVAL) sets.
        assert!(Args::try_parse_from(["x", "--cleanup"]).unwrap().cleanup);
        assert!(Args::try_parse_from(["x", "--cleanup", "--quiet"]).is_ok());
        assert!(Args::try_parse_from(["x", "--cleanup", "--jobs", "5"]).is_err());
    }

    #[test]
    fn the_old_redis_variable_still_works_with_a_warning() {
        let mut a = Args::try_parse_from(["x", "--jobs", "1"]).unwrap();
        a.redis = None;
        let warning = a.take_deprecated_redis_env(Some("redis://old:1/".into()));
        assert!(warning.unwrap().contains("FORKBOX_REDIS_URL"));
        assert_eq!(a.redis.as_deref(), Some("redis://old:1/"));
        let mut b = Args::try_parse_from(["x", "--redis", "redis://new:1/"]).unwrap();
        assert_eq!(
            b.take_deprecated_redis_env(Some("redis://old:1/".into())),
            None
        );
        assert_eq!(b.redis.as_deref(), Some("redis://new:1/"));
    }
}
