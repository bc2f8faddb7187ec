//! The local daemon: v1 jobs over a Unix socket, as newline-delimited JSON.
//!
//! Each request line is a v1 job (optionally with `"stream": true`); each response line carries
//! the request's `id`. The final line of a request is a v1 result; with streaming, event lines
//! `{"id", "event": "stdout"|"stderr", "data"}` come first. A connection may pipeline requests:
//! they run concurrently on the warm engine's slots and answer in completion order. Bad lines
//! get an `invalid` result naming the problem and the connection stays usable; a line longer
//! than the request limit is discarded as it streams in, never buffered whole.
//!
//! The socket is created with mode 0600 (0660 with `--group`) under a restrictive umask, so it
//! is never reachable by other users, even for an instant. An existing path is only replaced
//! when it is a stale socket of ours (nothing listening); anything else is refused. The
//! default path is in a directory only this user can write (`$XDG_RUNTIME_DIR`, else
//! `$TMPDIR/forkbox-<uid>` made 0700 and checked to be ours and not a symlink), so no other
//! user can take the name first; clients check the server's identity besides (`SO_PEERCRED`).

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use forkbox_queue::schema::{Job, JobResult, Outcome, Status, DEFAULT_MAX_JOB_BYTES};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use forkbox::node::gate::{Descriptors, Gate};
use forkbox::sandbox::{Engine, OutputChunk};

use super::opts::SandboxOpts;

/// Options of `forkbox daemon`.
#[derive(Debug, clap::Args)]
pub struct DaemonCmd {
    /// Socket path [default: $XDG_RUNTIME_DIR/forkbox.sock, else
    /// ${TMPDIR:-/tmp}/forkbox-<uid>/forkbox.sock, in a directory made 0700].
    #[arg(long, env = "FORKBOX_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Let this group connect too (socket mode 0660 instead of 0600).
    #[arg(long)]
    pub group: Option<String>,
    /// Concurrent sandboxes [default: number of CPUs].
    #[arg(long)]
    pub slots: Option<usize>,
    /// Largest accepted request line, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_JOB_BYTES)]
    pub max_request_bytes: usize,
    #[command(flatten)]
    pub sandbox: SandboxOpts,
}

/// The socket path used when none is given, and the directory of it that must be made private
/// (none for `$XDG_RUNTIME_DIR`, which is the user's own by definition).
pub fn default_socket() -> (PathBuf, Option<PathBuf>) {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() && Path::new(&dir).is_dir() => {
            (Path::new(&dir).join("forkbox.sock"), None)
        }
        _ => {
            let tmp = match std::env::var_os("TMPDIR") {
                Some(t) if !t.is_empty() => PathBuf::from(t),
                _ => PathBuf::from("/tmp"),
            };
            let dir = tmp.join(format!("forkbox-{}", nix::unistd::Uid::effective()));
            (dir.join("forkbox.sock"), Some(dir))
        }
    }
}

