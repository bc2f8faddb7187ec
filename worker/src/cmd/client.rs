//! The client commands: `submit`, `result`, `batch`, `stats`, `dlq`, `cancel`.
//!
//! Each is a thin layer over a [`Queue`] operation of the queue crate, with output for people
//! (tables, a progress bar) or for scripts (`--json`, ids alone on stdout), and exit codes like
//! `forkbox run` where a job's result is printed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use forkbox_queue::schema::DEFAULT_MAX_JOB_BYTES;
use forkbox_queue::{
    parse_payload, Broker, DlqSelection, Endpoint, Job, JobResult, JobState, Partitioned,
    QueueConfig, RedisTls,
};

use std::path::PathBuf;

use clap::{Args, Subcommand};
use forkbox::node::config::{self, check_redis_url};
use forkbox_queue::connect::without_password;

pub use super::opts::ClientOpts;
use super::opts::{JobArgs, RedisTlsOpts};
use super::run::print_outcome;
use super::terminal::{for_stderr, for_stdout};

/// Exit code of `batch submit` when the input has bad lines (sysexits' `EX_DATAERR`): distinct
/// from 125, which means a sandbox failure.
pub const EXIT_BAD_INPUT: u8 = 65;
/// Exit code of `submit --wait --timeout` when no result came in time (sysexits'
/// `EX_TEMPFAIL`): distinct from 124, which means the job itself timed out.
pub const EXIT_NO_RESULT: u8 = 75;

/// How long a client waits for Redis to answer before giving up with a clear message.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// Job id (idempotent: an id still pending or with a live result is not enqueued again).
    #[arg(long)]
    pub id: Option<String>,
    /// Wait for the result, print it and exit like `forkbox run`; warns when no worker serves
    /// the queue.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this many seconds (exit 75; 124 stays the job's own timeout).
    #[arg(long, value_name = "SECONDS", requires = "wait")]
    pub timeout: Option<f64>,
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
    /// Enqueue every line of a JSONL file (one job each) as one batch; prints the batch name,
    /// and records which line became which job id (see `batch results`, `--ids-out`).
    /// Any bad line is reported with its number, nothing is enqueued, and the exit code is 65.
    Submit(BatchSubmitArgs),
    /// Wait for a batch with a progress bar, then print a summary by status. Exit status: 0
    /// when it finished, 1 after --timeout, 2 with --fail-on-error when some job did not end
    /// ok, 130 on Ctrl-C (which prints the command that resumes the wait).
    Wait(BatchWaitArgs),
    /// Every result of a batch (or those with --status), joined to its input line and id.
    Results(BatchResultsArgs),
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
    /// Run every job that does not name a runtime in this one (`python`).
    #[arg(long, value_name = "RUNTIME")]
    pub runtime: Option<forkbox_queue::Runtime>,
    /// Also write the line -> id map here, one JSON object a line: {"line", "id", "new"}.
    #[arg(long, value_name = "FILE")]
    pub ids_out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BatchResultsArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// The batch name (as `batch submit` printed it).
    pub batch: String,
    /// Only these: statuses (ok, failed, timeout, ...), `not-ok` (finished, not ok) or
    /// `unfinished` (no result yet, or expired); comma-separated.
    #[arg(long, value_name = "S", value_delimiter = ',')]
    pub status: Vec<String>,
    /// One JSON object a line, {"line", "id", "result"} (`result` null when unfinished),
    /// instead of a table.
    #[arg(long)]
    pub jsonl: bool,
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
    /// Exit 2 when the batch finished with any job not `ok` (failed, timed out, killed at a
    /// limit, dead-lettered...), so a pipeline can gate on it; without it a finished batch
    /// exits 0 whatever its results.
    #[arg(long)]
    pub fail_on_error: bool,
}

