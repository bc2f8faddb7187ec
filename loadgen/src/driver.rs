//! Sending jobs and reading results: one measured phase of a run.
//!
//! Jobs go in with a plain `XADD forkbox:{Q}:jobs * job <json>`, as any client would send them.
//! Results are read from the results stream `forkbox:{Q}:results` with `XREAD BLOCK`, from the
//! stream's last id taken before the first job is sent; each entry is timestamped on arrival
//! and matched to its job by id. Reading the stream rather than waiting on each job's `done`
//! list sees every result, duplicates included: two entries for one id is a duplicate, which
//! the protocol forbids, so it is reported. A job with no result when the phase ends is lost;
//! before calling it lost the phase looks up its result key, in case its stream entry was
//! trimmed away before it was read.
//!
//! Connections reconnect on error, so a phase survives a Redis restart. A batch of `XADD`s that
//! failed mid-way is resent only for the jobs that are neither in the job stream nor have a
//! result: resending blindly would enqueue a job twice and report the worker's correct
//! de-duplication, or its absence, as ours.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::ProgressBar;
use redis::streams::StreamReadReply;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use forkbox_queue::keys::{JOB_FIELD, RESULT_FIELD};
use forkbox_queue::{connect, Connection, Endpoint, Keys, Link, RedisTls};

use crate::mix::{JobSource, Planned};
use crate::stats::{percentiles_ms, Recorder, ResultView};

const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// `XREAD BLOCK` timeout; also bounds how long the reader takes to notice the end of a phase.
const READ_BLOCK_MS: u64 = 250;
/// Most jobs sent in one pipeline.
const SEND_BATCH: usize = 500;
/// After the last outstanding result, how long to keep reading for duplicates.
const DUPLICATE_GRACE: Duration = Duration::from_millis(500);

/// How jobs are offered.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum Load {
    /// Keep `concurrency` jobs in flight.
    Closed { concurrency: usize },
    /// Send `rate` jobs per second on a fixed schedule, whatever the results do.
    Open { rate: f64 },
    /// Send every job at once, then let the cluster's workers start ([`Cluster::release`]),
    /// and measure from the first result to the last.
    Backlog,
}

/// When a phase stops sending.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    Jobs(u64),
    After(Duration),
}

/// A fault injected part-way through a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    KillWorker,
    RestartRedis,
    KillRedisPrimary,
}

/// A fault that was injected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultEvent {
    pub fault: Fault,
    /// Seconds since the run began.
    pub at_s: f64,
    pub detail: String,
}

/// The part of the cluster a phase can act on: inject faults and check the nodes still run.
pub trait Cluster: Send {
    /// Starts the workers held back while a backlog was enqueued; false when none were.
    fn release(&mut self) -> anyhow::Result<bool> {
        Ok(false)
    }
    fn inject(&mut self, fault: Fault) -> anyhow::Result<String>;
    /// Fails when a node died that was not killed on purpose.
    fn check(&mut self) -> anyhow::Result<()>;
}

#[derive(Debug, Clone)]
pub struct PhaseSpec {
    /// A short tag, part of every job id (`<run>-<tag>-<seq>`).
    pub tag: String,
    pub load: Load,
    pub stop: Stop,
    /// A phase ends when no result arrived for this long after the last send.
    pub drain_timeout: Duration,
    /// Faults and the fraction of the phase (0..1) at which each fires.
    pub faults: Vec<(f64, Fault)>,
}

#[derive(Debug)]
pub struct PhaseOutcome {
    pub recorder: Recorder,
    pub faults: Vec<FaultEvent>,
    pub interrupted: bool,
    /// Jobs enqueued when held-back workers were started (a backlog run that spawned them).
    pub workers_released_after: Option<u64>,
    /// Seconds since the run began.
    pub started_s: f64,
    pub ended_s: f64,
}

impl PhaseOutcome {
    /// Sent jobs without any result.
    pub fn lost(&self) -> u64 {
        self.recorder
            .records
            .iter()
            .filter(|r| r.sent_us.is_some() && r.results == 0)
            .count() as u64
    }
}

/// Where the load goes: one Redis server or a Redis Cluster (`--cluster`).
#[derive(Clone)]
pub enum Target {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
}

