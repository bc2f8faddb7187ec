//! One load-generator run, start to finish: set up what the run needs (simulated hosts, its own
//! Redis, workers), run the phases (one, one per scaling step, or one per ramp step), build the
//! report, and tear everything down.
//!
//! The order of set-up is the reverse of tear-down and is carried by the order of the guards'
//! declarations: hosts first, then Redis, then workers, so on any exit (error, Ctrl-C dropping
//! this future, panic) the workers die before Redis and the namespaces go last.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::watch;

use crate::cli::Args;
use crate::cluster::{self, Fleet, WorkerConfig};
use crate::driver::{Cluster, Driver, Fault, Load, PhaseSpec, Stop, Target};
use crate::humaneval;
use crate::mix::{JobSource, Mix};
use crate::netns::{SimulatedHosts, SystemIp};
use crate::orphans;
use crate::report::{self, Environment, MeasuredPhase, RampSummary, Report};
use crate::stats::percentiles_ms;
use forkbox_private_redis::{RedisServer, RedisServerOptions};
use forkbox_queue::Keys;

/// Workers and Redis as the phases see them.
struct LocalCluster<'a> {
    fleet: Fleet,
    /// Workers to start when a backlog is in: (fleet name, worker count).
    held_back: Option<(String, usize)>,
    worker_cfg: Option<&'a WorkerConfig>,
    netns: &'a [String],
    redis: Option<&'a mut RedisServer>,
    /// With --cluster: the seed URLs and the partitions' job streams, to find the primary
    /// serving the most of them.
    cluster_seeds: Option<(String, Vec<String>)>,
    log_dir: PathBuf,
}

impl LocalCluster<'_> {
    fn start(&mut self, name: &str, count: usize) -> anyhow::Result<()> {
        if let Some(cfg) = self.worker_cfg {
            self.fleet =
                tokio::task::block_in_place(|| Fleet::start(cfg, name, count, self.netns))?;
        }
        Ok(())
    }
}

impl Cluster for LocalCluster<'_> {
    fn release(&mut self) -> anyhow::Result<bool> {
        match self.held_back.take() {
            Some((name, count)) => self.start(&name, count).map(|()| true),
            None => Ok(false),
        }
    }

    fn inject(&mut self, fault: Fault) -> anyhow::Result<String> {
        match fault {
            Fault::KillWorker => {
                let (name, pid) = self.fleet.kill_one()?;
                Ok(format!("SIGKILL to worker {name} (pid {pid})"))
            }
            Fault::KillRedisPrimary => {
                let (seeds, streams) = self
                    .cluster_seeds
                    .as_ref()
                    .context("--kill-redis-primary-at needs --cluster")?;
                tokio::task::block_in_place(|| kill_busiest_primary(seeds, streams))
            }
            Fault::RestartRedis => {
                let redis = self
                    .redis
                    .as_deref_mut()
                    .context("--restart-redis-at needs the load generator's own Redis")?;
                let t = Instant::now();
                redis.restart()?;
                Ok(format!(
                    "SIGKILL to redis-server, restarted on port {} in {} ms",
                    redis.port(),
                    t.elapsed().as_millis()
                ))
            }
        }
    }

    fn check(&mut self) -> anyhow::Result<()> {
        self.fleet.check_alive(&self.log_dir)
    }
}