/// Exit code of `batch wait --fail-on-error` when some job did not end `ok`.
pub const EXIT_BATCH_NOT_OK: u8 = 2;
/// Exit code of `batch wait` interrupted by Ctrl-C (128 + SIGINT, as a shell reports it).
pub const EXIT_INTERRUPTED: u8 = 130;

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Redis URL: redis://[USER:PASSWORD@]HOST:PORT[/DB], rediss://... for TLS (see
    /// --redis-ca), redis+unix:///PATH; %-encode @ : / # ? % in a password (with --cluster:
    /// one or more comma-separated seed URLs of a Redis Cluster).
    #[arg(long, env = "FORKBOX_REDIS_URL", value_name = "URL", default_value = config::DEFAULT_REDIS_URL)]
    pub redis: String,
    #[command(flatten)]
    pub redis_tls: RedisTlsOpts,
    /// --redis names a Redis Cluster's seed nodes.
    #[arg(long, env = "FORKBOX_CLUSTER")]
    pub cluster: bool,
    /// Queues to show, comma-separated.
    #[arg(long, short = 'q', env = "FORKBOX_QUEUES", value_delimiter = ',', default_value = config::DEFAULT_QUEUE)]
    pub queues: Vec<String>,
    /// Partitions of each queue; must match what the queues were created with.
    #[arg(
        long,
        env = "FORKBOX_PARTITIONS",
        value_name = "N",
        default_value_t = 1
    )]
    pub partitions: usize,
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
#[command(
    after_help = "Exit status: 0 when a queued or running job was cancelled (or, with \
    --ahead, an id not yet submitted was marked); 1 when nothing was cancelled: the job had \
    finished, or no job has this id (a mistyped id cancels nothing)."
)]
pub struct CancelArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// The job id.
    pub id: String,
    /// When no job has this id yet, cancel the job that is submitted with it later (through
    /// the enqueue script, as `forkbox submit` and the SDKs do), for `--lifetime` seconds.
    #[arg(long)]
    pub ahead: bool,
    /// How long a cancel made with `--ahead` waits for its job, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600, requires = "ahead",
          value_parser = clap::value_parser!(u64).range(1..=forkbox_queue::MAX_CANCEL_AHEAD_S))]
    pub lifetime: u64,
}

/// Connects to Redis at `url` (TLS settings `tls` for `rediss://`), failing fast with a
/// message that says what went wrong: "cannot reach Redis at URL", "authentication failed",
/// or the TLS handshake.
pub async fn connect(url: &str, tls: &RedisTls) -> anyhow::Result<Broker> {
    connect_to(url, false, tls).await
}

/// Connects to `redis`: one URL, or with `cluster` the seed URLs of a Redis Cluster, failing
/// fast with a message that names them (without their passwords) and what went wrong. A
/// `PING` follows the connection, so that a Redis that wants a password says so here
/// (`NOAUTH`) rather than at the first command.
pub async fn connect_to(redis: &str, cluster: bool, tls: &RedisTls) -> anyhow::Result<Broker> {
    let endpoint = Endpoint::parse(redis, cluster)?;
    let urls = match &endpoint {
        Endpoint::Single(url) => std::slice::from_ref(url),
        Endpoint::Cluster(seeds) => seeds.as_slice(),
    };
    for url in urls {
        check_redis_url(url, tls).map_err(anyhow::Error::msg)?;
    }
    let attempt = async {
        let broker = Broker::connect_to_with(&endpoint, tls).await?;
        forkbox_queue::redis::cmd("PING")
            .query_async::<String>(&mut broker.connection())
            .await
            .map_err(|source| forkbox_queue::QueueError::Connect {
                url: endpoint.to_string(),
                source,
            })?;
        Ok::<_, forkbox_queue::QueueError>(broker)
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, attempt).await {
        Ok(Ok(broker)) => Ok(broker),
        Ok(Err(e)) => Err(connect_failure(&endpoint, e)),
        Err(_) => bail!(
            "cannot reach Redis at {endpoint}: no answer within {} s",
            CONNECT_TIMEOUT.as_secs()
        ),
    }
}

/// What a failed connection means, in words: a refused password or certificate is not an
/// unreachable Redis.
fn connect_failure(endpoint: &Endpoint, e: forkbox_queue::QueueError) -> anyhow::Error {
    use forkbox_queue::connect::{is_auth_error, is_tls_error};
    match e.redis_error() {
        Some(r) if is_auth_error(r) => anyhow::anyhow!(
            "authentication failed at {endpoint}: {r} (check the user and password in the URL, \
             redis://USER:PASSWORD@HOST:PORT, with @ : / # ? % in them %-encoded)"
        ),
        Some(r) if is_tls_error(r) => anyhow::anyhow!(
            "TLS handshake with {endpoint} failed: {r} (does --redis-ca name the CA that signed \
             the server's certificate? does the server want a client certificate, \
             --redis-cert and --redis-key?)"
        ),
        Some(_) => anyhow::Error::new(e).context(format!("cannot reach Redis at {endpoint}")),
        None => e.into(),
    }
}

