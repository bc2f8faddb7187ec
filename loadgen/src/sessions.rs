//! The sessions benchmark (`forkbox-session-bench`): one real worker node and a private Redis,
//! measured through the queue as a client sees it.
//!
//! The baseline, measured in the same run: a one-shot job `python3 -c 'print(1)'` on the warm
//! runtime, enqueue to result. Then: create → first `run_code("print(1)")` result, on a node
//! that opens each session at its create (`--session-pool 0`) and, alternated with it in the
//! same rounds, on a second node that keeps one opened ahead of demand (`--session-pool 1`,
//! its own queue; how many creates took a prepared sandbox is read from its metrics); the
//! `run_code("x + 1")` round trip in one session; the memory an idle session holds (its
//! sandbox's processes, as `info` reports it); and how many sessions of `memory_mb = 256` one
//! node holds while a client calling each of them in turn still gets `run_code` answers
//! within 10 ms at p99. Nothing here asserts a time: it prints figures and ratios.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use forkbox_private_redis::RedisServer;
use forkbox_queue::session::{Call, CallOp, SessionSpec};
use forkbox_queue::{Broker, Event, Job, Limits, Queue, QueueConfig, Runtime, Status};

/// What to measure, and with which binary.
#[derive(Debug, Clone)]
pub struct SessionBench {
    /// The `forkbox` binary the worker runs.
    pub forkbox: PathBuf,
    /// Samples of the baseline and of create → first result.
    pub opens: usize,
    /// `run_code` round trips in one session.
    pub calls: usize,
    /// Session counts tried for the capacity figure, in order.
    pub levels: Vec<usize>,
    /// Rounds of calls (each session once per round) at each level.
    pub rounds: usize,
}

/// Percentiles of a sample, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub p50: f64,
    pub p99: f64,
    pub n: usize,
}

fn summary(mut ms: Vec<f64>) -> Summary {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
    Summary {
        p50: at(0.50),
        p99: at(0.99),
        n: ms.len(),
    }
}

/// A worker process, killed on drop.
struct Worker(Child);

/// Starts a worker on `queue` with `args`.
fn worker(
    b: &SessionBench,
    url: &str,
    name: &str,
    queue: &str,
    args: &[&str],
) -> anyhow::Result<Worker> {
    let child = Command::new(&b.forkbox)
        .args(["worker", "--redis", url, "--name", name, "--queues", queue])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", b.forkbox.display()))?;
    Ok(Worker(child))
}

/// A free loopback port for a worker's metrics.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One sample of a worker's `/metrics` page (a series without labels).
fn metric(port: u16, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    c.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut page = String::new();
    c.read_to_string(&mut page).ok()?;
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn call(q: &Queue, c: Call) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    match q
        .call_session(&c, Duration::from_secs(30), &mut |_| {})
        .await?
    {
        Event::Result(r) => Ok(r),
        other => bail!("call ended: {other:?}"),
    }
}

fn session_job(memory_mb: Option<u64>) -> Job {
    Job {
        session: Some(SessionSpec {
            ttl_s: Some(3600),
            idle_s: Some(600),
        }),
        runtime: Some(Runtime::Python),
        limits: Limits {
            memory_mb,
            ..Limits::default()
        },
        ..Job::default()
    }
}

