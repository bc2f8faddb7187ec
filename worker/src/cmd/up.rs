//! `forkbox up`: the one-command local node.
//!
//! It uses the Redis at `--redis` when one answers PING there, else (or with `--own-redis`)
//! starts a private `redis-server` on a free port with its data in a temporary directory, then
//! runs a worker in this process and prints how to submit jobs. Ctrl-C stops the worker
//! (running jobs finish first; a second Ctrl-C kills them) and then the private Redis.
//! `--demo` submits a handful of sample jobs, prints their results as a table and stops.
//! The private Redis does not outlive `up` even when `up` is killed outright: it is started
//! under `setpriv --pdeathsig KILL` from the main thread (where util-linux is installed), and
//! the data directory such an `up` leaves is removed by the next one.
//!
//! Any local user can reach a loopback port, so the private Redis requires a random password.
//! It never appears on a command line (`ps` shows those to everyone): the server reads it from
//! its standard input, the node gets it in this process, and the user gets it from files that
//! only they can read (`url` and `password` in the 0700 data directory), which the printed
//! instructions read with `$(cat ...)` into the environment.

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use forkbox_private_redis::{RedisServer, RedisServerOptions};
use forkbox_queue::{FileData, Job, JobResult, QueueConfig};

use forkbox::node::config::{self, NodeConfig};
use forkbox::node::{Node, StopHandle, StopLevel};
use forkbox_queue::connect::without_password;

use super::opts::{start_engine, RedisTlsOpts, SandboxOpts};
use super::terminal::{for_stderr, for_stdout};
use super::{init_logging, runtime};

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Use the Redis here when it answers; otherwise start a private one.
    #[arg(long, env = "FORKBOX_REDIS_URL", value_name = "URL", default_value = config::DEFAULT_REDIS_URL)]
    pub redis: String,
    #[command(flatten)]
    pub redis_tls: RedisTlsOpts,
    /// Always start a private redis-server (0700 temporary directory, free port, random
    /// password kept off every command line: its URL is written to a 0600 file).
    #[arg(long)]
    pub own_redis: bool,
    /// The port of the private redis-server, when one is started [default: a free one].
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
    /// Jobs run at once [default: the number of CPUs].
    #[arg(long)]
    pub slots: Option<usize>,
    /// The queue to serve.
    #[arg(long, default_value = config::DEFAULT_QUEUE)]
    pub queue: String,
    /// Serve /metrics and /healthz here (port 0 picks one).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:0")]
    pub metrics_addr: SocketAddr,
    /// Seconds running jobs get to finish after Ctrl-C.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub grace: f64,
    /// Run sample jobs, print their results as a table, and stop.
    #[arg(long)]
    pub demo: bool,
    /// Serve from a Redis whose maxmemory-policy is not noeviction (it may evict jobs).
    #[arg(long)]
    pub allow_eviction: bool,
    /// Also start the HTTP gateway (Piston, Judge0, SandboxFusion APIs) on this queue, at
    /// ADDR (default 127.0.0.1:2358; no TLS, so keep it on loopback or behind a proxy).
    #[arg(long, value_name = "ADDR:PORT", num_args = 0..=1, default_missing_value = super::gateway::DEFAULT_LISTEN)]
    pub gateway: Option<SocketAddr>,
    #[command(flatten)]
    pub gateway_options: super::gateway::GatewayOptions,
    #[command(flatten)]
    pub sandbox: SandboxOpts,
}

/// Whether something answers PING at `url` within a second.
fn answers_ping(url: &str, tls: &forkbox_queue::RedisTls) -> bool {
    let Ok(client) = forkbox_queue::connect::redis_client(url, tls) else {
        return false;
    };
    let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(1)) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
    forkbox_queue::redis::cmd("PING")
        .query::<String>(&mut conn)
        .is_ok()
}

