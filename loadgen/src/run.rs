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
use crate::driver::{Cluster, Driver, Fault, Load, PhaseSpec, Stop};
use crate::humaneval;
use crate::mix::{JobSource, Mix};
use crate::netns::{SimulatedHosts, SystemIp};
use crate::orphans;
use crate::report::{self, Environment, MeasuredPhase, RampSummary, Report};
use crate::stats::percentiles_ms;
use forkbox_queue::{Keys, RedisServer, RedisServerOptions};

/// Workers and Redis as the phases see them.
struct LocalCluster<'a> {
    fleet: Fleet,
    /// Workers to start when a backlog is in: (fleet name, worker count).
    held_back: Option<(String, usize)>,
    worker_cfg: Option<&'a WorkerConfig>,
    netns: &'a [String],
    redis: Option<&'a mut RedisServer>,
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
/// with its address (never the URL, which may hold a password).
async fn redis_version(client: &redis::Client) -> anyhow::Result<String> {
    let mut c = crate::driver::connect(client).await.with_context(|| {
        format!(
            "cannot reach Redis at {} (is it running? without --redis the load generator \
             starts its own)",
            client.get_connection_info().addr
        )
    })?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut c)
        .await
        .unwrap_or_default();
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("")
        .trim()
        .to_owned())
}

/// Workers whose heartbeat on this queue is live (their keys expire when they stop).
async fn live_workers(client: &redis::Client, keys: &Keys) -> anyhow::Result<usize> {
    let mut c = crate::driver::connect(client).await?;
    let pattern = format!("{}*", glob_escape(&keys.worker("")));
    let (mut cursor, mut found) = (0u64, 0);
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await
            .context("looking for the queue's workers")?;
        found += batch.len();
        if next == 0 {
            return Ok(found);
        }
        cursor = next;
    }
}

/// `s` matched literally by a Redis glob pattern.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
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