/// SIGKILLs the primary serving the most of `streams` (ties: the lowest port), found through
/// the first seed of `seeds` that answers `CLUSTER NODES`; its pid comes from its own
/// `INFO server`, so it must run on this machine.
fn kill_busiest_primary(seeds: &str, streams: &[String]) -> anyhow::Result<String> {
    use forkbox_queue::redis;
    let mut nodes = None;
    for seed in seeds.split(',').map(str::trim) {
        let Ok(client) = redis::Client::open(seed) else {
            continue;
        };
        if let Ok(mut c) = client.get_connection_with_timeout(Duration::from_secs(2)) {
            if let Ok(text) = redis::cmd("CLUSTER").arg("NODES").query::<String>(&mut c) {
                nodes = Some((seed.to_owned(), text));
                break;
            }
        }
    }
    let (seed, text) = nodes.context("no cluster seed answered CLUSTER NODES")?;
    let view = forkbox_private_redis::parse_nodes(&text);
    let busiest = view
        .iter()
        .filter(|n| n.primary && !n.failed)
        .map(|n| {
            let held = streams
                .iter()
                .filter(|s| n.serves(redis::cluster_routing::get_slot(s.as_bytes())))
                .count();
            (held, std::cmp::Reverse(n.port), n)
        })
        .max_by_key(|(held, port, _)| (*held, *port))
        .map(|(held, _, n)| (held, n.port))
        .context("the cluster has no live primary")?;
    let host = seed
        .split("://")
        .nth(1)
        .and_then(|r| r.rsplit('@').next())
        .and_then(|r| r.split(':').next())
        .unwrap_or("127.0.0.1")
        .to_owned();
    let url = format!("redis://{host}:{}", busiest.1);
    let mut c = redis::Client::open(url.as_str())?
        .get_connection_with_timeout(Duration::from_secs(2))
        .with_context(|| format!("connecting to primary {url}"))?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut c)?;
    let pid: i32 = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .context("INFO server names no process_id")?;
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .context("running kill")?;
    anyhow::ensure!(
        status.success(),
        "SIGKILL to redis-server pid {pid} ({url}) failed: is the cluster on this machine?"
    );
    Ok(format!(
        "SIGKILL to cluster primary {url} (pid {pid}), serving {} of {} partition(s)",
        busiest.0,
        streams.len()
    ))
}

fn run_id() -> String {
    let u = uuid::Uuid::new_v4();
    u.simple().to_string()[..6].to_owned()
}

fn environment(redis_version: String, bin: Option<&PathBuf>) -> Environment {
    Environment {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        redis_version,
        forkbox_bin: bin.map(|b| b.display().to_string()),
    }
}

/// The server's version; the first contact with Redis, so an unreachable one fails the run here
/// with its address (never the URL, which may hold a password), and a refused password or
/// certificate is named as such.
async fn redis_version(client: &Target, keys: &Keys) -> anyhow::Result<String> {
    use forkbox_queue::connect::{is_auth_error, is_tls_error};
    let refused = |e: &redis::RedisError| {
        if is_auth_error(e) {
            Some(anyhow::anyhow!(
                "authentication failed at {}: {e} (check the user and password in --redis, \
                 with @ : / # ? % in them %-encoded)",
                client.describe()
            ))
        } else if is_tls_error(e) {
            Some(anyhow::anyhow!(
                "TLS handshake with {} failed: {e} (check --redis-ca, --redis-cert, --redis-key)",
                client.describe()
            ))
        } else {
            None
        }
    };
    let mut c = match crate::driver::connect(client).await {
        Ok(c) => c,
        Err(e) => {
            if let Some(why) = refused(&e) {
                return Err(why);
            }
            return Err(anyhow::Error::new(e).context(format!(
                "cannot reach Redis at {} (is it running? without --redis the load generator \
                 starts its own)",
                client.describe()
            )));
        }
    };
    // In a cluster: the version of the shard that holds the queue.
    let info: String = match c
        .query_in_slot_of(&keys.jobs(), redis::cmd("INFO").arg("server"))
        .await
    {
        Ok(info) => info,
        Err(e) => match refused(&e) {
            Some(why) => return Err(why),
            None => String::new(),
        },
    };
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("")
        .trim()
        .to_owned())
}

/// Records the queue's partition count, or fails naming both counts when it has another.
async fn check_partitions(
    redis: &str,
    args: &Args,
    queue: &str,
    partitions: usize,
) -> anyhow::Result<()> {
    let endpoint = forkbox_queue::Endpoint::parse(redis, args.cluster)?;
    let broker = forkbox_queue::Broker::connect_to_with(&endpoint, &args.redis_tls()).await?;
    broker
        .open_partitioned(queue, partitions, forkbox_queue::QueueConfig::default())
        .await?;
    Ok(())
}

/// Workers whose heartbeat on this queue is live (their keys expire when they stop).
async fn live_workers(client: &Target, keys: &Keys) -> anyhow::Result<usize> {
    let mut c = crate::driver::connect(client).await?;
    forkbox_queue::live_workers(&mut c, keys)
        .await
        .context("looking for the queue's workers")
}

/// Worker counts of the measured phases: 1..=K (or `--scale-steps`) for a scaling run, else K
/// (0 when no workers are spawned).
fn worker_steps(args: &Args) -> anyhow::Result<Vec<usize>> {
    let k_max = args.spawn_workers.unwrap_or(0);
    if !args.scale {
        return Ok(vec![k_max]);
    }
    let steps = args
        .scale_steps
        .clone()
        .unwrap_or_else(|| (1..=k_max).collect());
    ensure!(
        steps.iter().all(|&k| k >= 1),
        "--scale-steps must be at least 1"
    );
    if let Some(k) = steps.iter().find(|&&k| k > k_max) {
        bail!("--scale-steps: {k} is more than the {k_max} workers of --spawn-workers");
    }
    Ok(steps)
}

