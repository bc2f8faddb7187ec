//! Command-line interface: argument parsing and the one-shot commands (`run`, `check`, `bench`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use forkbox_queue::schema::{FileData, Job, Limits, Outcome, Status, EXIT_SANDBOX_ERROR};

use crate::sandbox::{self, wire::RootSource, Engine, EngineConfig};

/// Forkbox: run untrusted code in rootless sandboxes forked from a warm zygote.
#[derive(Debug, Parser)]
#[command(name = "forkbox", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one job in a sandbox and exit with its exit code (124 on timeout, 128+N when killed
    /// by signal N, 125 when the sandbox itself failed).
    Run(RunCmd),
    /// Report what this host supports and how each limit is enforced; exits non-zero when no
    /// sandbox can be made here.
    Check(SandboxOpts),
    /// Measure sandbox spawn cost against bare fork+exec and bubblewrap.
    Bench(crate::bench::BenchCmd),
    /// Serve jobs over a local Unix socket (newline-delimited JSON), for the Python SDK.
    Daemon(crate::daemon::DaemonCmd),
    #[command(flatten)]
    Node(crate::node::cli::NodeCommand),
}

/// Options shared by every command that builds an engine.
#[derive(Debug, Clone, Args)]
pub struct SandboxOpts {
    /// Use this unpacked root filesystem instead of the host allowlist.
    #[arg(long, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,
    /// Host directories exposed read-only (bind mounts), comma-separated.
    #[arg(
        long,
        value_name = "DIRS",
        value_delimiter = ',',
        conflicts_with = "rootfs"
    )]
    pub allow: Option<Vec<PathBuf>>,
    /// Share one network namespace between sandboxes instead of one each.
    #[arg(long)]
    pub shared_net: bool,
}

impl SandboxOpts {
    pub fn engine_config(&self, slots: usize) -> EngineConfig {
        let mut cfg = EngineConfig {
            slots,
            net_per_sandbox: !self.shared_net,
            ..EngineConfig::default()
        };
        if let Some(dir) = &self.rootfs {
            cfg.root = RootSource::Image(dir.clone());
        } else if let Some(dirs) = &self.allow {
            cfg.root = RootSource::Allowlist(dirs.clone());
        }
        cfg
    }
}

/// The job-describing options of `run` and `submit`.
#[derive(Debug, Clone, Args)]
pub struct JobArgs {
    /// Run a shell string with /bin/sh -c.
    #[arg(short = 'c', value_name = "SHELL", conflicts_with = "argv")]
    pub shell: Option<String>,
    /// Wall-clock limit from exec, in milliseconds [default: 10000].
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// Memory limit in MiB [default: 512].
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// Maximum number of processes [default: 64].
    #[arg(long)]
    pub pids: Option<u64>,
    /// CPU time limit in milliseconds (enforced with 1 s granularity without cgroups).
    #[arg(long)]
    pub cpu_ms: Option<u64>,
    /// Cap on stdout and on stderr, each, in bytes [default: 1048576].
    #[arg(long)]
    pub output_bytes: Option<u64>,
    /// Disk for all the job writes: /tmp, the working directory and /dev/shm together, in MiB
    /// [default: 64].
    #[arg(long)]
    pub disk_mb: Option<u64>,
    /// Largest file the job may write, in MiB.
    #[arg(long)]
    pub file_size_mb: Option<u64>,
    /// Maximum open files.
    #[arg(long)]
    pub open_files: Option<u64>,
    /// Extra environment variable (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Copy a local file into the working directory (repeatable).
    #[arg(long = "file", value_name = "PATH=LOCALFILE")]
    pub files: Vec<String>,
    /// Return files matching this glob, relative to the working directory (repeatable).
    #[arg(long = "collect", value_name = "GLOB")]
    pub collect: Vec<String>,
    /// Feed this local file to the job's stdin ("-" reads our stdin).
    #[arg(long, value_name = "FILE")]
    pub stdin_file: Option<PathBuf>,
    /// Working directory inside the sandbox (relative to /work).
    #[arg(long)]
    pub cwd: Option<String>,
    /// The program and its arguments.
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    pub argv: Vec<String>,
}

