//! Command-line entry points of the node and its client commands.
//!
//! `forkbox worker` and `forkbox up` start the sandbox engine first (it blocks, and its zygote
//! must be forked before the runtime's threads exist), then build the runtime and run the
//! [`Node`](crate::node::Node). The client commands only talk to Redis.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::cli::{JobArgs, SandboxOpts};
use crate::node::client;
use crate::node::config::{self, FileConfig, NodeConfig};
use crate::node::worker::{Node, StopHandle};

/// Node and client subcommands (flattened into `forkbox`'s command list).
#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Run a worker node: take jobs from Redis Streams, run them in sandboxes, store results.
    Worker(WorkerArgs),
    /// One-command local node: a private redis-server when none answers, plus a worker.
    Up(crate::node::up::UpArgs),
    /// Enqueue one job; print its id, or with --wait its result (exiting like `forkbox run`).
    Submit(SubmitArgs),
    /// Print a job's result, exiting like `forkbox run`.
    Result(ResultArgs),
    /// Submit a JSONL file of jobs as a batch, or wait for a batch.
    #[command(subcommand)]
    Batch(BatchCommand),
    /// Stream length, pending, lag, consumers and dead letters of queues.
    Stats(StatsArgs),
    /// List, requeue or purge dead letters.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Cancel a job: a pending one is skipped, a running one is killed (status `cancelled`).
    Cancel(CancelArgs),
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Redis URL (redis://host:port/db, rediss://, redis+unix:///path) [default: redis://127.0.0.1:6379].
    #[arg(long, env = "FORKBOX_REDIS_URL", value_name = "URL")]
    pub redis: Option<String>,
    /// Queues in priority order, highest first [default: default].
    #[arg(long, env = "FORKBOX_QUEUES", value_name = "Q1,Q2")]
    pub queues: Option<String>,
    /// Jobs run at once [default: the number of CPUs].
    #[arg(long, env = "FORKBOX_SLOTS")]
    pub slots: Option<usize>,
    /// Jobs read ahead of a free slot, so the next one starts without a Redis round trip;
    /// they wait on this node even when another is idle, so use it for full queues (batch
    /// runs), not for latency-bound ones [default: 0].
    #[arg(long, env = "FORKBOX_PREFETCH", value_name = "N")]
    pub prefetch: Option<usize>,
    /// Serve /metrics and /healthz here (port 0 picks one; the log says which) [default: none].
    #[arg(long, env = "FORKBOX_METRICS_ADDR", value_name = "ADDR:PORT")]
    pub metrics_addr: Option<SocketAddr>,
    /// Seconds running jobs get to finish after SIGTERM/SIGINT [default: 30].
    #[arg(long, env = "FORKBOX_GRACE", value_name = "SECS")]
    pub grace: Option<f64>,
    /// Entries idle this long are reclaimed from dead workers [default: 30000].
    #[arg(long, env = "FORKBOX_VISIBILITY_TIMEOUT_MS", value_name = "MS")]
    pub visibility_timeout_ms: Option<u64>,
    /// Deliveries before an entry is dead-lettered, unless the job sets its own [default: 3].
    #[arg(long, env = "FORKBOX_MAX_ATTEMPTS")]
    pub max_attempts: Option<u32>,
    /// Consumer name; must be unique per process [default: <hostname>-<pid>].
    #[arg(long, env = "FORKBOX_NAME")]
    pub name: Option<String>,
    /// Job payloads larger than this are dead-lettered unread [default: 10485760].
    #[arg(long, env = "FORKBOX_MAX_JOB_BYTES")]
    pub max_job_bytes: Option<usize>,
    /// TOML file with any of the settings above (keys as the flags, with underscores).
    #[arg(long, env = "FORKBOX_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub sandbox: SandboxOpts,
}

impl WorkerArgs {
    /// Flags and environment over the file over the defaults.
    pub fn resolve(&self) -> anyhow::Result<NodeConfig> {
        let file = match &self.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        let redis = self
            .redis
            .clone()
            .or(file.redis)
            .unwrap_or_else(|| config::DEFAULT_REDIS_URL.to_owned());
        let mut c = NodeConfig::new(redis);
        if let Some(q) = self
            .queues
            .as_deref()
            .map(config::split_queues)
            .or(file.queues.map(|q| q.into_vec()))
        {
            c.queues = q;
        }
        if let Some(s) = self.slots.or(file.slots) {
            c.slots = s;
        }
        if let Some(p) = self.prefetch.or(file.prefetch) {
            c.prefetch = p;
        }
        c.metrics_addr = self.metrics_addr.or(file.metrics_addr);
        if let Some(g) = self.grace.or(file.grace) {
            anyhow::ensure!(
                g.is_finite() && g >= 0.0,
                "--grace must be a number of seconds >= 0"
            );
            c.grace = Duration::from_secs_f64(g);
        }
        if let Some(v) = self.visibility_timeout_ms.or(file.visibility_timeout_ms) {
            c.queue.visibility_timeout_ms = v;
        }
        if let Some(a) = self.max_attempts.or(file.max_attempts) {
            c.queue.max_attempts = a;
        }
        if let Some(n) = self.name.clone().or(file.name) {
            c.name = n;
        }
        if let Some(b) = self.max_job_bytes.or(file.max_job_bytes) {
            c.queue.max_job_bytes = b;
        }
        if let Some(t) = file.result_ttl_s {
            c.queue.result_ttl_s = t;
        }
        if let Some(n) = file.results_maxlen {
            c.queue.results_maxlen = n;
        }
        if let Some(b) = file.skip_completed_on_read {
            c.queue.skip_completed_on_read = b;
        }
        c.validate()?;
        Ok(c)
    }
}

