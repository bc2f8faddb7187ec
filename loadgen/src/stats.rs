//! What a run measured: one record per job, HDR histograms, and one summary per second.
//!
//! Latency is enqueue-to-result, measured from the job's *intended* send time. In an open-loop
//! run the intended time comes from the arrival schedule, so a sender that falls behind (a GC
//! pause, a slow Redis reply) does not hide the wait it caused: the jobs it should have sent
//! meanwhile are charged for it. This is the coordinated-omission correction; without it a
//! stalled generator reports the latency of the few jobs it did send. The uncorrected figure
//! (from the actual send) is kept as `service` latency for comparison. In a closed loop the
//! intended and actual send times are the same moment.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::mix::Expect;

/// Width of a timeline window.
pub const WINDOW: Duration = Duration::from_secs(1);
/// Slack allowed past a hostile job's time limit before it counts as not contained.
pub const CONTAINMENT_SLACK_MS: f64 = 1_000.0;

/// Histograms hold microseconds from 1 µs to one hour, at 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("static histogram bounds are valid")
}

/// The result fields the load generator reads, parsed leniently: the v1 result JSON
/// ([`forkbox_queue::JobResult`]) read so that a field added or left out by a newer or older
/// worker does not stop the counting.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ResultView {
    pub id: String,
    pub status: String,
    pub exit_code: Option<i32>,
    pub spawn_us: Option<u64>,
    pub duration_ms: Option<f64>,
    pub stdout: String,
    pub stderr: String,
    pub max_rss_kb: Option<u64>,
    pub attempt: Option<u32>,
    pub worker: Option<String>,
    pub error: Option<String>,
}

impl ResultView {
    pub fn parse(json: &[u8]) -> Option<ResultView> {
        let v: ResultView = serde_json::from_slice(json).ok()?;
        (!v.id.is_empty()).then_some(v)
    }
}

/// Percentiles of a histogram, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// Summarises a microsecond histogram in milliseconds (all zero when empty).
pub fn percentiles_ms(h: &Histogram<u64>) -> Percentiles {
    if h.is_empty() {
        return Percentiles::default();
    }
    let ms = |us: u64| us as f64 / 1000.0;
    Percentiles {
        count: h.len(),
        mean: h.mean() / 1000.0,
        p50: ms(h.value_at_quantile(0.50)),
        p90: ms(h.value_at_quantile(0.90)),
        p99: ms(h.value_at_quantile(0.99)),
        p999: ms(h.value_at_quantile(0.999)),
        max: ms(h.max()),
    }
}

/// One second of the run, by completion time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// Start of the window, seconds since the run began.
    pub t_s: f64,
    pub enqueued: u64,
    pub completed: u64,
    pub unexpected: u64,
    pub latency_ms: Percentiles,
}

/// Everything known about one job.
#[derive(Debug, Clone)]
pub struct JobRecord {
    pub kind: usize,
    pub expect: Expect,
    pub task: Option<String>,
    /// Microseconds since the run began.
    pub intended_us: u64,
    pub sent_us: Option<u64>,
    pub done_us: Option<u64>,
    /// Results seen on the results stream for this id (more than one is a duplicate).
    pub results: u32,
    /// Status of the first result.
    pub status: Option<String>,
    /// Whether the result was what the workload expects.
    pub expected: Option<bool>,
    /// Found by looking up the result key after the drain, not on the stream.
    pub late: bool,
}

/// Per-kind totals.
#[derive(Debug, Clone)]
pub struct KindStats {
    pub latency: Histogram<u64>,
    pub by_status: BTreeMap<String, u64>,
    pub unexpected: u64,
}

