//! The `forkbox` command line: argument parsing and one module per command. This tree is the
//! binary's alone; it drives the library (`forkbox::sandbox`, `forkbox::node`) and the library
//! never reaches back into it.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use forkbox_queue::schema::EXIT_SANDBOX_ERROR;

mod check;
mod client;
mod daemon;
mod daemon_client;
mod gateway;
mod opts;
mod run;
mod session;
mod settings;
mod terminal;
mod up;
mod worker;

/// Forkbox: run untrusted code in rootless sandboxes forked from a warm zygote.
#[derive(Debug, Parser)]
#[command(name = "forkbox", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Every subcommand, in the order `forkbox --help` lists them.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one job in a sandbox and exit with its exit code (124 on timeout, 128+N when killed
    /// by signal N, 125 when the sandbox itself failed). When a `forkbox daemon` of this user
    /// (or root's) is running, the job goes to it and starts in one of its warm sandboxes
    /// (`--no-daemon` starts a zygote of this command's own).
    Run(run::RunCmd),
    /// Report what this host supports and how each limit is enforced; exits non-zero when no
    /// sandbox can be made here.
    Check(check::CheckArgs),
    /// Serve jobs over a local Unix socket (newline-delimited JSON), for the Python SDK.
    Daemon(daemon::DaemonCmd),
    /// Print the protocol contract as JSON: job fields, limits and their ranges, defaults, key
    /// layout, statuses and the enqueue script, for clients in other languages.
    Schema,
    /// Run a worker node: take jobs from Redis Streams, run them in sandboxes, store results.
    Worker(settings::WorkerSettings),
    /// One-command local node: a private redis-server when none answers, plus a worker.
    Up(up::UpArgs),
    /// Enqueue one job; print its id, or with --wait its result (exiting like `forkbox run`).
    Submit(client::SubmitArgs),
    /// Print a job's result, exiting like `forkbox run`.
    Result(client::ResultArgs),
    /// Submit a JSONL file of jobs as a batch, wait for a batch, or list its results.
    #[command(subcommand)]
    Batch(client::BatchCommand),
    /// Stream length, pending, lag, consumers and dead letters of queues.
    Stats(client::StatsArgs),
    /// List, requeue or purge dead letters.
    #[command(subcommand)]
    Dlq(client::DlqCommand),
    /// Serve Piston's, Judge0's and SandboxFusion's HTTP APIs over the queue: each request
    /// becomes a job, its answer the job's result (listens on 127.0.0.1:2358; no TLS).
    Gateway(gateway::GatewayArgs),
    /// What the fleet can run: each language and version the live workers of the queues
    /// published, with how many nodes offer it and its compile stage's default limits.
    Runtimes(client::RuntimesArgs),
    /// Sessions: long-lived sandboxes on a node, called through Redis (create, run-code,
    /// exec, files, info, list, kill, set-timeout).
    #[command(subcommand)]
    Session(session::SessionCommand),
    /// Cancel a job: a queued one is skipped, a running one is killed (status `cancelled`).
    /// A finished or unknown id cancels nothing (exit 1), unless `--ahead` is given.
    Cancel(client::CancelArgs),
}

