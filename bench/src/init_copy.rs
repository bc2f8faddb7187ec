//! `forkbox-bench init-copy`: what a warm-runtime sandbox's init pays for inheriting the
//! interpreter, measured before building an init that does not (`docs/benchmarks.md`, "An init
//! without the interpreter").
//!
//! In this process (single-threaded: it runs before anything starts a thread), forks that exit
//! at once are timed, parent and child CPU per fork: first before the interpreter's warm-up
//! (*plain*, a plain zygote's init), then after it, alternated by round, with the whole address
//! space (*whole*, the warm runtime's init today), without the mappings the warm-up added
//! (*lean*: what an init marked out of with `MADV_DONTFORK` would not inherit), and without the
//! heap's growth as well (*leanest*, a bound), and with the whole address space and a child that
//! enters a sandbox-like process's six namespaces through its pidfd before exiting (*entering*:
//! what a launcher made from outside its sandbox would add). Printed: every round, then each
//! mode's median and its ratio to *whole* measured in the same rounds.

use anyhow::bail;
use clap::Args;
use forkbox::sandbox::{measure_init_copy, CopyCostPlan, CopyFigures, CopyMode, PythonSettings};

#[derive(Debug, Args)]
pub struct InitCopyArgs {
    /// Forks per mode and round.
    #[arg(long, default_value_t = 300)]
    pub iterations: usize,
    /// Rounds (each runs every mode once, in a rotating order).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Modules the interpreter imports before the forks, comma-separated [default: the warm
    /// runtime's default preload].
    #[arg(long, value_name = "MODULES", value_delimiter = ',')]
    pub python_preload: Option<Vec<String>>,
    /// Print the figures as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

const MODES: [CopyMode; 5] = [
    CopyMode::Plain,
    CopyMode::Whole,
    CopyMode::Lean,
    CopyMode::Leanest,
    CopyMode::Entering,
];

fn name(mode: CopyMode) -> &'static str {
    match mode {
        CopyMode::Plain => "plain (no interpreter)",
        CopyMode::Whole => "whole (today's init)",
        CopyMode::Lean => "lean (interpreter's mappings DONTFORK)",
        CopyMode::Leanest => "leanest (and the heap's growth)",
        CopyMode::Entering => "whole, entering 6 namespaces (setns)",
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub fn main(args: InitCopyArgs) -> anyhow::Result<std::process::ExitCode> {
    if args.rounds == 0 || args.iterations == 0 {
        bail!("--rounds and --iterations must be at least 1");
    }
    let mut python = PythonSettings::default();
    if let Some(preload) = args.python_preload {
        python.preload = preload;
    }
    let plan = CopyCostPlan {
        python,
        env: vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("HOME".into(), "/tmp".into()),
            ("LANG".into(), "C.UTF-8".into()),
        ],
        iterations: args.iterations,
        rounds: args.rounds,
    };
    let cost = measure_init_copy(&plan).map_err(anyhow::Error::msg)?;
    let m = &cost.memory;
    if args.json {
        let rows: Vec<serde_json::Value> = cost
            .figures
            .iter()
            .map(|f| {
                serde_json::json!({
                    "round": f.round,
                    "mode": format!("{:?}", f.mode).to_lowercase(),
                    "parent_us": f.parent_us,
                    "child_us": f.child_us,
                    "wall_us": f.wall_us,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "modules": cost.modules,
                "added_ranges": m.ranges,
                "added_kib": m.added_kib,
                "added_anon_kib": m.added_anon_kib,
                "heap_growth_kib": m.heap_growth_kib,
                "kept_anon_kib": m.kept_anon_kib,
                "entering_skipped": cost.entering_skipped,
                "figures": rows,
            })
        );
        return Ok(std::process::ExitCode::SUCCESS);
    }
    println!(
        "interpreter: {} modules in sys.modules; the warm-up added {} ranges, {} KiB ({} KiB \
         anonymous), and grew the heap by {} KiB; anonymous memory outside the heap it did not \
         add: {} KiB",
        cost.modules, m.ranges, m.added_kib, m.added_anon_kib, m.heap_growth_kib, m.kept_anon_kib
    );
    println!(
        "{:>5}  {:<40} {:>10} {:>10} {:>10} {:>10}",
        "round", "mode", "parent µs", "child µs", "tree µs", "wall µs"
    );
    for f in &cost.figures {
        println!(
            "{:>5}  {:<40} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            f.round,
            name(f.mode),
            f.parent_us,
            f.child_us,
            f.tree_us(),
            f.wall_us
        );
    }
    let of = |mode: CopyMode| -> Vec<&CopyFigures> {
        cost.figures.iter().filter(|f| f.mode == mode).collect()
    };
    let whole: Vec<&CopyFigures> = of(CopyMode::Whole);
    println!(
        "\nmedians over {} rounds of {} forks (per fork; plain ran before the warm-up, the \
         others alternated after it):",
        args.rounds, args.iterations
    );
    if let Some(why) = &cost.entering_skipped {
        println!("  entering: SKIPPED: {why}");
    }
    for mode in MODES {
        let rows = of(mode);
        if rows.is_empty() {
            continue;
        }
        let tree = median(rows.iter().map(|f| f.tree_us()).collect());
        // The ratio of each round's figure to whole's of the same round, then their median.
        let ratio = median(
            rows.iter()
                .zip(&whole)
                .map(|(f, w)| f.tree_us() / w.tree_us())
                .collect(),
        );
        let saved = median(
            rows.iter()
                .zip(&whole)
                .map(|(f, w)| w.tree_us() - f.tree_us())
                .collect(),
        );
        println!(
            "  {:<40} tree {:>7.1} µs (parent {:>6.1}, child {:>6.1}), {:.2}× whole, saves \
             {:>6.1} µs a fork",
            name(mode),
            tree,
            median(rows.iter().map(|f| f.parent_us).collect()),
            median(rows.iter().map(|f| f.child_us).collect()),
            ratio,
            saved
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}