/// Runs the benchmark and returns its report (Markdown).
pub async fn run(b: &SessionBench) -> anyhow::Result<String> {
    let redis = RedisServer::start().context("starting a private redis-server")?;
    let max = b.levels.iter().copied().max().unwrap_or(1) + 4;
    let (max_s, mem) = (max.to_string(), (max as u64 * 256).to_string());
    let _worker = worker(
        b,
        &redis.url(),
        "bench-node",
        "default",
        &[
            "--slots",
            "2",
            "--max-sessions",
            &max_s,
            "--session-memory-mb",
            &mem,
            "--session-pool",
            "0",
        ],
    )?;
    let port = free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let _pooled = worker(
        b,
        &redis.url(),
        "bench-pool",
        "pooled",
        &[
            "--slots",
            "2",
            "--session-pool",
            "1",
            "--metrics-addr",
            &addr,
        ],
    )?;
    let broker = Broker::connect(&redis.url()).await?;
    let q = broker.queue("default", QueueConfig::default())?;
    let qp = broker.queue("pooled", QueueConfig::default())?;
    // The first job waits for the node to come up.
    let warm = Job {
        runtime: Some(Runtime::Python),
        ..Job::argv(["python3", "-c", "print(1)"])
    };
    let id = q.enqueue(&warm).await?;
    let first = q.wait_result(&id, Duration::from_secs(120)).await?;
    anyhow::ensure!(
        first.is_some_and(|r| r.outcome.status == Status::Ok),
        "the worker did not run the first job"
    );
    let id = qp.enqueue(&warm).await?;
    let first = qp.wait_result(&id, Duration::from_secs(120)).await?;
    anyhow::ensure!(
        first.is_some_and(|r| r.outcome.status == Status::Ok),
        "the pooled worker did not run the first job"
    );
    let creates = creates(&q, &qp, &warm, b.opens).await?;
    let from_pool = metric(port, "forkbox_sessions_from_pool_total").unwrap_or(f64::NAN);

    let s = q
        .open_session(&session_job(None), Duration::from_secs(60))
        .await?;
    call(&q, Call::run_code(&s.id, "x = 0")).await?;
    let mut round_trip = Vec::new();
    for _ in 0..b.calls {
        let t = Instant::now();
        let r = call(&q, Call::run_code(&s.id, "x = x + 1\nx")).await?;
        round_trip.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(r["ok"] == true, "{r:?}");
    }
    let info = call(&q, Call::new(&s.id, CallOp::Info)).await?;
    let idle_kb = info["info"]["memory_kb"].as_u64().unwrap_or(0);
    call(&q, Call::new(&s.id, CallOp::Kill)).await?;

    let capacity = capacity(&q, b).await?;
    let (base, cf, rt, oo) = (
        summary(creates.baseline),
        summary(creates.create_first),
        summary(round_trip),
        summary(creates.open_only),
    );
    let (pf, po) = (summary(creates.pooled_first), summary(creates.pooled_open));
    let mut out = String::new();
    out.push_str(&format!(
        "| Measure | p50 ms | p99 ms | n | ratio to the baseline's p50 |\n\
         | --- | --- | --- | --- | --- |\n\
         | baseline: one-shot job `python3 -c 'print(1)'`, warm runtime, enqueue → result | {:.2} | {:.2} | {} | 1.00 |\n\
         | session create → first `run_code(\"print(1)\")` result | {:.2} | {:.2} | {} | {:.2} |\n\
         | of which create → opened (the create job's result) | {:.2} | {:.2} | {} | {:.2} |\n\
         | with `--session-pool 1`: create → first `run_code(\"print(1)\")` result | {:.2} | {:.2} | {} | {:.2} |\n\
         | of which create → opened | {:.2} | {:.2} | {} | {:.2} |\n\
         | `run_code(\"x + 1\")` round trip | {:.2} | {:.2} | {} | {:.2} |\n\n",
        base.p50, base.p99, base.n,
        cf.p50, cf.p99, cf.n, cf.p50 / base.p50,
        oo.p50, oo.p99, oo.n, oo.p50 / base.p50,
        pf.p50, pf.p99, pf.n, pf.p50 / base.p50,
        po.p50, po.p99, po.n, po.p50 / base.p50,
        rt.p50, rt.p99, rt.n, rt.p50 / base.p50,
    ));
    out.push_str(&format!(
        "With the pool, create → first result against without: {:.2}× at p50; {} of {} creates \
         took a prepared sandbox.\n\n",
        pf.p50 / cf.p50,
        from_pool,
        pf.n
    ));
    out.push_str(&format!(
        "Idle session memory (its sandbox's processes, `info.memory_kb`): {:.1} MiB.\n\n",
        idle_kb as f64 / 1024.0
    ));
    out.push_str(
        "| Sessions live (memory_mb 256) | run_code p50 ms | p99 ms | calls |\n| --- | --- | --- | --- |\n",
    );
    let mut held = 0;
    for (n, s) in &capacity {
        out.push_str(&format!(
            "| {n} | {:.2} | {:.2} | {} |\n",
            s.p50, s.p99, s.n
        ));
        if s.p99 <= 10.0 {
            held = held.max(*n);
        }
    }
    out.push_str(&format!(
        "\nLargest count measured with run_code p99 within 10 ms: {held}.\n"
    ));
    Ok(out)
}

