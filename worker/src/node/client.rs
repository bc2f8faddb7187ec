//! The client commands: `submit`, `result`, `batch`, `stats`, `dlq`, `cancel`.
//!
//! Each is a thin layer over a [`Queue`] operation of the queue crate, with output for people
//! (tables, a progress bar) or for scripts (`--json`, ids alone on stdout), and exit codes like
//! `forkbox run` where a job's result is printed.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use forkbox_queue::schema::DEFAULT_MAX_JOB_BYTES;
use forkbox_queue::{parse_payload, Broker, DlqSelection, Job, JobResult, Queue, QueueConfig};

use crate::node::cli::{
    BatchSubmitArgs, BatchWaitArgs, CancelArgs, ClientOpts, DlqListArgs, DlqPurgeArgs,
    DlqRequeueArgs, ResultArgs, StatsArgs, SubmitArgs,
};
use crate::node::worker::redact;

/// How long a client waits for Redis to answer before giving up with a clear message.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Connects to Redis at `url`, failing fast with "cannot reach Redis at URL: ...".
pub async fn connect(url: &str) -> anyhow::Result<Broker> {
    let shown = redact(url);
    let client = forkbox_queue::redis::Client::open(url)
        .with_context(|| format!("invalid Redis URL {shown}"))?;
    // A plain connection first: the reconnecting manager would retry for a long while.
    let probe = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        forkbox_queue::redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, probe).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => bail!("cannot reach Redis at {shown}: {e}"),
        Err(_) => bail!(
            "cannot reach Redis at {shown}: no answer within {} s",
            CONNECT_TIMEOUT.as_secs()
        ),
    }
    Broker::connect(url)
        .await
        .with_context(|| format!("cannot reach Redis at {shown}"))
}

async fn open(opts: &ClientOpts) -> anyhow::Result<Queue> {
    let broker = connect(&opts.redis).await?;
    Ok(broker.queue(&opts.queue, QueueConfig::default())?)
}

/// Prints a result as `forkbox run` prints an outcome, or as JSON; returns the exit code.
pub fn print_result(result: &JobResult, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::to_string_pretty(result)?)?;
        Ok(ExitCode::from(result.outcome.exit_code.clamp(0, 255) as u8))
    } else {
        crate::cli::print_outcome(&result.outcome, false)
    }
}

/// Waits for `id` without a deadline, in slices.
async fn wait_forever(q: &Queue, id: &str) -> anyhow::Result<JobResult> {
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
            enq.id
        );
    }
    if !args.wait {
        println!("{}", enq.id);
        return Ok(ExitCode::SUCCESS);
    }
    let r = wait_forever(&q, &enq.id).await?;
    print_result(&r, args.json)
}

pub async fn result(args: ResultArgs) -> anyhow::Result<ExitCode> {
    let q = open(&args.client).await?;
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

/// Parses a JSONL file: every job, or every bad line with its number.
pub fn parse_jsonl(text: &str, max_bytes: usize) -> Result<Vec<Job>, Vec<String>> {
    let mut jobs = Vec::new();
    let mut bad = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_payload(line.as_bytes(), max_bytes) {
            Ok(j) => jobs.push(j),
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
    let jobs = match parse_jsonl(&text, DEFAULT_MAX_JOB_BYTES) {
        Ok(jobs) => jobs,
        Err(bad) => {
            for line in &bad {
                eprintln!("{}: {line}", args.file.display());
            }
            bail!(
                "{} bad line(s) in {}; nothing enqueued",
                bad.len(),
                args.file.display()
            );
        }
    };
    anyhow::ensure!(!jobs.is_empty(), "{} holds no jobs", args.file.display());
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
    let enq = q.enqueue_batch(&jobs, &batch).await?;
    let fresh = enq.iter().filter(|e| e.new).count();
    eprintln!(
        "batch {batch}: {fresh} job(s) enqueued on queue {}{}",
        q.name(),
        if fresh < enq.len() {
            format!(" ({} already pending or finished)", enq.len() - fresh)
        } else {
            String::new()
        }
    );
    println!("{batch}");
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
    let q = open(&args.client).await?;
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
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {per_sec} {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    loop {
        bar.set_length(status.total);
        bar.set_position(status.done.min(status.total));
        bar.set_message(summary(&status));
        if status.is_complete() {
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            bar.abandon();
            eprintln!(
                "batch {}: {}/{} done after the timeout ({})",
                args.batch,
                status.done,
                status.total,
                summary(&status)
            );
            return Ok(ExitCode::from(1));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        status = q.batch_status(&args.batch).await?;
    }
    bar.finish_and_clear();
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "batch": args.batch, "total": status.total, "done": status.done,
                "by_status": status.by_status,
            })
        );
    } else {
        println!(
            "batch {}: {}/{} done: {}",
            args.batch,
            status.done,
            status.total,
            summary(&status)
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn stats(args: StatsArgs) -> anyhow::Result<ExitCode> {
    let broker = connect(&args.redis).await?;
    let mut out = Vec::new();
    for name in &args.queues {
        let q = broker.queue(name, QueueConfig::default())?;
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
        println!("queue {name}");
        println!("  length     {:>8}  (waiting + in flight)", s.length);
        println!("  pending    {:>8}  (delivered, not finished)", s.pending);
        println!("  lag        {lag:>8}  (not yet delivered)");
        println!("  dead       {:>8}  (dead letters)", s.dead);
        println!("  consumers  {:>8}", s.consumers.len());
        for (c, alive) in consumers {
            println!(
                "    {:<32} pending {:>5}  idle {:>8.1} s  {}",
                c.name,
                c.pending,
                c.idle_ms as f64 / 1000.0,
                if alive { "alive" } else { "no heartbeat" }
            );
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn dlq_list(args: DlqListArgs) -> anyhow::Result<ExitCode> {
    let q = open(&args.client).await?;
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
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    if letters.is_empty() {
        eprintln!("no dead letters on queue {}", q.name());
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
            l.dead_id,
            l.id,
            l.deliveries,
            l.reason.replace('\n', " ")
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn dlq_requeue(args: DlqRequeueArgs) -> anyhow::Result<ExitCode> {
    let q = open(&args.client).await?;
    let which = if args.all {
        DlqSelection::All
    } else {
        DlqSelection::Ids(args.ids.clone())
    };
    let n = q.dlq_requeue(which).await?;
    println!("requeued {n} dead letter(s) on queue {}", q.name());
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
    let q = open(&args.client).await?;
    let n = q.dlq_purge().await?;
    println!("purged {n} dead letter(s) from queue {}", q.name());
    Ok(ExitCode::SUCCESS)
}

pub async fn cancel(args: CancelArgs) -> anyhow::Result<ExitCode> {
    let q = open(&args.client).await?;
    let heard = q.cancel(&args.id).await?;
    println!(
        "cancelled {} on queue {} ({heard} worker(s) heard it live; the others see it when they \
         next resync)",
        args.id,
        q.name()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_jsonl_lines_are_reported_with_their_numbers() {
        let text = "{\"cmd\":\"true\"}\n\n{\"cmd\":5}\nnot json\n{\"argv\":[\"x\"]}\n";
        let bad = parse_jsonl(text, DEFAULT_MAX_JOB_BYTES).unwrap_err();
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(bad[0].starts_with("line 3: cmd"), "{}", bad[0]);
        assert!(bad[1].starts_with("line 4: "), "{}", bad[1]);
        let ok = parse_jsonl("{\"cmd\":\"true\"}\n{\"argv\":[\"x\"]}", 1 << 20).unwrap();
        assert_eq!(ok.len(), 2);
    }
}