impl JobArgs {
    /// Builds and validates the job; errors name the offending option.
    pub fn to_job(&self) -> anyhow::Result<Job> {
        let mut job = match (&self.shell, self.argv.is_empty()) {
            (Some(cmd), _) => Job::shell(cmd.clone()),
            (None, false) => Job::argv(self.argv.clone()),
            (None, true) => bail!("nothing to run: give `-- CMD [ARGS...]` or `-c 'shell string'`"),
        };
        job.timeout_ms = self.timeout_ms;
        job.cwd = self.cwd.clone();
        job.limits = Limits {
            memory_mb: self.memory_mb,
            pids: self.pids,
            cpu_ms: self.cpu_ms,
            output_bytes: self.output_bytes,
            disk_mb: self.disk_mb,
            file_size_mb: self.file_size_mb,
            open_files: self.open_files,
        };
        for kv in &self.env {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("--env {kv:?}: expected K=V"))?;
            job.env.insert(k.to_owned(), v.to_owned());
        }
        for spec in &self.files {
            let (path, local) = spec
                .split_once('=')
                .with_context(|| format!("--file {spec:?}: expected PATH=LOCALFILE"))?;
            let bytes = std::fs::read(local)
                .with_context(|| format!("--file {spec:?}: reading {local}"))?;
            job.files
                .insert(path.to_owned(), FileData::from_bytes(bytes));
        }
        job.collect = self.collect.clone();
        if let Some(file) = &self.stdin_file {
            let bytes = if file.as_os_str() == "-" {
                let mut b = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
                    .context("reading stdin")?;
                b
            } else {
                std::fs::read(file).with_context(|| format!("--stdin-file {}", file.display()))?
            };
            job.stdin = Some(FileData::from_bytes(bytes));
        }
        job.validate()?;
        Ok(job)
    }
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct RunCmd {
    #[command(flatten)]
    pub job: JobArgs,
    #[command(flatten)]
    pub sandbox: SandboxOpts,
    /// Print the outcome as JSON instead of passing the job's output through.
    #[arg(long)]
    pub json: bool,
    /// Write collected files under this local directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

pub fn main(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Run(cmd) => run(cmd),
        Command::Check(opts) => check(opts),
        Command::Bench(cmd) => crate::bench::main(cmd),
        Command::Daemon(cmd) => crate::daemon::main(cmd),
        Command::Node(cmd) => crate::node::cli::main(cmd),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("forkbox: {e:#}");
            ExitCode::from(EXIT_SANDBOX_ERROR as u8)
        }
    }
}

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn run(cmd: RunCmd) -> anyhow::Result<ExitCode> {
    let job = cmd.job.to_job()?;
    let engine =
        Engine::start(cmd.sandbox.engine_config(1)).context("starting the sandbox engine")?;
    let outcome = runtime()?.block_on(engine.run(&job));
    if let Some(dir) = &cmd.out {
        save_files(dir, &outcome)?;
    }
    print_outcome(&outcome, cmd.json)
}

/// Prints an outcome as `run` does and returns the matching exit code.
pub fn print_outcome(outcome: &Outcome, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(outcome)?);
    } else {
        std::io::stdout().write_all(outcome.stdout.as_bytes())?;
        std::io::stdout().flush()?;
        std::io::stderr().write_all(outcome.stderr.as_bytes())?;
        let note = match outcome.status {
            Status::Error | Status::Invalid => Some(outcome.error.clone().unwrap_or_default()),
            Status::Timeout => Some("timed out".into()),
            Status::CpuLimit => Some("CPU time limit exceeded".into()),
            Status::MemoryLimit => Some("memory limit exceeded".into()),
            Status::OutputLimit => Some("output limit exceeded; output truncated".into()),
            Status::Cancelled => Some("cancelled".into()),
            _ => None,
        };
        if let Some(note) = note {
            eprintln!("forkbox: {note}");
        }
    }
    Ok(ExitCode::from(outcome.exit_code.clamp(0, 255) as u8))
}

fn save_files(dir: &std::path::Path, outcome: &Outcome) -> anyhow::Result<()> {
    for (rel, data) in &outcome.files {
        // Paths come from our own collector, relative to /work, but never trust them blindly.
        if rel.split('/').any(|c| c == "..") || rel.starts_with('/') {
            bail!("refusing to save collected file with unsafe path {rel:?}");
        }
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, data.to_bytes()?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn check(opts: SandboxOpts) -> anyhow::Result<ExitCode> {
    let report = crate::check::probe_host();
    for line in &report.lines {
        println!("{line}");
    }
    let engine = Engine::start(opts.engine_config(1));
    let mut fatal = report.fatal.clone();
    match &engine {
        Ok(e) => {
            let out = runtime()?.block_on(e.run(&Job::argv(["/bin/true"])));
            if out.status == Status::Ok {
                println!(
                    "ok    sandbox: /bin/true ran in a full sandbox (spawn {} us)",
                    out.spawn_us
                );
            } else {
                println!(
                    "FAIL  sandbox: {}",
                    out.error.clone().unwrap_or_else(|| out.status.to_string())
                );
                fatal.get_or_insert_with(|| out.error.unwrap_or_default());
            }
            let m = e.mechanisms();
            println!("info  identity: {}", m.identity);
            println!(
                "info  seccomp: deny list compiled to {} BPF instructions",
                m.seccomp_instructions
            );
            for (limit, how) in crate::check::limit_mechanisms(&m.cgroup) {
                println!("limit {limit:<12} {how}");
            }
        }
        Err(err) => {
            println!("FAIL  sandbox engine: {err}");
            fatal.get_or_insert_with(|| err.to_string());
        }
    }
    if let Some(reason) = fatal {
        eprintln!("forkbox: no sandbox can be made on this host: {reason}");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// The default engine configuration used by the node commands.
pub fn default_engine(slots: usize, opts: &SandboxOpts) -> anyhow::Result<Engine> {
    sandbox::Engine::start(opts.engine_config(slots)).context("starting the sandbox engine")
}
