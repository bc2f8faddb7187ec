//! `forkbox gateway`: an HTTP front end that speaks Piston's, Judge0's and SandboxFusion's
//! APIs and runs what they ask as Forkbox jobs.
//!
//! The gateway is stateless: each request becomes a job on the fleet's queue (Redis or a
//! Redis Cluster, through `forkbox-queue`), and the answer is read from the job's result, so
//! any number of gateways can serve one fleet. A Judge0 submission's request is kept in Redis
//! beside its job, with the same lifetime as its result, for a later `GET` to judge against.
//!
//! Each API is a pure translation ([`piston`], [`judge0`], [`fusion`]) between its requests
//! and results and an [`exec::Execution`]; this module only moves bytes, bounds and
//! authenticates: the optional API key (`X-Auth-Token`), the body size limit, a limit on the
//! requests one client address may have in flight, metrics and `/healthz`. It has no TLS of
//! its own: it listens on loopback unless told otherwise, and belongs behind a TLS-terminating
//! proxy when it does not.

pub mod catalogue;
pub mod exec;
pub mod fusion;
pub mod judge0;
pub mod metrics;
pub mod piston;

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, MatchedPath, Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use forkbox_queue::{Broker, JobState, Partitioned, QueueError, SharedWaits};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::gateway::catalogue::Catalogue;
use crate::gateway::exec::{Bounds, Executed, Execution, Staging};
use crate::gateway::metrics::{ErrorKind, Metrics};
use crate::runtimes::{self, Available};

/// The endpoints, as their routes are written (the metrics' `endpoint` label).
pub const ENDPOINTS: [&str; 15] = [
    "/healthz",
    "/metrics",
    "/api/v2/runtimes",
    "/api/v2/execute",
    "/languages",
    "/languages/{id}",
    "/statuses",
    "/about",
    "/config_info",
    "/submissions",
    "/submissions/{token}",
    "/submissions/batch",
    "/run_code",
    "/v1/ping",
    "unmatched",
];

/// What one gateway allows and how long it waits.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Required in `X-Auth-Token` on every request but `/healthz` and `/metrics`.
    pub api_key: Option<String>,
    /// Largest request body, in bytes (larger: 413).
    pub max_body_bytes: usize,
    /// Most requests one client address may have in flight (more: 429).
    pub per_client: usize,
    pub bounds: Bounds,
    pub judge0: judge0::Limits,
    /// How long a request waits for a job beyond the job's own limits (queueing, start-up).
    pub queue_wait: Duration,
    /// How long a Judge0 submission's request is kept (and its job's result).
    pub result_ttl_s: u64,
    /// How compiled languages reach the workers.
    pub staging: Staging,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            api_key: None,
            max_body_bytes: 10 * 1024 * 1024,
            per_client: 64,
            bounds: Bounds::default(),
            judge0: judge0::Limits::default(),
            queue_wait: Duration::from_secs(120),
            result_ttl_s: 86_400,
            staging: Staging::Native,
        }
    }
}

/// One gateway: the queue it feeds, its catalogue and settings.
#[derive(Debug)]
pub struct Gateway {
    queue: Partitioned,
    /// Every request's wait, shared (and its enqueue, when a lane is free).
    waits: SharedWaits,
    broker: Broker,
    /// The runtime catalogue (how each language compiles and runs).
    runtimes: runtimes::Catalogue,
    /// What the fleet offers now ([`Gateway::refresh`]).
    offered: RwLock<Arc<Catalogue>>,
    config: GatewayConfig,
    metrics: Metrics,
    in_flight: Mutex<HashMap<IpAddr, usize>>,
}

