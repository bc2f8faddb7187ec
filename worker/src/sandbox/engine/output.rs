//! Capture of a job's stdout and stderr: read as they come, with a cap each.
//!
//! The reads are futures that the run's own task polls beside its event loop rather than tasks
//! of their own: a spawned task per pipe cost every job wake-ups of the runtime's other worker
//! threads and a hand-back through its join handle on the path from the program's exit to its
//! result.

use std::future::Future;
use std::os::fd::OwnedFd;

use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use super::outcome::Captured;

/// Starts reading both pipes, at most `cap` bytes each, sending chunks to `live` as they come;
/// the future ends with what was captured once both pipes have closed, and the receiver fires
/// when either goes past the cap. The future reads only while it is polled.
pub(super) fn capture(
    stdout: OwnedFd,
    stderr: OwnedFd,
    cap: u64,
    live: Option<mpsc::UnboundedSender<OutputChunk>>,
) -> (
    impl Future<Output = (Captured, Captured)>,
    mpsc::UnboundedReceiver<()>,
) {
    let (over_tx, over_rx) = mpsc::unbounded_channel::<()>();
    let out = read_capped(
        stdout,
        cap,
        over_tx.clone(),
        OutputStream::Stdout,
        live.clone(),
    );
    let err = read_capped(stderr, cap, over_tx, OutputStream::Stderr, live);
    let both = async move { tokio::join!(out, err) };
    (both, over_rx)
}

/// A session's capture: its supervisor's diagnostics (fd 2) alone, at most `cap` bytes (the
/// rest read and discarded); its stdout carries frames and is read by the session itself.
/// The same shape as [`capture`], so a session's sandbox is watched as a job's is.
pub(super) fn capture_diagnostics(
    stderr: OwnedFd,
    cap: u64,
) -> (
    impl Future<Output = (Captured, Captured)>,
    mpsc::UnboundedReceiver<()>,
) {
    let (over_tx, over_rx) = mpsc::unbounded_channel::<()>();
    let err = read_capped(stderr, cap, over_tx, OutputStream::Stderr, None);
    let both = async move { (Captured::default(), err.await) };
    (both, over_rx)
}

/// Which output a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// A piece of a running job's output.
#[derive(Debug, Clone)]
pub struct OutputChunk {
    pub stream: OutputStream,
    pub data: Vec<u8>,
}

/// Reads up to `cap` bytes; signals `over` when the program writes more, and from then on
/// reads and discards the rest until the pipe closes. Past the cap the sandbox is being
/// killed: the pipe stays open until the kill lands, so the program never sees its output
/// closed (EPIPE, SIGPIPE), which it could otherwise report on stderr before it dies.
async fn read_capped(
    fd: OwnedFd,
    cap: u64,
    over: mpsc::UnboundedSender<()>,
    stream: OutputStream,
    live: Option<mpsc::UnboundedSender<OutputChunk>>,
) -> Captured {
    let forward = |data: &[u8]| {
        if let (Some(tx), false) = (&live, data.is_empty()) {
            let _ = tx.send(OutputChunk {
                stream,
                data: data.to_vec(),
            });
        }
    };
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return Captured::default();
    };
    // One byte past the cap is read to tell "exactly the cap" from "more than the cap"; the
    // bytes land straight in `out` (no zeroed scratch buffer, no second copy).
    let limit = (cap as usize).saturating_add(1);
    let mut out = Vec::new();
    loop {
        let want = (limit - out.len()).min(64 * 1024);
        out.reserve(want);
        // At most the cap so far (more returns below), so truncating keeps `before..` valid.
        let before = out.len();
        match (&mut rx).take(want as u64).read_buf(&mut out).await {
            Ok(0) | Err(_) => {
                return Captured {
                    bytes: out,
                    truncated: false,
                }
            }
            Ok(_) if out.len() > cap as usize => {
                out.truncate(cap as usize);
                forward(&out[before..]);
                let _ = over.send(());
                drain(&mut rx).await;
                return Captured {
                    bytes: out,
                    truncated: true,
                };
            }
            Ok(_) => forward(&out[before..]),
        }
    }
}

/// Reads `rx` until it closes, keeping nothing.
async fn drain(rx: &mut tokio::net::unix::pipe::Receiver) {
    let mut scratch = vec![0u8; 64 * 1024];
    while let Ok(n) = rx.read(&mut scratch).await {
        if n == 0 {
            return;
        }
    }
}

pub(super) async fn read_all(fd: OwnedFd, max: u64) -> Vec<u8> {
    let Ok(rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let _ = rx.take(max).read_to_end(&mut out).await;
    out
}
