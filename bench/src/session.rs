//! `forkbox-bench session`: what a session costs at the engine level, against a warm one-shot
//! job measured in the same run: open → first `run_code` result, fresh and from a sandbox
//! prepared ahead of demand (alternated, the preparation off the clock), the `run_code` round
//! trip, and the memory an idle session holds beyond the zygote's shared pages.

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use forkbox::sandbox::{Engine, SandboxSession, SessionShape, SessionSpec};
use forkbox_queue::schema::{Job, Runtime, Status};
use serde_json::{json, Value};

use crate::spawn::percentiles;
use crate::{runtime, EngineArgs};

#[derive(Debug, Args)]
pub struct SessionBenchArgs {
    /// Sessions opened (each: open, then its first run_code).
    #[arg(long, default_value_t = 20)]
    pub opens: usize,
    /// run_code round trips in one session.
    #[arg(long, default_value_t = 200)]
    pub calls: usize,
    #[command(flatten)]
    pub engine: EngineArgs,
}

pub fn main(args: SessionBenchArgs) -> anyhow::Result<ExitCode> {
    let engine = Engine::start(args.engine.engine_config(2))?;
    anyhow::ensure!(
        engine.runtime_zygote_pid().is_some(),
        "the warm Python runtime is off (--python-preload none?)"
    );
    let rt = runtime()?;
    rt.block_on(async {
        let spec = || SessionSpec {
            runtime: Some(Runtime::Python),
            ttl_ms: 600_000,
            ..SessionSpec::default()
        };
        // Baseline: a warm one-shot job that prints a sum, what a session's first call replaces.
        let job = Job {
            runtime: Some(Runtime::Python),
            ..Job::argv(["python3", "-c", "print(1 + 1)"])
        };
        let mut one_shot = Vec::new();
        let mut first = Vec::new();
        let mut opened = Vec::new();
        let (mut handed_first, mut handed) = (Vec::new(), Vec::new());
        let shape = SessionShape::of(&spec()).expect("a plain spec has a shape");
        for _ in 0..args.opens {
            // Prepared as the node's pool would, before the create: off the clock.
            let prepared = engine.prepare_session(shape).await?;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let t = Instant::now();
            let mut s = prepared.hand_over(&engine, &spec()).await?;
            handed.push(t.elapsed().as_secs_f64() * 1e6);
            let r = call(&mut s, "1 + 1").await?;
            anyhow::ensure!(r["text"] == "2", "first run_code: {r}");
            handed_first.push(t.elapsed().as_secs_f64() * 1e6);
            s.kill().await;
            let t = Instant::now();
            let outcome = engine.run(&job).await;
            anyhow::ensure!(outcome.status == Status::Ok, "baseline job: {outcome:?}");
            one_shot.push(t.elapsed().as_secs_f64() * 1e6);
            let t = Instant::now();
            let mut s = engine.open_session(spec()).await?;
            opened.push(t.elapsed().as_secs_f64() * 1e6);
            let r = call(&mut s, "1 + 1").await?;
            anyhow::ensure!(r["text"] == "2", "first run_code: {r}");
            first.push(t.elapsed().as_secs_f64() * 1e6);
            s.kill().await;
        }
        let mut s = engine.open_session(spec()).await?;
        call(&mut s, "x = 0").await?;
        let mut trips = Vec::new();
        for _ in 0..args.calls {
            let t = Instant::now();
            call(&mut s, "x += 1\nx").await?;
            trips.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let idle = idle_memory(&s);
        let mut cold = engine
            .open_session(SessionSpec {
                runtime: None,
                ..spec()
            })
            .await?;
        call(&mut cold, "x = 0").await?;
        let idle_cold = idle_memory(&cold);
        let (b50, b99, _, _) = percentiles(one_shot);
        let (f50, f99, _, n) = percentiles(first);
        let (o50, o99, _, _) = percentiles(opened);
        let (h50, h99, _, _) = percentiles(handed_first);
        let (ho50, ho99, _, _) = percentiles(handed);
        let (r50, r99, _, m) = percentiles(trips);
        println!("session, engine level ({n} opens, {m} round trips, debug or release as built)");
        println!("  warm one-shot job (baseline)      p50 {:>9.0} µs  p99 {:>9.0} µs", b50, b99);
        println!(
            "  open → first run_code result      p50 {:>9.0} µs  p99 {:>9.0} µs  ({:.2}× the one-shot job)",
            f50,
            f99,
            f50 / b50
        );
        println!(
            "    of which open (supervisor ready) p50 {:>9.0} µs  p99 {:>9.0} µs",
            o50, o99
        );
        println!(
            "  prepared: hand-over → first result p50 {:>9.0} µs  p99 {:>9.0} µs  ({:.2}× the one-shot job, {:.2}× fresh)",
            h50,
            h99,
            h50 / b50,
            h50 / f50
        );
        println!(
            "    of which the hand-over (setup)   p50 {:>9.0} µs  p99 {:>9.0} µs",
            ho50, ho99
        );
        println!(
            "  run_code round trip               p50 {:>9.0} µs  p99 {:>9.0} µs  ({:.3}× the one-shot job)",
            r50,
            r99,
            r50 / b50
        );
        for (name, m) in [("warm", idle), ("cold", idle_cold)] {
            println!(
                "  idle {name} session (supervisor + kernel): Pss {} KiB, Private_Dirty {} KiB, Rss {} KiB",
                m.pss_kb, m.private_dirty_kb, m.rss_kb
            );
        }
        s.kill().await;
        cold.kill().await;
        Ok(ExitCode::SUCCESS)
    })
}

async fn call(s: &mut SandboxSession, code: &str) -> anyhow::Result<Value> {
    let frame = json!({"id": "bench", "op": "run_code", "code": code});
    s.send(&serde_json::to_vec(&frame)?).await?;
    loop {
        let frame = s
            .recv()
            .await
            .map_err(|end| anyhow::anyhow!("session ended: {}", end.message()))?;
        let event: Value = serde_json::from_slice(&frame)?;
        if event["kind"] == "result" {
            return Ok(event);
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Memory {
    pss_kb: u64,
    private_dirty_kb: u64,
    rss_kb: u64,
}

/// The supervisor's and its kernel's `smaps_rollup`, summed (host pids: the supervisor is the
/// sandbox's launcher, the kernel its child).
fn idle_memory(s: &SandboxSession) -> Memory {
    let Some(supervisor) = s.host_pids().and_then(|p| p.get(1).copied()) else {
        return Memory::default();
    };
    let children =
        std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))
            .unwrap_or_default();
    let mut total = Memory::default();
    let pids = std::iter::once(supervisor.to_string())
        .chain(children.split_whitespace().map(str::to_owned));
    for pid in pids {
        let rollup =
            std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
        let field = |name: &str| {
            rollup
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        total.pss_kb += field("Pss:");
        total.private_dirty_kb += field("Private_Dirty:");
        total.rss_kb += field("Rss:");
    }
    total
}
