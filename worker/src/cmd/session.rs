//! `forkbox session ...`: sessions from the command line (docs/protocol.md "Sessions").
//!
//! `create` enqueues a session's create job and prints the id once a node opened it; the
//! other commands send one call each and print its events as they come. Everything a session
//! sends goes through the terminal escaping of [`super::terminal`].

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use forkbox_queue::session::{Call, CallOp, SessionSpec};
use forkbox_queue::{Event, FileData, Job, Limits, Network, Queue, Runtime};
use serde_json::Value;

use super::client::open_queue;
use super::opts::ClientOpts;
use super::run::RunCmd;
use super::terminal::{for_stderr, for_stdout};

/// Exit code of a call whose session ended or was lost, or that the node refused.
const EXIT_SESSION: u8 = 125;

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Open a session on some node and print its id.
    Create(CreateArgs),
    /// Run Python in the session's interpreter: its output as it comes, then the value of its
    /// last expression; exits 1 on an exception.
    RunCode(RunCodeArgs),
    /// Run a command in the session; its output as it comes, its exit code ours.
    Exec(ExecArgs),
    /// Write, read, list or remove the session's files (paths under /work).
    Files(FilesArgs),
    /// The session's record and usage, as JSON.
    Info(IdArgs),
    /// The live sessions of the queue.
    List(ListArgs),
    /// End the session.
    Kill(IdArgs),
    /// A new lifetime (from now) or idle timeout.
    SetTimeout(SetTimeoutArgs),
    /// Fork the session into N new sessions, each a copy of its interpreter state and files;
    /// prints their ids, one a line (what a branch does not get, and a branch that failed, on
    /// stderr). Needs `--runtime python`.
    Fork(ForkArgs),
    /// Take a checkpoint of the session (a stopped copy of its interpreter, and of its files)
    /// and print its id. Needs `--runtime python`.
    Checkpoint(CheckpointArgs),
    /// Restore a checkpoint as a new session, and print the new session's id.
    Restore(CheckpointIdArgs),
    /// Drop a checkpoint before its ttl.
    DropCheckpoint(CheckpointIdArgs),
}

#[derive(Debug, Args)]
pub struct CheckpointArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// The session's id.
    pub id: String,
    /// The checkpoint's lifetime in seconds [default: 600, within the node's
    /// --max-session-ttl; it ends with its session in any case].
    #[arg(long, value_name = "SECS")]
    pub ttl: Option<u64>,
}

#[derive(Debug, Args)]
pub struct CheckpointIdArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// The checkpoint's id (as `session checkpoint` printed it: its session's id, `.`, and
    /// 32 hex digits).
    pub checkpoint: String,
}

#[derive(Debug, Args)]
pub struct ForkArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// The session's id.
    pub id: String,
    /// How many branches.
    #[arg(short = 'n', long, default_value_t = 1)]
    pub n: u32,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// Session id [default: a fresh uuid].
    #[arg(long)]
    pub id: Option<String>,
    /// Lifetime in seconds [default: 600, within the node's --max-session-ttl].
    #[arg(long, value_name = "SECS")]
    pub ttl: Option<u64>,
    /// End the session after this long without a call [default: 120].
    #[arg(long, value_name = "SECS")]
    pub idle: Option<u64>,
    /// Memory limit of the whole session, in MiB.
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// Processes at once.
    #[arg(long)]
    pub pids: Option<u64>,
    /// CPU time over the whole session, in ms.
    #[arg(long)]
    pub cpu_ms: Option<u64>,
    /// Output cap of each call, in bytes.
    #[arg(long)]
    pub output_bytes: Option<u64>,
    /// The session's disk (/work), in MiB.
    #[arg(long)]
    pub disk_mb: Option<u64>,
    /// Extra environment variable (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Copy a local file into /work (repeatable).
    #[arg(long = "file", value_name = "PATH=LOCALFILE")]
    pub files: Vec<String>,
    /// `none` or `loopback` [default: the node's].
    #[arg(long, value_name = "MODE")]
    pub network: Option<Network>,
    /// `python`: run_code in the node's warm interpreter.
    #[arg(long, value_name = "RUNTIME")]
    pub runtime: Option<Runtime>,
    /// How long to wait for a node to open it, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub timeout: f64,
}

