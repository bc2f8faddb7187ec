//! The gateway's cost per request: the same program run through `forkbox gateway` over HTTP
//! (SandboxFusion's `POST /run_code`) and enqueued straight on Redis by a direct client
//! (`forkbox-queue`'s enqueue, then its result wait), alternating in rounds within one run so
//! both arms see the same workers, Redis and machine load.
//!
//! Each arm keeps `concurrency` requests in flight (one keep-alive HTTP connection per lane
//! for the gateway). Reported per arm: round-trip p50 and p99 and throughput; and the
//! gateway's own CPU time per request, from its `/proc/<pid>/stat` (user + system, every
//! thread) across its rounds, when its pid is given.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde::Serialize;

use forkbox_queue::{Broker, FileData, Job, Partitioned, QueueConfig, Runtime};

/// The program both arms run.
const PROGRAM: &str = "print(1)";
/// Rounds each arm runs, alternating (direct, gateway, direct, ...).
const ROUNDS: usize = 4;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Compare {
    /// The gateway's base URL (`http://127.0.0.1:2358`).
    pub url: String,
    /// The gateway's pid, for its CPU time.
    pub pid: Option<u32>,
    pub redis: String,
    pub queue: String,
    /// Requests per arm.
    pub jobs: usize,
    pub concurrency: usize,
}

/// One arm's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Arm {
    pub requests: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub throughput: f64,
}

/// Both arms, measured in one run.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub direct: Arm,
    pub gateway: Arm,
    /// The gateway's CPU time per request, in µs.
    pub gateway_cpu_us: Option<f64>,
}

impl Comparison {
    pub fn table(&self) -> String {
        let row = |name: &str, a: &Arm| {
            format!(
                "{name:<10} {:>8} {:>10.3} {:>10.3} {:>12.1}\n",
                a.requests, a.p50_ms, a.p99_ms, a.throughput
            )
        };
        let mut out = format!(
            "{:<10} {:>8} {:>10} {:>10} {:>12}\n",
            "arm", "requests", "p50 ms", "p99 ms", "jobs/s"
        );
        out += &row("direct", &self.direct);
        out += &row("gateway", &self.gateway);
        out += &format!(
            "gateway adds {:+.3} ms at p50 (target: at most 1 ms: {}); throughput {:.1}% of direct \
             (target: within 10%: {})\n",
            self.gateway.p50_ms - self.direct.p50_ms,
            verdict(self.gateway.p50_ms - self.direct.p50_ms <= 1.0),
            100.0 * self.gateway.throughput / self.direct.throughput,
            verdict(self.gateway.throughput >= 0.9 * self.direct.throughput),
        );
        match self.gateway_cpu_us {
            Some(us) => {
                out += &format!(
                    "gateway CPU per request: {us:.0} µs (target: at most 100 µs: {})\n",
                    verdict(us <= 100.0)
                )
            }
            None => out += "gateway CPU per request: not measured (give --gateway-pid)\n",
        }
        out
    }
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// The job a direct client sends for [`PROGRAM`]: what the gateway's translation of a
/// SandboxFusion `python` request gives (the runtime catalogue's python3 entry).
fn direct_job() -> Job {
    let mut job = Job::argv(["python3", "main.py"]);
    job.files
        .insert("main.py".into(), FileData::Text(PROGRAM.into()));
    job.runtime = Some(Runtime::Python);
    job.timeout_ms = Some(10_000);
    job
}

/// CPU ticks (user + system) of process `pid`, and the ticks per second.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').context("a /proc stat line")? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11).context("utime")?.parse()?;
    let stime: u64 = fields.get(12).context("stime")?.parse()?;
    Ok(utime + stime)
}

/// Clock ticks per second as /proc reports CPU times (USER_HZ, 100 on Linux).
const USER_HZ: f64 = 100.0;

async fn direct_lane(q: Partitioned, n: usize) -> anyhow::Result<Vec<Duration>> {
    let job = direct_job();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let id = q.enqueue(&job).await?;
        let r = q
            .wait_result(&id, Duration::from_secs(60))
            .await?
            .with_context(|| format!("no result for {id} within 60 s"))?;
        if r.outcome.stdout != "1\n" {
            bail!("direct job {id} gave {:?}", r.outcome);
        }
        out.push(t.elapsed());
    }
    Ok(out)
}

