//! Shared fixtures of the node tests: real `forkbox worker` processes against a private
//! redis-server, with their logs kept for failure messages, and polling helpers with deadlines.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use forkbox_queue::redis;
use forkbox_queue::{Broker, Queue, QueueConfig};
use forkbox_testkit::RedisServer;

pub const BIN: &str = env!("CARGO_BIN_EXE_forkbox");

/// A `forkbox worker` child process. Dropping it kills it.
pub struct WorkerProc {
    pub name: String,
    child: Option<Child>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl WorkerProc {
    /// Starts `forkbox worker --redis URL --name NAME --metrics-addr 127.0.0.1:0 ARGS...`.
    pub fn start(url: &str, name: &str, args: &[&str]) -> WorkerProc {
        WorkerProc::start_under(&[], url, name, args)
    }

    /// [`WorkerProc::start`] through a wrapper command (`prlimit --nofile=256:256 --`, say).
    pub fn start_under(wrapper: &[&str], url: &str, name: &str, args: &[&str]) -> WorkerProc {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("worker.log");
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let child = cmd
            .args(["worker", "--redis", url, "--name", name])
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawning forkbox worker");
        WorkerProc {
            name: name.to_owned(),
            child: Some(child),
            log,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The metrics address the worker logged.
    pub fn metrics_addr(&mut self) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = self.log();
            if let Some(rest) = log.split("metrics on http://").nth(1) {
                let addr = rest.split('/').next().unwrap();
                return addr.parse().unwrap();
            }
            if let Some(status) = self.try_wait() {
                panic!("worker exited ({status}) before serving metrics; log:\n{log}");
            }
            assert!(Instant::now() < deadline, "no metrics address; log:\n{log}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the worker logged that it reads its queues.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.log().contains(" reading ") {
            if let Some(status) = self.try_wait() {
                panic!("worker exited ({status}); log:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "worker not ready; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().unwrap())
    }

    /// Waits for the exit, up to `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.try_wait() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "worker did not exit within {limit:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, as a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- log of worker {} ---\n{}", self.name, self.log());
        }
        self.kill();
    }
}

pub async fn queue(url: &str, name: &str) -> Queue {
    Broker::connect(url)
        .await
        .unwrap()
        .queue(name, QueueConfig::default())
        .unwrap()
}

pub async fn conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Polls `check` every 20 ms until it returns `Some`, or panics with `what` at the deadline.
pub async fn poll<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `GET path` over HTTP/1.1; returns the status code and the body.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, body.to_owned())
}

/// One HTTP/1.1 request with a JSON body (none when empty); the status code and the body as
/// JSON (a JSON string when it is not JSON).
pub fn http_json(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let value = serde_json::from_str(body).unwrap_or_else(|_| serde_json::json!(body));
    (code, value)
}

/// Waits up to 60 s for the gateway at `addr` to offer Piston's `python`.
pub fn gateway_offers_python(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, v) = http_json(addr, "GET", "/api/v2/runtimes", None);
        if code == 200
            && v.as_array()
                .is_some_and(|a| a.iter().any(|l| l["language"] == "python"))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no python offered within 60 s: {code} {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The value of one sample line of a Prometheus text page, e.g.
/// `forkbox_jobs_total{queue="default",status="ok"}`; labels in any order.
pub fn metric(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    page.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if n != name {
            return None;
        }
        let have: Vec<&str> = rest.split(',').filter(|s| !s.is_empty()).collect();
        let matches = labels.len() == have.len()
            && labels
                .iter()
                .all(|(k, v)| have.contains(&format!("{k}=\"{v}\"").as_str()));
        matches.then(|| value.parse().ok()).flatten()
    })
}

