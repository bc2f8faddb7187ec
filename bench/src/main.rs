//! `forkbox-bench`: the benchmark drivers that measure the engine from inside, each against a
//! baseline measured in the same run. The product binary `forkbox` carries none of them.
//!
//! - `spawn` (spawn.rs): sandbox spawn latency, throughput and CPU of `/bin/true` against bare
//!   fork+exec and bubblewrap, and the watchdog's overshoot;
//! - `queue` (queue.rs): end-to-end `/bin/true` jobs through an in-process node against the
//!   raw engine, and what Redis does per job;
//! - `session` (session.rs): a session's open, first `run_code` and round trip at the engine
//!   level, and its idle memory, against a warm one-shot job;
//! - `twin` (twin.rs): the twin copy a session's fork uses, against rebuilding the same state;
//! - `fork` (fork.rs): a live session's fork to each branch's first result, against a fresh
//!   session building the same state and files, and its checkpoint and restore; at the engine
//!   and through an in-process node and Redis as a client calls them (fork_node.rs);
//! - `init-copy` (init_copy.rs): what a warm-runtime sandbox's init pays for inheriting the
//!   interpreter, against an init that would not (fork and exit of this process's copy, with
//!   and without the interpreter's mappings).
//!
//! Like `forkbox`, this binary serves its engine's zygote (`forkbox-bench __zygote`), so what it
//! measures is the sandbox code of the same build.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use forkbox::sandbox::{EngineConfig, PythonSettings};
use forkbox_queue::schema::Network;

mod fork;
mod fork_figures;
mod fork_node;
mod init_copy;
mod queue;
mod session;
mod spawn;
mod twin;

/// Forkbox's benchmark drivers: figures printed with their ratio to a baseline of the same run.
#[derive(Debug, Parser)]
#[command(name = "forkbox-bench", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    what: Bench,
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// Spawn latency and throughput of /bin/true against bare fork+exec and bubblewrap, and
    /// the watchdog's overshoot.
    Spawn(spawn::SpawnArgs),
    /// Queue overhead: end-to-end /bin/true jobs through a node against the raw engine.
    Queue(queue::QueueBenchArgs),
    /// Sessions at the engine level: open → first run_code, the run_code round trip, idle
    /// memory, against a warm one-shot job.
    Session(session::SessionBenchArgs),
    /// The twin copy of a session's fork: the parent's pause, the copy, the twin's memory.
    Twin(twin::TwinBenchArgs),
    /// A live session's fork, fork(1) and fork(N), to each branch's first run_code result,
    /// against a fresh session building the same state and files; its checkpoint and
    /// restore; at the engine and through a node and Redis.
    Fork(fork::ForkBenchArgs),
    /// What a warm-runtime init pays for inheriting the interpreter: fork and exit of a copy
    /// of this process with and without the interpreter's mappings, alternated.
    InitCopy(init_copy::InitCopyArgs),
}

/// What the measured engine is built with: the options of `forkbox worker` that change what a
/// sandbox costs.
#[derive(Debug, Args)]
struct EngineArgs {
    /// Share one network namespace between sandboxes instead of one each.
    #[arg(long)]
    shared_net: bool,
    /// The network of the jobs: `none` (Unix sockets only) or `loopback` [default: none].
    #[arg(long, env = "FORKBOX_NETWORK_DEFAULT", value_name = "MODE")]
    network_default: Option<Network>,
    /// Modules the warm Python runtime imports before the first sandbox, comma-separated, in
    /// place of the default list; `none` turns the runtime off [default: the node's list].
    #[arg(long, value_name = "MODULES", value_delimiter = ',')]
    python_preload: Option<Vec<String>>,
}

impl EngineArgs {
    fn engine_config(&self, slots: usize) -> EngineConfig {
        let python = match self.python_preload.as_deref() {
            Some([none]) if none == "none" => None,
            Some(modules) => Some(PythonSettings {
                preload: modules.to_vec(),
                ..PythonSettings::default()
            }),
            None => Some(PythonSettings::default()),
        };
        EngineConfig {
            slots,
            net_per_sandbox: !self.shared_net,
            network_default: self.network_default.unwrap_or_default(),
            python,
            ..EngineConfig::default()
        }
    }
}

/// The multi-threaded runtime the drivers measure in (started after the engine, whose zygote
/// must be exec'd before any thread exists).
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn main() -> ExitCode {
    // The zygote must stay single-threaded: dispatch to it before anything starts a thread.
    if std::env::args_os().nth(1).is_some_and(|a| a == "__zygote") {
        forkbox::sandbox::zygote_main();
    }
    let result = match Cli::parse().what {
        Bench::Spawn(args) => spawn::main(args),
        Bench::Queue(args) => queue::main(args),
        Bench::Session(args) => session::main(args),
        Bench::Twin(args) => twin::main(args),
        Bench::Fork(args) => fork::main(args),
        // Before any thread: it loads the interpreter into this process and forks it.
        Bench::InitCopy(args) => init_copy::main(args),
    };
    result.unwrap_or_else(|e| {
        eprintln!("forkbox-bench: {e:#}");
        ExitCode::FAILURE
    })
}
