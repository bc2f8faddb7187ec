//! `forkbox-bench fork`: a live session's fork (`Engine::fork_session`) end to end, against a
//! baseline measured in the same run: opening a fresh session and building the same state and
//! files again, which is what a branch without the fork would cost.
//!
//! The parent session builds `MiB` of Python state (a dict of strings and a list of random
//! bytes) and writes `--files-mib` of files to its disk. Per run: the baseline (open a session,
//! build the state, write the files, to that cell's result), then fork(1) and fork(N), each
//! timed from the call to every branch's first `run_code` result (the state's size, checked).
//! Printed: the parent's pause, the fork's own time, the branch's first result, and each over
//! the baseline; then fork(1) step by step (the branch's open, the freeze, the disk copy, the
//! twin copy and its own steps, the join, the first `run_code`), each the median of the runs.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use forkbox::sandbox::{Engine, ForkedBranch, PythonSettings, SandboxSession, SessionSpec};
use forkbox_queue::schema::{Limits, Runtime};
use serde_json::{json, Value};

use crate::{runtime, EngineArgs};

#[derive(Debug, Args)]
pub struct ForkBenchArgs {
    /// Python state of the parent, in MiB.
    #[arg(long, default_value_t = 50)]
    pub state_mib: u64,
    /// Files on the parent's disk, in MiB (one file per MiB).
    #[arg(long, default_value_t = 10)]
    pub files_mib: u64,
    /// The wider fork's branches.
    #[arg(long, default_value_t = 8)]
    pub wide: usize,
    /// Runs (the median is printed).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// The state and files, built in one cell; its value is the state's size, which each branch
/// must give back. `{mb}` and `{files}` are filled in.
const BUILD: &str = r#"
import random, os
state = {"d": {f"k{i}": "v" * (i % 50) + str(i) for i in range({mb} * 3000)},
         "blobs": [random.randbytes(1024) for _ in range({mb} * 512)]}
os.makedirs("data", exist_ok=True)
for i in range({files}):
    with open(f"data/f{i}.bin", "wb") as f:
        f.write(random.randbytes(1 << 20))
(len(state["d"]), len(state["blobs"]))
"#;

const CHECK: &str = r#"(len(state["d"]), len(state["blobs"]))"#;

/// One run's figures, in ms.
struct Run {
    rebuild: f64,
    pause: [f64; 2],
    fork: [f64; 2],
    first: [f64; 2],
    /// fork(1)'s steps, named, in the order of [`STEPS`].
    steps: Vec<f64>,
}

/// fork(1)'s steps as printed: the node's steps, the twin copy's own within it, and what is
/// left of the fork's time (the parent's kernel told to reap the frozen copy, the branch's
/// result assembled).
const STEPS: [&str; 14] = [
    "branch sandbox open (to its hello)",
    "freeze (the parent's fork, F found stopped)",
    "disk copy",
    "twin copy",
    "  inspect (seize, maps, pagemaps, fds)",
    "  mappings set up (injected calls)",
    "  memory: read F's pages",
    "  memory: write T's pages",
    "  memory: T's pagemap, pages dropped",
    "  fds reopened, cwd, umask",
    "  finish (T's figures, registers, detach)",
    "join (fork_join: reseed)",
    "rest of fork_session",
    "first run_code (after fork_session)",
];

pub fn main(args: ForkBenchArgs) -> anyhow::Result<std::process::ExitCode> {
    let mut cfg = args.engine.engine_config(2);
    cfg.python.get_or_insert_with(PythonSettings::default);
    let engine = Engine::start(cfg).context("starting the engine")?;
    let rt = runtime()?;
    let spec = SessionSpec {
        runtime: Some(Runtime::Python),
        ttl_ms: 600_000,
        limits: Limits {
            memory_mb: Some(512),
            disk_mb: Some(args.files_mib * 2 + 16),
            ..Limits::default()
        },
        ..SessionSpec::default()
    };
    let build = BUILD
        .replace("{mb}", &args.state_mib.to_string())
        .replace("{files}", &args.files_mib.to_string());
    let mut runs = Vec::new();
    for _ in 0..args.runs {
        runs.push(rt.block_on(one_run(&engine, &spec, &build, args.wide))?);
    }
    let median = |f: &dyn Fn(&Run) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let rebuild = median(&|r| r.rebuild);
    let twin_mib = runs.last().map_or(0.0, |r| r.steps[STEPS.len()]);
    println!(
        "session fork: {} MiB of state, {} MiB of files (median of {} runs)",
        args.state_mib, args.files_mib, args.runs
    );
    println!("baseline: a fresh session, the state and files built again: {rebuild:.0} ms");
    println!(
        "{:>8} {:>10} {:>9} {:>16} {:>17}",
        "branches", "pause ms", "fork ms", "first result ms", "first/baseline"
    );
    for (i, n) in [1, args.wide].into_iter().enumerate() {
        let first = median(&|r| r.first[i]);
        println!(
            "{:>8} {:>10.2} {:>9.0} {:>16.0} {:>17.3}",
            n,
            median(&|r| r.pause[i]),
            median(&|r| r.fork[i]),
            first,
            first / rebuild
        );
    }
    println!("fork(1) step by step, median ms ({twin_mib:.1} MiB copied into the twin):");
    for (i, name) in STEPS.iter().enumerate() {
        println!("{name:<46} {:>8.2}", median(&|r| r.steps[i]));
    }
    Ok(std::process::ExitCode::SUCCESS)
}

async fn one_run(
    engine: &Engine,
    spec: &SessionSpec,
    build: &str,
    wide: usize,
) -> anyhow::Result<Run> {
    let started = Instant::now();
    let mut parent = engine.open_session(spec.clone()).await?;
    let want = run(&mut parent, build).await?;
    let rebuild = started.elapsed().as_secs_f64() * 1e3;
    let mut out = Run {
        rebuild,
        pause: [0.0; 2],
        fork: [0.0; 2],
        first: [0.0; 2],
        steps: Vec::new(),
    };
    for (i, n) in [1, wide].into_iter().enumerate() {
        let started = Instant::now();
        let fork = engine.fork_session(&mut parent, spec, n).await?;
        out.fork[i] = started.elapsed().as_secs_f64() * 1e3;
        out.pause[i] = fork.parent_pause.as_secs_f64() * 1e3;
        let mut kids = Vec::new();
        let freeze = fork.freeze;
        for b in fork.branches {
            let b = b.context("a branch")?;
            if kids.is_empty() && n == 1 {
                out.steps = steps(&b, freeze, out.fork[i]);
            }
            kids.push(b.session);
        }
        for kid in &mut kids {
            let got = run(kid, CHECK).await?;
            if got != want {
                bail!("a branch's state is {got}, the parent's {want}");
            }
        }
        out.first[i] = started.elapsed().as_secs_f64() * 1e3;
        if n == 1 {
            out.steps[STEPS.len() - 1] = out.first[i] - out.fork[i];
        }
        for kid in kids {
            kid.kill().await;
        }
    }
    parent.kill().await;
    Ok(out)
}

/// fork(1)'s steps in ms, in the order of [`STEPS`] (the last, the first `run_code`, filled in
/// by the caller), then the MiB copied into the twin.
fn steps(b: &ForkedBranch, freeze: Duration, fork_ms: f64) -> Vec<f64> {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (s, t) = (&b.steps, &b.twin.steps);
    let node = [s.open, freeze, s.disk, s.twin];
    let rest = fork_ms - node.iter().map(|d| ms(*d)).sum::<f64>() - ms(s.join);
    let mut out: Vec<f64> = node.into_iter().map(ms).collect();
    out.extend(
        [
            t.inspect,
            t.maps,
            t.memory_read,
            t.memory_write,
            t.memory_other,
            t.fds,
            t.finish,
            s.join,
        ]
        .map(ms),
    );
    out.extend([rest, 0.0]);
    out.push(b.twin.copied_bytes as f64 / (1u64 << 20) as f64);
    out
}

/// Runs a cell and returns its value's text.
async fn run(session: &mut SandboxSession, code: &str) -> anyhow::Result<String> {
    let id = uuid::Uuid::new_v4().to_string();
    let call = json!({"id": id, "op": "run_code", "code": code, "timeout_ms": 300_000});
    session.send(&serde_json::to_vec(&call)?).await?;
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(300), session.recv())
            .await
            .context("no answer within 300 s")?
            .map_err(|end| anyhow::anyhow!("the session ended: {}", end.message()))?;
        let event: Value = serde_json::from_slice(&frame)?;
        if event["call"] == json!(id) && event["kind"] == "result" {
            if event["ok"] != true {
                bail!("the cell failed: {event}");
            }
            return Ok(event["text"].as_str().unwrap_or_default().to_owned());
        }
    }
}