impl Target {
    /// The target named by `--redis` (with `--cluster`: one or more comma-separated seeds,
    /// to which every node the cluster names is added, so that connections reopen through
    /// any node alive: see [`forkbox_queue::topology`]), with the TLS settings `tls` for
    /// `rediss://`.
    pub async fn open(redis: &str, cluster: bool, tls: &RedisTls) -> anyhow::Result<Target> {
        match Endpoint::parse(redis, cluster)? {
            Endpoint::Single(url) => Ok(Target::Single(connect::redis_client(&url, tls)?)),
            Endpoint::Cluster(seeds) => Ok(Target::Cluster(connect::cluster_client(
                &forkbox_queue::topology::learn(&seeds, tls).await,
                tls,
                |b| {
                    b.connection_timeout(CONNECT_TIMEOUT)
                        .response_timeout(RESPONSE_TIMEOUT)
                        .retries(10)
                        .min_retry_wait(100)
                        .max_retry_wait(2_000)
                        .retry_wait_formula(100, 2)
                },
            )?)),
        }
    }

    /// Where it is, for messages (never a URL, which may hold a password).
    pub fn describe(&self) -> String {
        match self {
            Target::Single(c) => c.get_connection_info().addr.to_string(),
            Target::Cluster(_) => "the Redis Cluster".to_owned(),
        }
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

pub(crate) async fn connect(target: &Target) -> redis::RedisResult<Connection> {
    match target {
        Target::Single(client) => Ok(Connection::single(Link::open(client.clone()).await?)),
        Target::Cluster(client) => Ok(Connection::cluster(client.get_async_connection().await?)),
    }
}

/// A connection that is re-established after an error.
struct Conn {
    client: Target,
    conn: Option<Connection>,
}

impl Conn {
    async fn get(&mut self) -> redis::RedisResult<&mut Connection> {
        if self.conn.is_none() {
            self.conn = Some(connect(&self.client).await?);
        }
        Ok(self.conn.as_mut().expect("just connected"))
    }

    async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let r = cmd.query_async(self.get().await?).await;
        if r.is_err() {
            self.conn = None;
        }
        r
    }

    async fn pipe<T: redis::FromRedisValue>(
        &mut self,
        p: &redis::Pipeline,
    ) -> redis::RedisResult<T> {
        let r = p.query_async(self.get().await?).await;
        if r.is_err() {
            self.conn = None;
        }
        r
    }
}

/// The id of the last entry of `stream`, or `0-0`.
async fn last_id(conn: &mut Conn, stream: &str) -> redis::RedisResult<String> {
    let reply: redis::streams::StreamRangeReply = conn
        .query(
            redis::cmd("XREVRANGE")
                .arg(stream)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1),
        )
        .await?;
    Ok(reply
        .ids
        .first()
        .map_or_else(|| "0-0".to_owned(), |e| e.id.clone()))
}

type Arrivals = Vec<(Instant, Vec<u8>)>;