pub fn main(args: UpArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    anyhow::ensure!(
        args.grace.is_finite() && args.grace >= 0.0,
        "--grace takes a number of seconds"
    );
    // Blocking set-up first: the private Redis and the engine (whose zygote must be started
    // before the runtime's threads exist).
    let private = if args.own_redis || !answers_ping(&args.redis, &args.redis_tls.tls()) {
        if !args.own_redis {
            eprintln!(
                "forkbox up: no Redis answers at {}; starting a private redis-server instead \
                 (its jobs and results are gone when up stops; give --own-redis to skip this \
                 check, or start Redis there and run up again to use it)",
                without_password(&args.redis)
            );
        }
        // Started from the main thread, which lives as long as we do: the server dies with us
        // even when we are killed outright.
        let options = RedisServerOptions {
            die_with_parent: true,
            port: args.port,
            password: Some(forkbox_private_redis::random_password()),
            ..RedisServerOptions::default()
        };
        let server = RedisServer::start_with(options).context(
            "starting a private redis-server (is `redis-server` installed and in PATH? \
             FORKBOX_REDIS_SERVER names another binary)",
        )?;
        let secrets = write_secrets(&server)?;
        Some((server, secrets))
    } else {
        None
    };
    let redis_url = private
        .as_ref()
        .map(|(server, _)| server.url())
        .unwrap_or_else(|| args.redis.clone());
    // A private server speaks plain TCP on loopback: the TLS settings are for --redis's.
    let redis_tls = match private {
        Some(_) => forkbox_queue::RedisTls::default(),
        None => args.redis_tls.tls(),
    };
    let mut config = NodeConfig::new(redis_url.clone());
    config.redis_tls = redis_tls.clone();
    config.queues = vec![args.queue.clone()];
    if let Some(s) = args.slots {
        config.slots = s;
    }
    config.metrics_addr = Some(args.metrics_addr);
    config.grace = Duration::from_secs_f64(args.grace);
    config.allow_eviction = args.allow_eviction;
    config.validate()?;
    let engine = start_engine(config.slots, &args.sandbox)?;
    let slots = config.slots;
    let name = config.name.clone();
    let node = Node::new(config, engine);
    let queue = args.queue.clone();
    let private_note = private.as_ref().map(|(server, secrets)| PrivateRedis {
        port: server.port(),
        secrets: secrets.clone(),
    });

    let code = runtime()?.block_on(async move {
        let stop = StopHandle::default();
        stop.on_signals(Duration::from_secs_f64(args.grace))?;
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let node_task = tokio::spawn(node.run(stop.clone(), move |addr| {
            let _ = ready_tx.send(addr);
        }));
        let Ok(metrics) = ready_rx.await else {
            // The node ended before it was ready: report its error.
            node_task.await.context("the node task")??;
            return Ok(ExitCode::SUCCESS);
        };
        let gateway = match args.gateway {
            None => None,
            Some(listen) => {
                let broker = forkbox_queue::Broker::connect_with(&redis_url, &redis_tls).await?;
                let (gw, listener) = super::gateway::prepare(
                    broker,
                    &queue,
                    1,
                    listen,
                    args.gateway_options.config()?,
                    forkbox::runtimes::Catalogue::load(args.gateway_options.runtimes.as_deref())?,
                )
                .await?;
                let addr = listener.local_addr().context("the gateway's address")?;
                let mut stop_rx = stop.subscribe();
                let shutdown = async move {
                    let _ = stop_rx.wait_for(|l| *l >= StopLevel::Drain).await;
                };
                tokio::spawn(forkbox::gateway::serve(listener, gw, shutdown));
                Some(addr)
            }
        };
        print_banner(
            &name,
            slots,
            &queue,
            &redis_url,
            private_note.as_ref(),
            Addresses { metrics, gateway },
            args.demo,
        );
        let mut code = ExitCode::SUCCESS;
        if args.demo {
            let mut stop_rx = stop.subscribe();
            tokio::select! {
                r = demo(&redis_url, &redis_tls, &queue) => match r {
                    Ok(c) => code = c,
                    Err(e) => {
                        eprintln!("forkbox up --demo: {}", for_stderr(&format!("{e:#}")));
                        code = ExitCode::from(1);
                    }
                },
                _ = stop_rx.wait_for(|l| *l >= StopLevel::Drain) => {}
            }
            stop.raise(StopLevel::Drain);
        }
        node_task.await.context("the node task")??;
        anyhow::Ok(code)
    })?;
    if let Some((server, _)) = private {
        drop(server);
        eprintln!("forkbox up: stopped the worker and the private redis-server");
    } else {
        eprintln!("forkbox up: stopped the worker");
    }
    Ok(code)
}