/// Checks the combinations of options that clap cannot express; returns the worker counts of
/// the measured phases.
fn validate(args: &Args) -> anyhow::Result<Vec<usize>> {
    if !args.ramp {
        ensure!(
            args.jobs.is_some() || args.duration.is_some(),
            "give --jobs N or --duration SECS"
        );
    }
    if args.hosts.is_some() {
        ensure!(
            args.spawn_workers.is_some(),
            "--hosts puts spawned workers in namespaces: give --spawn-workers"
        );
        ensure!(
            args.redis.is_none(),
            "--hosts needs the load generator's own Redis (listening on the bridge): drop --redis"
        );
    }
    if args.restart_redis_at.is_some() {
        ensure!(
            args.redis.is_none(),
            "--restart-redis-at needs the load generator's own Redis: drop --redis"
        );
    }
    if let Some(n) = Some(args.partitions).filter(|&n| n > forkbox_queue::keys::MAX_PARTITIONS) {
        anyhow::bail!(
            "--partitions {n}: at most {}",
            forkbox_queue::keys::MAX_PARTITIONS
        );
    }
    if args.cluster {
        ensure!(
            args.redis.is_some(),
            "--cluster needs the cluster's seed URLs in --redis (redis://h1:7000,redis://h2:7000)"
        );
    }
    let steps = worker_steps(args)?;
    if args.kill_worker_at.is_some() {
        ensure!(
            args.spawn_workers.is_some() && steps.iter().all(|&k| k >= 2),
            "--kill-worker-at needs 2 or more spawned workers in every phase, so that one is left \
             to reclaim the killed worker's jobs{}",
            if args.scale {
                " (a scaling run starts at K=1: give --scale-steps 2,4)"
            } else {
                ": give --spawn-workers 2 or more"
            }
        );
    }
    if args.backlog {
        ensure!(
            args.jobs.is_some(),
            "--backlog enqueues a known number of jobs at once: give --jobs N, not --duration"
        );
        ensure!(
            args.warmup.is_none(),
            "--warmup does not apply to --backlog: its throughput counts from the first result, \
             so the workers' start-up is not in it"
        );
    }
    if args.ramp {
        ensure!(!args.scale, "--ramp and --scale are separate runs");
    }
    Ok(steps)
}

/// What the phases measured, gathered for the report.
#[derive(Default)]
struct Measurements {
    phases: Vec<MeasuredPhase>,
    tags: Vec<String>,
    /// (workers, throughput, p99 ms) of each scaling step.
    scale_points: Vec<(usize, f64, f64)>,
    ramp_steps: Vec<report::RampStep>,
}

/// The settings every phase of a run shares.
struct Plan<'a> {
    args: &'a Args,
    run: &'a str,
    t0: Instant,
    cancel: &'a watch::Receiver<bool>,
    drain_timeout: Duration,
    length: Stop,
    faults: Vec<(f64, Fault)>,
    worker_redis_url: &'a str,
    log_dir: &'a std::path::Path,
}