/// Reads the results stream from `from` until `stop` turns true, forwarding each batch of
/// result JSON with its arrival time.
async fn read_results(
    client: Target,
    stream: String,
    from: String,
    tx: mpsc::UnboundedSender<Arrivals>,
    mut stop: watch::Receiver<bool>,
) {
    let mut conn = Conn { client, conn: None };
    let mut last = from;
    while !*stop.borrow() {
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT")
            .arg(2000)
            .arg("BLOCK")
            .arg(READ_BLOCK_MS)
            .arg("STREAMS")
            .arg(&stream)
            .arg(&last);
        let reply: redis::RedisResult<Option<StreamReadReply>> = tokio::select! {
            r = conn.query(&cmd) => r,
            _ = stop.changed() => break,
        };
        let at = Instant::now();
        match reply {
            Ok(Some(reply)) => {
                let mut batch = Vec::new();
                for key in reply.keys {
                    for entry in key.ids {
                        if let Some(v) = entry.map.get(RESULT_FIELD) {
                            if let Ok(bytes) = redis::from_redis_value::<Vec<u8>>(v) {
                                batch.push((at, bytes));
                            }
                        }
                        last = entry.id;
                    }
                }
                if !batch.is_empty() && tx.send(batch).is_err() {
                    break;
                }
            }
            Ok(None) => {}
            // Redis restarting: retry until it is back or the phase ends.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Time between two sends of an open loop.
fn open_interval(rate: f64) -> Duration {
    Duration::from_secs_f64(1.0 / rate.max(1e-3))
}

/// Runs phases against one queue.
pub struct Driver {
    client: Target,
    keys: Keys,
    /// Every partition's keys, partition 0 (`keys`) first; a job goes to its id's.
    parts: Vec<Keys>,
    run: String,
    t0: Instant,
    pub progress: ProgressBar,
    cancel: watch::Receiver<bool>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("run", &self.run).finish()
    }
}

/// What one phase's loop keeps between wake-ups.
struct PhaseState {
    rec: Recorder,
    start: Instant,
    /// Still sending: not at the job count or duration, not interrupted, results coming.
    sending: bool,
    interrupted: bool,
    /// A backlog's workers released (or its drain begun).
    released: bool,
    workers_released_after: Option<u64>,
    /// When a result last arrived or sending ended: what the drain timeout counts from.
    last_activity: Instant,
    /// When every job was first answered: duplicates still get a grace period.
    all_done_at: Option<Instant>,
    last_check: Instant,
    /// Faults still to fire, by the fraction of the phase they fire at.
    faults: Vec<(f64, Fault)>,
    fired: Vec<FaultEvent>,
}

impl PhaseState {
    fn new(t0: Instant, spec: &PhaseSpec, source: &JobSource, interrupted: bool) -> PhaseState {
        let mut rec = Recorder::new(t0, source.labels().len());
        rec.drain_window = spec.load == Load::Backlog;
        let mut faults: Vec<(f64, Fault)> = spec.faults.clone();
        faults.sort_by(|a, b| a.0.total_cmp(&b.0));
        let now = Instant::now();
        PhaseState {
            rec,
            start: now,
            sending: !interrupted,
            interrupted,
            released: false,
            workers_released_after: None,
            last_activity: now,
            all_done_at: None,
            last_check: now,
            faults,
            fired: Vec::new(),
        }
    }
}

/// Whether a phase whose sending has ended is over.
#[derive(Debug, PartialEq, Eq)]
enum Drain {
    Waiting,
    Over,
}

struct Progress<'a> {
    bar: &'a ProgressBar,
    last: Instant,
    last_done: u64,
    rate: f64,
}

impl Progress<'_> {
    fn update(&mut self, rec: &Recorder, phase_start: Instant, spec: &PhaseSpec) {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        if dt < 0.2 {
            return;
        }
        let done = rec.completed();
        let inst = (done - self.last_done) as f64 / dt;
        self.rate = if self.rate == 0.0 {
            inst
        } else {
            0.7 * self.rate + 0.3 * inst
        };
        self.last = now;
        self.last_done = done;
        match spec.stop {
            Stop::Jobs(_) => self.bar.set_position(done),
            Stop::After(_) => self
                .bar
                .set_position(now.duration_since(phase_start).as_secs()),
        }
        self.bar.set_message(format!(
            "{} done, {:.0} jobs/s, p99 {:.1} ms, in flight {}",
            done,
            self.rate,
            percentiles_ms(&rec.latency).p99,
            rec.outstanding()
        ));
    }
}