/// Makes `dir` (mode 0700) or checks that the one there is a directory, not a symlink, owned
/// by this user and closed to others: a directory another user made first would let them
/// replace the socket.
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    let meta =
        std::fs::symlink_metadata(dir).with_context(|| format!("inspecting {}", dir.display()))?;
    let me = nix::unistd::Uid::effective().as_raw();
    if !meta.file_type().is_dir() {
        bail!(
            "{} is not a directory (a symlink or a file, owned by uid {}); refusing to put the              socket there: remove it, or give --socket",
            dir.display(),
            meta.uid()
        );
    }
    if meta.uid() != me {
        bail!(
            "{} is owned by uid {}, not by us (uid {me}); another user may have made it to take              the socket's place: remove it, or give --socket",
            dir.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o077 != 0 {
        bail!(
            "{} has mode {:o}: other users could replace the socket; chmod 700 it, or give              --socket",
            dir.display(),
            meta.mode() & 0o7777
        );
    }
    Ok(())
}

pub fn main(cmd: DaemonCmd) -> anyhow::Result<ExitCode> {
    super::init_logging();
    let path = match cmd.socket.clone() {
        Some(path) => path,
        None => {
            let (path, dir) = default_socket();
            if let Some(dir) = dir {
                private_dir(&dir)?;
            }
            path
        }
    };
    let gid = match &cmd.group {
        Some(name) => Some(
            nix::unistd::Group::from_name(name)
                .with_context(|| format!("looking up group {name}"))?
                .with_context(|| format!("--group {name}: no such group"))?
                .gid,
        ),
        None => None,
    };
    let slots = cmd.slots.unwrap_or_else(forkbox::sandbox::default_slots);
    // The engine first: its zygote must be exec'd before the runtime starts threads.
    let engine =
        Engine::start(cmd.sandbox.engine_config(slots)).map_err(|e| cmd.sandbox.start_failed(e))?;
    super::log_python_runtime(&engine);
    let listener = bind(&path, gid)?;
    let rt = super::runtime()?;
    let result = rt.block_on(serve(listener, engine, cmd.max_request_bytes, &path, slots));
    let _ = std::fs::remove_file(&path);
    result.map(|()| ExitCode::SUCCESS)
}

/// Binds the socket with its final mode from the start; refuses paths that are not ours.
fn bind(
    path: &Path,
    gid: Option<nix::unistd::Gid>,
) -> anyhow::Result<std::os::unix::net::UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            bail!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            );
        }
        if meta.uid() != nix::unistd::Uid::effective().as_raw() {
            bail!(
                "{} is a socket owned by uid {}, not us; refusing to replace it",
                path.display(),
                meta.uid()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("a daemon is already listening on {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    // The umask applies to the bind; no thread exists yet that could create files meanwhile.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let listener = std::os::unix::net::UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = listener.with_context(|| format!("binding {}", path.display()))?;
    if let Some(gid) = gid {
        nix::unistd::chown(path, None, Some(gid))
            .with_context(|| format!("chgrp {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    }
    listener.set_nonblocking(true)?;
    Ok(listener)
}

async fn serve(
    listener: std::os::unix::net::UnixListener,
    engine: Engine,
    max_request: usize,
    path: &Path,
    slots: usize,
) -> anyhow::Result<()> {
    let listener = tokio::net::UnixListener::from_std(listener)?;
    // Each connection holds a descriptor: bounded, so that clients (a whole group's, with
    // --group) cannot take those the engine needs to set up jobs.
    let gate = Gate::new(daemon_connections(Descriptors::now()));
    tracing::info!(socket = %path.display(), slots, "forkbox daemon listening");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    // Every connection task holds a sender; the receiver sees the channel close once all are
    // done, which is how shutdown waits for in-flight jobs.
    let (alive, mut all_done) = mpsc::channel::<()>(1);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Some(place) = gate.try_enter() else {
                        tracing::warn!("refused a connection: too many open");
                        continue;
                    };
                    let (engine, alive, stop) = (engine.clone(), alive.clone(), stop.clone());
                    tokio::spawn(async move {
                        serve_connection(stream, engine, max_request, stop).await;
                        drop((alive, place));
                    });
                }
                Err(e) => tracing::warn!(error = %e, "accept failed"),
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    tracing::info!("draining: no new connections; waiting for running jobs");
    drop(listener);
    let _ = std::fs::remove_file(path);
    let _ = stop_tx.send(true);
    drop(alive);
    let _ = all_done.recv().await;
    tracing::info!("forkbox daemon stopped");
    Ok(())
}

/// Connections the daemon holds at once: a quarter of its descriptors, between 16 and 1024 (the
/// engine's reserve and each running job's handful come out of the rest).
fn daemon_connections(descriptors: Option<Descriptors>) -> usize {
    descriptors.map_or(256, |d| (d.limit / 4).clamp(16, 1024) as usize)
}

/// One parsed request line, or the reason it was rejected.
enum Request {
    Run {
        job: Box<Job>,
        id: String,
        stream: bool,
    },
    Reject {
        id: Option<String>,
        reason: String,
    },
}

/// Parses a request line: a v1 job, optionally with `"stream": true`.
fn parse_request(line: &[u8], max: usize) -> Request {
    let mut value: serde_json::Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            return Request::Reject {
                id: None,
                reason: format!("request is not valid JSON: {e}"),
            }
        }
    };
    let Some(obj) = value.as_object_mut() else {
        return Request::Reject {
            id: None,
            reason: "request must be a JSON object (a v1 job)".into(),
        };
    };
    let id = obj.get("id").and_then(|v| v.as_str()).map(str::to_owned);
    let stream = match obj.remove("stream") {
        None => false,
        Some(serde_json::Value::Bool(b)) => b,
        Some(other) => {
            return Request::Reject {
                id,
                reason: format!("stream: expected a boolean, got {other}"),
            }
        }
    };
    let bytes = serde_json::to_vec(&value).unwrap_or_default();
    match Job::parse(&bytes, max) {
        Ok(mut job) => {
            let id = job
                .id
                .get_or_insert_with(|| uuid::Uuid::new_v4().simple().to_string())
                .clone();
            Request::Run {
                job: Box::new(job),
                id,
                stream,
            }
        }
        Err(e) => Request::Reject {
            id,
            reason: e.to_string(),
        },
    }
}

/// `times`: when the job started and finished (ms since the Unix epoch), for one that ran.
fn result_line(id: Option<String>, outcome: Outcome, times: Option<(u64, u64)>) -> Vec<u8> {
    let result = JobResult {
        started_at_ms: times.map(|t| t.0),
        finished_at_ms: times.map(|t| t.1),
        ..JobResult::new(id.unwrap_or_default(), outcome, 1, "daemon".into())
    };
    let mut v = serde_json::to_value(&result).unwrap_or_default();
    if v.get("id").and_then(|i| i.as_str()) == Some("") {
        v["id"] = serde_json::Value::Null;
    }
    let mut bytes = serde_json::to_vec(&v).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

async fn serve_connection(
    stream: UnixStream,
    engine: Engine,
    max_request: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            if write.write_all(&line).await.is_err() {
                return;
            }
        }
    });
    let mut reader = BufReader::with_capacity(64 * 1024, read);
    // Jobs of this connection: dropped (and their sandboxes killed) if the client goes away.
    let mut jobs = tokio::task::JoinSet::new();
    let gone = Arc::new(tokio::sync::Notify::new());
    loop {
        let line = tokio::select! {
            line = read_line(&mut reader, max_request) => line,
            Some(_) = jobs.join_next(), if !jobs.is_empty() => continue,
            // Draining: take no new requests, let the running ones answer.
            _ = stop.wait_for(|s| *s) => break,
        };
        let line = match line {
            Ok(Some(Line::Complete(l))) => l,
            Ok(Some(Line::TooLong(n))) => {
                let reason =
                    format!("request line is over {max_request} bytes ({n} read before giving up)");
                let _ = tx.send(result_line(
                    None,
                    Outcome::not_run(Status::Invalid, reason),
                    None,
                ));
                continue;
            }
            Ok(None) | Err(_) => break,
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match parse_request(&line, max_request) {
            Request::Reject { id, reason } => {
                let _ = tx.send(result_line(
                    id,
                    Outcome::not_run(Status::Invalid, reason),
                    None,
                ));
            }
            Request::Run { job, id, stream } => {
                let (engine, tx, gone) = (engine.clone(), tx.clone(), gone.clone());
                jobs.spawn(async move {
                    let (chunk_tx, mut chunks) = mpsc::unbounded_channel::<OutputChunk>();
                    let forward = {
                        let (tx, id) = (tx.clone(), id.clone());
                        async move {
                            while let Some(c) = chunks.recv().await {
                                let event = serde_json::json!({
                                    "id": id, "event": c.stream, "data": String::from_utf8_lossy(&c.data),
                                });
                                let mut bytes = serde_json::to_vec(&event).unwrap_or_default();
                                bytes.push(b'\n');
                                let _ = tx.send(bytes);
                            }
                        }
                    };
                    let live = stream.then_some(chunk_tx);
                    let started = forkbox_queue::now_ms();
                    let run = async {
                        let slot = engine.slot().await;
                        engine.run_in(slot, &job, gone.notified(), live).await.outcome
                    };
                    let (outcome, ()) = tokio::join!(run, forward);
                    let times = (started, forkbox_queue::now_ms());
                    let _ = tx.send(result_line(Some(id), outcome, Some(times)));
                });
            }
        }
    }
    // A client that half-closes still gets its answers; one that is gone cannot, so its
    // remaining jobs are stopped rather than run for nobody.
    loop {
        tokio::select! {
            next = jobs.join_next() => if next.is_none() { break },
            () = tokio::time::sleep(std::time::Duration::from_millis(100)), if writer.is_finished() => {
                gone.notify_waiters();
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

enum Line {
    Complete(Vec<u8>),
    /// The line exceeded the limit and was discarded; the count of bytes read.
    TooLong(usize),
}

/// Reads one line of at most `max` bytes; a longer one is skipped without being buffered.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> std::io::Result<Option<Line>> {
    let mut line = Vec::new();
    let mut discarded = 0usize;
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(if line.is_empty() && discarded == 0 {
                None
            } else if discarded > 0 {
                Some(Line::TooLong(discarded))
            } else {
                Some(Line::Complete(line))
            });
        }
        let (chunk, found) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if discarded > 0 || line.len() + chunk.len() > max {
            discarded += line.len() + chunk.len();
            line = Vec::new();
        } else {
            line.extend_from_slice(chunk);
        }
        let used = found.unwrap_or(buf.len());
        reader.consume(used);
        if found.is_some() {
            return Ok(Some(if discarded > 0 {
                Line::TooLong(discarded)
            } else {
                Line::Complete(line)
            }));
        }
    }
}