impl Gateway {
    /// A gateway offering nothing until [`Gateway::refresh`] reads what the fleet runs.
    pub fn new(
        broker: Broker,
        queue: Partitioned,
        runtimes: runtimes::Catalogue,
        config: GatewayConfig,
    ) -> Gateway {
        Gateway {
            waits: SharedWaits::new(&queue),
            queue,
            broker,
            runtimes,
            offered: RwLock::new(Arc::new(Catalogue::default())),
            config,
            metrics: Metrics::new(&ENDPOINTS),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// What the gateway offers now.
    pub fn catalogue(&self) -> Arc<Catalogue> {
        self.offered
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads what the queue's live workers published (language, version) and offers that
    /// (nothing while none has: a guess from the gateway's own host would name versions the
    /// workers' sandboxes may not have). Returns how many languages are offered.
    pub async fn refresh(&self) -> Result<usize, forkbox_queue::QueueError> {
        let mut available = Vec::new();
        for part in self.queue.partitions() {
            for (worker, json) in part.published_runtimes().await? {
                match serde_json::from_str::<Vec<Available>>(&json) {
                    Ok(list) => available.extend(list),
                    Err(e) => tracing::warn!("worker {worker} published unreadable runtimes: {e}"),
                }
            }
        }
        let offered = Catalogue::offered(&self.runtimes, &available);
        let n = offered.languages().len();
        *self.offered.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(offered);
        Ok(n)
    }

    /// Refreshes what is offered every `every`, for as long as the gateway lives.
    pub fn keep_fresh(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let gw = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut wait = every;
            loop {
                tokio::time::sleep(wait).await;
                let Some(gw) = gw.upgrade() else { return };
                // Offering nothing yet: look again soon.
                wait = if gw.catalogue().languages().is_empty() {
                    Duration::from_secs(1)
                } else {
                    every
                };
                if let Err(e) = gw.refresh().await {
                    tracing::warn!("reading what the fleet runs: {e}");
                }
            }
        })
    }

    /// How long a request waits for job running `exec`: the job's own limits (the compile
    /// stage's only when it has one) and the queue wait.
    fn wait_limit(&self, exec: &Execution) -> Duration {
        let compile = if exec.is_staged() {
            exec.compile.timeout_ms
        } else {
            0
        };
        Duration::from_millis(compile + exec.run.timeout_ms) + self.config.queue_wait
    }

    /// Waits for job `id` (running `exec`), just enqueued, and reads what it did.
    async fn wait(&self, id: &str, exec: &Execution) -> Executed {
        let timeout = self.wait_limit(exec);
        let waited = self.waits.wait_new(id, timeout).await;
        self.finish(id, exec, timeout, waited).await
    }

    /// What job `id` did, from its wait; a job with no result in time is cancelled and
    /// reported as an internal error.
    async fn finish(
        &self,
        id: &str,
        exec: &Execution,
        timeout: Duration,
        waited: Result<Option<forkbox_queue::JobResult>, QueueError>,
    ) -> Executed {
        match waited {
            Ok(Some(result)) => exec::interpret(exec, self.config.staging, &result),
            Ok(None) => {
                let cancelled = match self.queue.cancel(id).await {
                    Ok(_) => "the job was cancelled".to_owned(),
                    Err(e) => {
                        tracing::warn!("cancelling job {id}, which had no result in time: {e}");
                        format!("cancelling the job failed: {e}")
                    }
                };
                Executed::Internal {
                    error: format!(
                        "no result within {:.1} s (is a worker serving queue {}?); {cancelled}",
                        timeout.as_secs_f64(),
                        self.queue.name()
                    ),
                }
            }
            Err(e) => Executed::Internal {
                error: format!("waiting for the result: {e}"),
            },
        }
    }

    /// Runs `exec` to its end under a fresh id (a uuid v4: Judge0 clients check tokens are):
    /// enqueued and waited for together ([`SharedWaits::enqueue_and_wait`]), or why it was
    /// not enqueued.
    async fn run(&self, exec: &Execution) -> Result<Executed, Submitted> {
        let id = uuid::Uuid::new_v4().to_string();
        let mut job = exec
            .to_job(&id, self.config.staging)
            .map_err(Submitted::Invalid)?;
        job.result_ttl_s = Some(self.config.result_ttl_s);
        let timeout = self.wait_limit(exec);
        // The enqueue validates the job (nothing is sent when it is not valid).
        let waited = match self.waits.enqueue_and_wait(&job, timeout).await {
            Err(QueueError::InvalidJob(e)) => return Err(Submitted::Invalid(e.to_string())),
            Err(e @ QueueError::Enqueue { .. }) => return Err(Submitted::Queue(e.to_string())),
            waited => waited,
        };
        self.metrics.jobs().increment(1);
        Ok(self.finish(&id, exec, timeout, waited).await)
    }

    fn submission_key(&self, token: &str) -> String {
        format!(
            "{}gateway:judge0:{token}",
            self.queue.for_id(token).keys().prefix()
        )
    }
}

/// Why a job was not enqueued.
#[derive(Debug)]
enum Submitted {
    /// The job is not valid (a 4xx).
    Invalid(String),
    /// Redis failed (a 5xx).
    Queue(String),
}

/// Marks a response whose job the sandbox failed, for the error count.
#[derive(Debug, Clone, Copy)]
struct SandboxFailed;

/// The router of gateway `gw`.
pub fn router(gw: Arc<Gateway>) -> Router {
    let limit = gw.config.max_body_bytes;
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics_text))
        .route("/api/v2/runtimes", get(piston_runtimes))
        .route("/api/v2/execute", post(piston_execute))
        .route("/languages", get(judge0_languages))
        .route("/languages/{id}", get(judge0_language))
        .route(
            "/statuses",
            get(|| async { json_response(200, judge0::statuses()) }),
        )
        .route(
            "/about",
            get(|| async { json_response(200, judge0::about()) }),
        )
        .route("/config_info", get(judge0_config_info))
        .route("/submissions", post(judge0_create))
        .route(
            "/submissions/batch",
            post(judge0_create_batch).get(judge0_get_batch),
        )
        .route("/submissions/{token}", get(judge0_get))
        .route("/run_code", post(fusion_run_code))
        .route(
            "/v1/ping",
            get(|| async { json_response(200, json!("pong")) }),
        )
        .fallback(|| async { json_response(404, json!({"error": "no such endpoint"})) })
        .layer(middleware::from_fn_with_state(gw.clone(), guard))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(gw)
}