/// The measurements of one phase of a run (a run has one phase, a scaling or ramp run several).
#[derive(Debug)]
pub struct Recorder {
    t0: Instant,
    pub records: Vec<JobRecord>,
    /// Enqueue-to-result from the intended send time (coordinated-omission corrected).
    pub latency: Histogram<u64>,
    /// Enqueue-to-result from the actual send time.
    pub service: Histogram<u64>,
    /// Sandbox spawn time reported by the worker.
    pub spawn: Histogram<u64>,
    pub by_status: BTreeMap<String, u64>,
    pub kinds: Vec<KindStats>,
    pub duplicated: u64,
    /// Results on the stream for ids this run did not send.
    pub foreign: u64,
    pub unexpected: u64,
    /// A few error messages from `error`/`invalid` results, to diagnose a failing run.
    pub error_samples: Vec<String>,
    windows: Vec<Window>,
    enqueued_per_window: Vec<u64>,
    open_window: Option<(usize, Histogram<u64>, u64, u64)>,
    first_intended_us: Option<u64>,
    first_done_us: Option<u64>,
    last_done_us: Option<u64>,
    sent_n: usize,
    done_n: usize,
    /// Jobs sent when the first result arrived.
    pub sent_at_first_result: Option<usize>,
    /// Measure throughput from the first result to the last (a drained backlog) rather than
    /// from the first intended send.
    pub drain_window: bool,
}

fn us_since(t0: Instant, t: Instant) -> u64 {
    t.saturating_duration_since(t0).as_micros() as u64
}

fn window_index(us: u64) -> usize {
    (us / WINDOW.as_micros() as u64) as usize
}

/// Whether a result is what the job's workload expects.
pub fn is_expected(expect: &Expect, r: &ResultView) -> bool {
    let infra_failure = matches!(r.status.as_str(), "error" | "invalid");
    match *expect {
        Expect::Ok => r.status == "ok",
        Expect::Ran => !infra_failure,
        Expect::Contained {
            timeout_ms,
            output_bytes,
            memory_mb,
            ..
        } => {
            let in_time = r
                .duration_ms
                .is_none_or(|d| d <= timeout_ms as f64 + CONTAINMENT_SLACK_MS);
            let output_held = output_bytes
                .is_none_or(|cap| (r.stdout.len() + r.stderr.len()) as u64 <= 2 * cap + 4096);
            let memory_held =
                memory_mb.is_none_or(|mb| r.max_rss_kb.is_none_or(|kb| kb <= 2 * mb * 1024));
            !infra_failure && in_time && output_held && memory_held
        }
    }
}

impl Recorder {
    pub fn new(t0: Instant, kinds: usize) -> Recorder {
        Recorder {
            t0,
            records: Vec::new(),
            latency: histogram(),
            service: histogram(),
            spawn: histogram(),
            by_status: BTreeMap::new(),
            kinds: (0..kinds)
                .map(|_| KindStats {
                    latency: histogram(),
                    by_status: BTreeMap::new(),
                    unexpected: 0,
                })
                .collect(),
            duplicated: 0,
            foreign: 0,
            unexpected: 0,
            error_samples: Vec::new(),
            windows: Vec::new(),
            enqueued_per_window: Vec::new(),
            open_window: None,
            first_intended_us: None,
            first_done_us: None,
            last_done_us: None,
            sent_n: 0,
            done_n: 0,
            sent_at_first_result: None,
            drain_window: false,
        }
    }

    pub fn t0(&self) -> Instant {
        self.t0
    }

    /// Registers a job about to be sent; returns its sequence number.
    pub fn plan(
        &mut self,
        kind: usize,
        expect: Expect,
        task: Option<String>,
        intended: Instant,
    ) -> usize {
        let intended_us = us_since(self.t0, intended);
        self.first_intended_us.get_or_insert(intended_us);
        self.records.push(JobRecord {
            kind,
            expect,
            task,
            intended_us,
            sent_us: None,
            done_us: None,
            results: 0,
            status: None,
            expected: None,
            late: false,
        });
        self.records.len() - 1
    }

    pub fn sent(&mut self, seq: usize, at: Instant) {
        let us = us_since(self.t0, at);
        if self.records[seq].sent_us.is_none() {
            self.sent_n += 1;
        }
        self.records[seq].sent_us = Some(us);
        let w = window_index(us);
        if self.enqueued_per_window.len() <= w {
            self.enqueued_per_window.resize(w + 1, 0);
        }
        self.enqueued_per_window[w] += 1;
    }

    /// Jobs sent so far with no result yet.
    pub fn outstanding(&self) -> usize {
        self.sent_n.saturating_sub(self.done_n)
    }

    pub fn sent_count(&self) -> usize {
        self.sent_n
    }

    pub fn completed(&self) -> u64 {
        self.done_n as u64
    }

    pub fn result_for_unknown_id(&mut self) {
        self.foreign += 1;
    }