/// Runs the command; an error is printed as `forkbox: ...` and exits 125.
pub fn main(cli: Cli) -> ExitCode {
    use client::{BatchCommand, DlqCommand};
    let result = match cli.command {
        Command::Run(cmd) => match cmd.session.clone() {
            Some(sid) => session::in_session(&cmd, &sid),
            None => run::main(cmd),
        },
        Command::Check(args) => check::main(args),
        Command::Daemon(cmd) => daemon::main(cmd),
        Command::Schema => serde_json::to_string_pretty(&forkbox_queue::contract::contract())
            .map_err(Into::into)
            .map(|text| {
                println!("{text}");
                ExitCode::SUCCESS
            }),
        Command::Worker(args) => worker::main(args),
        Command::Up(args) => up::main(args),
        Command::Submit(a) => client_runtime().and_then(|rt| rt.block_on(client::submit(a))),
        Command::Result(a) => client_runtime().and_then(|rt| rt.block_on(client::result(a))),
        Command::Batch(BatchCommand::Submit(a)) => {
            client_runtime().and_then(|rt| rt.block_on(client::batch_submit(a)))
        }
        Command::Batch(BatchCommand::Wait(a)) => {
            client_runtime().and_then(|rt| rt.block_on(client::batch_wait(a)))
        }
        Command::Batch(BatchCommand::Results(a)) => {
            client_runtime().and_then(|rt| rt.block_on(client::batch_results(a)))
        }
        Command::Stats(a) => client_runtime().and_then(|rt| rt.block_on(client::stats(a))),
        Command::Dlq(DlqCommand::List(a)) => {
            client_runtime().and_then(|rt| rt.block_on(client::dlq_list(a)))
        }
        Command::Dlq(DlqCommand::Requeue(a)) => {
            client_runtime().and_then(|rt| rt.block_on(client::dlq_requeue(a)))
        }
        Command::Dlq(DlqCommand::Purge(a)) => {
            client_runtime().and_then(|rt| rt.block_on(client::dlq_purge(a)))
        }
        Command::Gateway(a) => gateway::main(a),
        Command::Runtimes(a) => client_runtime().and_then(|rt| rt.block_on(client::runtimes(a))),
        Command::Session(a) => client_runtime().and_then(|rt| rt.block_on(session::main(a))),
        Command::Cancel(a) => client_runtime().and_then(|rt| rt.block_on(client::cancel(a))),
    };
    match result {
        Ok(code) => code,
        // As coreutils end when a reader stops reading (`forkbox batch results B | head`):
        // quietly, with the status a shell shows for SIGPIPE.
        Err(e) if e.downcast_ref::<StdoutClosed>().is_some() => {
            ExitCode::from(128 + libc::SIGPIPE as u8)
        }
        Err(e) => {
            // Errors quote what Redis or a job said.
            eprintln!("forkbox: {}", terminal::for_stderr(&describe(&e)));
            ExitCode::from(EXIT_SANDBOX_ERROR as u8)
        }
    }
}

/// Standard output was closed by its reader.
#[derive(Debug, thiserror::Error)]
#[error("standard output closed")]
pub struct StdoutClosed;

/// A failed write to standard output as an error: [`StdoutClosed`] when its reader is gone.
pub fn stdout_error(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        StdoutClosed.into()
    } else {
        anyhow::Error::new(e).context("writing to standard output")
    }
}

/// An error and its causes, each said once: a typed error's message often already ends with
/// its source's text, which the chain would repeat.
pub fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// The multi-threaded runtime of the commands that run jobs (start it after the engine, whose
/// zygote must be exec'd before any thread exists).
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// The one-threaded runtime of the client commands, which only talk to Redis.
fn client_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Says at start what the warm Python runtime is, and which preload modules it could not import
/// (a misspelt module would otherwise show only in `forkbox check`).
pub fn log_python_runtime(engine: &forkbox::sandbox::Engine) {
    use forkbox::sandbox::PythonRuntime;
    match &engine.mechanisms().python {
        PythonRuntime::Disabled => {}
        PythonRuntime::Unavailable(why) => {
            tracing::warn!("warm python runtime unavailable, python jobs run cold: {why}")
        }
        PythonRuntime::Ready { info, .. } => {
            tracing::info!(
                "warm python runtime: {} of {} preload module(s) imported in {:.0} ms",
                info.preloaded.len(),
                info.preloaded.len() + info.failed.len(),
                info.warm_up_ms
            );
            for (module, error) in &info.failed {
                tracing::warn!("python preload: {module} not imported: {error}");
            }
        }
    }
}

/// Logs to stderr at `info` unless `RUST_LOG` says otherwise.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: a log file or journald gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