/// Where the user finds the private Redis's credentials: files only they can read.
#[derive(Debug, Clone)]
struct Secrets {
    /// The URL with its password (for `FORKBOX_REDIS_URL`).
    url: PathBuf,
    /// The password alone (for redis-cli's `REDISCLI_AUTH`).
    password: PathBuf,
}

/// What the banner says about a private Redis.
struct PrivateRedis {
    port: u16,
    secrets: Secrets,
}

/// Writes the private server's URL and password, each 0600 in its 0700 data directory.
fn write_secrets(server: &RedisServer) -> anyhow::Result<Secrets> {
    let url = server.url();
    let password = url
        .split_once("://:")
        .and_then(|(_, rest)| rest.split_once('@'))
        .map(|(p, _)| p.to_owned())
        .context("the private redis-server has no password")?;
    let secrets = Secrets {
        url: server.dir().join("url"),
        password: server.dir().join("password"),
    };
    write_private(&secrets.url, &url)?;
    write_private(&secrets.password, &password)?;
    Ok(secrets)
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(format!("{text}\n").as_bytes()))
        .with_context(|| format!("writing {}", path.display()))
}

/// Where `up` serves HTTP: the node's metrics and the gateway.
struct Addresses {
    metrics: Option<SocketAddr>,
    gateway: Option<SocketAddr>,
}

fn print_banner(
    name: &str,
    slots: usize,
    queue: &str,
    url: &str,
    private: Option<&PrivateRedis>,
    served: Addresses,
    demo: bool,
) {
    let Addresses { metrics, gateway } = served;
    println!("forkbox up: worker {name} with {slots} slot(s) on queue {queue}");
    println!(
        "  redis:   {}{}",
        without_password(url),
        if private.is_some() {
            "  (private redis-server with a password; it stops with this node)"
        } else {
            ""
        }
    );
    if let Some(m) = metrics {
        println!("  metrics: http://{m}/metrics  (health: http://{m}/healthz)");
    }
    if let Some(addr) = gateway {
        println!("  gateway: http://{addr}  (Piston /api/v2/execute, Judge0 /submissions, SandboxFusion /run_code)");
    }
    if demo {
        println!();
        return;
    }
    println!("Submit a job from another terminal:");
    let cli = match private {
        Some(p) => {
            // Through the environment: a password on a command line is every user's to read.
            println!(
                "  export FORKBOX_REDIS_URL=\"$(cat {})\"",
                p.secrets.url.display()
            );
            println!("  forkbox submit --wait -- echo hi");
            println!(
                "  export REDISCLI_AUTH=\"$(cat {})\"",
                p.secrets.password.display()
            );
            format!("redis-cli -p {}", p.port)
        }
        None => {
            println!("  forkbox submit --redis {url} --wait -- echo hi");
            format!("redis-cli -u {url}")
        }
    };
    println!(
        "  {cli} XADD 'forkbox:{{{queue}}}:jobs' '*' job '{{\"id\":\"hello-1\",\"cmd\":\"echo hello\"}}'"
    );
    println!("  {cli} BLPOP 'forkbox:{{{queue}}}:done:hello-1' 30");
    println!("  {cli} GET 'forkbox:{{{queue}}}:result:hello-1'");
    println!("Ctrl-C stops the node.");
}