pub async fn run(args: Args, cancel: watch::Receiver<bool>) -> anyhow::Result<Report> {
    let steps = validate(&args)?;
    let t0 = Instant::now();
    let run = args.run_id.clone().unwrap_or_else(run_id);
    let mut source = load_jobs(&args)?;
    let labels = source.labels().to_vec();
    let report_dir = args.report.clone();
    let (log_dir, _log_tmp) = log_dir(report_dir.as_deref())?;

    sweep_orphans(&args);
    // Guards, in set-up order: dropped in reverse.
    let hosts = start_hosts(&args, &run)?;
    let mut own_redis = start_redis(&args, hosts.as_ref())?;
    let redis_url = match (&args.redis, &own_redis) {
        (Some(u), _) => u.clone(),
        (None, Some(r)) => r.url(),
        (None, None) => unreachable!("own Redis is started when no URL is given"),
    };
    let worker_redis_url = match (&hosts, &own_redis) {
        (Some(h), Some(r)) => r.url_via(IpAddr::V4(h.bridge_addr())),
        _ => redis_url.clone(),
    };

    let faulty = args.kill_worker_at.is_some()
        || args.restart_redis_at.is_some()
        || args.kill_redis_primary_at.is_some();
    let visibility = args.visibility_timeout_ms.or(faulty.then_some(2000));
    let drain_timeout = Duration::from_secs_f64(args.drain_timeout.unwrap_or_else(|| {
        let vis = visibility.unwrap_or(0) as f64 / 1000.0;
        let longest_job = source.longest_timeout_ms() as f64 / 1000.0;
        (2.0 * vis + 10.0).max(longest_job + 10.0).max(30.0)
    }));
    let bin = match args.spawn_workers {
        Some(_) => Some(cluster::forkbox_bin().context(
            "the forkbox binary was not found: set FORKBOX_BIN or build it (cargo build -p forkbox)",
        )?),
        None => None,
    };
    let worker_cfg = bin.as_ref().map(|bin| WorkerConfig {
        bin: bin.clone(),
        redis_url: worker_redis_url.clone(),
        queue: args.queue.clone(),
        slots: args.slots,
        visibility_timeout_ms: visibility,
        extra_args: args
            .cluster
            .then(|| "--cluster".to_owned())
            .into_iter()
            .chain(args.redis_tls_flags())
            .chain(
                (args.partitions > 1)
                    .then(|| ["--partitions".to_owned(), args.partitions.to_string()])
                    .into_iter()
                    .flatten(),
            )
            .chain(args.worker_args.iter().cloned())
            .collect(),
        log_dir: log_dir.clone(),
    });
    let netns_names: Vec<String> = hosts
        .iter()
        .flat_map(|h| h.hosts().iter().map(|h| h.netns.clone()))
        .collect();

    let (mut driver, redis_version) = open_driver(&args, &redis_url, &run, t0, &cancel).await?;
    let plan = Plan {
        args: &args,
        run: &run,
        t0,
        cancel: &cancel,
        drain_timeout,
        length: phase_length(&args),
        faults: faults(&args),
        worker_redis_url: &worker_redis_url,
        log_dir: &log_dir,
    };
    let mut measured = Measurements::default();
    for (step, &k) in steps.iter().enumerate() {
        if *cancel.borrow() {
            break;
        }
        let mut local = LocalCluster {
            fleet: Fleet::default(),
            held_back: None,
            worker_cfg: worker_cfg.as_ref(),
            netns: &netns_names,
            redis: own_redis.as_mut(),
            cluster_seeds: args.cluster.then(|| {
                (
                    redis_url.clone(),
                    driver.partitions().iter().map(Keys::jobs).collect(),
                )
            }),
            log_dir: log_dir.clone(),
        };
        run_step(
            &plan,
            step,
            k,
            &mut local,
            &mut driver,
            &mut source,
            &mut measured,
        )
        .await?;
        tokio::task::block_in_place(|| local.fleet.stop(Duration::from_secs(10)));
    }
    driver.progress.finish_and_clear();

    let environment = environment(redis_version, bin.as_ref());
    let report = build_report(&args, measured, &labels, environment)?;
    if let Some(dir) = &report_dir {
        write_report(&report, dir)?;
    }
    drop(own_redis);
    drop(hosts);
    Ok(report)
}

/// The job mix, with the HumanEval problems when the mix draws from them.
fn load_jobs(args: &Args) -> anyhow::Result<JobSource> {
    let mix = Mix::from_arg(&args.mix)?;
    let problems = if mix.needs_humaneval() {
        let path = humaneval::locate(args.humaneval.as_deref());
        humaneval::load(&path)?
    } else {
        Vec::new()
    };
    let mut source = JobSource::new(&mix, problems)?;
    source.set_runtime(args.runtime);
    source.set_network(args.network);
    Ok(source)
}

/// Where worker logs go: under the report directory, else a temporary one (kept alive by the
/// returned guard).
fn log_dir(
    report_dir: Option<&std::path::Path>,
) -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
    if let Some(d) = report_dir {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        return Ok((d.join("logs"), None));
    }
    let t = tempfile::Builder::new()
        .prefix(&orphans::temp_prefix())
        .tempdir()?;
    Ok((t.path().to_owned(), Some(t)))
}

