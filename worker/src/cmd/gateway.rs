//! `forkbox gateway`: the HTTP front end (Piston, Judge0, SandboxFusion) over a fleet's queue.
//!
//! It listens on loopback (127.0.0.1:2358, Judge0's port) unless `--listen` says otherwise,
//! and has no TLS of its own: to serve beyond this host, put it behind a proxy that terminates
//! TLS, and give it an API key (`--api-key-file`).

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use forkbox::gateway::exec::{Bounds, Staging};
use forkbox::gateway::{Gateway, GatewayConfig};
use forkbox::runtimes;
use forkbox_queue::{Broker, QueueConfig};

use super::client::{connect_to, ClientOpts};
use super::init_logging;

/// How often the gateway reads what the fleet's workers published.
const REFRESH: Duration = Duration::from_secs(15);

/// The address a gateway listens on unless told otherwise (Judge0's port, on loopback).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:2358";

#[derive(Debug, Args)]
pub struct GatewayArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// Address to listen on. Anything but loopback is reachable from other hosts: the gateway
    /// has no TLS of its own (put a TLS-terminating proxy in front) and should have
    /// --api-key-file.
    #[arg(long, value_name = "ADDR:PORT", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Threads serving requests. One (the default) costs the least CPU per request: a request
    /// waits on its job and on Redis, and handing its wake-ups between threads costs more
    /// than its own work; more threads serve more requests at once on a larger host.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: u16,
    #[command(flatten)]
    pub options: GatewayOptions,
}

/// The gateway's settings, shared with `forkbox up --gateway`.
#[derive(Debug, Clone, Args)]
pub struct GatewayOptions {
    /// A file holding the API key every request must carry in `X-Auth-Token` (`/healthz` and
    /// `/metrics` excepted); surrounding whitespace is ignored.
    #[arg(long, value_name = "FILE", env = "FORKBOX_GATEWAY_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Largest request body, in bytes (larger: HTTP 413).
    #[arg(long, value_name = "BYTES", default_value_t = 10 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Requests one client address may have in flight (more: HTTP 429).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub per_client: usize,
    /// Longest compile stage a request may ask for, in ms.
    #[arg(long, value_name = "MS", default_value_t = 60_000)]
    pub max_compile_timeout_ms: u64,
    /// Longest run stage a request may ask for, in ms.
    #[arg(long, value_name = "MS", default_value_t = 60_000)]
    pub max_run_timeout_ms: u64,
    /// Most memory a request may ask for, per stage, in MB.
    #[arg(long, value_name = "MB", default_value_t = 4096)]
    pub max_stage_memory_mb: u64,
    /// The compile stage's memory when a request sets none, in MB.
    #[arg(long, value_name = "MB", default_value_t = 1024)]
    pub compile_memory_mb: u64,
    /// Piston's output cap, in characters per stream.
    #[arg(long, value_name = "CHARS", default_value_t = 1024)]
    pub piston_output_chars: usize,
    /// How long a request waits for its job beyond the job's own limits, in seconds (then the
    /// job is cancelled and the request answered with an internal error).
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub queue_wait: u64,
    /// How compiled languages reach the workers: `native` (the job's compile stage, each stage
    /// with its own limits and usage) or `shell` (one script, for workers older than the
    /// compile stage, which refuse it; the stages then share the job's limits and usage).
    #[arg(long, value_name = "MODE", default_value = "native")]
    pub staging: Staging,
    /// A runtime catalogue file over the built-in one, as the workers' `--runtimes` (its
    /// entries replace the built-in ones of the same name): how each language is compiled
    /// and run. Give the gateway the workers' file.
    #[arg(long, value_name = "FILE", env = "FORKBOX_RUNTIMES")]
    pub runtimes: Option<PathBuf>,
    /// How long results and Judge0 submissions are kept, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 86_400)]
    pub result_ttl: u64,
}