/// Waits until `/metrics` shows `want` for one series and returns that page. A result
/// becomes visible in Redis a moment before the node counts it, so a test that has just
/// seen a result reads the counters through this.
pub fn metric_reaches(addr: SocketAddr, name: &str, labels: &[(&str, &str)], want: f64) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let page = http_get(addr, "/metrics").1;
        if metric(&page, name, labels) == Some(want) {
            return page;
        }
        assert!(
            Instant::now() < deadline,
            "{name}{labels:?} never reached {want}:\n{page}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every `(id, attempt, worker)` in a queue's results stream, in order.
pub async fn results_stream(url: &str, queue: &str) -> Vec<(String, serde_json::Value)> {
    let mut c = conn(url).await;
    let entries: Vec<(String, Vec<(String, String)>)> = {
        let v: redis::Value = redis::cmd("XRANGE")
            .arg(format!("forkbox:{{{queue}}}:results"))
            .arg("-")
            .arg("+")
            .query_async(&mut c)
            .await
            .unwrap();
        redis::from_redis_value(&v).unwrap()
    };
    entries
        .into_iter()
        .map(|(entry, fields)| {
            let json = fields
                .into_iter()
                .find(|(k, _)| k == "result")
                .map(|(_, v)| v)
                .expect("a result field");
            (entry, serde_json::from_str(&json).unwrap())
        })
        .collect()
}

/// The results stream of `queue` once it holds at least `n` entries (fails after `limit`).
pub async fn results_at_least(
    url: &str,
    queue: &str,
    n: usize,
    limit: Duration,
    what: &str,
) -> Vec<(String, serde_json::Value)> {
    poll(limit, what, || async move {
        let r = results_stream(url, queue).await;
        (r.len() >= n).then_some(r)
    })
    .await
}

/// Waits until the node's `/metrics` reports `n` busy slots (fails after `limit`, naming `what`).
pub async fn slots_busy(metrics: SocketAddr, n: f64, limit: Duration, what: &str) {
    poll(limit, what, || async move {
        let page = http_get(metrics, "/metrics").1;
        (metric(&page, "forkbox_slots_busy", &[]) == Some(n)).then_some(())
    })
    .await
}

pub fn start_redis() -> RedisServer {
    RedisServer::start().expect("redis-server (install it, or set FORKBOX_REDIS_SERVER)")
}

/// Whether a program is runnable.
pub fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

pub fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// Opens a session on each partition of `q` (served by node `node`) and uses it: state kept
/// across `run_code` calls, an `exec`, `info`, the command line (`forkbox session run-code`
/// with `cli_redis`, the options that reach the queue), and a kill. Each session's record and
/// events are on its own partition (its id's), so each step goes to that partition's keys.
pub async fn sessions_on_every_partition(
    q: &forkbox_queue::Partitioned,
    node: &str,
    cli_redis: &[&str],
) {
    use forkbox_queue::session::{Call, CallOp, Event, SessionSpec};
    use forkbox_queue::{Job, Runtime};

    let result = |end: Event| match end {
        Event::Result(r) => r,
        other => panic!("not a result: {other:?}"),
    };
    for (p, part) in q.partitions().iter().enumerate() {
        let sid = (0..)
            .map(|k| format!("part-session-{p}-{k}"))
            .find(|id| q.for_id(id).keys().jobs() == part.keys().jobs())
            .unwrap();
        let job = Job {
            id: Some(sid.clone()),
            session: Some(SessionSpec {
                ttl_s: Some(120),
                idle_s: Some(60),
            }),
            runtime: Some(Runtime::Python),
            ..Job::default()
        };
        q.enqueue_idempotent(&job).await.unwrap();
        let opened = part
            .wait_opened(&sid, Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| panic!("session {sid} on partition {p}: {e}"));
        assert_eq!(opened.node, node);
        let call = |c: Call| async move {
            let end = part
                .call_session(&c, Duration::from_secs(30), &mut |_| {})
                .await
                .unwrap_or_else(|e| panic!("{:?} on partition {p}: {e}", c.op));
            result(end)
        };
        assert_eq!(call(Call::run_code(&sid, "v = 20")).await["ok"], true);
        assert_eq!(call(Call::run_code(&sid, "v + 1")).await["text"], "21");
        let r = call(Call::exec_shell(&sid, "echo partition; exit 4")).await;
        assert_eq!(
            (&r["stdout"], &r["exit_code"]),
            (&"partition\n".into(), &4.into())
        );
        let info = call(Call::new(&sid, CallOp::Info)).await;
        assert_eq!(info["info"]["id"], sid.as_str(), "{info:?}");

        let partitions = q.partitions().len().to_string();
        let mut args = vec![
            "session",
            "run-code",
            "-q",
            q.name(),
            "--partitions",
            &partitions,
        ];
        args.extend_from_slice(cli_redis);
        args.extend([sid.as_str(), "v * 2"]);
        let out = Command::new(BIN).args(&args).output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "40\n",
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );

        call(Call::new(&sid, CallOp::Kill)).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info = part.session_info(&sid).await.unwrap().unwrap();
            if info.state == "ended" {
                assert_eq!(info.reason.as_deref(), Some("killed"), "{info:?}");
                break;
            }
            assert!(Instant::now() < deadline, "{info:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A private redis-server, a `forkbox worker` named `name` with `args` on it, ready, and a
/// client of its `default` queue.
pub async fn session_node(name: &str, args: &[&str]) -> (RedisServer, WorkerProc, Queue) {
    let server = start_redis();
    let mut w = WorkerProc::start(&server.url(), name, args);
    w.wait_ready();
    let q = queue(&server.url(), "default").await;
    (server, w, q)
}

/// A create of a warm Python session that lives up to 120 s, 60 s of them idle.
pub fn session_job() -> forkbox_queue::Job {
    forkbox_queue::Job {
        session: Some(forkbox_queue::session::SessionSpec {
            ttl_s: Some(120),
            idle_s: Some(60),
        }),
        runtime: Some(forkbox_queue::Runtime::Python),
        ..forkbox_queue::Job::default()
    }
}

/// Opens the session `job` creates, within 60 s.
pub async fn open_session(q: &Queue, job: &forkbox_queue::Job) -> forkbox_queue::SessionOpened {
    q.open_session(job, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("session opens: {e}"))
}

/// Sends `call` and returns its result (output events dropped), within `limit`.
pub async fn session_result(
    q: &Queue,
    call: forkbox_queue::session::Call,
    limit: Duration,
) -> serde_json::Map<String, serde_json::Value> {
    let end = q
        .call_session(&call, limit, &mut |_| {})
        .await
        .unwrap_or_else(|e| panic!("call {:?}: {e}", call.op));
    match end {
        forkbox_queue::session::Event::Result(r) => r,
        other => panic!("not a result: {other:?}"),
    }
}

/// Sends `call` and returns its result, within 60 s.
pub async fn call_result(
    q: &Queue,
    call: forkbox_queue::session::Call,
) -> serde_json::Map<String, serde_json::Value> {
    session_result(q, call, Duration::from_secs(60)).await
}

/// Runs `code` in the session `sid`, which must answer ok, and returns its value's text.
pub async fn run_code_text(q: &Queue, sid: &str, code: &str) -> String {
    let r = call_result(q, forkbox_queue::session::Call::run_code(sid, code)).await;
    assert_eq!(r["ok"], true, "{code}: {r:?}");
    r["text"].as_str().unwrap_or_default().to_owned()
}

/// Runs `forkbox ARGS` against the Redis at `url` with `stdin` on its standard input: its
/// exit code, standard output and standard error.
pub fn forkbox_cli_with(url: &str, args: &[&str], stdin: &str) -> (i32, String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(BIN)
        .args(args)
        .env("FORKBOX_REDIS_URL", url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`forkbox_cli_with`] with nothing on standard input.
pub fn forkbox_cli(url: &str, args: &[&str]) -> (i32, String, String) {
    forkbox_cli_with(url, args, "")
}