/// Removes what killed runs left behind, before this run makes its own.
fn sweep_orphans(args: &Args) {
    if args.spawn_workers.is_some() || args.hosts.is_some() || args.redis.is_none() {
        let swept = tokio::task::block_in_place(|| orphans::sweep(&mut SystemIp));
        if let Some(line) = swept.summary() {
            eprintln!("forkbox-loadgen: {line}");
        }
    }
}

fn start_hosts(args: &Args, run: &str) -> anyhow::Result<Option<SimulatedHosts>> {
    let Some(h) = args.hosts else {
        return Ok(None);
    };
    let hosts = tokio::task::block_in_place(|| SimulatedHosts::create(SystemIp, run, h))
        .context("creating simulated hosts")?;
    Ok(Some(hosts))
}

/// The run's own redis-server, unless `--redis` names one; reachable from the simulated hosts.
fn start_redis(args: &Args, hosts: Option<&SimulatedHosts>) -> anyhow::Result<Option<RedisServer>> {
    if args.redis.is_some() {
        return Ok(None);
    }
    let bind: Vec<IpAddr> = hosts.iter().map(|h| IpAddr::V4(h.bridge_addr())).collect();
    let appendonly = args.restart_redis_at.is_some();
    let options = RedisServerOptions {
        appendonly,
        extra_bind: bind,
        temp_prefix: format!("{}redis-", orphans::temp_prefix()),
        ..RedisServerOptions::default()
    };
    let server = tokio::task::block_in_place(|| RedisServer::start_with(options))
        .context("starting redis-server")?;
    Ok(Some(server))
}

/// The driver with its progress bar, and the Redis version; warns when no worker serves the
/// queue and the run starts none.
async fn open_driver(
    args: &Args,
    redis_url: &str,
    run: &str,
    t0: Instant,
    cancel: &watch::Receiver<bool>,
) -> anyhow::Result<(Driver, String)> {
    let target = Target::open(redis_url, args.cluster, &args.redis_tls()).await?;
    let mut driver = Driver::new(
        target,
        &args.queue,
        args.partitions,
        run,
        t0,
        cancel.clone(),
    )?;
    if !args.quiet {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>8} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
            )
            .expect("static template"),
        );
        driver.progress = bar;
    }
    // The first contact with Redis, so an unreachable one is named by its address.
    let redis_version = redis_version(driver.client(), driver.keys()).await?;
    check_partitions(redis_url, args, &args.queue, args.partitions).await?;
    if args.spawn_workers.is_none() && live_workers(driver.client(), driver.keys()).await? == 0 {
        driver.progress.suspend(|| {
            eprintln!(
                "forkbox-loadgen: no worker is serving queue {q} on this Redis (no live \
                 heartbeat); its jobs wait until one starts (forkbox worker --redis URL --queues \
                 {q}), or give --spawn-workers K",
                q = args.queue
            )
        });
    }
    Ok((driver, redis_version))
}

/// When a measured phase stops: after `--jobs`, `--duration`, or one ramp step's time.
fn phase_length(args: &Args) -> Stop {
    match (args.jobs, args.duration) {
        (Some(n), _) => Stop::Jobs(n),
        (None, Some(d)) => Stop::After(Duration::from_secs_f64(d)),
        (None, None) => Stop::After(Duration::from_secs_f64(args.ramp_step_secs)),
    }
}

/// The faults a measured phase injects, at their points of progress.
fn faults(args: &Args) -> Vec<(f64, Fault)> {
    let mut faults = Vec::new();
    if let Some(p) = args.kill_worker_at {
        faults.push((p, Fault::KillWorker));
    }
    if let Some(p) = args.restart_redis_at {
        faults.push((p, Fault::RestartRedis));
    }
    if let Some(p) = args.kill_redis_primary_at {
        faults.push((p, Fault::KillRedisPrimary));
    }
    faults
}

/// One step of the run with `k` workers: their start, the warm-up, then the ramp or the
/// measured phase.
async fn run_step(
    plan: &Plan<'_>,
    step: usize,
    k: usize,
    local: &mut LocalCluster<'_>,
    driver: &mut Driver,
    source: &mut JobSource,
    measured: &mut Measurements,
) -> anyhow::Result<()> {
    let args = plan.args;
    let spawned = local.worker_cfg.is_some() && k > 0;
    let fleet_name = format!("{}-{step}", plan.run);
    if spawned && args.backlog {
        // Started by the phase once every job is in the queue.
        local.held_back = Some((fleet_name, k));
    } else if spawned {
        local.start(&fleet_name, k)?;
    }
    // A backlog run measures from its first result, so start-up needs no warm-up (and
    // warm-up jobs would need workers running before the backlog is in).
    let warmup = args.warmup.unwrap_or(if spawned && !args.backlog {
        2 * k as u64 * u64::from(args.slots)
    } else {
        0
    });
    if warmup > 0 {
        warm_up(plan, step, k, warmup, spawned, local, driver).await?;
    }
    if args.ramp {
        ramp(plan, k, spawned, local, driver, source, measured).await
    } else {
        measure(plan, step, k, spawned, local, driver, source, measured).await
    }
}

