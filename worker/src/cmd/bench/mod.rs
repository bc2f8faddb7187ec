//! `forkbox bench spawn`: sandbox spawn cost against baselines measured in the same run.
//!
//! Latency is measured paced (a pause between runs, so the pre-warmed pool is refilled, as it
//! is for a node that is not saturated) and throughput back to back (the pool refill is then
//! part of the cost). Baselines: bare fork+exec+wait of the same program, and bubblewrap with
//! all namespaces unshared when it is installed.

use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use forkbox_queue::schema::{Job, Status};
use serde::Serialize;

use forkbox::sandbox::Engine;

use super::opts::SandboxOpts;
use super::runtime;

mod queue;
mod session;

#[derive(Debug, Args)]
pub struct BenchCmd {
    #[command(subcommand)]
    pub what: BenchWhat,
}

#[derive(Debug, Subcommand)]
pub enum BenchWhat {
    /// Spawn latency and throughput of /bin/true, and the watchdog's overshoot.
    Spawn(SpawnArgs),
    /// Queue overhead: end-to-end /bin/true jobs through a node against the raw engine.
    Queue(queue::QueueBenchArgs),
    /// Sessions at the engine level: open → first run_code, the run_code round trip, idle
    /// memory, against a warm one-shot job.
    Session(session::SessionBenchArgs),
}

#[derive(Debug, Args)]
pub struct SpawnArgs {
    /// Runs per method.
    #[arg(long, default_value_t = 300)]
    pub iterations: usize,
    /// Timeout runs for the watchdog overshoot (500 ms each).
    #[arg(long, default_value_t = 50)]
    pub overshoot_runs: usize,
    /// Pause between paced runs, in microseconds.
    #[arg(long, default_value_t = 5000)]
    pub pace_us: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sandbox: SandboxOpts,
}

#[derive(Debug, Serialize)]
struct Stats {
    p50_us: f64,
    p99_us: f64,
    mean_us: f64,
    n: usize,
}

/// p50, p99, mean and count of a sample set (nearest-rank percentiles).
pub(crate) fn percentiles(mut samples: Vec<f64>) -> (f64, f64, f64, usize) {
    samples.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| {
        samples
            .get(((samples.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let mean = samples.iter().sum::<f64>() / samples.len().max(1) as f64;
    (pick(0.50), pick(0.99), mean, samples.len())
}

fn stats(samples: Vec<f64>) -> Stats {
    let (p50_us, p99_us, mean_us, n) = percentiles(samples);
    Stats {
        p50_us,
        p99_us,
        mean_us,
        n,
    }
}

#[derive(Debug, Serialize)]
struct SpawnReport {
    bare_fork_exec: Stats,
    forkbox: Stats,
    forkbox_spawn_us: Stats,
    bwrap: Option<Stats>,
    bare_per_s: f64,
    forkbox_per_s: f64,
    bwrap_per_s: Option<f64>,
    /// CPU per back-to-back run: the process tree, and the whole machine.
    bare_cpu: Cpu,
    forkbox_cpu: Cpu,
    bwrap_cpu: Option<Cpu>,
    forkbox_vs_bare_p50: f64,
    bwrap_vs_forkbox_p50: Option<f64>,
    watchdog_overshoot: Stats,
}

/// CPU time per run, in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
struct Cpu {
    /// The runs' whole process tree: this process (fork, wait, the engine's threads) and
    /// every process it or the zygote reaped (namespaces set up, the program, tear-down in the
    /// exiting processes).
    tree_us: f64,
    /// Every CPU's busy time over the runs: adds the kernel's deferred work (namespace
    /// clean-up, RCU callbacks in kernel threads) and anything else the machine ran.
    machine_us: f64,
    /// The zygote's own share of `tree_us` (building sandboxes: their network namespaces, the
    /// clone), without the processes it reaped; 0 for the baselines.
    zygote_us: f64,
}

/// CPU seconds (user + system) counted so far for a run: the tree and the machine.
#[derive(Clone, Copy)]
struct CpuMark {
    tree_s: f64,
    machine_s: f64,
    zygote_s: f64,
}

impl CpuMark {
    /// `zygote` is an unreaped child whose own reaped children count too (read from `/proc`).
    fn now(zygote: Option<u32>) -> CpuMark {
        use nix::sys::resource::{getrusage, UsageWho};
        let secs = |who| {
            getrusage(who).map_or(0.0, |u| {
                let (a, b) = (u.user_time(), u.system_time());
                (a.tv_sec() + b.tv_sec()) as f64 + (a.tv_usec() + b.tv_usec()) as f64 / 1e6
            })
        };
        let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100) as f64;
        // utime, stime, cutime, cstime: fields 14-17, the 12th-15th after the comm.
        let zygote_fields = |take: usize| {
            zygote
                .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
                .map_or(0.0, |stat| {
                    let after_comm = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
                    after_comm
                        .split(' ')
                        .skip(11)
                        .take(take)
                        .filter_map(|f| f.parse::<f64>().ok())
                        .sum::<f64>()
                        / tick
                })
        };
        let (zygote_s, zygote_own_s) = (zygote_fields(4), zygote_fields(2));
        let machine_s = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                let ticks: Vec<f64> = s
                    .lines()
                    .next()?
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|f| f.parse().ok())
                    .collect();
                // user nice system idle iowait irq softirq steal: busy is all but idle, iowait.
                let busy: f64 = ticks.iter().take(8).sum::<f64>()
                    - ticks.get(3).copied().unwrap_or(0.0)
                    - ticks.get(4).copied().unwrap_or(0.0);
                Some(busy / tick)
            })
            .unwrap_or(0.0);
        CpuMark {
            tree_s: secs(UsageWho::RUSAGE_SELF) + secs(UsageWho::RUSAGE_CHILDREN) + zygote_s,
            machine_s,
            zygote_s: zygote_own_s,
        }
    }

    fn per_run_since(self, start: CpuMark, n: usize) -> Cpu {
        let per = |a: f64, b: f64| (a - b).max(0.0) * 1e6 / n.max(1) as f64;
        Cpu {
            tree_us: per(self.tree_s, start.tree_s),
            machine_us: per(self.machine_s, start.machine_s),
            zygote_us: per(self.zygote_s, start.zygote_s),
        }
    }
}

