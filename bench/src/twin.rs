//! `forkbox-bench twin`: the twin copy a session's fork uses (`sandbox::make_twin`), against
//! a baseline measured in the same run: building the same Python state again from scratch,
//! which is what a fork without the copy would cost.
//!
//! Each run starts two warm-Python jobs of one engine: A builds `MiB` of state (a dict of
//! strings and a list of random bytes) and forks a branch F that stops itself, timing the
//! fork's pause in A; B stops itself as the twin T. The copy makes T a copy of F; both then
//! print their state's digest, which must agree. Printed per size and variant: the parent's
//! pause, the copy's time, the MiB copied (and skipped as identical), T's resident and
//! private memory once made, and the copy's time over the state's build time.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use forkbox::sandbox::{make_twin, Engine, PythonSettings, TwinLimits, TwinReport};
use forkbox_queue::schema::{Job, Outcome, Runtime};
use nix::unistd::Pid;
use serde_json::Value;

use crate::{runtime, EngineArgs};

#[derive(Debug, Args)]
pub struct TwinBenchArgs {
    /// State sizes in MiB, comma-separated.
    #[arg(long, default_value = "10,50", value_delimiter = ',')]
    pub sizes: Vec<u64>,
    /// Runs per size and variant (the median is printed).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Job A: builds the state, forks F (timing the pause), and prints F's digest (F prints it
/// once continued) and its own figures. argv: token, MiB.
const SESSION: &str = r#"
import os, sys, signal, time, hashlib, json, random
tok, mb = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
state = {"d": {f"k{i}": "v" * (i % 50) + str(i) for i in range(mb * 3000)},
         "blobs": [random.randbytes(1024) for _ in range(mb * 512)]}
build_ms = (time.perf_counter() - t0) * 1e3
def digest():
    h = hashlib.sha256()
    for k, v in state["d"].items():
        h.update(k.encode() + v.encode())
    for b in state["blobs"]:
        h.update(b)
    return h.hexdigest()[:16]
sys.stdout.flush()
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    with open("/proc/self/comm", "w") as c:
        c.write("F" + tok)
    os.kill(os.getpid(), signal.SIGSTOP)
    print(json.dumps({"digest": digest()}), flush=True)
    os._exit(0)
pause_ms = (time.perf_counter() - t0) * 1e3
os.waitpid(pid, 0)
print(json.dumps({"build_ms": build_ms, "pause_ms": pause_ms}), flush=True)
"#;

/// Job B: the twin, stopped until it is made a copy of F.
const TWIN: &str = r#"
import os, sys, signal
with open("/proc/self/comm", "w") as c:
    c.write("T" + sys.argv[1])
os.kill(os.getpid(), signal.SIGSTOP)
print("the twin resumed as itself", flush=True)
os._exit(3)
"#;

/// One run's figures.
struct Run {
    build_ms: f64,
    pause_ms: f64,
    report: TwinReport,
}

pub fn main(args: TwinBenchArgs) -> anyhow::Result<std::process::ExitCode> {
    let mut cfg = args.engine.engine_config(2);
    cfg.python.get_or_insert_with(PythonSettings::default);
    let engine = Engine::start(cfg).context("starting the engine")?;
    let rt = runtime()?;
    println!("twin copy (median of {} runs per row)", args.runs);
    println!(
        "{:>5} {:>15} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>10} {:>11}",
        "MiB",
        "variant",
        "build ms",
        "pause ms",
        "copy ms",
        "copied",
        "identical",
        "T MiB",
        "T private",
        "copy/build"
    );
    for &mb in &args.sizes {
        for skip_identical in [false, true] {
            let mut runs = Vec::new();
            for _ in 0..args.runs {
                runs.push(rt.block_on(one_run(&engine, mb, skip_identical))?);
            }
            print_row(mb, skip_identical, &mut runs);
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn print_row(mb: u64, skip_identical: bool, runs: &mut [Run]) {
    let median = |f: &dyn Fn(&Run) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let copy_ms = median(&|r| r.report.elapsed.as_secs_f64() * 1e3);
    let build_ms = median(&|r| r.build_ms);
    println!(
        "{:>5} {:>15} {:>9.1} {:>9.2} {:>9.1} {:>9.1} {:>10.1} {:>8.1} {:>10.1} {:>11.3}",
        mb,
        if skip_identical {
            "skip-identical"
        } else {
            "copy-all"
        },
        build_ms,
        median(&|r| r.pause_ms),
        copy_ms,
        median(&|r| mib(r.report.copied_bytes)),
        median(&|r| mib(r.report.identical_bytes)),
        median(&|r| r.report.twin_rss_kb as f64 / 1024.0),
        median(&|r| r.report.twin_private_kb as f64 / 1024.0),
        copy_ms / build_ms,
    );
}

fn job(program: &str, args: &[String]) -> Job {
    let mut argv = vec!["python3".to_owned(), "-c".to_owned(), program.to_owned()];
    argv.extend(args.iter().cloned());
    let mut job = Job::argv(argv);
    job.runtime = Some(Runtime::Python);
    job.timeout_ms = Some(300_000);
    job.limits.memory_mb = Some(2048);
    job
}

async fn one_run(engine: &Engine, mb: u64, skip_identical: bool) -> anyhow::Result<Run> {
    let tok = format!("{:08x}", uuid::Uuid::new_v4().as_u128() as u32);
    let a = job(SESSION, &[tok.clone(), mb.to_string()]);
    let b = job(TWIN, std::slice::from_ref(&tok));
    let copier = tokio::task::spawn_blocking(move || -> anyhow::Result<TwinReport> {
        let (f, t) = wait_for_both(&tok)?;
        let limits = TwinLimits {
            memory_bytes: 2048 << 20,
            timeout: Duration::from_secs(120),
            skip_identical,
        };
        let report = make_twin(f, t, &limits).context("the copy")?;
        nix::sys::signal::kill(f, nix::sys::signal::Signal::SIGCONT)?;
        Ok(report)
    });
    let (oa, ob) = tokio::join!(engine.run(&a), engine.run(&b));
    let report = copier.await??;
    let (fa, tb) = (lines(&oa)?, lines(&ob)?);
    let (Some(f_out), Some(parent), Some(t_out)) = (fa.first(), fa.get(1), tb.first()) else {
        bail!("missing output: A {:?}, B {:?}", oa.stdout, ob.stdout);
    };
    if f_out["digest"] != t_out["digest"] {
        bail!(
            "the twin's digest {} differs from F's {}",
            t_out["digest"],
            f_out["digest"]
        );
    }
    Ok(Run {
        build_ms: parent["build_ms"].as_f64().unwrap_or(0.0),
        pause_ms: parent["pause_ms"].as_f64().unwrap_or(0.0),
        report,
    })
}

fn lines(o: &Outcome) -> anyhow::Result<Vec<Value>> {
    o.stdout
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("{l:?}: {}", o.stderr)))
        .collect()
}

/// The host pids of F and T, once both have stopped (found by the names they gave themselves).
fn wait_for_both(tok: &str) -> anyhow::Result<(Pid, Pid)> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let (Some(f), Some(t)) = (stopped(&format!("F{tok}")), stopped(&format!("T{tok}"))) {
            return Ok((f, t));
        }
        if Instant::now() > deadline {
            bail!("the branch and the twin did not both stop");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn stopped(comm: &str) -> Option<Pid> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .map(|(_, r)| r.trim_start().starts_with('T'));
        if name.trim() == comm && state == Some(true) {
            return Some(Pid::from_raw(pid));
        }
    }
    None
}