impl GatewayOptions {
    /// The gateway's configuration, the API key read from its file.
    pub fn config(&self) -> anyhow::Result<GatewayConfig> {
        anyhow::ensure!(self.per_client >= 1, "--per-client must be at least 1");
        anyhow::ensure!(
            self.max_body_bytes >= 1024,
            "--max-body-bytes must be at least 1024"
        );
        anyhow::ensure!(
            self.result_ttl >= 1,
            "--result-ttl must be at least 1 second"
        );
        let api_key = self.api_key_file.as_deref().map(read_api_key).transpose()?;
        Ok(GatewayConfig {
            api_key,
            max_body_bytes: self.max_body_bytes,
            per_client: self.per_client,
            bounds: Bounds {
                max_compile_timeout_ms: self.max_compile_timeout_ms,
                max_run_timeout_ms: self.max_run_timeout_ms,
                max_memory_mb: self.max_stage_memory_mb,
                compile_memory_mb: self.compile_memory_mb.min(self.max_stage_memory_mb),
                piston_output_chars: self.piston_output_chars,
            },
            judge0: Default::default(),
            queue_wait: Duration::from_secs(self.queue_wait),
            result_ttl_s: self.result_ttl,
            staging: self.staging,
        })
    }
}

/// Reads the API key; warns when others than the owner may read the file.
fn read_api_key(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the API key file {}", path.display()))?;
    let key = text.trim().to_owned();
    anyhow::ensure!(
        !key.is_empty(),
        "the API key file {} is empty",
        path.display()
    );
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                "the API key file {} may be read by other users (mode {:o}); chmod 600 it",
                path.display(),
                meta.permissions().mode() & 0o777
            );
        }
    }
    Ok(key)
}

/// Opens the queue, reads what the fleet runs and binds `listen`: a gateway ready to serve.
pub async fn prepare(
    broker: Broker,
    queue: &str,
    partitions: usize,
    listen: SocketAddr,
    config: GatewayConfig,
    runtimes: runtimes::Catalogue,
) -> anyhow::Result<(Arc<Gateway>, tokio::net::TcpListener)> {
    let api_key = config.api_key.is_some();
    let q = broker
        .open_partitioned(queue, partitions, QueueConfig::default())
        .await?;
    let gw = Arc::new(Gateway::new(broker, q, runtimes, config));
    let offered = gw.refresh().await?;
    if offered == 0 {
        tracing::warn!(
            "no language is offered yet: no live worker serves queue {queue}; what workers \
             publish is read every second until one does"
        );
    }
    gw.keep_fresh(REFRESH);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    if !listen.ip().is_loopback() {
        tracing::warn!(
            "the gateway listens on {listen}, beyond loopback, without TLS{}",
            if api_key {
                ""
            } else {
                " and without an API key"
            }
        );
    }
    Ok((gw, listener))
}

/// One line per language: what the gateway offers.
pub fn describe(gw: &Gateway) -> String {
    gw.catalogue()
        .languages()
        .iter()
        .map(|l| format!("{} {}", l.name(), l.version))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn main(args: GatewayArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    let config = args.options.config()?;
    let runtime = match args.threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n.into());
            b
        }
    }
    .enable_all()
    .build()
    .context("starting the async runtime")?;
    runtime.block_on(async move {
        let broker = connect_to(&args.client.redis, args.client.cluster, &args.client.redis_tls.tls()).await?;
        let (gw, listener) = prepare(
            broker,
            &args.client.queue,
            args.client.partitions,
            args.listen,
            config,
            runtimes::Catalogue::load(args.options.runtimes.as_deref())?,
        )
        .await?;
        let addr = listener.local_addr().context("the listening address")?;
        println!("forkbox gateway: http://{addr} on queue {}", args.client.queue);
        println!("  languages: {}", describe(&gw));
        println!("  Piston /api/v2/execute, Judge0 /submissions, SandboxFusion /run_code; /metrics, /healthz");
        let shutdown = async {
            use tokio::signal::unix::{signal, SignalKind};
            match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
                (Ok(mut int), Ok(mut term)) => {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                    }
                }
                _ => std::future::pending::<()>().await,
            }
        };
        forkbox::gateway::serve(listener, gw, shutdown)
            .await
            .context("serving HTTP")?;
        eprintln!("forkbox gateway: stopped");
        Ok(ExitCode::SUCCESS)
    })
}