impl Driver {
    pub fn new(
        target: Target,
        queue: &str,
        partitions: usize,
        run: &str,
        t0: Instant,
        cancel: watch::Receiver<bool>,
    ) -> anyhow::Result<Driver> {
        Ok(Driver {
            client: target,
            keys: Keys::new(queue)?,
            parts: (0..partitions.max(1))
                .map(|p| Keys::partition(queue, p, partitions.max(1)))
                .collect::<Result<_, _>>()?,
            run: run.to_owned(),
            t0,
            progress: ProgressBar::hidden(),
            cancel,
        })
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn client(&self) -> &Target {
        &self.client
    }

    /// Every partition's keys, partition 0 first.
    pub fn partitions(&self) -> &[Keys] {
        &self.parts
    }

    fn part_of(&self, id: &str) -> usize {
        forkbox_queue::keys::partition_of(id, self.parts.len())
    }

    /// The keys of the partition job `id` goes to.
    fn keys_for(&self, id: &str) -> &Keys {
        &self.parts[self.part_of(id)]
    }

    /// Ids of `ids` that are already in the job stream or have a result.
    async fn already_enqueued(
        &self,
        conn: &mut Conn,
        ids: &[String],
    ) -> redis::RedisResult<HashSet<String>> {
        let mut found = HashSet::new();
        for id in ids {
            let exists: bool = conn
                .query(redis::cmd("EXISTS").arg(self.keys_for(id).result(id)))
                .await?;
            if exists {
                found.insert(id.clone());
            }
        }
        let wanted: HashSet<&str> = ids.iter().map(String::as_str).collect();
        for part in &self.parts {
            let mut from = "-".to_owned();
            loop {
                let page: redis::streams::StreamRangeReply = conn
                    .query(
                        redis::cmd("XRANGE")
                            .arg(part.jobs())
                            .arg(&from)
                            .arg("+")
                            .arg("COUNT")
                            .arg(5000),
                    )
                    .await?;
                let n = page.ids.len();
                for e in &page.ids {
                    if let Some(v) = e.map.get(JOB_FIELD) {
                        if let Ok(bytes) = redis::from_redis_value::<Vec<u8>>(v) {
                            if let Ok(j) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                                if let Some(id) = j.get("id").and_then(|v| v.as_str()) {
                                    if wanted.contains(id) {
                                        found.insert(id.to_owned());
                                    }
                                }
                            }
                        }
                    }
                }
                match page.ids.last() {
                    Some(e) if n == 5000 => from = format!("({}", e.id),
                    _ => break,
                }
            }
        }
        Ok(found)
    }