pub fn main(cmd: BenchCmd) -> anyhow::Result<ExitCode> {
    match cmd.what {
        BenchWhat::Spawn(args) => spawn(args),
        BenchWhat::Queue(args) => queue::main(args),
        BenchWhat::Session(args) => session::main(args),
    }
}

fn time_command(
    mut make: impl FnMut() -> Command,
    n: usize,
    pace: Duration,
) -> anyhow::Result<(Vec<f64>, f64, Cpu)> {
    let mut paced = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let status = make()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        paced.push(t.elapsed().as_secs_f64() * 1e6);
        anyhow::ensure!(status.success(), "baseline command failed: {status}");
        std::thread::sleep(pace);
    }
    let (t, cpu) = (Instant::now(), CpuMark::now(None));
    for _ in 0..n {
        make()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
    }
    let per_s = n as f64 / t.elapsed().as_secs_f64();
    Ok((paced, per_s, CpuMark::now(None).per_run_since(cpu, n)))
}

fn bwrap_command() -> Option<impl FnMut() -> Command> {
    let bwrap = ["/usr/bin/bwrap", "/bin/bwrap"]
        .into_iter()
        .find(|p| Path::new(p).exists())?;
    Some(move || {
        let mut c = Command::new(bwrap);
        c.args([
            "--unshare-all",
            "--die-with-parent",
            "--ro-bind",
            "/usr",
            "/usr",
        ]);
        for (link, target) in [
            ("/bin", "usr/bin"),
            ("/sbin", "usr/sbin"),
            ("/lib", "usr/lib"),
            ("/lib64", "usr/lib64"),
        ] {
            if Path::new(link).is_symlink() {
                c.args(["--symlink", target, link]);
            } else if Path::new(link).is_dir() {
                c.args(["--ro-bind", link, link]);
            }
        }
        c.args([
            "--ro-bind",
            "/etc",
            "/etc",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "/bin/true",
        ]);
        c
    })
}