/// Opens the queue for a command that adds jobs: its partition count is recorded if the queue
/// has none yet, and must match the one recorded otherwise.
/// Opens the queue of `opts` (for `forkbox session`).
pub async fn open_queue(opts: &ClientOpts) -> anyhow::Result<Partitioned> {
    open(opts).await
}

async fn open(opts: &ClientOpts) -> anyhow::Result<Partitioned> {
    let broker = connect_to(&opts.redis, opts.cluster, &opts.redis_tls.tls()).await?;
    Ok(broker
        .open_partitioned(&opts.queue, opts.partitions, QueueConfig::default())
        .await?)
}

/// Opens the queue for a command that only reads or acts on what is there: the partition
/// count is checked against the recorded one, never recorded.
async fn open_existing(opts: &ClientOpts) -> anyhow::Result<Partitioned> {
    let broker = connect_to(&opts.redis, opts.cluster, &opts.redis_tls.tls()).await?;
    let q = broker.partitioned(&opts.queue, opts.partitions, QueueConfig::default())?;
    q.verify_layout().await?;
    Ok(q)
}

/// Prints a result as `forkbox run` prints an outcome, or as JSON; returns the exit code.
pub fn print_result(result: &JobResult, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        let mut out = std::io::stdout().lock();
        let text = serde_json::to_string_pretty(result)?;
        writeln!(out, "{}", for_stdout(&text))?;
        Ok(ExitCode::from(result.outcome.exit_code.clamp(0, 255) as u8))
    } else {
        print_outcome(&result.outcome, false)
    }
}

/// Waits for `id` without a deadline, in slices.
async fn wait_forever(q: &Partitioned, id: &str) -> anyhow::Result<JobResult> {
    loop {
        if let Some(r) = q.wait_result(id, Duration::from_secs(60)).await? {
            return Ok(r);
        }
    }
}

pub async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let mut job = args.job.to_job()?;
    job.id = args.id.clone();
    let q = open(&args.client).await?;
    let enq = q.enqueue_idempotent(&job).await?;
    if !enq.new {
        eprintln!(
            "forkbox: job {} is already pending or has a live result; not enqueued again",
            for_stderr(&enq.id)
        );
    }
    if !args.wait {
        println!("{}", for_stdout(&enq.id));
        return Ok(ExitCode::SUCCESS);
    }
    let unserved = q.live_workers().await? == 0;
    if unserved {
        eprintln!(
            "forkbox: warning: {}",
            for_stderr(&no_worker_hint(&q, &args.client.redis))
        );
    }
    let r = match args.timeout {
        None => wait_forever(&q, &enq.id).await?,
        Some(secs) => match q.wait_result(&enq.id, seconds("--timeout", secs)?).await? {
            Some(r) => r,
            None => {
                let hint = if unserved || q.live_workers().await? == 0 {
                    format!("; {}", no_worker_hint(&q, &args.client.redis))
                } else {
                    String::new()
                };
                eprintln!(
                    "{}",
                    for_stderr(&format!(
                        "forkbox: no result for {} on queue {} within {secs} s{hint}",
                        enq.id,
                        q.name(),
                    ))
                );
                return Ok(ExitCode::from(EXIT_NO_RESULT));
            }
        },
    };
    print_result(&r, args.json)
}

/// Why a wait on `q` may never end: no worker has a live heartbeat on it.
fn no_worker_hint(q: &Partitioned, redis: &str) -> String {
    format!(
        "no worker is serving queue {} on {} (no live heartbeat); the job waits until one \
         starts (forkbox worker --queues {}), or check the queue name",
        q.name(),
        without_password(redis),
        q.name()
    )
}

/// A `--flag SECONDS` value as a duration.
fn seconds(flag: &str, secs: f64) -> anyhow::Result<Duration> {
    anyhow::ensure!(
        secs.is_finite() && secs >= 0.0,
        "{flag} takes a number of seconds >= 0, got {secs}"
    );
    Ok(Duration::from_secs_f64(secs))
}