    fn count_status(&mut self, seq: usize, r: &ResultView) {
        let rec = &self.records[seq];
        let kind = rec.kind;
        let expected = is_expected(&rec.expect, r);
        *self.by_status.entry(r.status.clone()).or_default() += 1;
        *self.kinds[kind]
            .by_status
            .entry(r.status.clone())
            .or_default() += 1;
        if !expected {
            self.unexpected += 1;
            self.kinds[kind].unexpected += 1;
        }
        if matches!(r.status.as_str(), "error" | "invalid") && self.error_samples.len() < 10 {
            self.error_samples.push(format!(
                "{}: {}: {}",
                r.id,
                r.status,
                r.error.as_deref().unwrap_or("(no message)")
            ));
        }
        let rec = &mut self.records[seq];
        rec.status = Some(r.status.clone());
        rec.expected = Some(expected);
        if let Some(s) = r.spawn_us {
            self.spawn.saturating_record(s.max(1));
        }
    }

    /// A result read from the stream at `at`. Returns true for the first result of the job.
    pub fn result(&mut self, seq: usize, at: Instant, r: &ResultView) -> bool {
        let done_us = us_since(self.t0, at);
        let rec = &mut self.records[seq];
        rec.results += 1;
        if rec.results > 1 {
            self.duplicated += 1;
            return false;
        }
        rec.done_us = Some(done_us);
        self.done_n += 1;
        if self.first_done_us.is_none() {
            self.first_done_us = Some(done_us);
            self.sent_at_first_result = Some(self.sent_n);
        }
        let latency = done_us.saturating_sub(rec.intended_us).max(1);
        let service = rec.sent_us.map(|s| done_us.saturating_sub(s).max(1));
        let kind = rec.kind;
        self.latency.saturating_record(latency);
        if let Some(s) = service {
            self.service.saturating_record(s);
        }
        self.kinds[kind].latency.saturating_record(latency);
        self.count_status(seq, r);
        self.last_done_us = Some(self.last_done_us.map_or(done_us, |l| l.max(done_us)));
        self.window_record(done_us, latency, self.records[seq].expected == Some(false));
        true
    }

    /// A result found under its result key after the drain (its stream entry was missed, for
    /// example trimmed): it counts as completed, without a latency.
    pub fn late_result(&mut self, seq: usize, r: &ResultView) {
        if self.records[seq].results > 0 {
            return;
        }
        self.records[seq].results = 1;
        self.records[seq].late = true;
        self.done_n += 1;
        self.count_status(seq, r);
    }

    fn window_record(&mut self, done_us: u64, latency_us: u64, unexpected: bool) {
        let w = window_index(done_us);
        match &self.open_window {
            Some((open, ..)) if *open == w => {}
            // Results arrive in stream order, so a late straggler for a closed window is
            // counted in the open one rather than reopening history.
            Some((open, ..)) if *open > w => {}
            _ => {
                self.close_window();
                self.open_window = Some((w, histogram(), 0, 0));
            }
        }
        if let Some((_, h, completed, unexp)) = &mut self.open_window {
            h.saturating_record(latency_us);
            *completed += 1;
            *unexp += u64::from(unexpected);
        }
    }

    fn close_window(&mut self) {
        if let Some((w, h, completed, unexpected)) = self.open_window.take() {
            self.windows.push(Window {
                t_s: (w as f64) * WINDOW.as_secs_f64(),
                enqueued: 0,
                completed,
                unexpected,
                latency_ms: percentiles_ms(&h),
            });
        }
    }

    /// The timeline so far: one entry per second that saw a completion or an enqueue.
    pub fn timeline(&mut self) -> Vec<Window> {
        self.close_window();
        let mut by_index: BTreeMap<usize, Window> = self
            .windows
            .iter()
            .map(|w| ((w.t_s / WINDOW.as_secs_f64()).round() as usize, w.clone()))
            .collect();
        for (i, &n) in self.enqueued_per_window.iter().enumerate() {
            if n > 0 {
                by_index
                    .entry(i)
                    .or_insert_with(|| Window {
                        t_s: i as f64 * WINDOW.as_secs_f64(),
                        ..Window::default()
                    })
                    .enqueued = n;
            }
        }
        by_index.into_values().collect()
    }