/// A session's id and a call's timeout.
#[derive(Debug, Args)]
pub struct CallOpts {
    #[command(flatten)]
    pub client: ClientOpts,
    /// The session's id.
    pub id: String,
    /// The call's wall-clock limit, in milliseconds [default: 30000].
    #[arg(long)]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Args)]
pub struct RunCodeArgs {
    #[command(flatten)]
    pub call: CallOpts,
    /// The Python source, or `-` to read it from standard input.
    pub code: String,
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct ExecArgs {
    #[command(flatten)]
    pub call: CallOpts,
    /// Extra environment variable (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Working directory (relative to /work).
    #[arg(long)]
    pub cwd: Option<String>,
    /// Run a shell string with /bin/sh -c.
    #[arg(short = 'c', value_name = "SHELL", conflicts_with = "argv")]
    pub shell: Option<String>,
    /// The program and its arguments.
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    pub argv: Vec<String>,
}

#[derive(Debug, Args)]
pub struct FilesArgs {
    #[command(flatten)]
    pub call: CallOpts,
    #[command(subcommand)]
    pub op: FilesOp,
}

#[derive(Debug, Subcommand)]
pub enum FilesOp {
    /// Write PATH from a local FILE, or from standard input (`-` or nothing).
    Write { path: String, file: Option<String> },
    /// Print a file's content.
    Read { path: String },
    /// List a directory [default: /work].
    Ls { path: Option<String> },
    /// Remove a file or a tree.
    Rm { path: String },
}

#[derive(Debug, Args)]
pub struct IdArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// The session's id.
    pub id: String,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SetTimeoutArgs {
    #[command(flatten)]
    pub client: ClientOpts,
    /// The session's id.
    pub id: String,
    /// New lifetime, counted from now, in seconds.
    #[arg(long, value_name = "SECS")]
    pub ttl: Option<u64>,
    /// New idle timeout, in seconds.
    #[arg(long, value_name = "SECS")]
    pub idle: Option<u64>,
}

pub async fn main(cmd: SessionCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SessionCommand::Create(a) => create(a).await,
        SessionCommand::RunCode(a) => run_code(a).await,
        SessionCommand::Exec(a) => {
            let call = exec_call(&a.call.id, a.shell.clone(), a.argv.clone(), &a.env, a.cwd)?;
            exec(&a.call, call).await
        }
        SessionCommand::Files(a) => files(a).await,
        SessionCommand::Info(a) => {
            let call = Call::new(&a.id, CallOp::Info);
            let r = send(&a.client, call).await?;
            print_json(r.get("info").unwrap_or(&Value::Null))
        }
        SessionCommand::List(a) => list(a).await,
        SessionCommand::Kill(a) => {
            send(&a.client, Call::new(&a.id, CallOp::Kill)).await?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Fork(a) => fork(a).await,
        SessionCommand::Checkpoint(a) => {
            let call = Call {
                ttl_s: a.ttl,
                ..Call::new(&a.id, CallOp::Checkpoint)
            };
            let r = send(&a.client, call).await?;
            check_ok(&r)?;
            let id = r
                .get("checkpoint")
                .and_then(|c| c["id"].as_str())
                .unwrap_or_default();
            println!("{}", for_stdout(id));
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Restore(a) => {
            let r = send(&a.client, checkpoint_call(&a.checkpoint, CallOp::Restore)?).await?;
            check_ok(&r)?;
            let id = r.get("id").and_then(Value::as_str).unwrap_or_default();
            println!("{}", for_stdout(id));
            for what in r
                .get("not_carried")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let what = what.as_str().unwrap_or_default();
                eprintln!(
                    "forkbox: {}: not carried: {}",
                    for_stderr(id),
                    for_stderr(what)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::DropCheckpoint(a) => {
            let call = checkpoint_call(&a.checkpoint, CallOp::DropCheckpoint)?;
            check_ok(&send(&a.client, call).await?)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::SetTimeout(a) => {
            let call = Call {
                ttl_s: a.ttl,
                idle_s: a.idle,
                ..Call::new(&a.id, CallOp::SetTimeout)
            };
            let r = send(&a.client, call).await?;
            check_ok(&r)?;
            print_json(&Value::Object(r))
        }
    }
}

async fn create(a: CreateArgs) -> anyhow::Result<ExitCode> {
    let mut job = Job {
        id: a.id.clone(),
        session: Some(SessionSpec {
            ttl_s: a.ttl,
            idle_s: a.idle,
        }),
        runtime: a.runtime,
        network: a.network,
        limits: Limits {
            memory_mb: a.memory_mb,
            pids: a.pids,
            cpu_ms: a.cpu_ms,
            output_bytes: a.output_bytes,
            disk_mb: a.disk_mb,
            ..Limits::default()
        },
        ..Job::default()
    };
    for kv in &a.env {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--env {kv:?}: expected K=V"))?;
        job.env.insert(k.to_owned(), v.to_owned());
    }
    for spec in &a.files {
        let (path, local) = spec
            .split_once('=')
            .with_context(|| format!("--file {spec:?}: expected PATH=LOCALFILE"))?;
        let bytes =
            std::fs::read(local).with_context(|| format!("--file {spec:?}: reading {local}"))?;
        job.files
            .insert(path.to_owned(), FileData::from_bytes(bytes));
    }
    job.validate()?;
    anyhow::ensure!(
        a.timeout.is_finite() && a.timeout > 0.0,
        "--timeout must be a number of seconds > 0"
    );
    let q = open_queue(&a.client).await?;
    let sid = q.enqueue_idempotent(&job).await?.id;
    let opened = q
        .for_id(&sid)
        .wait_opened(&sid, Duration::from_secs_f64(a.timeout))
        .await?;
    println!("{}", for_stdout(&opened.id));
    Ok(ExitCode::SUCCESS)
}

async fn run_code(a: RunCodeArgs) -> anyhow::Result<ExitCode> {
    let code = if a.code == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the code from standard input")?;
        s
    } else {
        a.code.clone()
    };
    let call = Call {
        timeout_ms: a.call.timeout_ms,
        ..Call::run_code(&a.call.id, code)
    };
    let Some(r) = stream(&a.call.client, call).await? else {
        return Ok(ExitCode::from(EXIT_SESSION));
    };
    if let Some(text) = r.get("text").and_then(Value::as_str) {
        println!("{}", for_stdout(text));
    }
    if let Some(exc) = r.get("exception").filter(|e| !e.is_null()) {
        let lines: Vec<&str> = exc["traceback"]
            .as_array()
            .map(|l| l.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut text = lines.concat();
        if text.is_empty() {
            text = format!(
                "{}: {}\n",
                exc["name"].as_str().unwrap_or("Exception"),
                exc["value"].as_str().unwrap_or_default()
            );
        }
        eprint!("{}", for_stderr(&text));
        return Ok(ExitCode::from(1));
    }
    check_ok(&r)?;
    Ok(ExitCode::SUCCESS)
}

/// The `exec` call of `session exec` and `run --session`.
pub fn exec_call(
    sid: &str,
    shell: Option<String>,
    argv: Vec<String>,
    env: &[String],
    cwd: Option<String>,
) -> anyhow::Result<Call> {
    let mut call = match (shell, argv.is_empty()) {
        (Some(cmd), _) => Call::exec_shell(sid, cmd),
        (None, false) => Call::exec_argv(sid, argv),
        (None, true) => bail!("nothing to run: give `-- CMD [ARGS...]` or `-c 'shell string'`"),
    };
    call.cwd = cwd;
    if !env.is_empty() {
        let mut vars = std::collections::BTreeMap::new();
        for kv in env {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("--env {kv:?}: expected K=V"))?;
            vars.insert(k.to_owned(), v.to_owned());
        }
        call.env = Some(vars);
    }
    Ok(call)
}

/// Runs an `exec` call: its output as it comes, its exit code ours (124 on timeout, 128+N
/// when killed by signal N).
pub async fn exec(opts: &CallOpts, mut call: Call) -> anyhow::Result<ExitCode> {
    call.timeout_ms = opts.timeout_ms;
    let Some(r) = stream(&opts.client, call).await? else {
        return Ok(ExitCode::from(EXIT_SESSION));
    };
    if r.get("timed_out") == Some(&Value::Bool(true)) {
        return Ok(ExitCode::from(124));
    }
    if let Some(sig) = r.get("signal").and_then(Value::as_u64) {
        return Ok(ExitCode::from((128 + sig).min(255) as u8));
    }
    match r.get("exit_code").and_then(Value::as_i64) {
        Some(code) => Ok(ExitCode::from(code.clamp(0, 255) as u8)),
        None => {
            check_ok(&r)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn files(a: FilesArgs) -> anyhow::Result<ExitCode> {
    let sid = &a.call.id;
    let call = match &a.op {
        FilesOp::Write { path, file } => {
            let bytes = match file.as_deref() {
                None | Some("-") => {
                    let mut b = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut b)
                        .context("reading standard input")?;
                    b
                }
                Some(local) => std::fs::read(local).with_context(|| format!("reading {local}"))?,
            };
            Call {
                data: Some(FileData::from_bytes(bytes)),
                ..Call::files(sid, CallOp::FilesWrite, path)
            }
        }
        FilesOp::Read { path } => Call::files(sid, CallOp::FilesRead, path),
        FilesOp::Ls { path } => Call {
            path: path.clone(),
            ..Call::new(sid, CallOp::FilesList)
        },
        FilesOp::Rm { path } => Call::files(sid, CallOp::FilesRemove, path),
    };
    let call = Call {
        timeout_ms: a.call.timeout_ms,
        ..call
    };
    let r = send(&a.call.client, call).await?;
    check_ok(&r)?;
    let mut out = std::io::stdout().lock();
    match &a.op {
        FilesOp::Read { .. } => {
            let data: FileData = serde_json::from_value(r.get("data").cloned().unwrap_or_default())
                .context("the node's answer has no file data")?;
            let bytes = data.to_bytes().context("the file data's base64")?;
            match String::from_utf8(bytes) {
                Ok(text) => write!(out, "{}", for_stdout(&text)),
                Err(e) => out.write_all(e.as_bytes()),
            }
            .map_err(super::stdout_error)?;
        }
        FilesOp::Ls { .. } => {
            for e in r
                .get("entries")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let line = format!(
                    "{:<5} {:>10} {}",
                    e["type"].as_str().unwrap_or("?"),
                    e["size"].as_u64().unwrap_or(0),
                    e["name"].as_str().unwrap_or_default()
                );
                writeln!(out, "{}", for_stdout(&line)).map_err(super::stdout_error)?;
            }
        }
        FilesOp::Write { .. } | FilesOp::Rm { .. } => {}
    }
    Ok(ExitCode::SUCCESS)
}

async fn list(a: ListArgs) -> anyhow::Result<ExitCode> {
    let q = open_queue(&a.client).await?;
    let mut all = Vec::new();
    for part in q.partitions() {
        all.extend(part.live_sessions().await?);
    }
    if a.json {
        return print_json(&serde_json::to_value(&all)?);
    }
    let now = forkbox_queue::now_ms();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<40} {:<24} {:>10} {:>6}",
        "ID", "NODE", "ENDS IN", "IDLE"
    )
    .map_err(super::stdout_error)?;
    for s in &all {
        let line = format!(
            "{:<40} {:<24} {:>9}s {:>5}s",
            s.id,
            s.node,
            s.expires_ms.saturating_sub(now) / 1000,
            s.idle_s
        );
        writeln!(out, "{}", for_stdout(&line)).map_err(super::stdout_error)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Sends `call` and waits for its result, printing output events as they come; `None` when
/// the call ended with an error event (printed).
async fn stream(
    client: &ClientOpts,
    call: Call,
) -> anyhow::Result<Option<serde_json::Map<String, Value>>> {
    let q = open_queue(client).await?;
    let queue: Queue = q.for_id(&call.session).clone();
    let end = queue
        .call_session(&call, Duration::from_secs(10), &mut |e| match e {
            Event::Stdout { data } => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(for_stdout(data).as_bytes());
                let _ = out.flush();
            }
            Event::Stderr { data } => {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(for_stderr(data).as_bytes());
                let _ = err.flush();
            }
            _ => {}
        })
        .await?;
    match end {
        Event::Result(r) => Ok(Some(r)),
        Event::Error { error, .. } => {
            eprintln!("forkbox: {}", for_stderr(&error));
            Ok(None)
        }
        _ => bail!("the call ended without a terminal event"),
    }
}

/// [`stream`] for a call whose output is its result alone; an error event is an error.
async fn send(client: &ClientOpts, call: Call) -> anyhow::Result<serde_json::Map<String, Value>> {
    let q = open_queue(client).await?;
    let queue: Queue = q.for_id(&call.session).clone();
    match queue
        .call_session(&call, Duration::from_secs(10), &mut |_| {})
        .await?
    {
        Event::Result(r) => Ok(r),
        Event::Error { error, .. } => bail!("{error}"),
        _ => bail!("the call ended without a terminal event"),
    }
}

/// `session fork`: the new ids on stdout; what each branch lacks, and each failed branch, on
/// stderr; exits 1 when a branch asked for was not made.
async fn fork(a: ForkArgs) -> anyhow::Result<ExitCode> {
    let call = Call {
        n: Some(a.n),
        ..Call::new(&a.id, CallOp::Fork)
    };
    let r = send(&a.client, call).await?;
    check_ok(&r)?;
    let mut all = true;
    for b in r
        .get("branches")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match b["id"].as_str() {
            Some(id) if b["ok"] == true => {
                println!("{}", for_stdout(id));
                for what in b["not_carried"].as_array().into_iter().flatten() {
                    let what = what.as_str().unwrap_or_default();
                    eprintln!(
                        "forkbox: {}: not carried: {}",
                        for_stderr(id),
                        for_stderr(what)
                    );
                }
            }
            _ => {
                all = false;
                let why = b["error"].as_str().unwrap_or("no reason given");
                eprintln!("forkbox: a branch failed: {}", for_stderr(why));
            }
        }
    }
    Ok(if all {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// A `restore` or `drop_checkpoint` call, to the session the checkpoint's id names.
fn checkpoint_call(checkpoint: &str, op: CallOp) -> anyhow::Result<Call> {
    let Some(sid) = forkbox_queue::session::checkpoint_session(checkpoint) else {
        bail!(
            "{} is not a checkpoint's id (a session's id, `.`, and 32 hex digits)",
            for_stderr(checkpoint)
        );
    };
    Ok(Call {
        checkpoint: Some(checkpoint.to_owned()),
        ..Call::new(sid, op)
    })
}

fn check_ok(r: &serde_json::Map<String, Value>) -> anyhow::Result<()> {
    if r.get("ok") == Some(&Value::Bool(false)) {
        bail!(
            "{}",
            for_stderr(
                r.get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("the call failed")
            )
        );
    }
    Ok(())
}

fn print_json(v: &Value) -> anyhow::Result<ExitCode> {
    let text = serde_json::to_string_pretty(v)?;
    println!("{}", for_stdout(&text));
    Ok(ExitCode::SUCCESS)
}

/// `run --session ID`: the command as an `exec` call of the session.
pub fn in_session(cmd: &RunCmd, sid: &str) -> anyhow::Result<ExitCode> {
    let j = &cmd.job;
    let session_only = [
        ("--memory-mb", j.memory_mb.is_some()),
        ("--pids", j.pids.is_some()),
        ("--cpu-ms", j.cpu_ms.is_some()),
        ("--output-bytes", j.output_bytes.is_some()),
        ("--disk-mb", j.disk_mb.is_some()),
        ("--file", !j.files.is_empty()),
        ("--collect", !j.collect.is_empty()),
        ("--runtime", j.runtime.is_some()),
        ("--network", j.network.is_some()),
        ("--stdin-file", j.stdin_file.is_some()),
        ("--json", cmd.json),
        ("--out", cmd.out.is_some()),
    ];
    if let Some((flag, _)) = session_only.iter().find(|(_, set)| *set) {
        bail!("{flag} does not apply with --session: the session's own settings hold");
    }
    let call = exec_call(sid, j.shell.clone(), j.argv.clone(), &j.env, j.cwd.clone())?;
    let opts = CallOpts {
        client: cmd.client.clone(),
        id: sid.to_owned(),
        timeout_ms: j.timeout_ms,
    };
    super::runtime()?.block_on(exec(&opts, call))
}
