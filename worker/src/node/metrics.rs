//! Prometheus metrics and the HTTP responder that serves them.
//!
//! The recorder is `metrics-exporter-prometheus` without its HTTP listener: the node installs
//! it once per process ([`install`]) and answers `GET /metrics` (the rendered text) and
//! `GET /healthz` from a small HTTP/1.1 responder on a tokio listener ([`serve`]), which keeps
//! hyper out of the build. Every series the node reports is registered at zero when it starts
//! ([`register`]), so a first scrape already lists them all. Any local user can reach the
//! port, so it sits behind a [`Gate`]: at most [`METRICS_CONNECTIONS`] at once, each
//! with a few seconds to send its request head. `/healthz` fails when the node itself is short
//! of descriptors, or a job's set-up recently failed for want of the node's own resources.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use forkbox_queue::Status;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::node::error::NodeError;
use crate::node::gate::{read_head, Descriptors, Gate, HeadError, HeadLimits};
use crate::node::health::RedisHealth;
pub use crate::node::health::REDIS_ERRORS;

pub const JOBS: &str = "forkbox_jobs_total";
pub const JOB_DURATION: &str = "forkbox_job_duration_seconds";
pub const SPAWN: &str = "forkbox_spawn_seconds";
pub const SLOTS_BUSY: &str = "forkbox_slots_busy";
pub const SLOTS: &str = "forkbox_slots";
pub const QUEUE_LAG: &str = "forkbox_queue_lag";
pub const QUEUE_PENDING: &str = "forkbox_queue_pending";
pub const QUEUE_WAIT: &str = "forkbox_queue_wait_seconds";
pub const IN_FLIGHT: &str = "forkbox_jobs_in_flight";
pub const DEAD_LETTER_LENGTH: &str = "forkbox_dead_letter_length";
pub const BUILD_INFO: &str = "forkbox_build_info";
pub const RECLAIMED: &str = "forkbox_reclaimed_total";
pub const RECOVERED: &str = "forkbox_recovered_total";
pub const DEAD_LETTERS: &str = "forkbox_dead_letter_total";
pub const WATCHDOG_OVERSHOOT: &str = "forkbox_watchdog_overshoot_seconds";
pub const REDIS_DATA_LOST: &str = "forkbox_redis_data_lost_total";
pub const RESULTS_LOST: &str = "forkbox_results_lost_total";
pub const SESSIONS_LIVE: &str = "forkbox_sessions_live";
pub const SESSIONS_CREATED: &str = "forkbox_sessions_created_total";
pub const SESSIONS_ENDED: &str = "forkbox_sessions_ended_total";
pub const SESSION_CALLS: &str = "forkbox_session_calls_total";
pub const SESSION_POOL_READY: &str = "forkbox_session_pool_ready";
pub const SESSIONS_FROM_POOL: &str = "forkbox_sessions_from_pool_total";
pub const SESSION_CALL_DURATION: &str = "forkbox_session_call_seconds";