/// `--redis` and `--queue` of the client commands.
#[derive(Debug, Clone, Args)]
pub struct ClientOpts {
    /// Redis URL.
    #[arg(long, env = "FORKBOX_REDIS_URL", value_name = "URL", default_value = config::DEFAULT_REDIS_URL)]
    pub redis: String,
    /// Queue name.
    #[arg(long, short = 'q', env = "FORKBOX_QUEUE", default_value = config::DEFAULT_QUEUE)]
    pub queue: String,
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// Job id (idempotent: an id still pending or with a live result is not enqueued again).
    #[arg(long)]
    pub id: Option<String>,
    /// Wait for the result, print it and exit like `forkbox run`.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: print the result JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub job: JobArgs,
}

#[derive(Debug, Args)]
pub struct ResultArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// The job id.
    pub id: String,
    /// Wait up to this many seconds for the result.
    #[arg(long, value_name = "SECONDS")]
    pub wait: Option<f64>,
    /// Print the result JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum BatchCommand {
    /// Enqueue every line of a JSONL file (one job each) as one batch; prints the batch name.
    /// Any bad line is reported with its number and nothing is enqueued.
    Submit(BatchSubmitArgs),
    /// Wait for a batch with a progress bar, then print a summary by status.
    Wait(BatchWaitArgs),
}

#[derive(Debug, Args)]
pub struct BatchSubmitArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// The JSONL file ("-" reads stdin).
    pub file: PathBuf,
    /// Batch name [default: the file's stem plus a random suffix].
    #[arg(long)]
    pub batch: Option<String>,
}

#[derive(Debug, Args)]
pub struct BatchWaitArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// The batch name.
    pub batch: String,
    /// Give up after this many seconds (exit 1).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
    /// Print the final counters as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Redis URL.
    #[arg(long, env = "FORKBOX_REDIS_URL", value_name = "URL", default_value = config::DEFAULT_REDIS_URL)]
    pub redis: String,
    /// Queues to show, comma-separated.
    #[arg(long, short = 'q', env = "FORKBOX_QUEUES", value_delimiter = ',', default_value = config::DEFAULT_QUEUE)]
    pub queues: Vec<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// The oldest dead letters with their reasons.
    List(DlqListArgs),
    /// Put dead letters back on the job stream (by dead-letter id, or --all).
    Requeue(DlqRequeueArgs),
    /// Delete every dead letter of the queue.
    Purge(DlqPurgeArgs),
}

#[derive(Debug, Args)]
pub struct DlqListArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// How many to show.
    #[arg(long, default_value_t = 50)]
    pub count: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DlqRequeueArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// Requeue every dead letter.
    #[arg(long, conflicts_with = "ids")]
    pub all: bool,
    /// Dead-letter ids (the first column of `forkbox dlq list`).
    #[arg(required_unless_present = "all")]
    pub ids: Vec<String>,
}

#[derive(Debug, Args)]
pub struct DlqPurgeArgs {
    #[command(flatten)]
    pub client: ClientOpts,
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// The job id.
    pub id: String,
}

pub fn main(cmd: NodeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        NodeCommand::Worker(args) => worker(args),
        NodeCommand::Up(args) => crate::node::up::main(args),
        NodeCommand::Submit(a) => client_runtime()?.block_on(client::submit(a)),
        NodeCommand::Result(a) => client_runtime()?.block_on(client::result(a)),
        NodeCommand::Batch(BatchCommand::Submit(a)) => {
            client_runtime()?.block_on(client::batch_submit(a))
        }
        NodeCommand::Batch(BatchCommand::Wait(a)) => {
            client_runtime()?.block_on(client::batch_wait(a))
        }
        NodeCommand::Stats(a) => client_runtime()?.block_on(client::stats(a)),
        NodeCommand::Dlq(DlqCommand::List(a)) => client_runtime()?.block_on(client::dlq_list(a)),
        NodeCommand::Dlq(DlqCommand::Requeue(a)) => {
            client_runtime()?.block_on(client::dlq_requeue(a))
        }
        NodeCommand::Dlq(DlqCommand::Purge(a)) => client_runtime()?.block_on(client::dlq_purge(a)),
        NodeCommand::Cancel(a) => client_runtime()?.block_on(client::cancel(a)),
    }
}

/// Logs to stderr at `info` unless `RUST_LOG` says otherwise.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn client_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn worker(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    let config = args.resolve()?;
    let engine = crate::cli::default_engine(config.slots, &args.sandbox)?;
    let grace = config.grace;
    let node = Node::new(config, engine);
    crate::cli::runtime()?.block_on(async move {
        let stop = StopHandle::default();
        stop.on_signals(grace)?;
        let report = node.run(stop, |_| {}).await?;
        if report.abandoned > 0 {
            tracing::warn!(
                "{} job(s) were killed at the end of the grace period and left pending",
                report.abandoned
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(subcommand)]
        cmd: NodeCommand,
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(
            &path,
            "redis = \"redis://file:1/\"\nslots = 7\nprefetch = 2\nqueues = [\"high\", \"low\"]\n",
        )
        .unwrap();
        let w = Wrapper::try_parse_from([
            "x",
            "worker",
            "--config",
            path.to_str().unwrap(),
            "--slots",
            "3",
        ])
        .unwrap();
        let NodeCommand::Worker(args) = w.cmd else {
            panic!("parsed as worker")
        };
        let c = args.resolve().unwrap();
        assert_eq!(c.slots, 3);
        assert_eq!(c.prefetch, 2);
        assert_eq!(c.redis_url, "redis://file:1/");
        assert_eq!(c.queues, ["high", "low"]);
        assert_eq!(c.grace, Duration::from_secs(30));
    }
}