const HUMANEVAL_LIKE: &str = r#"from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    """Check if any two numbers are closer to each other than the threshold."""
    ordered = sorted(numbers)
    return any(b - a < threshold for a, b in zip(ordered, ordered[1:]))


def check(candidate):
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) is True
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) is False
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) is True
    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 0.5) is False


check(has_close_elements)
print("all tests passed")
"#;

/// The sample jobs of `--demo`, with what each shows.
pub fn demo_jobs() -> Vec<(&'static str, Job)> {
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let mut jobs = vec![
        ("echo", Job::shell("echo hello from a sandbox")),
        (
            "python3",
            Job::argv([
                "python3",
                "-c",
                "print(sum(i * i for i in range(1_000_000)))",
            ]),
        ),
        ("failing", Job::shell("echo 'about to fail' >&2; exit 3")),
        (
            "timeout",
            Job {
                timeout_ms: Some(300),
                ..Job::shell("sleep 10")
            },
        ),
        (
            "humaneval",
            Job {
                files: [(
                    "solution.py".to_owned(),
                    FileData::Text(HUMANEVAL_LIKE.into()),
                )]
                .into(),
                ..Job::argv(["python3", "solution.py"])
            },
        ),
        (
            "isolation",
            Job::shell(
                "echo \"uid $(id -u) inside; $(ls -A /root /home 2>/dev/null | wc -l) host files \
                 visible in /root and /home\"",
            ),
        ),
    ];
    for (label, job) in &mut jobs {
        job.id = Some(format!("demo-{run_id}-{label}"));
    }
    jobs
}

async fn demo(url: &str, tls: &forkbox_queue::RedisTls, queue: &str) -> anyhow::Result<ExitCode> {
    let q = super::client::connect(url, tls)
        .await?
        .queue(queue, QueueConfig::default())?;
    let jobs = demo_jobs();
    println!("submitting {} sample jobs...", jobs.len());
    for (_, job) in &jobs {
        q.enqueue(job).await?;
    }
    let mut rows = Vec::new();
    for (label, job) in &jobs {
        let id = job.id.clone().expect("demo jobs carry ids");
        let r = q
            .wait_result(&id, Duration::from_secs(60))
            .await?
            .with_context(|| format!("no result for {id} within 60 s"))?;
        rows.push((*label, r));
    }
    print_table(&rows);
    println!();
    println!("Each job ran in its own sandbox forked from a warm zygote; results live in Redis");
    println!(
        "under forkbox:{{{queue}}}:result:<id>. Run `forkbox up` without --demo to keep a node."
    );
    Ok(ExitCode::SUCCESS)
}

fn print_table(rows: &[(&str, JobResult)]) {
    println!();
    println!(
        "{:<10} {:<8} {:>4} {:>9} {:>9}  OUTPUT",
        "JOB", "STATUS", "EXIT", "WALL ms", "SPAWN us"
    );
    for (label, r) in rows {
        let o = &r.outcome;
        let text = if !o.stdout.trim().is_empty() {
            o.stdout.trim()
        } else if !o.stderr.trim().is_empty() {
            o.stderr.trim()
        } else if o.status == forkbox_queue::Status::Timeout {
            "killed at its wall-clock limit"
        } else {
            o.error.as_deref().unwrap_or("")
        };
        let mut line: String = text.lines().last().unwrap_or("").chars().take(60).collect();
        if text.lines().count() > 1 || text.chars().count() > 60 {
            line.push('…');
        }
        println!(
            "{:<10} {:<8} {:>4} {:>9.1} {:>9}  {}",
            label,
            o.status.as_str(),
            o.exit_code,
            o.duration_ms,
            o.spawn_us,
            for_stdout(&line)
        );
    }
}
