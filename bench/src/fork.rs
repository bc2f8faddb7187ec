//! `forkbox-bench fork`: a live session's fork (`Engine::fork_session`) end to end, against a
//! baseline measured in the same run: opening a fresh session and building the same state and
//! files again, which is what a branch without the fork would cost.
//!
//! The parent session builds `MiB` of Python state (a dict of strings and a list of random
//! bytes) and writes `--files-mib` of files to its disk. Per run: the baseline (open a session,
//! build the state, write the files, to that cell's result), then fork(1) and fork(N), each
//! timed from the call to every branch's first `run_code` result (the state's size, checked),
//! then a checkpoint, its restore, and the restored session's first result. Then the same
//! again through an in-process node and a private redis-server, as a client calls them
//! (fork_node.rs), unless `--engine-only`; the two take turns going first, and `--warmup`
//! runs are made first and not counted. Printed: the parent's pause, the fork's own time,
//! the branch's first result, and each over the baseline; the checkpoint and restore; each
//! engine figure beside the node's and their difference (the node's and Redis's share); then
//! fork(1) step by step at the engine (the branch's open, the freeze, the disk copy, the twin
//! copy and its own steps, the join, the first `run_code`), each the median of the runs.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use forkbox::sandbox::{Engine, ForkedBranch, PythonSettings, SandboxSession, SessionSpec};
use forkbox_queue::schema::{Limits, Runtime};
use serde_json::{json, Value};

use crate::fork_figures::{middle, Timed, CHECK, TRIPS};
use crate::fork_node::NodeBench;
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
    /// Runs made first and not counted (the first sessions fill caches).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Measure at the engine only, not through a node and Redis.
    #[arg(long)]
    pub engine_only: bool,
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

/// One of a run's figures, read from its [`Timed`].
type Figure = fn(&Timed) -> f64;

