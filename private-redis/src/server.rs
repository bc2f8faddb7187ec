//! A private `redis-server` process.
//!
//! Tests of every crate need a real Redis they own (never the data behind port 6379), and
//! `forkbox up` starts its own when none is reachable. [`RedisServer`] starts `redis-server` on
//! a free 127.0.0.1 port with its data in a directory it owns, waits until the server answers
//! `PING`, and kills it when dropped. A temporary data directory is made 0700, and a server
//! given a password gets it through its standard input (`redis-server -`), never its command
//! line, which every local user can read in `/proc/<pid>/cmdline`. [`RedisServer::restart`] brings it back on the same port
//! and directory, so with `appendonly` the data survives a SIGKILL, which is how tests simulate
//! a Redis crash.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a start may take before it counts as failed (AOF replay included).
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Fresh ports tried when the chosen one was taken between probing and binding.
const PORT_ATTEMPTS: usize = 5;

/// Why the server could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RedisServerError {
    #[error("creating the data directory: {0}")]
    CreateDir(#[source] std::io::Error),
    #[error("finding a free port: {0}")]
    FreePort(#[source] std::io::Error),
    #[error("spawning {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("redis-server on port {port} exited during start-up ({status}); log: {log}")]
    Exited {
        port: u16,
        status: std::process::ExitStatus,
        log: String,
    },
    #[error("redis-server on port {port} did not answer PING within {timeout:?}; log: {log}")]
    NotReady {
        port: u16,
        timeout: Duration,
        log: String,
    },
    #[error("killing redis-server: {0}")]
    Kill(#[source] std::io::Error),
}

/// How to run the server.
#[derive(Debug, Clone)]
pub struct RedisServerOptions {
    /// Append-only file on (`appendfsync always`), so acknowledged writes survive a SIGKILL.
    pub appendonly: bool,
    /// The `redis-server` binary; a bare name is looked up in `PATH`.
    pub binary: PathBuf,
    /// Data directory; a fresh temporary directory (removed on drop) when `None`.
    pub dir: Option<PathBuf>,
    /// Also listen on a Unix socket `redis.sock` in the data directory.
    pub unix_socket: bool,
    /// Addresses to listen on besides 127.0.0.1 (a bridge address, so that nodes in other
    /// network namespaces reach it). With any, protected mode is off: those clients are not
    /// on loopback.
    pub extra_bind: Vec<std::net::IpAddr>,
    /// Name prefix of the temporary data directory made when `dir` is `None` (the server runs
    /// in it, so it also marks the process as ours).
    pub temp_prefix: String,
    /// Have the kernel SIGKILL the server when the thread that started it ends, so that it does
    /// not outlive an owner killed outright (`setpriv --pdeathsig KILL`, from util-linux, when
    /// it is installed). Only for a thread that lives as long as its process, such as `main`:
    /// the signal follows the thread, not the process. The temporary data directory is then
    /// named after this process too ([`forkbox_queue::owner`]), and those such owners that are gone
    /// left behind (their `Drop` never ran) are removed first.
    pub die_with_parent: bool,
    /// Listen on this port instead of a free one (a port that is taken is then an error).
    pub port: Option<u16>,
    /// Run as a Redis Cluster node (`cluster-enabled yes`, its cluster bus on a second free
    /// port) with this node timeout in milliseconds: how long a silent peer takes to be marked
    /// failed, and so most of a failover's duration. See `forkbox_testkit::RedisCluster`.
    pub cluster_node_timeout_ms: Option<u64>,
    /// Require this password (`requirepass`), so that other local users, who can reach any
    /// loopback port, can neither read nor write the data. [`random_password`] makes one.
    pub password: Option<String>,
    /// Speak TLS only (`--port 0 --tls-port`), with these certificates.
    pub tls: Option<ServerTls>,
    /// More `redis-server` arguments (`--user ...`).
    pub extra_args: Vec<String>,
}

/// The TLS side of a server that speaks nothing else.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA that client certificates must be signed by.
    pub ca: PathBuf,
    /// Refuse clients without a certificate signed by `ca` (mutual TLS).
    pub require_client_cert: bool,
}

/// A password of 64 hex digits (256 random bits minus the UUID version bits), safe to put in a
/// URL and a Redis config line without quoting.
pub fn random_password() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

impl Default for RedisServerOptions {
    fn default() -> Self {
        RedisServerOptions {
            appendonly: false,
            binary: std::env::var_os("FORKBOX_REDIS_SERVER")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("redis-server")),
            dir: None,
            unix_socket: false,
            extra_bind: Vec::new(),
            temp_prefix: "forkbox-redis-".into(),
            die_with_parent: false,
            port: None,
            cluster_node_timeout_ms: None,
            password: None,
            tls: None,
            extra_args: Vec::new(),
        }
    }
}