/// Job wall time: 1 ms to 10 min.
const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 600.0,
];
/// Time in queue: 1 ms to 1 h.
const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
/// Spawn and watchdog overshoot: 50 µs to 1 s.
const FINE_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide recorder (once; later calls return the same handle).
pub fn install() -> Result<PrometheusHandle, NodeError> {
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let err = |e: metrics_exporter_prometheus::BuildError| NodeError::MetricsInstall(e.to_string());
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(JOB_DURATION.into()), DURATION_BUCKETS)
        .map_err(err)?
        .set_buckets_for_metric(Matcher::Full(SPAWN.into()), FINE_BUCKETS)
        .map_err(err)?
        .set_buckets_for_metric(Matcher::Full(WATCHDOG_OVERSHOOT.into()), FINE_BUCKETS)
        .map_err(err)?
        .set_buckets_for_metric(Matcher::Full(QUEUE_WAIT.into()), WAIT_BUCKETS)
        .map_err(err)?
        .set_buckets_for_metric(
            Matcher::Full(SESSION_CALL_DURATION.into()),
            DURATION_BUCKETS,
        )
        .map_err(err)?;
    let handle = builder.install_recorder().map_err(err)?;
    describe();
    Ok(HANDLE.get_or_init(|| handle).clone())
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(JOBS, "Results stored by this node, by queue and status.");
    describe_histogram!(
        JOB_DURATION,
        Unit::Seconds,
        "Wall time of each job, by queue."
    );
    describe_histogram!(
        SPAWN,
        Unit::Seconds,
        "Sandbox spawn: request to execve, by queue."
    );
    describe_histogram!(
        QUEUE_WAIT,
        Unit::Seconds,
        "Time in queue: from the job's stream entry to its start on this node, by queue."
    );
    describe_gauge!(SLOTS_BUSY, "Jobs running now.");
    describe_gauge!(SLOTS, "Concurrent jobs this node runs at most.");
    describe_gauge!(
        IN_FLIGHT,
        "Entries this node holds: read and not yet acknowledged, by queue."
    );
    describe_gauge!(QUEUE_LAG, "Entries not yet delivered to group workers.");
    describe_gauge!(
        QUEUE_PENDING,
        "Entries delivered to some worker of the group and not yet acknowledged."
    );
    describe_gauge!(
        DEAD_LETTER_LENGTH,
        "Entries in the queue's dead-letter stream."
    );
    describe_gauge!(BUILD_INFO, "Always 1; the labels name the running build.");
    describe_counter!(
        RECLAIMED,
        "Entries taken over from dead or stuck consumers."
    );
    describe_counter!(
        RECOVERED,
        "Own entries taken back after the reply of the read that was handed them was lost."
    );
    describe_counter!(DEAD_LETTERS, "Entries moved to the dead-letter stream.");
    describe_counter!(REDIS_ERRORS, "Failed Redis calls.");
    describe_counter!(
        REDIS_DATA_LOST,
        "Times the node saw Redis lose the queue's data (its consumer group gone, or a restart \
         that took entries the node held)."
    );
    describe_counter!(
        RESULTS_LOST,
        "Results computed and not stored: the entry was gone and no result existed (lost with \
         Redis' data)."
    );
    describe_gauge!(SESSIONS_LIVE, "Sessions live on this node.");
    describe_counter!(SESSIONS_CREATED, "Sessions this node opened.");
    describe_counter!(SESSIONS_ENDED, "Sessions this node ended, by reason.");
    describe_counter!(SESSION_CALLS, "Calls to this node's sessions, by op.");
    describe_gauge!(
        SESSION_POOL_READY,
        "Session sandboxes opened ahead of demand and waiting for their session."
    );
    describe_counter!(
        SESSIONS_FROM_POOL,
        "Sessions opened by handing over a sandbox opened ahead of demand."
    );
    describe_histogram!(
        SESSION_CALL_DURATION,
        Unit::Seconds,
        "Session calls: from the node reading the call to its terminal event, by op."
    );
    describe_histogram!(
        WATCHDOG_OVERSHOOT,
        Unit::Seconds,
        "How late the watchdog's kill came after a job's wall limit."
    );
}