async fn gateway_lane(url: String, n: usize) -> anyhow::Result<Vec<Duration>> {
    let uri: hyper::Uri = format!("{url}/run_code")
        .parse()
        .context("the gateway URL")?;
    let host = uri
        .host()
        .context("the gateway URL has no host")?
        .to_owned();
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .with_context(|| format!("connecting to {host}:{port}"))?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let body = serde_json::json!({"code": PROGRAM, "language": "python"}).to_string();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let req = hyper::Request::post(uri.path())
            .header(hyper::header::HOST, format!("{host}:{port}"))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.clone())))?;
        let t = Instant::now();
        sender.ready().await?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        out.push(t.elapsed());
        let v: serde_json::Value = serde_json::from_slice(&bytes)?;
        if !status.is_success() || v["run_result"]["stdout"] != "1\n" {
            bail!("the gateway answered {status}: {v}");
        }
    }
    Ok(out)
}

/// Runs `lanes` copies of a lane of `n` requests at once; the latencies and the wall time.
async fn round<F, Fut>(lanes: usize, n: usize, lane: F) -> anyhow::Result<(Vec<Duration>, Duration)>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Vec<Duration>>> + Send + 'static,
{
    let t = Instant::now();
    let tasks: Vec<_> = (0..lanes)
        .map(|i| tokio::spawn(lane(n / lanes + usize::from(i < n % lanes))))
        .collect();
    let mut all = Vec::with_capacity(n);
    for task in tasks {
        all.extend(task.await??);
    }
    Ok((all, t.elapsed()))
}

/// Measures both arms.
pub async fn compare(c: &Compare) -> anyhow::Result<Comparison> {
    anyhow::ensure!(
        c.jobs >= ROUNDS * c.concurrency,
        "--jobs must be at least {} here",
        ROUNDS * c.concurrency
    );
    let broker = Broker::connect(&c.redis).await?;
    let q = broker
        .open_partitioned(&c.queue, 1, QueueConfig::default())
        .await?;
    // Warm both paths (connections, the workers' sandboxes) before measuring.
    round(c.concurrency, c.concurrency * 4, |n| {
        direct_lane(q.clone(), n)
    })
    .await?;
    round(c.concurrency, c.concurrency * 4, |n| {
        gateway_lane(c.url.clone(), n)
    })
    .await?;
    let per_round = c.jobs / ROUNDS;
    let (mut direct, mut gateway) = (Vec::new(), Vec::new());
    let (mut direct_wall, mut gateway_wall) = (Duration::ZERO, Duration::ZERO);
    let mut ticks = 0u64;
    for _ in 0..ROUNDS {
        let (lat, wall) = round(c.concurrency, per_round, |n| direct_lane(q.clone(), n)).await?;
        direct.extend(lat);
        direct_wall += wall;
        let before = c.pid.map(cpu_ticks).transpose()?;
        let (lat, wall) =
            round(c.concurrency, per_round, |n| gateway_lane(c.url.clone(), n)).await?;
        if let (Some(pid), Some(before)) = (c.pid, before) {
            ticks += cpu_ticks(pid)? - before;
        }
        gateway.extend(lat);
        gateway_wall += wall;
    }
    let arm = |mut lat: Vec<Duration>, wall: Duration| {
        lat.sort();
        Arm {
            requests: lat.len(),
            p50_ms: percentile(&lat, 0.5),
            p99_ms: percentile(&lat, 0.99),
            throughput: lat.len() as f64 / wall.as_secs_f64(),
        }
    };
    let gateway = arm(gateway, gateway_wall);
    Ok(Comparison {
        gateway_cpu_us: c
            .pid
            .map(|_| ticks as f64 / USER_HZ * 1e6 / gateway.requests as f64),
        direct: arm(direct, direct_wall),
        gateway,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_the_verdicts_of_the_targets() {
        let lat: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&lat, 0.5), 51.0);
        assert_eq!(percentile(&lat, 0.99), 99.0);
        let arm = |p50_ms, throughput| Arm {
            requests: 100,
            p50_ms,
            p99_ms: p50_ms,
            throughput,
        };
        let c = Comparison {
            direct: arm(10.0, 100.0),
            gateway: arm(12.0, 80.0),
            gateway_cpu_us: Some(150.0),
        };
        let t = c.table();
        assert!(
            t.contains("adds +2.000 ms at p50 (target: at most 1 ms: MISSED)"),
            "{t}"
        );
        assert!(
            t.contains("80.0% of direct (target: within 10%: MISSED)"),
            "{t}"
        );
        assert!(t.contains("150 µs (target: at most 100 µs: MISSED)"), "{t}");
        let c = Comparison {
            direct: arm(10.0, 100.0),
            gateway: arm(10.5, 95.0),
            gateway_cpu_us: None,
        };
        let t = c.table();
        assert!(
            t.contains("(target: at most 1 ms: met)") && t.contains("(target: within 10%: met)"),
            "{t}"
        );
    }

    #[test]
    fn the_direct_job_is_valid() {
        direct_job().validate().unwrap();
    }
}