fn spawn(args: SpawnArgs) -> anyhow::Result<ExitCode> {
    let n = args.iterations.max(10);
    let pace = Duration::from_micros(args.pace_us);
    let (bare, bare_per_s, bare_cpu) = time_command(|| Command::new("/bin/true"), n, pace)?;
    let bwrap = match bwrap_command() {
        Some(make) => Some(time_command(make, n, pace)?),
        None => None,
    };
    let engine = Engine::start(args.sandbox.engine_config(1))?;
    let rt = runtime()?;
    let job = Job::argv(["/bin/true"]);
    let zygote = engine.zygote_pid();
    let (fb, fb_spawn, fb_per_s, fb_cpu, overshoot) = rt.block_on(async {
        // Warm-up, so the first measured run does not pay for first-touch page faults.
        for _ in 0..10 {
            engine.run(&job).await;
        }
        let (mut lat, mut spawn) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let t = Instant::now();
            let out = engine.run(&job).await;
            lat.push(t.elapsed().as_secs_f64() * 1e6);
            anyhow::ensure!(
                out.status == Status::Ok,
                "sandboxed /bin/true failed: {:?}",
                out.error
            );
            spawn.push(out.spawn_us as f64);
            tokio::time::sleep(pace).await;
        }
        let (t, cpu) = (Instant::now(), CpuMark::now(zygote));
        for _ in 0..n {
            engine.run(&job).await;
        }
        let per_s = n as f64 / t.elapsed().as_secs_f64();
        // The last sandbox's init is reaped by the zygote just after its report; the machine
        // is idle meanwhile, which its busy time does not count.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let cpu = CpuMark::now(zygote).per_run_since(cpu, n);
        let mut over = Vec::new();
        let looping = Job {
            timeout_ms: Some(500),
            ..Job::shell("while :; do :; done")
        };
        for _ in 0..args.overshoot_runs {
            let out = engine.run(&looping).await;
            anyhow::ensure!(
                out.status == Status::Timeout,
                "expected a timeout, got {}",
                out.status
            );
            over.push(out.watchdog_overshoot_us.unwrap_or(0) as f64);
        }
        Ok((lat, spawn, per_s, cpu, over))
    })?;
    let report = SpawnReport {
        forkbox_vs_bare_p50: stats(fb.clone()).p50_us / stats(bare.clone()).p50_us,
        bwrap_vs_forkbox_p50: bwrap
            .as_ref()
            .map(|(b, _, _)| stats(b.clone()).p50_us / stats(fb.clone()).p50_us),
        bare_fork_exec: stats(bare),
        forkbox: stats(fb),
        forkbox_spawn_us: stats(fb_spawn),
        bwrap_per_s: bwrap.as_ref().map(|(_, r, _)| *r),
        bwrap_cpu: bwrap.as_ref().map(|(_, _, c)| *c),
        bwrap: bwrap.map(|(b, _, _)| stats(b)),
        bare_cpu,
        forkbox_cpu: fb_cpu,
        bare_per_s,
        forkbox_per_s: fb_per_s,
        watchdog_overshoot: stats(overshoot),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("spawn of /bin/true, {n} runs each (paced latency; back-to-back throughput)");
    println!(
        "{:<28} {:>10} {:>10} {:>10} {:>12} {:>12}",
        "method", "p50 us", "p99 us", "runs/s", "tree CPU us", "machine us"
    );
    let row = |name: &str, s: &Stats, r: f64, c: &Cpu| {
        println!(
            "{name:<28} {:>10.0} {:>10.0} {:>10.0} {:>12.0} {:>12.0}",
            s.p50_us, s.p99_us, r, c.tree_us, c.machine_us
        )
    };
    row(
        "bare fork+exec+wait",
        &report.bare_fork_exec,
        report.bare_per_s,
        &report.bare_cpu,
    );
    row(
        "forkbox sandbox (warm)",
        &report.forkbox,
        report.forkbox_per_s,
        &report.forkbox_cpu,
    );
    if let (Some(b), Some(r), Some(c)) = (&report.bwrap, report.bwrap_per_s, &report.bwrap_cpu) {
        row("bwrap --unshare-all", b, r, c);
    } else {
        println!("bwrap: not installed (apt-get install -y bubblewrap)");
    }
    println!(
        "forkbox request-to-exec (spawn_us): p50 {:.0} us, p99 {:.0} us",
        report.forkbox_spawn_us.p50_us, report.forkbox_spawn_us.p99_us
    );
    println!("ratio forkbox/bare p50: {:.2}x", report.forkbox_vs_bare_p50);
    if let Some(r) = report.bwrap_vs_forkbox_p50 {
        println!("ratio bwrap/forkbox p50: {r:.2}x (forkbox is {r:.1}x faster)");
    }
    if let Some(c) = &report.bwrap_cpu {
        println!(
            "ratio CPU per run forkbox/bwrap: tree {:.2}x, machine {:.2}x",
            report.forkbox_cpu.tree_us / c.tree_us.max(1.0),
            report.forkbox_cpu.machine_us / c.machine_us.max(1.0)
        );
    }
    let o = &report.watchdog_overshoot;
    println!(
        "watchdog overshoot at 500 ms, {} runs: p50 {:.0} us, p99 {:.0} us",
        o.n, o.p50_us, o.p99_us
    );
    Ok(ExitCode::SUCCESS)
}