/// Serves `gw` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    gw: Arc<Gateway>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        router(gw).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

fn json_response(status: u16, body: Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Constant-time comparison of the key a client sent with the configured one.
fn key_matches(sent: &[u8], want: &[u8]) -> bool {
    sent.len() == want.len() && sent.iter().zip(want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// One request's passage: the API key, the per-client limit, then metrics around the handler.
async fn guard(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let endpoint: &'static str = req
        .extensions()
        .get::<MatchedPath>()
        .and_then(|p| ENDPOINTS.iter().find(|e| **e == p.as_str()).copied())
        .unwrap_or("unmatched");
    let open = matches!(endpoint, "/healthz" | "/metrics");
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let response = if !open && !authorised(&gw, req.headers()) {
        json_response(
            401,
            json!({"error": "X-Auth-Token is missing or wrong", "message": "X-Auth-Token is missing or wrong"}),
        )
    } else if open {
        next.run(req).await
    } else {
        match peer.map(|ip| Slot::take(&gw, ip)) {
            Some(None) => json_response(
                429,
                json!({"error": format!("too many requests in flight from this address (at most {})", gw.config.per_client),
                       "message": format!("too many requests in flight from this address (at most {})", gw.config.per_client)}),
            ),
            Some(Some(_slot)) => next.run(req).await,
            None => next.run(req).await,
        }
    };
    let code = response.status().as_u16();
    gw.metrics.requests(endpoint, code).increment(1);
    gw.metrics
        .latency(endpoint)
        .record(started.elapsed().as_secs_f64());
    let kind = if response.extensions().get::<SandboxFailed>().is_some() {
        Some(ErrorKind::Sandbox)
    } else if response.status().is_client_error() {
        Some(ErrorKind::Client)
    } else if response.status().is_server_error() {
        Some(ErrorKind::Server)
    } else {
        None
    };
    if let Some(kind) = kind {
        gw.metrics.errors(endpoint, kind).increment(1);
    }
    response
}

fn authorised(gw: &Gateway, headers: &HeaderMap) -> bool {
    match &gw.config.api_key {
        None => true,
        Some(want) => headers
            .get("x-auth-token")
            .is_some_and(|v| key_matches(v.as_bytes(), want.as_bytes())),
    }
}

/// A request in flight from one address; its count drops when this does.
struct Slot {
    gw: Arc<Gateway>,
    ip: IpAddr,
}

impl Slot {
    fn take(gw: &Arc<Gateway>, ip: IpAddr) -> Option<Slot> {
        let mut map = gw.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n >= gw.config.per_client {
            return None;
        }
        *n += 1;
        Some(Slot { gw: gw.clone(), ip })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut map = self.gw.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

async fn healthz(State(gw): State<Arc<Gateway>>) -> Response {
    let ping = forkbox_queue::redis::cmd("PING")
        .query_async::<String>(&mut gw.broker.connection())
        .await;
    match ping {
        Ok(_) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("redis: {e}\n")).into_response(),
    }
}

async fn metrics_text(State(gw): State<Arc<Gateway>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        gw.metrics.render(),
    )
        .into_response()
}

fn sandbox_failed(mut r: Response, executed: &Executed) -> Response {
    if matches!(executed, Executed::Internal { .. }) {
        r.extensions_mut().insert(SandboxFailed);
    }
    r
}

// --- Piston -------------------------------------------------------------------------------

async fn piston_runtimes(State(gw): State<Arc<Gateway>>) -> Response {
    json_response(200, piston::runtimes(&gw.catalogue()))
}

async fn piston_execute(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let exec = match piston::parse_execute(content_type, &body, &gw.catalogue(), &gw.config.bounds)
    {
        Ok(e) => e,
        Err(r) => return json_response(r.status, json!({"message": r.message})),
    };
    match gw.run(&exec).await {
        Ok(executed) => {
            let (status, body) =
                piston::respond(&exec, &executed, gw.config.bounds.piston_output_chars);
            sandbox_failed(json_response(status, body), &executed)
        }
        Err(Submitted::Invalid(e)) => json_response(400, json!({"message": e})),
        Err(Submitted::Queue(e)) => json_response(500, json!({"message": e})),
    }
}

// --- Judge0 -------------------------------------------------------------------------------

async fn judge0_languages(State(gw): State<Arc<Gateway>>) -> Response {
    json_response(200, judge0::languages(&gw.catalogue()))
}

async fn judge0_language(State(gw): State<Arc<Gateway>>, Path(id): Path<String>) -> Response {
    match judge0::language(&gw.catalogue(), &id) {
        Ok(v) => json_response(200, v),
        Err(r) => json_response(r.status, r.body),
    }
}

async fn judge0_config_info(State(gw): State<Arc<Gateway>>) -> Response {
    json_response(200, judge0::config_info(&gw.config.judge0))
}

#[derive(Debug, Deserialize)]
struct SubmissionQuery {
    base64_encoded: Option<String>,
    wait: Option<String>,
    fields: Option<String>,
    tokens: Option<String>,
}

/// A boolean query parameter as Judge0 reads it.
fn flag(name: &str, v: &Option<String>) -> Result<bool, judge0::Rejection> {
    match v.as_deref() {
        None | Some("") | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => Err(judge0::error(
            400,
            format!("{name} must be true or false, not {other:?}"),
        )),
    }
}

fn judge0_err(r: judge0::Rejection) -> Response {
    json_response(r.status, r.body)
}

fn parse_json(body: &[u8]) -> Result<Value, judge0::Rejection> {
    serde_json::from_slice(body)
        .map_err(|e| judge0::error(400, format!("the body is not valid JSON: {e}")))
}

/// Parses one submission and the execution it asks for.
fn judge0_prepare(
    gw: &Gateway,
    body: &Value,
    b64: bool,
) -> Result<(judge0::Submission, Execution), judge0::Rejection> {
    let sub = judge0::parse_submission(
        body,
        b64,
        &gw.catalogue(),
        &gw.config.judge0,
        forkbox_queue::now_ms(),
    )?;
    let exec = sub.execution(&gw.catalogue(), &gw.config.bounds)?;
    let job = exec
        .to_job("check", gw.config.staging)
        .map_err(|e| judge0::error(422, format!("the submission cannot run: {e}")))?;
    job.validate()
        .map_err(|e| judge0::error(422, format!("the submission cannot run: {e}")))?;
    Ok((sub, exec))
}

/// Keeps `sub` for `token`'s later reads, then enqueues its job.
async fn judge0_enqueue(
    gw: &Gateway,
    sub: &judge0::Submission,
    exec: &Execution,
) -> Result<String, Response> {
    let id = uuid::Uuid::new_v4().to_string();
    let text = serde_json::to_string(sub).expect("a submission serializes");
    let stored = forkbox_queue::redis::cmd("SET")
        .arg(gw.submission_key(&id))
        .arg(text)
        .arg("EX")
        .arg(gw.config.result_ttl_s)
        .query_async::<()>(&mut gw.broker.connection())
        .await;
    if let Err(e) = stored {
        return Err(json_response(
            500,
            json!({"error": format!("storing the submission: {e}")}),
        ));
    }
    let mut job = match exec.to_job(&id, gw.config.staging) {
        Ok(job) => job,
        Err(e) => return Err(json_response(422, json!({"error": e}))),
    };
    job.result_ttl_s = Some(gw.config.result_ttl_s);
    match gw.queue.enqueue_idempotent(&job).await {
        Ok(_) => {
            gw.metrics.jobs().increment(1);
            Ok(id)
        }
        Err(e) => Err(json_response(500, json!({"error": e.to_string()}))),
    }
}

async fn judge0_create(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<SubmissionQuery>,
    body: Bytes,
) -> Response {
    let prepared = (|| {
        let b64 = flag("base64_encoded", &q.base64_encoded)?;
        let wait = flag("wait", &q.wait)?;
        let fields = judge0::select_fields(q.fields.as_deref())?;
        let (sub, exec) = judge0_prepare(&gw, &parse_json(&body)?, b64)?;
        Ok::<_, judge0::Rejection>((b64, wait, fields, sub, exec))
    })();
    let (b64, wait, fields, sub, exec) = match prepared {
        Ok(p) => p,
        Err(r) => return judge0_err(r),
    };
    let token = match judge0_enqueue(&gw, &sub, &exec).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    if !wait {
        return json_response(201, json!({"token": token}));
    }
    let executed = gw.wait(&token, &exec).await;
    let progress = judge0::Progress::Done {
        verdict: judge0::verdict(&sub, &executed),
        finished_at_ms: Some(forkbox_queue::now_ms()),
    };
    let body = judge0::render(&token, &sub, &progress, &fields, &gw.catalogue(), b64);
    sandbox_failed(json_response(201, body), &executed)
}

#[derive(Debug, Deserialize)]
struct Batch {
    submissions: Vec<Value>,
}

async fn judge0_create_batch(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<SubmissionQuery>,
    body: Bytes,
) -> Response {
    let b64 = match flag("base64_encoded", &q.base64_encoded) {
        Ok(b) => b,
        Err(r) => return judge0_err(r),
    };
    let batch: Batch = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return judge0_err(judge0::error(400, format!("submissions: {e}"))),
    };
    if batch.submissions.is_empty() || batch.submissions.len() > judge0::MAX_BATCH {
        return json_response(
            422,
            json!({"error": format!("number of submissions in a batch should be between 1 and {}", judge0::MAX_BATCH)}),
        );
    }
    let prepared: Vec<_> = batch
        .submissions
        .iter()
        .map(|s| judge0_prepare(&gw, s, b64))
        .collect();
    if prepared.iter().any(Result::is_err) {
        // Nothing is enqueued: each position says what was wrong with it, or null.
        let report: Vec<Value> = prepared
            .into_iter()
            .map(|p| p.err().map_or(Value::Null, |r| r.body))
            .collect();
        return json_response(422, Value::Array(report));
    }
    let mut tokens = Vec::with_capacity(prepared.len());
    for (sub, exec) in prepared.into_iter().flatten() {
        match judge0_enqueue(&gw, &sub, &exec).await {
            Ok(t) => tokens.push(json!({"token": t})),
            Err(r) => return r,
        }
    }
    json_response(201, Value::Array(tokens))
}

/// Where submission `token` is and what it came to; `None` when unknown or expired.
async fn judge0_lookup(
    gw: &Gateway,
    token: &str,
) -> Result<Option<(judge0::Submission, judge0::Progress)>, Response> {
    let server = |e: String| json_response(500, json!({"error": e}));
    let stored: Option<String> = forkbox_queue::redis::cmd("GET")
        .arg(gw.submission_key(token))
        .query_async(&mut gw.broker.connection())
        .await
        .map_err(|e| server(format!("reading the submission: {e}")))?;
    let Some(stored) = stored else {
        return Ok(None);
    };
    let sub: judge0::Submission = serde_json::from_str(&stored)
        .map_err(|e| server(format!("a stored submission is corrupt: {e}")))?;
    let done = |result: &forkbox_queue::JobResult| {
        let executed = match sub.execution(&gw.catalogue(), &gw.config.bounds) {
            Ok(exec) => exec::interpret(&exec, gw.config.staging, result),
            Err(_) => Executed::Internal {
                error: format!("language {} is no longer offered here", sub.language_id),
            },
        };
        judge0::Progress::Done {
            verdict: judge0::verdict(&sub, &executed),
            finished_at_ms: result.finished_at_ms,
        }
    };
    let q = gw.queue.for_id(token);
    if let Some(r) = q.result(token).await.map_err(|e| server(e.to_string()))? {
        let progress = done(&r);
        return Ok(Some((sub, progress)));
    }
    let progress = match q
        .job_state(token)
        .await
        .map_err(|e| server(e.to_string()))?
    {
        JobState::Queued => judge0::Progress::Queued,
        JobState::Running { .. } => judge0::Progress::Processing,
        JobState::Finished { .. } => {
            match q.result(token).await.map_err(|e| server(e.to_string()))? {
                Some(r) => done(&r),
                None => return Ok(None),
            }
        }
        JobState::Unknown => return Ok(None),
    };
    Ok(Some((sub, progress)))
}

async fn judge0_get(
    State(gw): State<Arc<Gateway>>,
    Path(token): Path<String>,
    Query(q): Query<SubmissionQuery>,
) -> Response {
    let (b64, fields) = match flag("base64_encoded", &q.base64_encoded)
        .and_then(|b| Ok((b, judge0::select_fields(q.fields.as_deref())?)))
    {
        Ok(p) => p,
        Err(r) => return judge0_err(r),
    };
    if uuid::Uuid::parse_str(&token).is_err() {
        return judge0_err(judge0::error(
            404,
            format!("no submission with token {token:?}"),
        ));
    }
    match judge0_lookup(&gw, &token).await {
        Ok(Some((sub, progress))) => {
            let body = judge0::render(&token, &sub, &progress, &fields, &gw.catalogue(), b64);
            json_response(200, body)
        }
        Ok(None) => judge0_err(judge0::error(
            404,
            format!("no submission with token {token:?}"),
        )),
        Err(r) => r,
    }
}

async fn judge0_get_batch(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<SubmissionQuery>,
) -> Response {
    let (b64, fields) = match flag("base64_encoded", &q.base64_encoded)
        .and_then(|b| Ok((b, judge0::select_fields(q.fields.as_deref())?)))
    {
        Ok(p) => p,
        Err(r) => return judge0_err(r),
    };
    let tokens: Vec<&str> = q
        .tokens
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    if tokens.is_empty() || tokens.len() > judge0::MAX_BATCH {
        return judge0_err(judge0::error(
            400,
            format!(
                "tokens: give between 1 and {} comma-separated tokens",
                judge0::MAX_BATCH
            ),
        ));
    }
    let mut out = Vec::with_capacity(tokens.len());
    for token in tokens {
        if uuid::Uuid::parse_str(token).is_err() {
            out.push(Value::Null);
            continue;
        }
        match judge0_lookup(&gw, token).await {
            Ok(Some((sub, progress))) => out.push(judge0::render(
                token,
                &sub,
                &progress,
                &fields,
                &gw.catalogue(),
                b64,
            )),
            Ok(None) => out.push(Value::Null),
            Err(r) => return r,
        }
    }
    json_response(200, json!({"submissions": out}))
}

// --- SandboxFusion ------------------------------------------------------------------------

async fn fusion_run_code(State(gw): State<Arc<Gateway>>, body: Bytes) -> Response {
    let exec = match fusion::parse_run_code(&body, &gw.catalogue(), &gw.config.bounds) {
        Ok(e) => e,
        Err(r) => return json_response(422, r.body),
    };
    let executed = match gw.run(&exec).await {
        Ok(e) => e,
        Err(Submitted::Invalid(e)) => {
            return json_response(
                422,
                json!({"detail": [{"loc": ["body"], "msg": e, "type": "value_error"}]}),
            )
        }
        Err(Submitted::Queue(e)) => Executed::Internal { error: e },
    };
    sandbox_failed(json_response(200, fusion::respond(&executed)), &executed)
}