/// One run's figures.
struct Run {
    engine: Timed,
    node: Option<Timed>,
    /// fork(1)'s steps at the engine, named, in the order of [`STEPS`].
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
    let node = match args.engine_only {
        true => None,
        // Room for the parent, the wider fork's branches and a restore, each of 512 MiB.
        false => Some(rt.block_on(NodeBench::start(engine.clone(), args.wide + 2, 512))?),
    };
    let mut runs = Vec::new();
    for i in 0..args.warmup + args.runs {
        // The engine and the node take turns going first, so neither always finds the
        // other's leftovers (page cache, freed memory).
        let node_first = i % 2 == 1;
        let through_node = || match &node {
            Some(node) => rt
                .block_on(node.one_run(&spec.limits, &build, args.wide))
                .map(Some),
            None => Ok(None),
        };
        let node_run = if node_first { through_node()? } else { None };
        let (engine_run, steps) = rt.block_on(one_run(&engine, &spec, &build, args.wide))?;
        let node_run = if node_first {
            node_run
        } else {
            through_node()?
        };
        if i >= args.warmup {
            runs.push(Run {
                engine: engine_run,
                node: node_run,
                steps,
            });
        }
    }
    if let Some(node) = node {
        rt.block_on(node.stop())?;
    }
    let median = |f: &dyn Fn(&Run) -> f64| middle(runs.iter().map(f).collect());
    let e = |f: Figure| median(&|r| f(&r.engine));
    let rebuild = e(|t| t.rebuild);
    let twin_mib = runs.last().map_or(0.0, |r| r.steps[STEPS.len()]);
    println!(
        "session fork: {} MiB of state, {} MiB of files (median of {} runs, {} warm-up not counted)",
        args.state_mib, args.files_mib, args.runs, args.warmup
    );
    println!("baseline: a fresh session, the state and files built again: {rebuild:.0} ms");
    println!(
        "{:>8} {:>10} {:>9} {:>16} {:>17}",
        "branches", "pause ms", "fork ms", "first result ms", "first/baseline"
    );
    for (i, n) in [1, args.wide].into_iter().enumerate() {
        let first = median(&|r| r.engine.first[i]);
        println!(
            "{:>8} {:>10.2} {:>9.0} {:>16.0} {:>17.3}",
            n,
            median(&|r| r.engine.pause[i]),
            median(&|r| r.engine.fork[i]),
            first,
            first / rebuild
        );
    }
    if runs.iter().all(|r| r.node.is_some()) {
        print_against_node(&runs, args.runs, args.wide);
    } else {
        println!(
            "checkpoint {:.0} ms, restore {:.0} ms, restore to the first result {:.0} ms, \
             checkpoint → restore → first result {:.0} ms",
            e(|t| t.checkpoint),
            e(|t| t.restore),
            e(|t| t.restore_first),
            e(|t| t.checkpoint_to_first)
        );
    }
    println!("fork(1) step by step, median ms ({twin_mib:.1} MiB copied into the twin):");
    for (i, name) in STEPS.iter().enumerate() {
        println!("{name:<46} {:>8.2}", median(&|r| r.steps[i]));
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// The engine's figures beside the node's, run by run and as medians: each row's difference
/// is the median of the runs' differences (each run measured both, one after the other), not
/// the difference of the medians.
fn print_against_node(runs: &[Run], count: usize, wide: usize) {
    let median = |f: &dyn Fn(&Run) -> f64| middle(runs.iter().map(f).collect());
    let e = |f: Figure| median(&|r| f(&r.engine));
    let node = |f: Figure| median(&|r| f(r.node.as_ref().expect("measured")));
    let diff = |f: Figure| median(&|r| f(r.node.as_ref().expect("measured")) - f(&r.engine));
    println!(
        "engine against node + Redis, median ms ({} runs, the engine and the node going first \
         by turns):",
        count
    );
    println!(
        "{:<44} {:>9} {:>9} {:>12} {:>7}",
        "", "engine", "node", "node-engine", "node/e"
    );
    let rows: Vec<(String, Figure)> = vec![
        ("parent opened, state built (baseline)".into(), |t| {
            t.rebuild
        }),
        ("a call's round trip (run_code 1 + 1)".into(), |t| t.trip),
        ("fork(1): the parent's pause".into(), |t| t.pause[0]),
        ("fork(1): to the fork's answer".into(), |t| t.fork[0]),
        ("fork(1): to the branch's first result".into(), |t| {
            t.first[0]
        }),
        (format!("fork({wide}): the parent's pause"), |t| t.pause[1]),
        (format!("fork({wide}): to the fork's answer"), |t| t.fork[1]),
        (
            format!("fork({wide}): to every branch's first result"),
            |t| t.first[1],
        ),
        ("checkpoint: to its answer".into(), |t| t.checkpoint),
        ("restore: to its answer".into(), |t| t.restore),
        ("restore: to the first result".into(), |t| t.restore_first),
        ("checkpoint → restore → first result".into(), |t| {
            t.checkpoint_to_first
        }),
    ];
    for (name, f) in rows {
        let (en, no) = (e(f), node(f));
        println!(
            "{name:<44} {en:>9.2} {no:>9.2} {:>12.2} {:>6.2}×",
            diff(f),
            no / en
        );
    }
    // The spread behind the medians, run by run.
    let each = |f: &dyn Fn(&Run) -> f64| {
        let v: Vec<String> = runs.iter().map(|r| format!("{:.0}", f(r))).collect();
        v.join(", ")
    };
    for (name, i) in [("fork(1)", 0), (&*format!("fork({wide})"), 1)] {
        println!(
            "{name} to every first result, run by run: engine {}; node {}",
            each(&|r| r.engine.first[i]),
            each(&|r| r.node.as_ref().expect("measured").first[i])
        );
    }
    println!(
        "checkpoint → restore → first result, run by run: engine {}; node {}",
        each(&|r| r.engine.checkpoint_to_first),
        each(&|r| r.node.as_ref().expect("measured").checkpoint_to_first)
    );
}

/// One run at the engine: its figures, and fork(1)'s steps (see [`steps`]).
async fn one_run(
    engine: &Engine,
    spec: &SessionSpec,
    build: &str,
    wide: usize,
) -> anyhow::Result<(Timed, Vec<f64>)> {
    let started = Instant::now();
    let mut parent = engine.open_session(spec.clone()).await?;
    let want = run(&mut parent, build).await?;
    let mut out = Timed {
        rebuild: ms(started),
        ..Timed::default()
    };
    let mut trips = Vec::new();
    for _ in 0..TRIPS {
        let started = Instant::now();
        run(&mut parent, "1 + 1").await?;
        trips.push(ms(started));
    }
    out.trip = middle(trips);
    let mut fork1_steps = Vec::new();
    for (i, n) in [1, wide].into_iter().enumerate() {
        let started = Instant::now();
        let fork = engine.fork_session(&mut parent, spec, n).await?;
        out.fork[i] = ms(started);
        out.pause[i] = fork.parent_pause.as_secs_f64() * 1e3;
        let mut kids = Vec::new();
        let freeze = fork.freeze;
        for b in fork.branches {
            let b = b.context("a branch")?;
            if kids.is_empty() && n == 1 {
                fork1_steps = steps(&b, freeze, out.fork[i]);
            }
            kids.push(b.session);
        }
        for kid in &mut kids {
            let got = run(kid, CHECK).await?;
            if got != want {
                bail!("a branch's state is {got}, the parent's {want}");
            }
        }
        out.first[i] = ms(started);
        if n == 1 {
            fork1_steps[STEPS.len() - 1] = out.first[i] - out.fork[i];
        }
        for kid in kids {
            kid.kill().await;
        }
    }
    let started = Instant::now();
    let mut cp = engine.checkpoint_session(&mut parent, spec).await?;
    out.checkpoint = ms(started);
    let restoring = Instant::now();
    let mut back = engine.restore_checkpoint(&mut cp, spec).await?.session;
    out.restore = ms(restoring);
    let got = run(&mut back, CHECK).await?;
    if got != want {
        bail!("the restored state is {got}, the parent's {want}");
    }
    out.restore_first = ms(restoring);
    out.checkpoint_to_first = ms(started);
    back.kill().await;
    drop(cp);
    parent.kill().await;
    Ok((out, fork1_steps))
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
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