pub async fn result(args: ResultArgs) -> anyhow::Result<ExitCode> {
    let q = open_existing(&args.client).await?;
    let r = match args.wait {
        Some(secs) => {
            anyhow::ensure!(
                secs.is_finite() && secs >= 0.0,
                "--wait takes a number of seconds"
            );
            q.wait_result(&args.id, Duration::from_secs_f64(secs))
                .await?
        }
        None => q.result(&args.id).await?,
    };
    match r {
        Some(r) => print_result(&r, args.json),
        None => bail!(
            "no result for {} on queue {}{} (not finished yet, unknown, or expired)",
            args.id,
            args.client.queue,
            args.wait
                .map(|s| format!(" within {s} s"))
                .unwrap_or_default()
        ),
    }
}

/// Parses a JSONL file: every job with its line number (from 1; blank lines are skipped), or
/// every bad line with its number.
pub fn parse_jsonl(text: &str, max_bytes: usize) -> Result<Vec<(u64, Job)>, Vec<String>> {
    let mut jobs = Vec::new();
    let mut bad = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_payload(line.as_bytes(), max_bytes) {
            Ok(j) => jobs.push((n as u64 + 1, j)),
            Err(e) => bad.push(format!("line {}: {e}", n + 1)),
        }
    }
    if bad.is_empty() {
        Ok(jobs)
    } else {
        Err(bad)
    }
}

pub async fn batch_submit(args: BatchSubmitArgs) -> anyhow::Result<ExitCode> {
    let text = if args.file.as_os_str() == "-" {
        let mut s = String::new();
        for line in std::io::stdin().lock().lines() {
            s.push_str(&line.context("reading stdin")?);
            s.push('\n');
        }
        s
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    let mut jobs = match parse_jsonl(&text, DEFAULT_MAX_JOB_BYTES) {
        Ok(jobs) => jobs,
        Err(bad) => {
            for line in &bad {
                // A bad line is quoted, and its text is the file's, not ours.
                eprintln!("{}: {}", args.file.display(), for_stderr(line));
            }
            eprintln!(
                "forkbox: {} bad line(s) in {}; nothing enqueued",
                bad.len(),
                args.file.display()
            );
            return Ok(ExitCode::from(EXIT_BAD_INPUT));
        }
    };
    anyhow::ensure!(!jobs.is_empty(), "{} holds no jobs", args.file.display());
    for (_, job) in &mut jobs {
        job.runtime = job.runtime.or(args.runtime);
    }
    let batch = match &args.batch {
        Some(b) => b.clone(),
        None => {
            let stem = args
                .file
                .file_stem()
                .and_then(|s| s.to_str())
                .filter(|s| *s != "-")
                .unwrap_or("batch");
            let stem: String = stem
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            format!("{stem}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
        }
    };
    let q = open(&args.client).await?;
    // Ids first, so the line map is in Redis before any job can finish.
    for (_, job) in &mut jobs {
        job.id
            .get_or_insert_with(|| uuid::Uuid::now_v7().to_string());
    }
    let lines: Vec<(u64, String)> = jobs
        .iter()
        .map(|(n, j)| (*n, j.id.clone().expect("set above")))
        .collect();
    let ttl = jobs
        .iter()
        .map(|(_, j)| j.result_ttl_s.unwrap_or(q.config().result_ttl_s))
        .max()
        .unwrap_or(1);
    q.record_batch_lines(&batch, &lines, ttl).await?;
    let jobs: Vec<Job> = jobs.into_iter().map(|(_, j)| j).collect();
    let enq = q.enqueue_batch(&jobs, &batch).await?;
    if let Some(path) = &args.ids_out {
        let mut out = String::new();
        for ((line, _), e) in lines.iter().zip(&enq) {
            out.push_str(&serde_json::json!({"line": line, "id": e.id, "new": e.new}).to_string());
            out.push('\n');
        }
        std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))?;
    }
    let fresh = enq.iter().filter(|e| e.new).count();
    let note = format!(
        "batch {batch}: {fresh} job(s) enqueued on queue {} from {} line(s){}; {}",
        q.name(),
        enq.len(),
        if fresh < enq.len() {
            format!(" ({} already pending or finished)", enq.len() - fresh)
        } else {
            String::new()
        },
        match &args.ids_out {
            Some(p) => format!("line -> id map in {}", p.display()),
            None => format!("results by line: forkbox batch results {batch}"),
        }
    );
    eprintln!("{}", for_stderr(&note));
    println!("{}", for_stdout(&batch));
    Ok(ExitCode::SUCCESS)
}

