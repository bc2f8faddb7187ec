//! Bounds on a listening socket that other local users reach, and the node's descriptor
//! headroom.
//!
//! Every process on the host can connect to a loopback port. A client that opens connections
//! and never finishes its request would otherwise hold one of the node's descriptors each,
//! until the engine can no longer make the memfds and pipes of the next job. A [`Gate`] in
//! front of a listener holds at most so many connections at once (one more is accepted and
//! closed at once, so the kernel's backlog never fills); an HTTP listener gives each
//! [`HeadLimits::time`] to send its request head ([`read_head`]). [`Descriptors`] tells how
//! close the process is to its `RLIMIT_NOFILE`, for `/healthz` and for telling the node's own
//! shortage from a job's fault.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What an HTTP request's head may take.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    /// Time from accept to the end of the request head (`\r\n\r\n`).
    pub time: Duration,
    /// Largest request head, in bytes.
    pub bytes: usize,
}

/// Admits at most so many connections of one listener at once.
#[derive(Debug, Clone)]
pub struct Gate {
    connections: usize,
    permits: Arc<Semaphore>,
}

/// A connection's place at the [`Gate`], given back when this is dropped.
#[derive(Debug)]
pub struct Place {
    _permit: OwnedSemaphorePermit,
}

/// One admitted connection; its place at the gate frees when this is dropped (so the stream
/// is lent out, never given away without it).
#[derive(Debug)]
pub struct Admitted {
    stream: TcpStream,
    _place: Place,
}

impl Admitted {
    pub fn stream_mut(&mut self) -> &mut TcpStream {
        &mut self.stream
    }
}

/// Why a request head was not read.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error("the request head did not arrive within {0:?}")]
    TooSlow(Duration),
    #[error("the request head is over {0} bytes")]
    TooLarge(usize),
    #[error("the connection closed before the end of the request head")]
    Closed,
    #[error("reading the request head: {0}")]
    Read(#[source] std::io::Error),
}

/// Answer to a connection over the limit, written without waiting (the socket's buffer is
/// empty, so it fits) just before it is closed.
const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

impl Gate {
    pub fn new(connections: usize) -> Gate {
        Gate {
            connections,
            permits: Arc::new(Semaphore::new(connections)),
        }
    }

    /// A place for a connection just accepted, if one is free (for listeners other than TCP,
    /// whose accept loop is their own).
    pub fn try_enter(&self) -> Option<Place> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        Some(Place { _permit: permit })
    }

    /// The next connection of an HTTP listener within the limit. Connections over it are
    /// answered 503 and closed as they arrive;
    /// an accept that fails (EMFILE and the like) is retried after a pause instead of spinning.
    pub async fn accept(&self, listener: &TcpListener) -> Admitted {
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            match self.try_enter() {
                Some(place) => {
                    return Admitted {
                        stream,
                        _place: place,
                    }
                }
                None => {
                    let _ = stream.try_write(BUSY);
                    tracing::debug!("refused a connection: {} already open", self.connections);
                }
            }
        }
    }
}

/// Reads up to the end of an HTTP request head within the gate's limits; returns the head.
pub async fn read_head(stream: &mut TcpStream, limits: HeadLimits) -> Result<Vec<u8>, HeadError> {
    let read = async {
        let mut buf = Vec::with_capacity(512);
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut chunk).await.map_err(HeadError::Read)?;
            if n == 0 {
                return Err(HeadError::Closed);
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.len() > limits.bytes {
                return Err(HeadError::TooLarge(limits.bytes));
            }
        }
        Ok(buf)
    };
    match tokio::time::timeout(limits.time, read).await {
        Ok(r) => r,
        Err(_) => {
            let _ = stream.shutdown().await;
            Err(HeadError::TooSlow(limits.time))
        }
    }
}

/// The process's open descriptors against its soft `RLIMIT_NOFILE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptors {
    pub open: u64,
    pub limit: u64,
}

impl Descriptors {
    /// Descriptors of this process now (`/proc/self/fd`); `None` where they cannot be counted.
    pub fn now() -> Option<Descriptors> {
        Descriptors::of(Path::new("/proc/self/fd"))
    }

    /// Descriptors listed in `fd_dir` against this process's limit.
    pub fn of(fd_dir: &Path) -> Option<Descriptors> {
        let (soft, _) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok()?;
        // One entry is the directory handle the listing itself holds.
        let open = std::fs::read_dir(fd_dir).ok()?.count().saturating_sub(1) as u64;
        Some(Descriptors { open, limit: soft })
    }

    /// Descriptors the engine needs free to set up jobs: a sixteenth of the limit, at least
    /// 64 (each job takes about ten while it starts).
    pub fn reserve(self) -> u64 {
        (self.limit / 16).max(64)
    }

    /// Fewer descriptors free than the [`reserve`](Self::reserve).
    pub fn short(self) -> bool {
        self.limit.saturating_sub(self.open) < self.reserve()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_a_sixteenth_of_the_limit_and_at_least_64() {
        let d = |open, limit| Descriptors { open, limit };
        assert_eq!(d(0, 256).reserve(), 64);
        assert_eq!(d(0, 4096).reserve(), 256);
        assert!(!d(3840, 4096).short());
        assert!(d(3841, 4096).short());
        assert!(d(5000, 4096).short());
        assert!(!d(10, 256).short());
        assert!(d(200, 256).short());
    }

    #[test]
    fn descriptors_counts_this_process() {
        let before = Descriptors::now().unwrap();
        let files: Vec<_> = (0..10).map(|_| tempfile::tempfile().unwrap()).collect();
        let after = Descriptors::now().unwrap();
        assert!(after.open >= before.open + 10, "{before:?} {after:?}");
        drop(files);
    }

    #[tokio::test]
    async fn the_gate_closes_connections_over_the_limit_and_slow_heads() {
        let limits = HeadLimits {
            time: Duration::from_millis(200),
            bytes: 64,
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gate = Gate::new(2);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let acceptor = tokio::spawn(async move {
            loop {
                if tx.send(gate.accept(&listener).await).is_err() {
                    break;
                }
            }
        });
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\n").await.unwrap();
        let mut a1 = rx.recv().await.unwrap();
        let mut quick = TcpStream::connect(addr).await.unwrap();
        quick.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut a2 = rx.recv().await.unwrap();
        // A third while both are held: answered busy and closed.
        let mut third = TcpStream::connect(addr).await.unwrap();
        let mut got = Vec::new();
        third.read_to_end(&mut got).await.unwrap();
        assert!(
            got.starts_with(b"HTTP/1.1 503"),
            "{}",
            String::from_utf8_lossy(&got)
        );
        let slow_head = read_head(a1.stream_mut(), limits).await;
        assert!(
            matches!(slow_head, Err(HeadError::TooSlow(_))),
            "{slow_head:?}"
        );
        let quick_head = read_head(a2.stream_mut(), limits).await.unwrap();
        assert_eq!(quick_head, b"GET / HTTP/1.1\r\n\r\n");
        drop((a1, a2));
        acceptor.abort();
        // The slow one was closed.
        let mut rest = Vec::new();
        let n = slow.read_to_end(&mut rest).await.unwrap_or(0);
        assert_eq!(n, 0);
    }
}