/// Registers every series at zero so the first scrape shows them.
pub fn register(queues: &[String], slots: usize) {
    for q in queues {
        for s in Status::ALL {
            metrics::counter!(JOBS, "queue" => q.clone(), "status" => s.as_str()).absolute(0);
        }
        metrics::gauge!(QUEUE_LAG, "queue" => q.clone()).set(0.0);
        metrics::gauge!(QUEUE_PENDING, "queue" => q.clone()).set(0.0);
        metrics::gauge!(DEAD_LETTER_LENGTH, "queue" => q.clone()).set(0.0);
        metrics::gauge!(IN_FLIGHT, "queue" => q.clone()).set(0.0);
        metrics::counter!(RECLAIMED, "queue" => q.clone()).absolute(0);
        metrics::counter!(RECOVERED, "queue" => q.clone()).absolute(0);
        metrics::counter!(DEAD_LETTERS, "queue" => q.clone()).absolute(0);
        metrics::counter!(REDIS_DATA_LOST, "queue" => q.clone()).absolute(0);
        metrics::counter!(RESULTS_LOST, "queue" => q.clone()).absolute(0);
        // Touching a histogram registers it; it renders with zero counts until the first sample.
        let _ = metrics::histogram!(JOB_DURATION, "queue" => q.clone());
        let _ = metrics::histogram!(SPAWN, "queue" => q.clone());
        let _ = metrics::histogram!(QUEUE_WAIT, "queue" => q.clone());
    }
    metrics::counter!(REDIS_ERRORS).absolute(0);
    metrics::gauge!(SLOTS_BUSY).set(0.0);
    metrics::gauge!(SLOTS).set(slots as f64);
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    let _ = metrics::histogram!(WATCHDOG_OVERSHOOT);
    metrics::gauge!(SESSIONS_LIVE).set(0.0);
    metrics::counter!(SESSIONS_CREATED).absolute(0);
    metrics::gauge!(SESSION_POOL_READY).set(0.0);
    metrics::counter!(SESSIONS_FROM_POOL).absolute(0);
    for reason in forkbox_queue::EndReason::ALL {
        metrics::counter!(SESSIONS_ENDED, "reason" => reason.as_str()).absolute(0);
    }
    for op in forkbox_queue::CallOp::ALL {
        metrics::counter!(SESSION_CALLS, "op" => op.as_str()).absolute(0);
        let _ = metrics::histogram!(SESSION_CALL_DURATION, "op" => op.as_str());
    }
}

/// What `/healthz` reports.
#[derive(Debug, Default)]
pub struct NodeStatus {
    pub draining: AtomicBool,
    pub redis: Arc<RedisHealth>,
    /// Cleared when the sandbox engine's zygote is gone: no job can run any more.
    pub sandbox_alive: AtomicBool,
    /// The last job set-up that failed for want of the node's own resources, and when.
    pub resource_fault: Mutex<Option<(Instant, String)>>,
}

/// How long `/healthz` fails after a set-up fault of the node's own resources.
const RESOURCE_FAULT_SHOWN: Duration = Duration::from_secs(30);

impl NodeStatus {
    /// Records a job set-up that failed for want of the node's resources (see
    /// [`NodeFault`](crate::node::error::NodeFault)).
    pub fn resource_fault(&self, error: &str) {
        *self.resource_fault.lock().expect("status lock") = Some((Instant::now(), error.into()));
    }

    fn health(&self) -> (u16, String) {
        self.health_with(Descriptors::now())
    }

    fn health_with(&self, descriptors: Option<Descriptors>) -> (u16, String) {
        if !self.sandbox_alive.load(Ordering::Relaxed) {
            return (503, "the sandbox zygote is gone; restart the node\n".into());
        }
        if self.draining.load(Ordering::Relaxed) {
            return (503, "draining: finishing running jobs before exit\n".into());
        }
        if let Some(d) = descriptors.filter(|d| d.short()) {
            return (
                503,
                format!(
                    "out of descriptors: {} of {} open, fewer than {} left for setting up jobs\n",
                    d.open,
                    d.limit,
                    d.reserve()
                ),
            );
        }
        if let Some((at, error)) = &*self.resource_fault.lock().expect("status lock") {
            let ago = at.elapsed();
            if ago < RESOURCE_FAULT_SHOWN {
                return (
                    503,
                    format!(
                        "a job's set-up failed {:.0} s ago for want of the node's own \
                         resources: {error}\n",
                        ago.as_secs_f64()
                    ),
                );
            }
        }
        match self.redis.outage() {
            // Still 200: the node is alive and resumes by itself within a couple of seconds of
            // Redis answering again (a liveness probe must not restart it: that would not
            // bring Redis back). The text says what is wrong; `forkbox_redis_errors_total`
            // counts the failures.
            Some(d) => (
                200,
                format!(
                    "degraded: Redis unreachable for {:.0} s; retrying (jobs that are running \
                     go on, their results wait in the outbox)\n",
                    d.as_secs_f64()
                ),
            ),
            None => (200, "ok\n".into()),
        }
    }
}