/// What `batch results --status` selects.
fn selected(filter: &[String], result: Option<&JobResult>) -> bool {
    filter.is_empty()
        || filter.iter().any(|f| match result {
            Some(r) => {
                f == r.outcome.status.as_str()
                    || (f == "not-ok" && r.outcome.status != forkbox_queue::Status::Ok)
            }
            None => f == "unfinished",
        })
}

pub async fn batch_results(args: BatchResultsArgs) -> anyhow::Result<ExitCode> {
    let known: Vec<&str> = forkbox_queue::Status::ALL
        .iter()
        .map(|s| s.as_str())
        .chain(["not-ok", "unfinished"])
        .collect();
    for f in &args.status {
        anyhow::ensure!(
            known.contains(&f.as_str()),
            "--status {f}: not a status; use one of {}",
            known.join(", ")
        );
    }
    let q = open_existing(&args.client).await?;
    let lines = q.batch_lines(&args.batch).await?;
    if lines.is_empty() {
        bail!(
            "batch {} has no recorded jobs on queue {} (not submitted with `forkbox batch \
             submit`, or expired)",
            args.batch,
            q.name()
        );
    }
    let (numbers, ids): (Vec<u64>, Vec<String>) = lines.into_iter().unzip();
    let mut out = std::io::stdout().lock();
    if !args.jsonl {
        writeln!(
            out,
            "{:>6}  {:<40} {:<12} {:>4}",
            "LINE", "ID", "STATUS", "EXIT"
        )
        .map_err(super::stdout_error)?;
    }
    let mut unfinished = 0usize;
    // A page of results at a time, printed as it arrives: a large batch is streamed.
    const PAGE: usize = 500;
    for (numbers, ids) in numbers.chunks(PAGE).zip(ids.chunks(PAGE)) {
        let results = q.results_of(ids).await?;
        for ((line, id), result) in numbers.iter().zip(ids).zip(&results) {
            unfinished += usize::from(result.is_none());
            if !selected(&args.status, result.as_ref()) {
                continue;
            }
            if args.jsonl {
                let v = serde_json::json!({"line": line, "id": id, "result": result});
                writeln!(out, "{}", for_stdout(&v.to_string())).map_err(super::stdout_error)?;
            } else {
                let (status, exit) = match result {
                    Some(r) => (r.outcome.status.as_str(), r.outcome.exit_code.to_string()),
                    None => ("unfinished", "-".to_owned()),
                };
                let id = for_stdout(id);
                writeln!(out, "{line:>6}  {id:<40} {status:<12} {exit:>4}")
                    .map_err(super::stdout_error)?;
            }
        }
        out.flush().map_err(super::stdout_error)?;
    }
    if unfinished > 0 {
        eprintln!(
            "batch {}: {unfinished} of {} job(s) have no result (not finished yet, or expired)",
            for_stderr(&args.batch),
            ids.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn summary(status: &forkbox_queue::BatchStatus) -> String {
    let parts: Vec<String> = status
        .by_status
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect();
    if parts.is_empty() {
        "none finished".into()
    } else {
        parts.join(", ")
    }
}

pub async fn batch_wait(args: BatchWaitArgs) -> anyhow::Result<ExitCode> {
    // Taken over at once, so Ctrl-C from here on says how to resume rather than kill us.
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("handling SIGINT")?;
    let q = open_existing(&args.client).await?;
    let deadline = args
        .timeout
        .map(|s| Instant::now() + Duration::from_secs_f64(s));
    let mut status = q.batch_status(&args.batch).await?;
    if status.total == 0 {
        bail!(
            "batch {} is unknown on queue {} (never submitted with `forkbox batch submit`, or expired)",
            args.batch,
            q.name()
        );
    }
    let bar = indicatif::ProgressBar::new(status.total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    let rate = ResultRate::new(status.done, Instant::now());
    loop {
        bar.set_length(status.total);
        bar.set_position(status.done.min(status.total));
        // Drawn on standard error; the statuses are Redis's hash fields.
        let per_s = rate.per_s(status.done, Instant::now());
        let text = match per_s {
            Some(r) => format!("{} {}", show_rate(r), summary(&status)),
            None => summary(&status),
        };
        bar.set_message(for_stderr(&text).into_owned());
        if status.is_complete() {
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            bar.abandon();
            let note = format!(
                "batch {}: {}/{} done after the timeout ({})",
                args.batch,
                status.done,
                status.total,
                summary(&status)
            );
            eprintln!("{}", for_stderr(&note));
            return Ok(ExitCode::from(1));
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = interrupt.recv() => {
                bar.abandon();
                eprintln!(
                    "batch {}: {}/{} done when interrupted ({}); the jobs go on. Resume the \
                     wait with:\n  {}",
                    args.batch,
                    status.done,
                    status.total,
                    summary(&status),
                    resume_command(&args)
                );
                return Ok(ExitCode::from(EXIT_INTERRUPTED));
            }
        }
        status = q.batch_status(&args.batch).await?;
    }
    bar.finish_and_clear();
    if args.json {
        let v = serde_json::json!({
            "batch": args.batch, "total": status.total, "done": status.done,
            "by_status": status.by_status,
        });
        println!("{}", for_stdout(&v.to_string()));
    } else {
        let line = format!(
            "batch {}: {}/{} done: {}",
            args.batch,
            status.done,
            status.total,
            summary(&status)
        );
        println!("{}", for_stdout(&line));
    }
    let not_ok = status
        .by_status
        .iter()
        .any(|(s, n)| s.as_str() != "ok" && *n > 0);
    if args.fail_on_error && not_ok {
        return Ok(ExitCode::from(EXIT_BATCH_NOT_OK));
    }
    Ok(ExitCode::SUCCESS)
}

/// The rate at which a batch's results arrive while it is watched: results since the wait
/// began over the time since then (what came before the wait is no rate of ours to show).
#[derive(Debug, Clone, Copy)]
struct ResultRate {
    done_at_start: u64,
    start: Instant,
}

impl ResultRate {
    fn new(done: u64, now: Instant) -> ResultRate {
        ResultRate {
            done_at_start: done,
            start: now,
        }
    }

    /// Results a second, once there is a second of them to go by.
    fn per_s(&self, done: u64, now: Instant) -> Option<f64> {
        let secs = now.duration_since(self.start).as_secs_f64();
        (secs >= 1.0).then(|| done.saturating_sub(self.done_at_start) as f64 / secs)
    }
}

/// A rate, rounded: whole results a second, one decimal below ten.
fn show_rate(per_s: f64) -> String {
    if per_s >= 10.0 {
        format!("{per_s:.0}/s")
    } else {
        format!("{per_s:.1}/s")
    }
}

/// The command that waits for the same batch again.
fn resume_command(args: &BatchWaitArgs) -> String {
    let c = &args.client;
    let mut cmd = format!("forkbox batch wait {}", args.batch);
    if c.redis != config::DEFAULT_REDIS_URL {
        cmd += &format!(" --redis '{}'", without_password(&c.redis));
    }
    if c.cluster {
        cmd += " --cluster";
    }
    if c.queue != config::DEFAULT_QUEUE {
        cmd += &format!(" -q {}", c.queue);
    }
    if c.partitions != 1 {
        cmd += &format!(" --partitions {}", c.partitions);
    }
    if args.fail_on_error {
        cmd += " --fail-on-error";
    }
    cmd
}

#[derive(Debug, Args)]
pub struct RuntimesArgs {
    #[command(flatten)]
    pub fleet: StatsArgs,
    /// A runtime catalogue file over the built-in one, as the workers' and the gateway's
    /// `--runtimes`: where each language's compile limits are read.
    #[arg(long, value_name = "FILE", env = "FORKBOX_RUNTIMES")]
    pub runtimes: Option<std::path::PathBuf>,
}

/// `forkbox runtimes`: the languages and versions the live workers of the queues published,
/// each with how many nodes offer it and its compile stage's default limits (the catalogue's).
pub async fn runtimes(args: RuntimesArgs) -> anyhow::Result<ExitCode> {
    use forkbox::runtimes::{Available, Catalogue, CompileLimits};
    let catalogue = Catalogue::load(args.runtimes.as_deref())?;
    let compile_limits = |language: &str| -> Option<CompileLimits> {
        let lang = catalogue.find(language)?;
        lang.compile.as_ref().map(|_| lang.compile_limits)
    };
    let args = args.fleet;
    let broker = connect_to(&args.redis, args.cluster, &args.redis_tls.tls()).await?;
    let mut offers: BTreeMap<Available, BTreeSet<String>> = BTreeMap::new();
    for name in &args.queues {
        let q = broker.partitioned(name, args.partitions, QueueConfig::default())?;
        for part in q.partitions() {
            for (worker, json) in part.published_runtimes().await? {
                let list: Vec<Available> = serde_json::from_str(&json).map_err(|e| {
                    anyhow::anyhow!("worker {worker} published unreadable runtimes: {e}")
                })?;
                for available in list {
                    offers.entry(available).or_default().insert(worker.clone());
                }
            }
        }
    }
    if args.json {
        let rows: Vec<serde_json::Value> = offers
            .iter()
            .map(|(a, nodes)| {
                serde_json::json!({"language": a.language, "version": a.version, "nodes": nodes.len(),
                    "compile_limits": compile_limits(&a.language)})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    if offers.is_empty() {
        eprintln!(
            "no live worker of {} published its runtimes",
            args.queues.join(",")
        );
        return Ok(ExitCode::from(1));
    }
    println!(
        "{:<16} {:<16} {:>5}  COMPILE_LIMITS",
        "LANGUAGE", "VERSION", "NODES"
    );
    for (a, nodes) in &offers {
        println!(
            "{:<16} {:<16} {:>5}  {}",
            for_stdout(&a.language),
            for_stdout(&a.version),
            nodes.len(),
            compile_limits(&a.language).map_or_else(|| "-".to_owned(), |l| l.to_string())
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn stats(args: StatsArgs) -> anyhow::Result<ExitCode> {
    let broker = connect_to(&args.redis, args.cluster, &args.redis_tls.tls()).await?;
    let mut out = Vec::new();
    for name in &args.queues {
        let q = broker.partitioned(name, args.partitions, QueueConfig::default())?;
        q.verify_layout().await?;
        let s = q.stats().await?;
        let mut consumers = Vec::new();
        for c in &s.consumers {
            consumers.push((c, q.is_alive(&c.name).await?));
        }
        if args.json {
            out.push(serde_json::json!({
                "queue": name, "length": s.length, "pending": s.pending, "lag": s.lag,
                "dead": s.dead,
                "consumers": consumers.iter().map(|(c, alive)| serde_json::json!({
                    "name": c.name, "pending": c.pending, "idle_ms": c.idle_ms, "alive": alive,
                })).collect::<Vec<_>>(),
            }));
            continue;
        }
        let lag = s
            .lag
            .map_or_else(|| "unknown".to_owned(), |l| l.to_string());
        println!("queue {}", for_stdout(name));
        println!("  length     {:>8}  (waiting + in flight)", s.length);
        println!("  pending    {:>8}  (delivered, not finished)", s.pending);
        println!("  lag        {lag:>8}  (not yet delivered)");
        println!("  dead       {:>8}  (dead letters)", s.dead);
        println!("  consumers  {:>8}", s.consumers.len());
        for (c, alive) in consumers {
            println!(
                "    {:<32} pending {:>5}  idle {:>8.1} s  {}",
                for_stdout(&c.name),
                c.pending,
                c.idle_ms as f64 / 1000.0,
                if alive { "alive" } else { "no heartbeat" }
            );
        }
    }
    if args.json {
        println!("{}", for_stdout(&serde_json::to_string_pretty(&out)?));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn dlq_list(args: DlqListArgs) -> anyhow::Result<ExitCode> {
    let q = open_existing(&args.client).await?;
    let letters = q.dlq_list(args.count).await?;
    if args.json {
        let v: Vec<_> = letters
            .iter()
            .map(|l| {
                serde_json::json!({
                    "dead_id": l.dead_id, "id": l.id, "reason": l.reason, "entry_id": l.entry_id,
                    "queue": l.queue, "deliveries": l.deliveries, "worker": l.worker,
                    "at_ms": l.at_ms, "job": String::from_utf8_lossy(&l.job),
                })
            })
            .collect();
        println!("{}", for_stdout(&serde_json::to_string_pretty(&v)?));
        return Ok(ExitCode::SUCCESS);
    }
    if letters.is_empty() {
        eprintln!("no dead letters on queue {}", for_stderr(q.name()));
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<20} {:<28} {:>4}  REASON",
        "DEAD ID", "JOB ID", "DLV"
    )?;
    for l in &letters {
        writeln!(
            out,
            "{:<20} {:<28} {:>4}  {}",
            for_stdout(&l.dead_id),
            for_stdout(&l.id),
            l.deliveries,
            for_stdout(&l.reason.replace('\n', " "))
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn dlq_requeue(args: DlqRequeueArgs) -> anyhow::Result<ExitCode> {
    let q = open_existing(&args.client).await?;
    let which = if args.all {
        DlqSelection::All
    } else {
        DlqSelection::Ids(args.ids.clone())
    };
    let n = q.dlq_requeue(which).await?;
    println!(
        "requeued {n} dead letter(s) on queue {}",
        for_stdout(q.name())
    );
    if !args.all && n < args.ids.len() {
        eprintln!(
            "forkbox: {} of the given ids were not in the dead-letter stream",
            args.ids.len() - n
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn dlq_purge(args: DlqPurgeArgs) -> anyhow::Result<ExitCode> {
    let q = open_existing(&args.client).await?;
    let n = q.dlq_purge().await?;
    println!(
        "purged {n} dead letter(s) from queue {}",
        for_stdout(q.name())
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn cancel(args: CancelArgs) -> anyhow::Result<ExitCode> {
    let q = open_existing(&args.client).await?;
    let state = q.job_state(&args.id).await?;
    let (id, queue) = (for_stdout(&args.id), for_stdout(q.name()));
    if state.cancellable() {
        let heard = q.cancel(&args.id).await?;
        let what = match &state {
            JobState::Queued => "it will not run".to_owned(),
            other => format!("{other}: it is killed"),
        };
        println!(
            "cancelled {id} on queue {queue}, {what} ({heard} worker(s) heard it live; the \
             others see it when they next resync)"
        );
        return Ok(ExitCode::SUCCESS);
    }
    match state {
        JobState::Unknown if args.ahead => {
            q.cancel_ahead(&args.id, args.lifetime).await?;
            println!(
                "no job {id} on queue {queue} yet: one submitted with this id within {} s is \
                 cancelled as it is added",
                args.lifetime
            );
            return Ok(ExitCode::SUCCESS);
        }
        JobState::Finished { status } => {
            eprintln!(
                "job {} on queue {} already finished ({}): nothing cancelled",
                for_stderr(&args.id),
                for_stderr(q.name()),
                for_stderr(&status.to_string())
            )
        }
        _ => eprintln!(
            "no job {} on queue {} (never submitted, its result expired, or added by a \
             raw XADD under an id of its own): nothing cancelled; to cancel a job before it is \
             submitted, add --ahead",
            for_stderr(&args.id),
            for_stderr(q.name())
        ),
    }
    Ok(ExitCode::FAILURE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_of_results_since_the_wait_began_rounded() {
        let t0 = Instant::now();
        // 500 results were in before the wait: 10 more in 5 s is 2/s, not 102/s.
        let rate = ResultRate::new(500, t0);
        assert_eq!(rate.per_s(500, t0 + Duration::from_millis(300)), None);
        let r = rate.per_s(510, t0 + Duration::from_secs(5)).unwrap();
        assert_eq!(show_rate(r), "2.0/s");
        assert_eq!(show_rate(11.7527), "12/s");
        assert_eq!(show_rate(1.7527), "1.8/s");
    }

    #[test]
    fn bad_jsonl_lines_are_reported_with_their_numbers() {
        let text = "{\"cmd\":\"true\"}\n\n{\"cmd\":5}\nnot json\n{\"argv\":[\"x\"]}\n";
        let bad = parse_jsonl(text, DEFAULT_MAX_JOB_BYTES).unwrap_err();
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(bad[0].starts_with("line 3: cmd"), "{}", bad[0]);
        assert!(bad[1].starts_with("line 4: "), "{}", bad[1]);
        let ok = parse_jsonl("{\"cmd\":\"true\"}\n\n{\"argv\":[\"x\"]}", 1 << 20).unwrap();
        let numbers: Vec<u64> = ok.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            numbers,
            [1, 3],
            "blank lines keep the numbering of the file"
        );
    }
}