/// `warmup` no-op jobs, so the measured phase starts on warm workers.
async fn warm_up(
    plan: &Plan<'_>,
    step: usize,
    k: usize,
    warmup: u64,
    spawned: bool,
    local: &mut LocalCluster<'_>,
    driver: &mut Driver,
) -> anyhow::Result<()> {
    let args = plan.args;
    driver.progress.set_prefix("warm-up");
    let mut noop = JobSource::new(&Mix::parse("noop")?, Vec::new())?;
    let spec = PhaseSpec {
        tag: format!("w{step}"),
        load: Load::Closed {
            concurrency: (k.max(1) * args.slots as usize).max(1),
        },
        stop: Stop::Jobs(warmup),
        drain_timeout: Duration::from_secs(60),
        faults: Vec::new(),
    };
    let c: Option<&mut dyn Cluster> = if spawned { Some(local) } else { None };
    let o = driver.run_phase(&spec, &mut noop, c).await?;
    if !o.interrupted && o.lost() > 0 {
        bail!(
            "{} of {warmup} warm-up jobs got no result within {:?}: are the workers \
             reading queue {:?} on {}? (logs in {})",
            o.lost(),
            spec.drain_timeout,
            args.queue,
            plan.worker_redis_url,
            plan.log_dir.display()
        );
    }
    Ok(())
}

/// Open-loop steps of rising rate until one is not sustained (or the steps or time run out).
async fn ramp(
    plan: &Plan<'_>,
    k: usize,
    spawned: bool,
    local: &mut LocalCluster<'_>,
    driver: &mut Driver,
    source: &mut JobSource,
    measured: &mut Measurements,
) -> anyhow::Result<()> {
    let args = plan.args;
    let increment = args.ramp_step.unwrap_or(args.ramp_start);
    for i in 0..args.ramp_max_steps {
        if *plan.cancel.borrow() {
            break;
        }
        if let Some(d) = args.duration {
            if plan.t0.elapsed().as_secs_f64() >= d {
                break;
            }
        }
        let rate = args.ramp_start + increment * i as f64;
        driver.progress.set_prefix(format!("{rate:.0}/s"));
        let spec = PhaseSpec {
            tag: format!("r{i}"),
            load: Load::Open { rate },
            stop: Stop::After(Duration::from_secs_f64(args.ramp_step_secs)),
            drain_timeout: plan.drain_timeout,
            faults: Vec::new(),
        };
        let c: Option<&mut dyn Cluster> = if spawned { Some(&mut *local) } else { None };
        let o = driver.run_phase(&spec, source, c).await?;
        let rec = &o.recorder;
        let sent = rec.sent_count().max(1) as f64;
        let error_rate = (o.lost() + rec.unexpected) as f64 / sent;
        let st = report::ramp_step(
            rate,
            rec.throughput(),
            percentiles_ms(&rec.latency).p99,
            error_rate,
            args.ramp_p99_ms,
            args.ramp_max_error_rate,
        );
        let sustained = st.sustained;
        measured.ramp_steps.push(st);
        measured.tags.push(spec.tag.clone());
        measured.phases.push(MeasuredPhase {
            outcome: o,
            workers: spawned.then_some(k),
            load: spec.load,
        });
        if !sustained {
            break;
        }
    }
    Ok(())
}

