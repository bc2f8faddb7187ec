//! A `redis-server` the load generator starts itself.
//!
//! Runs need their own Redis in two cases: `--restart-redis-at` (the load generator must own the
//! process to SIGKILL and restart it, with the append-only file on so acknowledged writes
//! survive) and `--hosts` (the server must listen on the simulated network's bridge address so
//! workers reach it over veth, not loopback). The queue crate's test fixture listens on
//! loopback only, hence this small launcher with a bind list.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

const START_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug)]
pub struct LocalRedis {
    binary: PathBuf,
    bind: Vec<IpAddr>,
    port: u16,
    appendonly: bool,
    dir: PathBuf,
    child: Option<Child>,
    _temp: Option<tempfile::TempDir>,
}

/// A port the kernel just handed out and released (never 6379).
pub fn free_port() -> anyhow::Result<u16> {
    loop {
        let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .context("finding a free port")?;
        let port = l.local_addr()?.port();
        if port != 6379 {
            return Ok(port);
        }
    }
}

impl LocalRedis {
    /// Starts `redis-server` listening on loopback and every address in `extra_bind`, with its
    /// data in `dir` (a fresh temporary directory when `None`).
    pub fn start(
        extra_bind: &[IpAddr],
        appendonly: bool,
        dir: Option<&Path>,
    ) -> anyhow::Result<LocalRedis> {
        let (dir, temp) = match dir {
            Some(d) => {
                std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
                (d.to_owned(), None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("forkbox-loadgen-redis-")
                    .tempdir()
                    .context("creating the Redis data directory")?;
                (t.path().to_owned(), Some(t))
            }
        };
        let mut bind = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
        bind.extend_from_slice(extra_bind);
        let binary = std::env::var_os("FORKBOX_REDIS_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("redis-server"));
        let mut last = None;
        for _ in 0..5 {
            let mut r = LocalRedis {
                binary: binary.clone(),
                bind: bind.clone(),
                port: free_port()?,
                appendonly,
                dir: dir.clone(),
                child: None,
                _temp: None,
            };
            match r.spawn_and_wait() {
                Ok(()) => {
                    r._temp = temp;
                    return Ok(r);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("attempted at least once"))
    }

    /// The URL through address `addr` (one of the bind addresses).
    pub fn url_via(&self, addr: IpAddr) -> String {
        format!("redis://{addr}:{}/", self.port)
    }

    pub fn url(&self) -> String {
        self.url_via(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// SIGKILL: a crash, nothing flushed beyond what the append-only file holds.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILL, then start again on the same port and data directory.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn_and_wait()
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(6)..].join(" | ")
    }

    fn spawn_and_wait(&mut self) -> anyhow::Result<()> {
        let bind: Vec<String> = self.bind.iter().map(ToString::to_string).collect();
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg(bind.join(" "))
            .arg("--dir")
            .arg(&self.dir)
            .args(["--logfile", "redis.log", "--save", "", "--daemonize", "no"])
            // Workers in other network namespaces connect from non-loopback addresses.
            .args(["--protected-mode", "no"]);
        if self.appendonly {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", self.binary.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(c) = &mut self.child {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    bail!(
                        "redis-server on port {} exited during start-up ({status}): {}",
                        self.port,
                        self.log_tail()
                    );
                }
            }
            if ping(self.port) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                bail!(
                    "redis-server on port {} did not answer PING: {}",
                    self.port,
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// True on `+PONG` (not `-LOADING` during an AOF replay).
fn ping(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
}
