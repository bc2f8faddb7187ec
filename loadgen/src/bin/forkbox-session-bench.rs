//! `forkbox-session-bench`: the sessions benchmark (see `forkbox_loadgen::sessions`). Prints
//! a Markdown report; run it on a release build.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use forkbox_loadgen::sessions::{run, SessionBench};

/// Sessions through a real worker and a private Redis, against a one-shot job baseline.
#[derive(Debug, Parser)]
struct Args {
    /// The forkbox binary the worker runs.
    #[arg(long, default_value = "target/release/forkbox")]
    forkbox: PathBuf,
    /// Samples of the baseline and of create → first result.
    #[arg(long, default_value_t = 30)]
    opens: usize,
    /// run_code round trips in one session.
    #[arg(long, default_value_t = 300)]
    calls: usize,
    /// Session counts tried for the capacity figure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,16,32,64")]
    levels: Vec<usize>,
    /// Rounds of calls at each level (each session once per round).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
}

#[tokio::main]
async fn main() -> ExitCode {
    let a = Args::parse();
    let bench = SessionBench {
        forkbox: a.forkbox,
        opens: a.opens,
        calls: a.calls,
        levels: a.levels,
        rounds: a.rounds,
    };
    match run(&bench).await {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("forkbox-session-bench: {e:#}");
            ExitCode::from(1)
        }
    }
}
