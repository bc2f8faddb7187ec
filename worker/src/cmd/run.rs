//! `forkbox run`: one job in a sandbox, its output passed through, its exit code ours.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use forkbox_queue::schema::{Outcome, Status};

use forkbox::sandbox::Engine;

use super::opts::{JobArgs, SandboxOpts};
use super::runtime;
use super::terminal::visible;

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
    /// Pass the job's output to a terminal byte for byte, escape sequences included. By
    /// default, when stdout or stderr is a terminal, the job's control characters are shown
    /// instead of obeyed (ESC as ^[, for instance), so a job cannot drive the terminal; pipes
    /// and files always get the exact bytes.
    #[arg(long, conflicts_with = "json")]
    pub raw: bool,
    /// Run in a zygote of this command's own, even when a `forkbox daemon` of this user (or
    /// root's) listens on the socket: by default the job goes to that daemon, whose warm
    /// sandboxes spawn it at once (with the daemon's own root, allowlist and maximums), unless
    /// a sandbox option (--rootfs, --allow, --max-*, ...) is given here.
    #[arg(long)]
    pub no_daemon: bool,
    /// The daemon's socket [default: $XDG_RUNTIME_DIR/forkbox.sock, else
    /// ${TMPDIR:-/tmp}/forkbox-<uid>/forkbox.sock].
    #[arg(long, env = "FORKBOX_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Run the command in this session (through Redis: --redis, --queue), as `forkbox session
    /// exec` does; only the command, --env, --cwd and --timeout-ms apply.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    #[command(flatten)]
    pub client: super::client::ClientOpts,
}

pub fn main(cmd: RunCmd) -> anyhow::Result<ExitCode> {
    if let Some(sid) = &cmd.session {
        return in_session(&cmd, sid);
    }
    let job = cmd.job.to_job()?;
    if !cmd.no_daemon && cmd.sandbox.is_unset() {
        let socket = cmd
            .socket
            .clone()
            .unwrap_or_else(|| super::daemon::default_socket().0);
        if let Some(stream) = super::daemon_client::connect(&socket)? {
            let result = super::daemon_client::run(stream, &job)?;
            return finish(&cmd, &result.outcome);
        }
    }
    let mut config = cmd.sandbox.engine_config(1);
    // The one sandbox kept ready is built for the job's network.
    config.network_default = job.network.unwrap_or(config.network_default);
    // One job, so one zygote: the runtime's when it asks for one (it runs there warm, or cold
    // when its command line cannot), else the plain one with no interpreter to warm.
    let engine = if job.runtime.is_some() {
        Engine::start_runtime_only(config)
    } else {
        config.python = None;
        Engine::start(config)
    }
    .map_err(|e| cmd.sandbox.start_failed(e))?;
    let outcome = runtime()?.block_on(engine.run(&job));
    finish(&cmd, &outcome)
}

/// `run --session ID`: the command as an `exec` call of the session.
fn in_session(cmd: &RunCmd, sid: &str) -> anyhow::Result<ExitCode> {
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
    let call =
        super::session::exec_call(sid, j.shell.clone(), j.argv.clone(), &j.env, j.cwd.clone())?;
    let opts = super::session::CallOpts {
        client: cmd.client.clone(),
        id: sid.to_owned(),
        timeout_ms: j.timeout_ms,
    };
    runtime()?.block_on(super::session::exec(&opts, call))
}

/// Saves the collected files and prints the outcome; its exit code is ours.
fn finish(cmd: &RunCmd, outcome: &Outcome) -> anyhow::Result<ExitCode> {
    if let Some(dir) = &cmd.out {
        save_files(dir, outcome)?;
    }
    print_outcome_as(outcome, cmd.json, cmd.raw)
}

/// Prints an outcome as `run` does and returns the matching exit code.
pub fn print_outcome(outcome: &Outcome, json: bool) -> anyhow::Result<ExitCode> {
    print_outcome_as(outcome, json, false)
}

/// [`print_outcome`]; with `raw`, the job's output reaches a terminal unchanged.
pub fn print_outcome_as(outcome: &Outcome, json: bool, raw: bool) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(outcome)?);
    } else {
        let for_terminal = |text: &str, terminal: bool| -> String {
            if terminal && !raw {
                visible(text).into_owned()
            } else {
                text.to_owned()
            }
        };
        let (out_tty, err_tty) = (
            std::io::stdout().is_terminal(),
            std::io::stderr().is_terminal(),
        );
        std::io::stdout().write_all(for_terminal(&outcome.stdout, out_tty).as_bytes())?;
        std::io::stdout().flush()?;
        std::io::stderr().write_all(for_terminal(&outcome.stderr, err_tty).as_bytes())?;
        let note = match outcome.status {
            Status::Error | Status::Invalid => Some(outcome.error.clone().unwrap_or_default()),
            Status::Timeout => Some("timed out".into()),
            Status::CpuLimit => Some("CPU time limit exceeded".into()),
            Status::MemoryLimit => Some("memory limit exceeded".into()),
            Status::OutputLimit => Some("output limit exceeded; output truncated".into()),
            Status::Cancelled => Some("cancelled".into()),
            // A kill for memory the host or the node ran short of says so.
            Status::Signaled => outcome.error.clone(),
            _ => None,
        };
        if let Some(note) = note {
            // The error may quote the job's own input (a file name, a path).
            eprintln!("forkbox: {}", visible(&note));
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