/// A running `redis-server` owned by this process. Dropping it kills the server.
#[derive(Debug)]
pub struct RedisServer {
    options: RedisServerOptions,
    port: u16,
    /// The cluster bus port of a cluster node.
    bus_port: Option<u16>,
    dir: PathBuf,
    child: Option<Child>,
    // Held for its Drop, which removes the directory; declared after `child` is irrelevant
    // because Drop of RedisServer kills the child first.
    _temp: Option<tempfile::TempDir>,
}

impl RedisServer {
    /// Starts a server with default options (no persistence).
    pub fn start() -> Result<RedisServer, RedisServerError> {
        RedisServer::start_with(RedisServerOptions::default())
    }

    /// Starts a server with the append-only file on.
    pub fn start_persistent() -> Result<RedisServer, RedisServerError> {
        RedisServer::start_with(RedisServerOptions {
            appendonly: true,
            ..RedisServerOptions::default()
        })
    }

    /// Starts a server on a free port, or on `options.port`.
    pub fn start_with(options: RedisServerOptions) -> Result<RedisServer, RedisServerError> {
        let (dir, temp) = match &options.dir {
            Some(d) => {
                std::fs::create_dir_all(d).map_err(RedisServerError::CreateDir)?;
                (d.clone(), None)
            }
            None => {
                let prefix = if options.die_with_parent {
                    // Their servers died with their owners.
                    for dir in
                        forkbox_queue::owner::abandoned(&std::env::temp_dir(), &options.temp_prefix)
                    {
                        let _ = std::fs::remove_dir_all(dir);
                    }
                    format!("{}{}-", options.temp_prefix, forkbox_queue::owner::tag())
                } else {
                    options.temp_prefix.clone()
                };
                // 0700: the AOF and the log hold jobs and results, which are no other user's.
                let t = tempfile::Builder::new()
                    .prefix(&prefix)
                    .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
                    .tempdir()
                    .map_err(RedisServerError::CreateDir)?;
                (t.path().to_owned(), Some(t))
            }
        };
        let mut last_err = None;
        let attempts = if options.port.is_some() {
            1
        } else {
            PORT_ATTEMPTS
        };
        for _ in 0..attempts {
            let port = match options.port {
                Some(p) => p,
                None => free_port()?,
            };
            let bus_port = match options.cluster_node_timeout_ms {
                Some(_) => Some(free_port_besides(port)?),
                None => None,
            };
            let mut server = RedisServer {
                options: options.clone(),
                port,
                bus_port,
                dir: dir.clone(),
                child: None,
                _temp: None,
            };
            match server.spawn_and_wait() {
                Ok(()) => {
                    server._temp = temp;
                    return Ok(server);
                }
                // Another process took the port between the probe and redis' bind: try another.
                Err(e @ RedisServerError::Exited { .. }) if e.to_string().contains("in use") => {
                    last_err = Some(e)
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.expect("at least one attempt was made"))
    }

    /// `redis://127.0.0.1:<port>/` (`rediss://` for a TLS server), with the password when the
    /// server has one.
    pub fn url(&self) -> String {
        self.url_via(Ipv4Addr::LOCALHOST.into())
    }

    /// The URL through one of the listening addresses (see [`RedisServerOptions::extra_bind`]).
    pub fn url_via(&self, addr: std::net::IpAddr) -> String {
        let auth = match &self.options.password {
            Some(p) => format!(":{p}@"),
            None => String::new(),
        };
        let scheme = if self.options.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!(
            "{scheme}://{auth}{}/",
            std::net::SocketAddr::new(addr, self.port)
        )
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data directory (AOF files and `redis.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server with SIGKILL (a crash: nothing is flushed beyond what the AOF holds).
    pub fn kill(&mut self) -> Result<(), RedisServerError> {
        if let Some(mut child) = self.child.take() {
            // kill() fails only when the process was already reaped, which wait() settles.
            let _ = child.kill();
            child.wait().map_err(RedisServerError::Kill)?;
        }
        Ok(())
    }

    /// Kills the server if it runs, then starts it again on the same port and directory.
    pub fn restart(&mut self) -> Result<(), RedisServerError> {
        self.kill()?;
        self.spawn_and_wait()
    }

    /// The last lines of the server's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(8)..].join(" | ")
    }

    fn socket_path(&self) -> PathBuf {
        self.dir.join("redis.sock")
    }

    fn spawn_and_wait(&mut self) -> Result<(), RedisServerError> {
        let mut cmd = match self.options.die_with_parent.then(setpriv).flatten() {
            Some(setpriv) => {
                let mut c = Command::new(setpriv);
                c.args(["--pdeathsig", "KILL", "--"])
                    .arg(&self.options.binary);
                c
            }
            None => Command::new(&self.options.binary),
        };
        let mut bind = vec!["127.0.0.1".to_owned()];
        bind.extend(self.options.extra_bind.iter().map(ToString::to_string));
        let protected = if self.options.extra_bind.is_empty() {
            "yes"
        } else {
            "no"
        };
        match &self.options.tls {
            Some(tls) => {
                cmd.args(["--port", "0", "--tls-port"])
                    .arg(self.port.to_string())
                    .arg("--tls-cert-file")
                    .arg(&tls.cert)
                    .arg("--tls-key-file")
                    .arg(&tls.key)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca)
                    .arg("--tls-auth-clients")
                    .arg(if tls.require_client_cert { "yes" } else { "no" });
                if self.options.cluster_node_timeout_ms.is_some() {
                    cmd.args(["--tls-cluster", "yes", "--tls-replication", "yes"]);
                }
            }
            None => {
                cmd.arg("--port").arg(self.port.to_string());
            }
        }
        cmd.arg("--bind")
            .arg(bind.join(" "))
            .arg("--dir")
            .arg(&self.dir)
            .args(["--logfile", "redis.log"])
            .args(["--save", ""])
            .args(["--daemonize", "no"])
            .args(["--protected-mode", protected]);
        if self.options.appendonly {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        if let (Some(timeout), Some(bus)) = (self.options.cluster_node_timeout_ms, self.bus_port) {
            cmd.args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", "nodes.conf"])
                .arg("--cluster-port")
                .arg(bus.to_string())
                .arg("--cluster-node-timeout")
                .arg(timeout.to_string());
        }
        cmd.args(&self.options.extra_args);
        if self.options.unix_socket {
            cmd.arg("--unixsocket")
                .arg(self.socket_path())
                .args(["--unixsocketperm", "700"]);
        }
        // A process group of its own: a terminal's Ctrl-C goes to the foreground group, and
        // the owner (e.g. `forkbox up`, still storing results) decides when Redis stops.
        cmd.process_group(0);
        // The password as a config line on standard input (`-`, the last argument): anything
        // in argv is world-readable.
        if self.options.password.is_some() {
            cmd.arg("-");
            cmd.stdin(Stdio::piped());
        } else {
            cmd.stdin(Stdio::null());
        }
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let mut child = cmd.spawn().map_err(|source| RedisServerError::Spawn {
            binary: self.options.binary.clone(),
            source,
        })?;
        if let (Some(password), Some(mut stdin)) = (&self.options.password, child.stdin.take()) {
            // A write that fails means the server already exited, which the loop reports.
            let _ = stdin.write_all(format!("requirepass {password}\n").as_bytes());
        }
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = &mut self.child {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(RedisServerError::Exited {
                        port: self.port,
                        status,
                        log: self.log_tail(),
                    });
                }
            }
            if ping(
                self.port,
                self.options.password.as_deref(),
                self.options.tls.is_some(),
            ) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = self.kill();
                return Err(RedisServerError::NotReady {
                    port: self.port,
                    timeout: START_TIMEOUT,
                    log: self.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// A port the kernel just gave out and released; never 6379 by construction of the retry.
fn free_port() -> Result<u16, RedisServerError> {
    loop {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .map_err(RedisServerError::FreePort)?;
        let port = listener
            .local_addr()
            .map_err(RedisServerError::FreePort)?
            .port();
        if port != 6379 {
            return Ok(port);
        }
    }
}

/// A free port other than `taken` (a cluster node's bus port beside its client port).
fn free_port_besides(taken: u16) -> Result<u16, RedisServerError> {
    loop {
        let port = free_port()?;
        if port != taken {
            return Ok(port);
        }
    }
}

/// True when the server answers `+PONG` (not `-LOADING` while it replays its AOF), after
/// `AUTH` with `password` when one is given, or, when none is, `-NOAUTH` (it wants a password
/// it was given another way). A TLS server is ready once it accepts a connection: without persistence it
/// has nothing to load.
fn ping(port: u16, password: Option<&str>, tls: bool) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    if tls {
        return true;
    }
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let (request, replies) = match password {
        Some(p) => (format!("AUTH {p}\r\nPING\r\n"), 2),
        None => ("PING\r\n".to_owned(), 1),
    };
    if s.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 128];
    while got.iter().filter(|&&b| b == b'\n').count() < replies {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let last = got
        .split(|&b| b == b'\n')
        .nth(replies - 1)
        .unwrap_or_default();
    last.starts_with(b"+PONG") || (password.is_none() && last.starts_with(b"-NOAUTH"))
}

/// util-linux's `setpriv`, when it is in `PATH`.
fn setpriv() -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join("setpriv"))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_password_is_required_and_never_on_the_command_line() {
        let password = random_password();
        assert_eq!(password.len(), 64);
        let server = RedisServer::start_with(RedisServerOptions {
            password: Some(password.clone()),
            ..RedisServerOptions::default()
        })
        .unwrap();
        assert!(server.url().contains(&format!(":{password}@")));
        let mode = std::fs::metadata(server.dir())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", server.pid().unwrap())).unwrap();
        assert!(!String::from_utf8_lossy(&cmdline).contains(&password));
        // Without the password: refused; with it: served.
        let mut s = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET k\r\n").unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap();
        assert!(
            buf[..n].starts_with(b"-NOAUTH"),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
        assert!(ping(server.port(), Some(&password), false));
        assert!(!ping(server.port(), Some("wrong"), false));
    }
}