/// Samples of the baseline and of create → first result, with and without the pool.
#[derive(Default)]
struct Creates {
    baseline: Vec<f64>,
    create_first: Vec<f64>,
    open_only: Vec<f64>,
    pooled_first: Vec<f64>,
    pooled_open: Vec<f64>,
}

/// `opens` rounds, each: the one-shot baseline on `q`, a create and its first `run_code` on
/// `q` (no pool), then the same on `qp` (the node with the pool).
async fn creates(q: &Queue, qp: &Queue, warm: &Job, opens: usize) -> anyhow::Result<Creates> {
    let mut c = Creates::default();
    for _ in 0..opens {
        let t = Instant::now();
        let id = q.enqueue(warm).await?;
        let r = q.wait_result(&id, Duration::from_secs(60)).await?;
        anyhow::ensure!(
            r.is_some_and(|r| r.outcome.status == Status::Ok),
            "baseline job"
        );
        c.baseline.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let s = q
            .open_session(&session_job(None), Duration::from_secs(60))
            .await?;
        c.open_only.push(t.elapsed().as_secs_f64() * 1e3);
        let r = call(q, Call::run_code(&s.id, "print(1)")).await?;
        anyhow::ensure!(r["ok"] == true, "first run_code: {r:?}");
        c.create_first.push(t.elapsed().as_secs_f64() * 1e3);
        call(q, Call::new(&s.id, CallOp::Kill)).await?;
        // The same on the node that keeps a session sandbox ready; it refills while the
        // next round's other measures run. Each session is ended once measured.
        let t = Instant::now();
        let s = qp
            .open_session(&session_job(None), Duration::from_secs(60))
            .await?;
        c.pooled_open.push(t.elapsed().as_secs_f64() * 1e3);
        let r = call(qp, Call::run_code(&s.id, "print(1)")).await?;
        anyhow::ensure!(r["ok"] == true, "first run_code (pooled): {r:?}");
        c.pooled_first.push(t.elapsed().as_secs_f64() * 1e3);
        call(qp, Call::new(&s.id, CallOp::Kill)).await?;
    }
    Ok(c)
}

/// Opens sessions of 256 MiB up to each level and calls each in turn, `rounds` times.
async fn capacity(q: &Queue, b: &SessionBench) -> anyhow::Result<Vec<(usize, Summary)>> {
    let mut live = Vec::new();
    let mut out = Vec::new();
    for &level in &b.levels {
        while live.len() < level {
            let s = q
                .open_session(&session_job(Some(256)), Duration::from_secs(60))
                .await?;
            call(q, Call::run_code(&s.id, "x = 0")).await?;
            live.push(s.id);
        }
        let mut ms = Vec::new();
        for _ in 0..b.rounds {
            for sid in &live {
                let t = Instant::now();
                call(q, Call::run_code(sid, "x = x + 1\nx")).await?;
                ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        out.push((level, summary(ms)));
    }
    for sid in &live {
        let _ = call(q, Call::new(sid, CallOp::Kill)).await;
    }
    Ok(out)
}