pub async fn run(args: Args, cancel: watch::Receiver<bool>) -> anyhow::Result<Report> {
    let steps = validate(&args)?;
    let t0 = Instant::now();
    let run = args.run_id.clone().unwrap_or_else(run_id);
    let mix = Mix::from_arg(&args.mix)?;
    let problems = if mix.needs_humaneval() {
        let path = humaneval::locate(args.humaneval.as_deref());
        humaneval::load(&path)?
    } else {
        Vec::new()
    };
    let mut source = JobSource::new(&mix, problems)?;
    let labels = source.labels().to_vec();

    let report_dir = args.report.clone();
    if let Some(d) = &report_dir {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let _log_tmp;
    let log_dir = match &report_dir {
        Some(d) => d.join("logs"),
        None => {
            let t = tempfile::Builder::new()
                .prefix(&orphans::temp_prefix())
                .tempdir()?;
            let p = t.path().to_owned();
            _log_tmp = t;
            p
        }
    };

    if args.spawn_workers.is_some() || args.hosts.is_some() || args.redis.is_none() {
        let swept = tokio::task::block_in_place(|| orphans::sweep(&mut SystemIp));
        if let Some(line) = swept.summary() {
            eprintln!("forkbox-loadgen: {line}");
        }
    }
    // Guards, in set-up order: dropped in reverse.
    let hosts = match args.hosts {
        Some(h) => Some(
            tokio::task::block_in_place(|| SimulatedHosts::create(SystemIp, &run, h))
                .context("creating simulated hosts")?,
        ),
        None => None,
    };
    let mut own_redis = match &args.redis {
        Some(_) => None,
        None => {
            let bind: Vec<IpAddr> = hosts.iter().map(|h| IpAddr::V4(h.bridge_addr())).collect();
            let appendonly = args.restart_redis_at.is_some();
            let options = RedisServerOptions {
                appendonly,
                extra_bind: bind,
                temp_prefix: format!("{}redis-", orphans::temp_prefix()),
                ..RedisServerOptions::default()
            };
            Some(
                tokio::task::block_in_place(|| RedisServer::start_with(options))
                    .context("starting redis-server")?,
            )
        }
    };
    let redis_url = match (&args.redis, &own_redis) {
        (Some(u), _) => u.clone(),
        (None, Some(r)) => r.url(),
        (None, None) => unreachable!("own Redis is started when no URL is given"),
    };
    let worker_redis_url = match (&hosts, &own_redis) {
        (Some(h), Some(r)) => r.url_via(IpAddr::V4(h.bridge_addr())),
        _ => redis_url.clone(),
    };

    let faulty = args.kill_worker_at.is_some() || args.restart_redis_at.is_some();
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
        extra_args: args.worker_args.clone(),
        log_dir: log_dir.clone(),
    });
    let netns_names: Vec<String> = hosts
        .iter()
        .flat_map(|h| h.hosts().iter().map(|h| h.netns.clone()))
        .collect();

    let mut driver = Driver::new(&redis_url, &args.queue, &run, t0, cancel.clone())?;
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
    let redis_version = redis_version(driver.client()).await?;
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

    let length = match (args.jobs, args.duration) {
        (Some(n), _) => Stop::Jobs(n),
        (None, Some(d)) => Stop::After(Duration::from_secs_f64(d)),
        (None, None) => Stop::After(Duration::from_secs_f64(args.ramp_step_secs)),
    };
    let mut faults = Vec::new();
    if let Some(p) = args.kill_worker_at {
        faults.push((p, Fault::KillWorker));
    }
    if let Some(p) = args.restart_redis_at {
        faults.push((p, Fault::RestartRedis));
    }

    let mut measured: Vec<MeasuredPhase> = Vec::new();
    let mut tags: Vec<String> = Vec::new();
    let mut scale_points = Vec::new();
    let mut ramp_steps = Vec::new();
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
            log_dir: log_dir.clone(),
        };
        let spawned = worker_cfg.is_some() && k > 0;
        let fleet_name = format!("{run}-{step}");
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
        let concurrency = args
            .concurrency
            .unwrap_or_else(|| (2 * k.max(1) * args.slots as usize).max(1));
        if warmup > 0 {
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
            let c: Option<&mut dyn Cluster> = if spawned { Some(&mut local) } else { None };
            let o = driver.run_phase(&spec, &mut noop, c).await?;
            if !o.interrupted && o.lost() > 0 {
                bail!(
                    "{} of {warmup} warm-up jobs got no result within {:?}: are the workers \
                     reading queue {:?} on {worker_redis_url}? (logs in {})",
                    o.lost(),
                    spec.drain_timeout,
                    args.queue,
                    log_dir.display()
                );
            }
        }
        if args.ramp {
            let increment = args.ramp_step.unwrap_or(args.ramp_start);
            for i in 0..args.ramp_max_steps {
                if *cancel.borrow() {
                    break;
                }
                if let Some(d) = args.duration {
                    if t0.elapsed().as_secs_f64() >= d {
                        break;
                    }
                }
                let rate = args.ramp_start + increment * i as f64;
                driver.progress.set_prefix(format!("{rate:.0}/s"));
                let spec = PhaseSpec {
                    tag: format!("r{i}"),
                    load: Load::Open { rate },
                    stop: Stop::After(Duration::from_secs_f64(args.ramp_step_secs)),
                    drain_timeout,
                    faults: Vec::new(),
                };
                let c: Option<&mut dyn Cluster> = if spawned { Some(&mut local) } else { None };
                let o = driver.run_phase(&spec, &mut source, c).await?;
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
                ramp_steps.push(st);
                tags.push(spec.tag.clone());
                measured.push(MeasuredPhase {
                    outcome: o,
                    workers: spawned.then_some(k),
                    load: spec.load,
                });
                if !sustained {
                    break;
                }
            }
        } else {
            driver.progress.set_prefix(if args.scale {
                format!("K={k}")
            } else if args.backlog {
                "backlog".into()
            } else {
                "run".into()
            });
            let load = match args.rate {
                _ if args.backlog => Load::Backlog,
                Some(rate) => Load::Open { rate },
                None => Load::Closed { concurrency },
            };
            let spec = PhaseSpec {
                tag: format!("m{step}"),
                load,
                stop: length,
                drain_timeout,
                faults: faults.clone(),
            };
            let c: Option<&mut dyn Cluster> = if spawned { Some(&mut local) } else { None };
            let o = driver.run_phase(&spec, &mut source, c).await?;
            scale_points.push((
                k,
                o.recorder.throughput(),
                percentiles_ms(&o.recorder.latency).p99,
            ));
            tags.push(spec.tag.clone());
            measured.push(MeasuredPhase {
                outcome: o,
                workers: spawned.then_some(k),
                load,
            });
        }
        tokio::task::block_in_place(|| local.fleet.stop(Duration::from_secs(10)));
    }
    driver.progress.finish_and_clear();

    let parameters = serde_json::to_value(&args)?;
    let mut report = Report::build(
        &mut measured,
        &tags,
        &labels,
        parameters,
        environment(redis_version, bin.as_ref()),
    );
    if args.scale {
        report.scaling = Some(report::scaling_points(&scale_points));
    }
    if args.ramp {
        report.ramp = Some(RampSummary {
            p99_bound_ms: args.ramp_p99_ms,
            max_error_rate: args.ramp_max_error_rate,
            max_sustainable_jobs_per_s: report::max_sustainable(&ramp_steps),
            steps: ramp_steps,
        });
    }
    if let Some(dir) = &report_dir {
        std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(&report)?)?;
        std::fs::write(dir.join("report.md"), report.markdown())?;
        crate::plot::write_all(&report, dir)?;
    }
    drop(own_redis);
    drop(hosts);
    Ok(report)
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
    fn glob_patterns_match_queue_names_literally() {
        assert_eq!(
            glob_escape("forkbox:{a*b?[c]\\}:"),
            "forkbox:{a\\*b\\?\\[c\\]\\\\}:"
        );
        assert_eq!(glob_escape("plain"), "plain");
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