/// The measured phase of a plain, backlog or scaling run.
#[allow(clippy::too_many_arguments)]
async fn measure(
    plan: &Plan<'_>,
    step: usize,
    k: usize,
    spawned: bool,
    local: &mut LocalCluster<'_>,
    driver: &mut Driver,
    source: &mut JobSource,
    measured: &mut Measurements,
) -> anyhow::Result<()> {
    let args = plan.args;
    driver.progress.set_prefix(if args.scale {
        format!("K={k}")
    } else if args.backlog {
        "backlog".into()
    } else {
        "run".into()
    });
    let concurrency = args
        .concurrency
        .unwrap_or_else(|| (2 * k.max(1) * args.slots as usize).max(1));
    let load = match args.rate {
        _ if args.backlog => Load::Backlog,
        Some(rate) => Load::Open { rate },
        None => Load::Closed { concurrency },
    };
    let spec = PhaseSpec {
        tag: format!("m{step}"),
        load,
        stop: plan.length,
        drain_timeout: plan.drain_timeout,
        faults: plan.faults.clone(),
    };
    let c: Option<&mut dyn Cluster> = if spawned { Some(local) } else { None };
    let o = driver.run_phase(&spec, source, c).await?;
    measured.scale_points.push((
        k,
        o.recorder.throughput(),
        percentiles_ms(&o.recorder.latency).p99,
    ));
    measured.tags.push(spec.tag.clone());
    measured.phases.push(MeasuredPhase {
        outcome: o,
        workers: spawned.then_some(k),
        load,
    });
    Ok(())
}

fn build_report(
    args: &Args,
    mut measured: Measurements,
    labels: &[String],
    environment: Environment,
) -> anyhow::Result<Report> {
    let parameters = serde_json::to_value(args)?;
    let mut report = Report::build(
        &mut measured.phases,
        &measured.tags,
        labels,
        parameters,
        environment,
    );
    if args.scale {
        report.scaling = Some(report::scaling_points(&measured.scale_points));
    }
    if args.ramp {
        report.ramp = Some(RampSummary {
            p99_bound_ms: args.ramp_p99_ms,
            max_error_rate: args.ramp_max_error_rate,
            max_sustainable_jobs_per_s: report::max_sustainable(&measured.ramp_steps),
            steps: measured.ramp_steps,
        });
    }
    Ok(report)
}

/// `report.json`, `report.md` and the plots, under `dir`.
fn write_report(report: &Report, dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(report)?)?;
    std::fs::write(dir.join("report.md"), report.markdown())?;
    crate::plot::write_all(report, dir)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn check(extra: &[&str]) -> anyhow::Result<Vec<usize>> {
        let mut argv = vec!["forkbox-loadgen", "--jobs", "10"];
        argv.extend_from_slice(extra);
        validate(&Args::try_parse_from(argv).unwrap())
    }

    #[test]
    fn worker_counts_are_checked_before_anything_starts() {
        let err = |extra: &[&str]| check(extra).unwrap_err().to_string();
        assert!(err(&["--kill-worker-at", "30%"]).contains("--spawn-workers 2 or more"));
        assert!(err(&["--spawn-workers", "1", "--kill-worker-at", "30%"]).contains("every phase"));
        // A scaling run's first phase has one worker.
        let scale = err(&["--spawn-workers", "4", "--scale", "--kill-worker-at", "30%"]);
        assert!(scale.contains("--scale-steps 2,4"), "{scale}");
        let steps = ["--spawn-workers", "4", "--scale", "--scale-steps", "1,4"];
        assert!(check(&[&steps[..], &["--kill-worker-at", "30%"]].concat()).is_err());

        check(&["--spawn-workers", "2", "--kill-worker-at", "30%"]).unwrap();
        let steps = ["--spawn-workers", "2", "--scale", "--scale-steps", "2,4"];
        let e = check(&steps).unwrap_err().to_string();
        assert!(e.contains("4 is more than the 2 workers"), "{e}");
        let steps = ["--spawn-workers", "4", "--scale", "--scale-steps", "2,4"];
        check(&[&steps[..], &["--kill-worker-at", "30%"]].concat()).unwrap();
    }

    #[test]
    fn a_backlog_needs_a_job_count_and_no_warm_up() {
        check(&["--backlog", "--spawn-workers", "2"]).unwrap();
        let e = check(&["--backlog", "--warmup", "4"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--warmup does not apply to --backlog"), "{e}");
        // A backlog is a job count sent at once: not a duration, a rate or a concurrency.
        let parse = |argv: &[&str]| Args::try_parse_from([&["forkbox-loadgen"], argv].concat());
        let by_time = parse(&["--backlog", "--duration", "5"]).unwrap();
        let e = validate(&by_time).unwrap_err().to_string();
        assert!(e.contains("give --jobs N"), "{e}");
        for other in [["--rate", "5"], ["--concurrency", "4"]] {
            assert!(parse(&[&["--backlog", "--jobs", "10"][..], &other].concat()).is_err());
        }
    }
}