    /// Sends `batch` (id, JSON) with XADD, retrying across connection errors until `deadline`.
    async fn send(
        &self,
        conn: &mut Conn,
        batch: &[(String, String)],
        deadline: Instant,
    ) -> anyhow::Result<()> {
        let mut pending: Vec<&(String, String)> = batch.iter().collect();
        let mut failures = 0u32;
        loop {
            // One pipeline per partition: a cluster pipeline stays in one slot.
            let mut sent = Ok(());
            for part in 0..self.parts.len() {
                let mut p = redis::pipe();
                let mut any = false;
                for (id, json) in pending.iter().filter(|(id, _)| self.part_of(id) == part) {
                    p.cmd("XADD")
                        .arg(self.keys_for(id).jobs())
                        .arg("*")
                        .arg(JOB_FIELD)
                        .arg(json.as_str())
                        .ignore();
                    any = true;
                }
                if any {
                    sent = conn.pipe::<()>(&p).await;
                    if sent.is_err() {
                        break;
                    }
                }
            }
            match sent {
                Ok(()) => return Ok(()),
                Err(e) => {
                    failures += 1;
                    if Instant::now() >= deadline {
                        return Err(e).context(format!("enqueueing after {failures} attempts"));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let ids: Vec<String> = pending.iter().map(|(id, _)| id.clone()).collect();
                    if let Ok(found) = self.already_enqueued(conn, &ids).await {
                        pending.retain(|(id, _)| !found.contains(id));
                        if pending.is_empty() {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }

    /// Tells the operator something about the run: above the progress bar, or on stderr when
    /// there is none (`--quiet`, or no terminal), where a hidden bar would drop it.
    fn note(&self, message: String) {
        if self.progress.is_hidden() {
            eprintln!("forkbox-loadgen: {message}");
        } else {
            self.progress.println(message);
        }
    }

    fn job_id(&self, tag: &str, seq: usize) -> String {
        format!("{}-{}-{}", self.run, tag, seq)
    }

    /// Runs one phase to its end: sending stopped, and every job answered or the drain timed
    /// out.
    pub async fn run_phase(
        &self,
        spec: &PhaseSpec,
        source: &mut JobSource,
        mut cluster: Option<&mut dyn Cluster>,
    ) -> anyhow::Result<PhaseOutcome> {
        let mut conn = Conn {
            client: self.client.clone(),
            conn: None,
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let (tx, mut rx) = mpsc::unbounded_channel();
        // One reader per partition's results stream: in a cluster they are on different
        // shards, which one XREAD cannot span.
        let mut readers = Vec::new();
        for part in &self.parts {
            let from = last_id(&mut conn, &part.results())
                .await
                .context("reading the results stream")?;
            readers.push(tokio::spawn(read_results(
                self.client.clone(),
                part.results(),
                from,
                tx.clone(),
                stop_rx.clone(),
            )));
        }
        drop(tx);
        let r = self
            .phase_loop(spec, source, &mut cluster, &mut conn, &mut rx)
            .await;
        let _ = stop_tx.send(true);
        for reader in readers {
            let _ = reader.await;
        }
        let mut outcome = r?;
        // Results whose stream entry was never read.
        let missing: Vec<usize> = outcome
            .recorder
            .records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.sent_us.is_some() && r.results == 0)
            .map(|(i, _)| i)
            .collect();
        // One pipeline per partition and chunk: a cluster pipeline stays in one slot.
        'parts: for part in 0..self.parts.len() {
            let mine: Vec<usize> = missing
                .iter()
                .copied()
                .filter(|&seq| self.part_of(&self.job_id(&spec.tag, seq)) == part)
                .collect();
            for chunk in mine.chunks(500) {
                let mut p = redis::pipe();
                for &seq in chunk {
                    let id = self.job_id(&spec.tag, seq);
                    p.cmd("GET").arg(self.keys_for(&id).result(&id));
                }
                let Ok(values) = conn.pipe::<Vec<Option<Vec<u8>>>>(&p).await else {
                    break 'parts;
                };
                for (&seq, v) in chunk.iter().zip(values) {
                    if let Some(r) = v.as_deref().and_then(ResultView::parse) {
                        outcome.recorder.late_result(seq, &r);
                    }
                }
            }
        }
        Ok(outcome)
    }

    /// The phase's loop: each wake-up decides whether sending goes on, sends what is due (or,
    /// once sending has ended, waits for the drain), fires the faults that are due, checks the
    /// cluster, then sleeps until results arrive, a send is due, the progress ticks or the run
    /// is interrupted.
    async fn phase_loop(
        &self,
        spec: &PhaseSpec,
        source: &mut JobSource,
        cluster: &mut Option<&mut dyn Cluster>,
        conn: &mut Conn,
        rx: &mut mpsc::UnboundedReceiver<Arrivals>,
    ) -> anyhow::Result<PhaseOutcome> {
        let mut cancel = self.cancel.clone();
        let mut st = PhaseState::new(self.t0, spec, source, *cancel.borrow());
        let started_s = st.start.duration_since(self.t0).as_secs_f64();
        let id_prefix = format!("{}-{}-", self.run, spec.tag);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut progress = Progress {
            bar: &self.progress,
            last: st.start,
            last_done: 0,
            rate: 0.0,
        };
        match spec.stop {
            Stop::Jobs(n) => self.progress.set_length(n),
            Stop::After(d) => self.progress.set_length(d.as_secs().max(1)),
        }
        self.progress.set_position(0);
        loop {
            let now = Instant::now();
            if st.sending {
                self.decide_sending(spec, &mut st, now);
            }
            let mut wake = None;
            if st.sending {
                let batch;
                (batch, wake) = self.due_batch(spec, source, &mut st, now);
                self.send_batch(spec, conn, &mut st.rec, batch).await?;
            } else if self.drain_step(spec, cluster, &mut st, now)? == Drain::Over {
                break;
            }
            self.fire_due_faults(spec, cluster, &mut st, now)?;
            if now.duration_since(st.last_check) >= Duration::from_secs(1) {
                st.last_check = now;
                if let Some(c) = cluster.as_deref_mut() {
                    c.check()?;
                }
            }
            let sleep_until = wake.unwrap_or(now + Duration::from_secs(3600));
            tokio::select! {
                batch = rx.recv() => {
                    let Some(batch) = batch else { anyhow::bail!("the results reader stopped") };
                    st.last_activity = Instant::now();
                    for (at, json) in batch {
                        self.on_result(&mut st.rec, &id_prefix, at, &json);
                    }
                    // Take whatever else already arrived before deciding what to send.
                    while let Ok(batch) = rx.try_recv() {
                        for (at, json) in batch {
                            self.on_result(&mut st.rec, &id_prefix, at, &json);
                        }
                    }
                }
                _ = tokio::time::sleep_until(sleep_until.into()), if wake.is_some() => {}
                _ = tick.tick() => progress.update(&st.rec, st.start, spec),
                r = cancel.changed(), if !st.interrupted => {
                    if r.is_err() || *cancel.borrow() {
                        st.interrupted = true;
                        st.sending = false;
                    }
                }
            }
        }
        progress.update(&st.rec, st.start, spec);
        Ok(PhaseOutcome {
            workers_released_after: st.workers_released_after,
            recorder: st.rec,
            faults: st.fired,
            interrupted: st.interrupted,
            started_s,
            ended_s: Instant::now().duration_since(self.t0).as_secs_f64(),
        })
    }

    /// Stops sending at the job count or duration, or when jobs are in flight and not one
    /// result came for a whole drain timeout.
    fn decide_sending(&self, spec: &PhaseSpec, st: &mut PhaseState, now: Instant) {
        let rec = &st.rec;
        let more = match (spec.stop, spec.load) {
            (Stop::Jobs(n), _) => (rec.records.len() as u64) < n,
            // The schedule decides: a job due before the end is sent even when this loop wakes
            // up late.
            (Stop::After(d), Load::Open { rate }) => {
                open_interval(rate).mul_f64(rec.records.len() as f64) < d
            }
            (Stop::After(d), _) => now < st.start + d,
        };
        if !more {
            st.sending = false;
            st.last_activity = now;
        } else if spec.load != Load::Backlog
            && rec.outstanding() > 0
            && now.duration_since(st.last_activity) >= spec.drain_timeout
        {
            // The workers are gone or stuck. A closed loop would wait for them forever.
            st.sending = false;
            self.note(format!(
                "no result for {:.0?} with {} job(s) in flight: ending the phase early; the \
                 unanswered jobs count as lost",
                spec.drain_timeout,
                rec.outstanding()
            ));
        }
    }

    /// The jobs to send now under the phase's load, planned in the recorder, and when to wake
    /// for the next scheduled send.
    fn due_batch(
        &self,
        spec: &PhaseSpec,
        source: &mut JobSource,
        st: &mut PhaseState,
        now: Instant,
    ) -> (Vec<(usize, String, String)>, Option<Instant>) {
        let mut batch = Vec::new();
        let mut wake = None;
        let limit = match spec.stop {
            Stop::Jobs(n) => n as usize,
            Stop::After(_) => usize::MAX,
        };
        let rec = &mut st.rec;
        match spec.load {
            Load::Closed { concurrency } => {
                let want = concurrency.saturating_sub(rec.outstanding());
                for _ in 0..want.min(SEND_BATCH) {
                    if rec.records.len() >= limit {
                        break;
                    }
                    batch.push(self.plan(spec, source, rec, now));
                }
            }
            Load::Open { rate } => {
                let interval = open_interval(rate);
                while batch.len() < SEND_BATCH && rec.records.len() < limit {
                    let due = st.start + interval.mul_f64(rec.records.len() as f64);
                    if due > now || matches!(spec.stop, Stop::After(d) if due >= st.start + d) {
                        wake = Some(due);
                        break;
                    }
                    batch.push(self.plan(spec, source, rec, due));
                }
                if batch.len() == SEND_BATCH {
                    wake = Some(now);
                }
            }
            Load::Backlog => {
                while batch.len() < SEND_BATCH && rec.records.len() < limit {
                    batch.push(self.plan(spec, source, rec, now));
                }
                wake = Some(now);
            }
        }
        (batch, wake)
    }

    /// Marks a planned batch sent and enqueues it.
    async fn send_batch(
        &self,
        spec: &PhaseSpec,
        conn: &mut Conn,
        rec: &mut Recorder,
        batch: Vec<(usize, String, String)>,
    ) -> anyhow::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let sent_at = Instant::now();
        for (seq, ..) in &batch {
            rec.sent(*seq, sent_at);
        }
        let jobs: Vec<(String, String)> =
            batch.into_iter().map(|(_, id, json)| (id, json)).collect();
        let deadline = Instant::now() + spec.drain_timeout;
        self.send(conn, &jobs, deadline).await
    }

    /// Once sending has ended: releases a backlog's workers, then says whether the phase is
    /// over (every job answered and the grace for duplicates past, the drain timed out, or a
    /// backlog interrupted).
    fn drain_step(
        &self,
        spec: &PhaseSpec,
        cluster: &mut Option<&mut dyn Cluster>,
        st: &mut PhaseState,
        now: Instant,
    ) -> anyhow::Result<Drain> {
        if spec.load == Load::Backlog && st.interrupted {
            // A backlog can hold far more jobs than a loop keeps in flight: an interrupted one
            // ends now, and the jobs still queued count as lost.
            self.note(format!(
                "interrupted with {} job(s) of the backlog unanswered; they count as lost",
                st.rec.outstanding()
            ));
            return Ok(Drain::Over);
        }
        if !st.released && spec.load == Load::Backlog {
            st.released = true;
            let started = match cluster.as_deref_mut() {
                Some(c) => tokio::task::block_in_place(|| c.release())?,
                None => false,
            };
            if started {
                st.workers_released_after = Some(st.rec.sent_count() as u64);
            }
            self.note(format!(
                "{} jobs enqueued; {}",
                st.rec.sent_count(),
                if started {
                    "workers started"
                } else {
                    "draining"
                }
            ));
            st.last_activity = Instant::now();
        }
        if st.rec.outstanding() == 0 {
            let at = *st.all_done_at.get_or_insert(now);
            if now.duration_since(at) >= DUPLICATE_GRACE {
                return Ok(Drain::Over);
            }
        } else if now.duration_since(st.last_activity) >= spec.drain_timeout {
            return Ok(Drain::Over);
        }
        Ok(Drain::Waiting)
    }

    /// Fires the faults due at this fraction of the phase: of the jobs completed, or of the
    /// time.
    fn fire_due_faults(
        &self,
        spec: &PhaseSpec,
        cluster: &mut Option<&mut dyn Cluster>,
        st: &mut PhaseState,
        now: Instant,
    ) -> anyhow::Result<()> {
        let fraction = match spec.stop {
            Stop::Jobs(n) => st.rec.completed() as f64 / n.max(1) as f64,
            Stop::After(d) => now.duration_since(st.start).as_secs_f64() / d.as_secs_f64(),
        };
        while let Some(&(at, fault)) = st.faults.first() {
            if fraction < at {
                break;
            }
            st.faults.remove(0);
            let Some(c) = cluster.as_deref_mut() else {
                anyhow::bail!("fault {fault:?} needs a cluster started by the load generator");
            };
            let detail = tokio::task::block_in_place(|| c.inject(fault))?;
            self.note(format!("fault: {fault:?}: {detail}"));
            st.fired.push(FaultEvent {
                fault,
                at_s: Instant::now().duration_since(self.t0).as_secs_f64(),
                detail,
            });
        }
        Ok(())
    }

    fn plan(
        &self,
        spec: &PhaseSpec,
        source: &mut JobSource,
        rec: &mut Recorder,
        intended: Instant,
    ) -> (usize, String, String) {
        let Planned {
            kind,
            mut job,
            expect,
            task,
        } = source.next_job();
        let seq = rec.plan(kind, expect, task, intended);
        let id = self.job_id(&spec.tag, seq);
        job.id = Some(id.clone());
        let json = serde_json::to_string(&job).expect("a Job always serializes");
        (seq, id, json)
    }

    fn on_result(&self, rec: &mut Recorder, id_prefix: &str, at: Instant, json: &[u8]) {
        let Some(r) = ResultView::parse(json) else {
            rec.result_for_unknown_id();
            return;
        };
        let seq =
            r.id.strip_prefix(id_prefix)
                .and_then(|s| s.parse::<usize>().ok())
                .filter(|&s| s < rec.records.len());
        match seq {
            Some(seq) => {
                rec.result(seq, at, &r);
            }
            None => rec.result_for_unknown_id(),
        }
    }
}