/// Binds `addr` (port 0 picks a free one) and returns the listener with its real address.
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), NodeError> {
    let err = |source| NodeError::MetricsBind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(err)?;
    let local = listener.local_addr().map_err(err)?;
    Ok((listener, local))
}

/// Serves `/metrics` and `/healthz` until the task is dropped; also runs the recorder's upkeep.
pub async fn serve(listener: TcpListener, handle: PrometheusHandle, status: Arc<NodeStatus>) {
    let upkeep = handle.clone();
    let _upkeep = AbortOnDrop(tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    }));
    let gate = Gate::new(METRICS_CONNECTIONS);
    loop {
        let mut admitted = gate.accept(&listener).await;
        let handle = handle.clone();
        let status = status.clone();
        tokio::spawn(async move {
            // Borrowed, never moved out: a move of the stream alone would leave the rest of
            // `Admitted`, the connection's place at the gate, behind to be freed at once.
            let stream = admitted.stream_mut();
            let _ = tokio::time::timeout(RESPONSE_TIME, respond(stream, &handle, &status)).await;
            drop(admitted);
        });
    }
}

/// Connections the metrics listener holds at once: far fewer than the descriptors the engine
/// keeps free ([`Descriptors::reserve`], at least 64).
pub const METRICS_CONNECTIONS: usize = 32;

/// A request head's bounds on the metrics port: a scrape sends it at once.
const METRICS_HEAD: HeadLimits = HeadLimits {
    time: Duration::from_secs(5),
    bytes: 8192,
};

/// The whole exchange, response included, for a reader that takes the answer slowly.
const RESPONSE_TIME: Duration = Duration::from_secs(10);

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn respond(
    stream: &mut TcpStream,
    handle: &PrometheusHandle,
    status: &NodeStatus,
) -> std::io::Result<()> {
    let buf = match read_head(stream, METRICS_HEAD).await {
        Ok(head) => head,
        Err(HeadError::TooLarge(_)) => {
            return write_response(stream, 431, "text/plain", "request too large\n", false).await
        }
        // Too slow, or gone: nothing to answer.
        Err(_) => return Ok(()),
    };
    let head = String::from_utf8_lossy(&buf);
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return write_response(stream, 405, "text/plain", "use GET\n", false).await;
    }
    match path {
        "/metrics" => {
            let body = handle.render();
            write_response(stream, 200, "text/plain; version=0.0.4", &body, head_only).await
        }
        "/healthz" => {
            let (code, body) = status.health();
            write_response(stream, code, "text/plain", &body, head_only).await
        }
        _ => {
            write_response(
                stream,
                404,
                "text/plain",
                "not found; try /metrics or /healthz\n",
                head_only,
            )
            .await
        }
    }
}

async fn write_response(
    stream: &mut TcpStream,
    code: u16,
    content_type: &str,
    body: &str,
    head_only: bool,
) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if !head_only {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> NodeStatus {
        NodeStatus {
            sandbox_alive: AtomicBool::new(true),
            ..NodeStatus::default()
        }
    }

    #[test]
    fn healthz_fails_while_the_node_is_short_of_its_own_resources() {
        let s = status();
        let plenty = Descriptors {
            open: 100,
            limit: 4096,
        };
        assert_eq!(s.health_with(Some(plenty)), (200, "ok\n".into()));
        let (code, text) = s.health_with(Some(Descriptors {
            open: 4000,
            limit: 4096,
        }));
        assert_eq!(code, 503);
        assert_eq!(
            text,
            "out of descriptors: 4000 of 4096 open, fewer than 256 left for setting up jobs\n"
        );
        s.resource_fault("memfd: EMFILE: Too many open files");
        let (code, text) = s.health_with(Some(plenty));
        assert_eq!(code, 503);
        assert!(text.contains("memfd: EMFILE"), "{text}");
    }
}
