//! `forkbox-bench queue`: what the queue costs on top of the sandbox, measured in one run.
//!
//! On a private redis-server and one engine, it measures:
//!
//! 1. the raw in-process engine: `/bin/true` runs per second with S runs at a time (the
//!    baseline), and the latency of one run at a time;
//! 2. end to end through an in-process node with S slots: N `/bin/true` jobs enqueued in
//!    pipelined chunks through forkbox-queue's enqueue script, timed from the first enqueue to
//!    the last stored result;
//! 3. enqueue-to-result latency at light load: one job at a time, timed from before the
//!    enqueue to the result read back by a waiting client (`wait_result`);
//! 4. Redis cost per job during (2): round trips the node sent (counted by its broker in
//!    forkbox-queue, heartbeats and claim refreshes included) and the commands Redis executed
//!    (INFO commandstats deltas; script-internal calls included).
//!
//! It prints ratios against the baseline; `--json` prints the raw figures, `--section FILE`
//! writes a `bench/report.py` section for docs/benchmarks.md.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use forkbox_private_redis::RedisServer;
use forkbox_queue::{redis, Job, Queue, QueueConfig, Status};
use serde::Serialize;

use forkbox::node::{Node, NodeConfig, StopHandle, StopLevel};
use forkbox::sandbox::Engine;

use crate::{runtime, EngineArgs};

#[derive(Debug, Args)]
pub struct QueueBenchArgs {
    /// Jobs in the throughput runs.
    #[arg(long, default_value_t = 2000)]
    pub jobs: usize,
    /// Concurrent runs (engine) and node slots [default: the number of CPUs].
    #[arg(long)]
    pub slots: Option<usize>,
    /// Jobs in the light-load latency run (one at a time).
    #[arg(long, default_value_t = 300)]
    pub latency_jobs: usize,
    /// Do not check fresh entries for an existing result before running them (one round trip
    /// less per read; a raw re-XADD of a finished id then runs again, its result discarded).
    #[arg(long)]
    pub no_duplicate_check: bool,
    /// Print the figures as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write a bench/report.py section (e.g. bench/out/queue-overhead.json).
    #[arg(long, value_name = "FILE")]
    pub section: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Debug, Serialize)]
struct Latency {
    p50_ms: f64,
    p99_ms: f64,
    mean_ms: f64,
    n: usize,
}

fn latency(ms: Vec<f64>) -> Latency {
    let (p50_ms, p99_ms, mean_ms, n) = crate::spawn::percentiles(ms);
    Latency {
        p50_ms,
        p99_ms,
        mean_ms,
        n,
    }
}

#[derive(Debug, Serialize)]
struct QueueReport {
    jobs: usize,
    slots: usize,
    duplicate_check: bool,
    raw_engine_per_s: f64,
    raw_engine_latency: Latency,
    queue_per_s: f64,
    queue_vs_raw: f64,
    queue_latency: Latency,
    latency_overhead_p50_ms: f64,
    round_trips_per_job: f64,
    commands_per_job: f64,
    commands_by_name: BTreeMap<String, f64>,
    target_throughput_met: bool,
    target_latency_met: bool,
    target_round_trips_met: bool,
}