    /// Seconds from the first intended send (or, for a drained backlog, the first result) to
    /// the last result.
    pub fn elapsed_s(&self) -> f64 {
        let from = if self.drain_window {
            self.first_done_us
        } else {
            self.first_intended_us
        };
        match (from, self.last_done_us) {
            (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e6,
            _ => 0.0,
        }
    }

    /// Completed jobs (seen on the stream) per second of [`Recorder::elapsed_s`]. A drained
    /// backlog's window opens at the first result, so that job's own run is not in it and it
    /// is not counted: the rate is of the results that came after it.
    pub fn throughput(&self) -> f64 {
        throughput(self.throughput_count(), self.elapsed_s())
    }

    /// The completed jobs [`Recorder::throughput`] counts over [`Recorder::elapsed_s`].
    pub fn throughput_count(&self) -> u64 {
        let seen = self
            .records
            .iter()
            .filter(|r| r.results > 0 && !r.late)
            .count() as u64;
        if self.drain_window {
            seen.saturating_sub(1)
        } else {
            seen
        }
    }
}

pub fn throughput(completed: u64, elapsed_s: f64) -> f64 {
    if elapsed_s > 0.0 {
        completed as f64 / elapsed_s
    } else {
        0.0
    }
}

/// For the hostile workload: latency of the other jobs, split by whether a hostile job was in
/// flight at any point while they were.
pub fn latency_beside_hostile(records: &[JobRecord]) -> (Histogram<u64>, Histogram<u64>) {
    let end = records.iter().filter_map(|r| r.done_us).max().unwrap_or(0);
    let mut hostile: Vec<(u64, u64)> = records
        .iter()
        .filter(|r| matches!(r.expect, Expect::Contained { .. }))
        .filter_map(|r| Some((r.sent_us?, r.done_us.unwrap_or(end))))
        .collect();
    hostile.sort_unstable();
    // prefix_max_end[k]: the latest end among the first k+1 hostile intervals by start.
    let prefix_max_end: Vec<u64> = hostile
        .iter()
        .scan(0u64, |m, &(_, e)| {
            *m = (*m).max(e);
            Some(*m)
        })
        .collect();
    let mut beside = histogram();
    let mut apart = histogram();
    for r in records {
        if matches!(r.expect, Expect::Contained { .. }) {
            continue;
        }
        let (Some(s), Some(d)) = (r.sent_us, r.done_us) else {
            continue;
        };
        let latency = d.saturating_sub(r.intended_us).max(1);
        // Hostile intervals starting before this job ended; one of them overlaps if it ends
        // after this job started.
        let k = hostile.partition_point(|&(hs, _)| hs < d);
        let overlaps = k > 0 && prefix_max_end[k - 1] > s;
        if overlaps {
            beside.saturating_record(latency);
        } else {
            apart.saturating_record(latency);
        }
    }
    (beside, apart)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mix::Hostile;

    fn ok(id: &str) -> ResultView {
        ResultView {
            id: id.into(),
            status: "ok".into(),
            spawn_us: Some(900),
            ..ResultView::default()
        }
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut h = histogram();
        for ms in 1..=1000u64 {
            h.record(ms * 1000).unwrap();
        }
        let p = percentiles_ms(&h);
        assert_eq!(p.count, 1000);
        let close = |a: f64, b: f64| (a - b).abs() <= b * 0.001 + 1e-9;
        assert!(close(p.p50, 500.0), "{p:?}");
        assert!(close(p.p90, 900.0), "{p:?}");
        assert!(close(p.p99, 990.0), "{p:?}");
        assert!(close(p.p999, 999.0), "{p:?}");
        assert!(close(p.max, 1000.0), "{p:?}");
        assert!(close(p.mean, 500.5), "{p:?}");
        assert_eq!(percentiles_ms(&histogram()), Percentiles::default());
    }

    #[test]
    fn coordinated_omission_is_charged_to_the_schedule() {
        // An open loop at 1000 jobs/s: the sender stalls for 100 ms after job 0, then sends
        // the 100 jobs it owed at once. Every job's service time is 1 ms.
        let t0 = Instant::now();
        let mut rec = Recorder::new(t0, 1);
        let ms = |n: u64| t0 + Duration::from_millis(n);
        for i in 0..=100u64 {
            let seq = rec.plan(0, Expect::Ok, None, ms(i));
            let sent = if i == 0 { ms(0) } else { ms(100) };
            rec.sent(seq, sent);
            rec.result(seq, sent + Duration::from_millis(1), &ok("x"));
        }
        let corrected = percentiles_ms(&rec.latency);
        let service = percentiles_ms(&rec.service);
        // Uncorrected, the stall is invisible: everything took 1 ms.
        assert!((service.p99 - 1.0).abs() < 0.01, "{service:?}");
        // Corrected, job i (sent at 100 ms, due at i ms) is charged 101 - i ms: the latencies
        // are 1, 1, 2, ..., 100 ms.
        assert!((corrected.p50 - 50.0).abs() < 0.1, "{corrected:?}");
        assert!((corrected.max - 100.0).abs() < 0.1, "{corrected:?}");
        assert!((corrected.mean - 50.0).abs() < 0.1, "{corrected:?}");
    }

    #[test]
    fn duplicates_statuses_and_unexpected_results() {
        let t0 = Instant::now();
        let mut rec = Recorder::new(t0, 2);
        let a = rec.plan(0, Expect::Ok, None, t0);
        let b = rec.plan(1, Expect::Ran, None, t0);
        let c = rec.plan(0, Expect::Ok, None, t0);
        for s in [a, b, c] {
            rec.sent(s, t0);
        }
        assert_eq!(rec.outstanding(), 3);
        assert!(rec.result(a, t0 + Duration::from_millis(5), &ok("a")));
        assert!(!rec.result(a, t0 + Duration::from_millis(6), &ok("a")));
        let failed = ResultView {
            status: "failed".into(),
            ..ok("b")
        };
        assert!(rec.result(b, t0 + Duration::from_millis(7), &failed));
        let error = ResultView {
            status: "error".into(),
            error: Some("clone: EPERM".into()),
            ..ok("c")
        };
        rec.late_result(c, &error);
        assert_eq!(rec.duplicated, 1);
        assert_eq!(rec.completed(), 3);
        assert_eq!(rec.outstanding(), 0);
        assert_eq!(rec.by_status["ok"], 1);
        assert_eq!(rec.by_status["failed"], 1);
        assert_eq!(rec.by_status["error"], 1);
        // `failed` is fine for a user job, `error` is not fine for a noop.
        assert_eq!(rec.unexpected, 1);
        assert_eq!(rec.error_samples, ["c: error: clone: EPERM"]);
        assert_eq!(rec.latency.len(), 2);
        assert_eq!(rec.spawn.len(), 3);
    }

    #[test]
    fn throughput_and_timeline_windows() {
        let t0 = Instant::now();
        let mut rec = Recorder::new(t0, 1);
        // 10 jobs/s for 3 s, each taking 50 ms; the first second's jobs take 150 ms.
        for i in 0..30u64 {
            let at = t0 + Duration::from_millis(i * 100);
            let seq = rec.plan(0, Expect::Ok, None, at);
            rec.sent(seq, at);
            let took = if i < 9 { 150 } else { 50 };
            rec.result(seq, at + Duration::from_millis(took), &ok("x"));
        }
        let tl = rec.timeline();
        assert_eq!(tl.len(), 3);
        assert_eq!(tl.iter().map(|w| w.enqueued).sum::<u64>(), 30);
        assert_eq!(tl.iter().map(|w| w.completed).sum::<u64>(), 30);
        assert_eq!(tl[0].t_s, 0.0);
        assert!((tl[0].latency_ms.p50 - 150.0).abs() < 0.2, "{:?}", tl[0]);
        assert!((tl[2].latency_ms.p99 - 50.0).abs() < 0.1, "{:?}", tl[2]);
        // 30 results between t=0 and the last at 2.95 s.
        assert!((rec.elapsed_s() - 2.95).abs() < 1e-6);
        assert!((rec.throughput() - 30.0 / 2.95).abs() < 1e-6);
        assert_eq!(throughput(5, 0.0), 0.0);
    }

    #[test]
    fn a_drained_backlog_is_measured_from_its_first_result() {
        let t0 = Instant::now();
        let mut rec = Recorder::new(t0, 1);
        rec.drain_window = true;
        // 11 jobs sent at once; the workers start later, and results come at 1.0 s, then one
        // every 100 ms.
        let seqs: Vec<usize> = (0..11).map(|_| rec.plan(0, Expect::Ok, None, t0)).collect();
        for &seq in &seqs {
            rec.sent(seq, t0);
        }
        for (i, &seq) in seqs.iter().enumerate() {
            let at = t0 + Duration::from_millis(1000 + 100 * i as u64);
            rec.result(seq, at, &ok("x"));
        }
        assert_eq!(rec.sent_at_first_result, Some(11));
        assert!((rec.elapsed_s() - 1.0).abs() < 1e-6, "{}", rec.elapsed_s());
        assert!(
            (rec.throughput() - 10.0).abs() < 1e-6,
            "{}",
            rec.throughput()
        );
        // The same results measured from the first send: 11 jobs in 2 s.
        rec.drain_window = false;
        assert!((rec.throughput() - 11.0 / 2.0).abs() < 1e-6);
    }

    #[test]
    fn containment_checks_time_output_and_status() {
        let flood = Expect::Contained {
            hostile: Hostile::OutputFlood,
            timeout_ms: 2000,
            output_bytes: Some(1000),
            memory_mb: None,
        };
        let r = ResultView {
            status: "output_limit".into(),
            duration_ms: Some(30.0),
            stdout: "y\n".repeat(500),
            ..ok("f")
        };
        assert!(is_expected(&flood, &r));
        let bloated = ResultView {
            stdout: "y".repeat(10_000),
            ..r.clone()
        };
        assert!(!is_expected(&flood, &bloated));
        let slow = ResultView {
            duration_ms: Some(3500.0),
            ..r.clone()
        };
        assert!(!is_expected(&flood, &slow));
        let broken = ResultView {
            status: "error".into(),
            ..r
        };
        assert!(!is_expected(&flood, &broken));
    }

    #[test]
    fn hostile_overlap_split() {
        let t0 = Instant::now();
        let mut rec = Recorder::new(t0, 2);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let hostile = Expect::Contained {
            hostile: Hostile::InfiniteLoop,
            timeout_ms: 1000,
            output_bytes: None,
            memory_mb: None,
        };
        // Hostile job in flight from 100 to 1100 ms.
        let h = rec.plan(1, hostile, None, at(100));
        rec.sent(h, at(100));
        rec.result(
            h,
            at(1100),
            &ResultView {
                status: "timeout".into(),
                ..ok("h")
            },
        );
        // Jobs at 0-10 (apart), 500-520 (beside), 1050-1200 (beside), 2000-2001 (apart).
        for (s, e) in [(0, 10), (500, 520), (1050, 1200), (2000, 2001)] {
            let seq = rec.plan(0, Expect::Ok, None, at(s));
            rec.sent(seq, at(s));
            rec.result(seq, at(e), &ok("n"));
        }
        let (beside, apart) = latency_beside_hostile(&rec.records);
        assert_eq!(beside.len(), 2);
        assert_eq!(apart.len(), 2);
        assert!((percentiles_ms(&beside).max - 150.0).abs() < 0.1);
        assert!((percentiles_ms(&apart).max - 10.0).abs() < 0.01);
    }

    #[test]
    fn result_view_reads_the_schema_result() {
        let r = forkbox_queue::JobResult {
            outcome: forkbox_queue::Outcome {
                spawn_us: 1234,
                duration_ms: 2.5,
                ..forkbox_queue::Outcome::not_run(forkbox_queue::Status::CpuLimit, "x")
            },
            ..forkbox_queue::JobResult::new(
                "lg-1".into(),
                forkbox_queue::Outcome::not_run(forkbox_queue::Status::CpuLimit, "x"),
                2,
                "w1".into(),
            )
        };
        let json = serde_json::to_vec(&r).unwrap();
        let v = ResultView::parse(&json).unwrap();
        assert_eq!(v.id, "lg-1");
        assert_eq!(v.status, forkbox_queue::Status::CpuLimit.as_str());
        assert_eq!(v.spawn_us, Some(1234));
        assert_eq!(v.duration_ms, Some(2.5));
        assert_eq!(v.attempt, Some(2));
        assert_eq!(v.worker.as_deref(), Some("w1"));
        assert!(ResultView::parse(br#"{"status":"ok"}"#).is_none());
        assert!(ResultView::parse(b"garbage").is_none());
    }
}