pub fn main(args: QueueBenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.jobs > 0 && args.latency_jobs > 0,
        "--jobs and --latency-jobs must be > 0"
    );
    let slots = args.slots.unwrap_or_else(forkbox::sandbox::default_slots);
    let server = RedisServer::start().context("starting a private redis-server")?;
    let engine =
        Engine::start(args.engine.engine_config(slots)).context("starting the sandbox engine")?;
    let report = runtime()?.block_on(measure(&server, engine, slots, &args))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    if let Some(path) = &args.section {
        std::fs::write(path, serde_json::to_string_pretty(&section(&report))?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn measure(
    server: &RedisServer,
    engine: Engine,
    slots: usize,
    args: &QueueBenchArgs,
) -> anyhow::Result<QueueReport> {
    let noop = Job::argv(["/bin/true"]);
    // Warm-up: the first runs fill caches and the pre-built sandbox pool.
    for _ in 0..slots * 4 {
        engine.run(&noop).await;
    }

    // 1. The raw engine.
    let t = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..slots {
        let engine = engine.clone();
        let noop = noop.clone();
        let n = args.jobs / slots + usize::from(s < args.jobs % slots);
        tasks.push(tokio::spawn(async move {
            for _ in 0..n {
                let o = engine.run(&noop).await;
                anyhow::ensure!(o.status == Status::Ok, "raw run failed: {:?}", o.error);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let raw_per_s = args.jobs as f64 / t.elapsed().as_secs_f64();
    let mut raw_ms = Vec::new();
    for _ in 0..args.latency_jobs {
        let t = Instant::now();
        engine.run(&noop).await;
        raw_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }

    // 2. Through an in-process node.
    let mut config = NodeConfig::new(server.url());
    config.queues = vec!["bench".into()];
    config.slots = slots;
    config.name = "bench-node".into();
    config.queue.skip_completed_on_read = !args.no_duplicate_check;
    let node = Node::new(config, engine);
    let trips = node.round_trips();
    let stop = StopHandle::default();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let node_task = tokio::spawn(node.run(stop.clone(), move |_| {
        let _ = ready_tx.send(());
    }));
    ready_rx
        .await
        .context("the node stopped before it was ready")?;
    let q = Queue::connect(&server.url(), "bench", QueueConfig::default()).await?;
    let mut admin = q.broker().connection();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await?;
    let trips_before = trips.get();
    let t = Instant::now();
    let ids = enqueue_all(&q, "tp", args.jobs).await?;
    wait_all(&q, &ids).await?;
    let queue_per_s = args.jobs as f64 / t.elapsed().as_secs_f64();
    let round_trips = (trips.get() - trips_before) as f64 / args.jobs as f64;
    let commands = commandstats(&mut admin).await?;

    // 3. Light load: one job at a time.
    let mut queue_ms = Vec::new();
    for i in 0..args.latency_jobs {
        let job = Job {
            id: Some(format!("lat-{i}")),
            ..noop.clone()
        };
        let t = Instant::now();
        q.enqueue(&job).await?;
        let r = q
            .wait_result(&format!("lat-{i}"), Duration::from_secs(30))
            .await?
            .context("no result within 30 s")?;
        queue_ms.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(r.outcome.status == Status::Ok, "job failed: {r:?}");
    }
    stop.raise(StopLevel::Drain);
    node_task.await??;

    // Commands per job, without the benchmark's own (the enqueue script is part of the
    // protocol; the polls for completion are not).
    let per_job: BTreeMap<String, f64> = commands
        .into_iter()
        .filter(|(name, _)| !matches!(name.as_str(), "config|resetstat" | "info" | "hget" | "ping"))
        .map(|(name, calls)| (name, calls as f64 / args.jobs as f64))
        .collect();
    let raw_latency = latency(raw_ms);
    let queue_latency = latency(queue_ms);
    Ok(QueueReport {
        jobs: args.jobs,
        slots,
        duplicate_check: !args.no_duplicate_check,
        raw_engine_per_s: raw_per_s,
        queue_per_s,
        queue_vs_raw: queue_per_s / raw_per_s,
        latency_overhead_p50_ms: queue_latency.p50_ms - raw_latency.p50_ms,
        round_trips_per_job: round_trips,
        commands_per_job: per_job.values().sum(),
        commands_by_name: per_job,
        target_throughput_met: queue_per_s >= 0.6 * raw_per_s,
        target_latency_met: queue_latency.p50_ms <= 3.0,
        target_round_trips_met: round_trips <= 2.0,
        raw_engine_latency: raw_latency,
        queue_latency,
    })
}

/// Enqueues `n` `/bin/true` jobs through forkbox-queue's enqueue script, pipelined (what
/// `forkbox submit`, `forkbox batch submit` and the load generator use), in one batch whose
/// `done` counter tells when all are finished.
async fn enqueue_all(q: &Queue, prefix: &str, n: usize) -> anyhow::Result<Vec<String>> {
    let jobs: Vec<Job> = (0..n)
        .map(|i| Job {
            id: Some(format!("{prefix}-{i}")),
            ..Job::argv(["/bin/true"])
        })
        .collect();
    let added = q.enqueue_batch(&jobs, prefix).await?;
    anyhow::ensure!(
        added.iter().all(|e| e.new),
        "a benchmark id was already taken"
    );
    Ok(added.into_iter().map(|e| e.id).collect())
}

async fn wait_all(q: &Queue, ids: &[String]) -> anyhow::Result<()> {
    let batch = ids[0].split('-').next().unwrap_or_default().to_owned();
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut conn = q.broker().connection();
    loop {
        let done: Option<u64> = redis::cmd("HGET")
            .arg(q.keys().batch(&batch))
            .arg("done")
            .query_async(&mut conn)
            .await?;
        if done.unwrap_or(0) >= ids.len() as u64 {
            let s = q.batch_status(&batch).await?;
            anyhow::ensure!(
                s.by_status.get("ok") == Some(&(ids.len() as u64)),
                "not every job ended ok: {:?}",
                s.by_status
            );
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "jobs still unfinished after 600 s"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `cmdstat_<name>:calls=N,...` lines of INFO commandstats.
async fn commandstats(
    conn: &mut forkbox_queue::Connection,
) -> anyhow::Result<BTreeMap<String, u64>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    Ok(info
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect())
}

fn print_report(r: &QueueReport) {
    println!(
        "forkbox-bench queue: {} /bin/true jobs, {} slot(s)",
        r.jobs, r.slots
    );
    println!();
    println!("{:<44} {:>10} {:>8}", "", "jobs/s", "vs raw");
    println!(
        "{:<44} {:>10.0} {:>7.2}×",
        "raw engine, in process (baseline)", r.raw_engine_per_s, 1.0
    );
    println!(
        "{:<44} {:>10.0} {:>7.2}×  (target ≥ 0.60×: {})",
        "queue: enqueue → stored result, one node",
        r.queue_per_s,
        r.queue_vs_raw,
        if r.target_throughput_met {
            "met"
        } else {
            "missed"
        }
    );
    println!();
    println!(
        "{:<44} {:>10} {:>8}",
        "latency, one job at a time", "p50 ms", "p99 ms"
    );
    println!(
        "{:<44} {:>10.2} {:>8.2}",
        "raw engine run", r.raw_engine_latency.p50_ms, r.raw_engine_latency.p99_ms
    );
    println!(
        "{:<44} {:>10.2} {:>8.2}  (target p50 ≤ 3 ms: {})",
        "enqueue → result (client-observed)",
        r.queue_latency.p50_ms,
        r.queue_latency.p99_ms,
        if r.target_latency_met {
            "met"
        } else {
            "missed"
        }
    );
    println!();
    println!(
        "Redis per job under load: {:.2} round trips sent by the node (target ≤ 2: {}), {:.2} commands executed",
        r.round_trips_per_job,
        if r.target_round_trips_met { "met" } else { "missed" },
        r.commands_per_job
    );
    let by: Vec<String> = r
        .commands_by_name
        .iter()
        .filter(|(_, n)| **n >= 0.01)
        .map(|(k, n)| format!("{k} {n:.2}"))
        .collect();
    println!("  commands: {}", by.join(", "));
}

/// A bench/report.py section.
fn section(r: &QueueReport) -> serde_json::Value {
    let rows = vec![
        vec![
            "raw engine, in process (baseline)".to_owned(),
            format!("{:.0}", r.raw_engine_per_s),
            "1.00×".to_owned(),
            format!("{:.2}", r.raw_engine_latency.p50_ms),
            format!("{:.2}", r.raw_engine_latency.p99_ms),
        ],
        vec![
            "queue: enqueue → stored result, one node".to_owned(),
            format!("{:.0}", r.queue_per_s),
            format!("{:.2}×", r.queue_vs_raw),
            format!("{:.2}", r.queue_latency.p50_ms),
            format!("{:.2}", r.queue_latency.p99_ms),
        ],
    ];
    serde_json::json!({
        "section": "queue-overhead",
        "order": 25,
        "title": "Queue overhead: one node against its own engine",
        "intro": format!(
            "`forkbox-bench queue --jobs {} --slots {}`: {} `/bin/true` jobs, enqueued with \
             forkbox-queue's enqueue script as forkbox's own clients do, through a private \
             redis-server and an in-process node, against the same engine driven directly with \
             the same concurrency. Latency is one job at a time (light load).",
            r.jobs, r.slots, r.jobs
        ),
        "tables": [{
            "columns": ["path", "jobs/s", "vs raw", "p50 ms (one at a time)", "p99 ms"],
            "rows": rows,
        }],
        "notes": [
            format!(
                "Targets: throughput ≥ 0.60× raw ({}), p50 enqueue-to-result ≤ 3 ms ({}), \
                 ≤ 2 Redis round trips per job ({}).",
                if r.target_throughput_met { "met" } else { "missed" },
                if r.target_latency_met { "met" } else { "missed" },
                if r.target_round_trips_met { "met" } else { "missed" },
            ),
            format!(
                "Redis per job under load: {:.2} round trips sent by the node, {:.2} commands \
                 executed (INFO commandstats, script-internal calls included).",
                r.round_trips_per_job, r.commands_per_job
            ),
        ],
    })
}
