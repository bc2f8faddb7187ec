//! The run's report: `report.json` for scripts, `report.md` and the terminal summary for people.
//!
//! Counts are summed over the measured phases (warm-up excluded) and histograms merged, so the
//! top-level latency describes every measured job. Throughput is the completed jobs over the
//! summed phase durations; in a scaling or ramp run the per-phase figures are in `scaling` and
//! `ramp`, and those are the ones to read.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::driver::{FaultEvent, Load, PhaseOutcome};
use crate::mix::Expect;
use crate::stats::{self, histogram, percentiles_ms, Percentiles, Window};

/// Spawn time reported by the workers, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SpawnSummary {
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KindSummary {
    pub sent: u64,
    pub completed: u64,
    pub unexpected: u64,
    pub by_status: BTreeMap<String, u64>,
    pub latency_ms: Percentiles,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HumanEvalSummary {
    pub sent: u64,
    pub passed: u64,
    /// Task ids whose job did not pass, with the status it got (`lost` when none).
    pub not_passed: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostileProgram {
    pub sent: u64,
    pub contained: u64,
    pub by_status: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostileSummary {
    pub programs: BTreeMap<String, HostileProgram>,
    /// Latency of the other jobs while a hostile job was in flight.
    pub others_beside_hostile_ms: Percentiles,
    /// Latency of the other jobs while none was.
    pub others_apart_ms: Percentiles,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseSummary {
    pub tag: String,
    pub workers: Option<usize>,
    pub load: serde_json::Value,
    pub started_s: f64,
    pub ended_s: f64,
    pub enqueued: u64,
    pub completed: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub unexpected: u64,
    pub throughput_jobs_per_s: f64,
    pub latency_ms: Percentiles,
    /// Jobs already enqueued when the first result arrived (all of them, for a backlog run).
    #[serde(default)]
    pub sent_before_first_result: Option<u64>,
    /// Jobs already enqueued when the spawned workers were started (backlog runs only).
    #[serde(default)]
    pub workers_started_after: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScalePoint {
    pub workers: usize,
    pub throughput_jobs_per_s: f64,
    pub p99_ms: f64,
    /// Throughput relative to one worker's: the K=1 step's, or, when the run had none, the
    /// first step's throughput divided by its worker count.
    pub speedup: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RampStep {
    pub offered_jobs_per_s: f64,
    pub achieved_jobs_per_s: f64,
    pub p99_ms: f64,
    pub error_rate: f64,
    pub sustained: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RampSummary {
    pub p99_bound_ms: f64,
    pub max_error_rate: f64,
    /// Achieved throughput of the last step that met both bounds (0 when none did).
    pub max_sustainable_jobs_per_s: f64,
    pub steps: Vec<RampStep>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    pub cores: usize,
    pub kernel: String,
    pub redis_version: String,
    pub forkbox_bin: Option<String>,
}

/// `report.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// No job lost, none duplicated, the run not interrupted.
    pub ok: bool,
    pub interrupted: bool,
    pub enqueued: u64,
    pub completed: u64,
    pub lost: u64,
    pub duplicated: u64,
    /// Results found by their result key after the drain rather than on the stream.
    pub late_results: u64,
    /// Results that are not what the workload expects (a noop that did not exit 0, a hostile
    /// program that was not contained, ...).
    pub unexpected: u64,
    /// Stream entries for ids this run did not send.
    pub foreign_results: u64,
    pub by_status: BTreeMap<String, u64>,
    pub throughput_jobs_per_s: f64,
    pub elapsed_s: f64,
    /// Enqueue-to-result from the intended send time (coordinated-omission corrected).
    pub latency_ms: Percentiles,
    /// Enqueue-to-result from the actual send time.
    pub service_latency_ms: Percentiles,
    pub spawn_us: SpawnSummary,
    pub by_kind: BTreeMap<String, KindSummary>,
    pub humaneval: Option<HumanEvalSummary>,
    pub hostile: Option<HostileSummary>,
    pub faults: Vec<FaultEvent>,
    pub phases: Vec<PhaseSummary>,
    pub scaling: Option<Vec<ScalePoint>>,
    pub ramp: Option<RampSummary>,
    pub timeline: Vec<Window>,
    pub error_samples: Vec<String>,
    pub parameters: serde_json::Value,
    pub environment: Environment,
}

/// A measured phase and what the report should say about it.
#[derive(Debug)]
pub struct MeasuredPhase {
    pub outcome: PhaseOutcome,
    pub workers: Option<usize>,
    pub load: Load,
}

impl MeasuredPhase {
    pub fn summary(&self) -> PhaseSummary {
        let r = &self.outcome.recorder;
        PhaseSummary {
            tag: String::new(),
            workers: self.workers,
            load: serde_json::to_value(self.load).unwrap_or_default(),
            started_s: self.outcome.started_s,
            ended_s: self.outcome.ended_s,
            enqueued: r.sent_count() as u64,
            completed: r.completed(),
            lost: self.outcome.lost(),
            duplicated: r.duplicated,
            unexpected: r.unexpected,
            throughput_jobs_per_s: r.throughput(),
            latency_ms: percentiles_ms(&r.latency),
            sent_before_first_result: r.sent_at_first_result.map(|n| n as u64),
            workers_started_after: self.outcome.workers_released_after,
        }
    }
}

fn add_counts(into: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>) {
    for (k, v) in from {
        *into.entry(k.clone()).or_default() += v;
    }
}

#[cfg(test)]
impl PhaseSummary {
    /// A phase of `workers` workers under `load`, 2.5 s from `started_s`, with its 10 jobs all
    /// answered, for tests to adjust.
    pub(crate) fn for_test(workers: usize, load: serde_json::Value, started_s: f64) -> Self {
        PhaseSummary {
            tag: format!("m{workers}"),
            workers: Some(workers),
            load,
            started_s,
            ended_s: started_s + 2.5,
            enqueued: 10,
            completed: 10,
            lost: 0,
            duplicated: 0,
            unexpected: 0,
            throughput_jobs_per_s: 4.0,
            latency_ms: Percentiles::default(),
            sent_before_first_result: Some(10),
            workers_started_after: None,
        }
    }
}

impl Report {
    /// A report of no phases, for tests to fill in.
    #[cfg(test)]
    pub(crate) fn empty() -> Report {
        Report::build(
            &mut [],
            &[],
            &[],
            serde_json::json!({}),
            Environment::default(),
        )
    }

    pub fn build(
        phases: &mut [MeasuredPhase],
        tags: &[String],
        labels: &[String],
        parameters: serde_json::Value,
        environment: Environment,
    ) -> Report {
        let mut latency = histogram();
        let mut service = histogram();
        let mut spawn = histogram();
        let mut by_status = BTreeMap::new();
        let mut by_kind: BTreeMap<String, KindSummary> = BTreeMap::new();
        let mut kind_latency: BTreeMap<String, hdrhistogram::Histogram<u64>> = BTreeMap::new();
        let mut humaneval: Option<HumanEvalSummary> = None;
        let mut hostile: Option<HostileSummary> = None;
        let mut beside = histogram();
        let mut apart = histogram();
        let (mut enqueued, mut completed, mut lost, mut duplicated) = (0, 0, 0, 0);
        let (mut late, mut unexpected, mut foreign) = (0, 0, 0);
        let mut stream_completed = 0u64;
        let mut elapsed = 0.0;
        let mut faults = Vec::new();
        let mut timeline = Vec::new();
        let mut summaries = Vec::new();
        let mut error_samples = Vec::new();
        let mut interrupted = false;
        for (i, p) in phases.iter_mut().enumerate() {
            let mut s = p.summary();
            s.tag = tags.get(i).cloned().unwrap_or_default();
            summaries.push(s);
            let o = &mut p.outcome;
            interrupted |= o.interrupted;
            faults.extend(o.faults.iter().cloned());
            lost += o.lost();
            let r = &mut o.recorder;
            timeline.extend(r.timeline());
            latency.add(&r.latency).expect("same bounds");
            service.add(&r.service).expect("same bounds");
            spawn.add(&r.spawn).expect("same bounds");
            add_counts(&mut by_status, &r.by_status);
            enqueued += r.sent_count() as u64;
            completed += r.completed();
            duplicated += r.duplicated;
            unexpected += r.unexpected;
            foreign += r.foreign;
            elapsed += r.elapsed_s();
            stream_completed += r.throughput_count();
            error_samples.extend(r.error_samples.iter().cloned());
            for (k, ks) in r.kinds.iter().enumerate() {
                let label = labels.get(k).cloned().unwrap_or_else(|| k.to_string());
                let e = by_kind.entry(label.clone()).or_default();
                e.unexpected += ks.unexpected;
                add_counts(&mut e.by_status, &ks.by_status);
                kind_latency
                    .entry(label)
                    .or_insert_with(histogram)
                    .add(&ks.latency)
                    .expect("same bounds");
            }
            let mut any_hostile = false;
            for rec in &r.records {
                let label = labels.get(rec.kind).cloned().unwrap_or_default();
                let e = by_kind.entry(label).or_default();
                if rec.sent_us.is_some() {
                    e.sent += 1;
                }
                if rec.results > 0 {
                    e.completed += 1;
                }
                late += u64::from(rec.late);
                if let Some(task) = &rec.task {
                    let h = humaneval.get_or_insert_with(HumanEvalSummary::default);
                    h.sent += 1;
                    if rec.status.as_deref() == Some("ok") {
                        h.passed += 1;
                    } else {
                        h.not_passed.insert(
                            task.clone(),
                            rec.status.clone().unwrap_or_else(|| "lost".into()),
                        );
                    }
                }
                if let Expect::Contained { hostile: which, .. } = rec.expect {
                    any_hostile = true;
                    let h = hostile.get_or_insert_with(HostileSummary::default);
                    let prog = h.programs.entry(which.name().to_owned()).or_default();
                    prog.sent += 1;
                    prog.contained += u64::from(rec.expected == Some(true));
                    let status = rec.status.clone().unwrap_or_else(|| "lost".into());
                    *prog.by_status.entry(status).or_default() += 1;
                }
            }
            if any_hostile {
                let (b, a) = stats::latency_beside_hostile(&r.records);
                beside.add(&b).expect("same bounds");
                apart.add(&a).expect("same bounds");
            }
        }
        if let Some(h) = &mut hostile {
            h.others_beside_hostile_ms = percentiles_ms(&beside);
            h.others_apart_ms = percentiles_ms(&apart);
        }
        for (label, h) in &kind_latency {
            if let Some(k) = by_kind.get_mut(label) {
                k.latency_ms = percentiles_ms(h);
            }
        }
        error_samples.truncate(10);
        let timeline = merge_windows(timeline);
        let sp = percentiles_ms(&spawn);
        Report {
            ok: lost == 0 && duplicated == 0 && !interrupted,
            interrupted,
            enqueued,
            completed,
            lost,
            duplicated,
            late_results: late,
            unexpected,
            foreign_results: foreign,
            by_status,
            throughput_jobs_per_s: stats::throughput(stream_completed, elapsed),
            elapsed_s: elapsed,
            latency_ms: percentiles_ms(&latency),
            service_latency_ms: percentiles_ms(&service),
            // The histogram holds µs and percentiles_ms divides by 1000: scale back.
            spawn_us: SpawnSummary {
                count: sp.count,
                p50: sp.p50 * 1000.0,
                p90: sp.p90 * 1000.0,
                p99: sp.p99 * 1000.0,
                max: sp.max * 1000.0,
            },
            by_kind,
            humaneval,
            hostile,
            faults,
            phases: summaries,
            scaling: None,
            ramp: None,
            timeline,
            error_samples,
            parameters,
            environment,
        }
    }

    /// The summary table printed at the end of a run and at the top of `report.md`.
    pub fn summary_table(&self) -> String {
        let mut s = String::new();
        let l = &self.latency_ms;
        let rows: Vec<(&str, String)> = vec![
            ("enqueued", self.enqueued.to_string()),
            ("completed", self.completed.to_string()),
            ("lost", self.lost.to_string()),
            ("duplicated", self.duplicated.to_string()),
            ("unexpected results", self.unexpected.to_string()),
            (
                "throughput",
                format!("{:.1} jobs/s", self.throughput_jobs_per_s),
            ),
            (
                "latency p50 / p90 / p99 / p99.9 / max",
                format!(
                    "{:.2} / {:.2} / {:.2} / {:.2} / {:.2} ms",
                    l.p50, l.p90, l.p99, l.p999, l.max
                ),
            ),
            (
                "spawn p50 / p99",
                format!("{:.0} / {:.0} µs", self.spawn_us.p50, self.spawn_us.p99),
            ),
            (
                "by status",
                self.by_status
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        ];
        let _ = writeln!(s, "| metric | value |\n|---|---|");
        for (k, v) in rows {
            let _ = writeln!(s, "| {k} | {v} |");
        }
        s
    }

    /// The report as Markdown: one section after another, each present only when the run
    /// has something for it.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let sections: [fn(&Report, &mut String); 10] = [
            Report::md_headline,
            Report::md_backlogs,
            Report::md_by_kind,
            Report::md_humaneval,
            Report::md_hostile,
            Report::md_scaling,
            Report::md_ramp,
            Report::md_faults,
            Report::md_errors,
            Report::md_plots_and_environment,
        ];
        for section in sections {
            section(self, &mut s);
        }
        s
    }

    /// Title, verdict, summary table and the latency note.
    fn md_headline(&self, s: &mut String) {
        let verdict = if self.ok {
            "OK: no job lost or duplicated"
        } else if self.interrupted {
            "INTERRUPTED"
        } else {
            "FAILED: jobs lost or duplicated"
        };
        let _ = writeln!(s, "# Forkbox load run\n\n**{verdict}**\n");
        s.push_str(&self.summary_table());
        let _ = writeln!(
            s,
            "\nLatency is enqueue-to-result from each job's intended send time (corrected for \
             coordinated omission); from the actual send time: p50 {:.2} ms, p99 {:.2} ms.\n",
            self.service_latency_ms.p50, self.service_latency_ms.p99
        );
    }

    /// How each backlog phase was fed to the workers.
    fn md_backlogs(&self, s: &mut String) {
        let backlogs: Vec<&PhaseSummary> = self
            .phases
            .iter()
            .filter(|p| p.load["mode"] == "backlog")
            .collect();
        for p in &backlogs {
            let which = match p.workers {
                Some(k) if backlogs.len() > 1 => format!(" (K={k})"),
                _ => String::new(),
            };
            let started = match p.workers_started_after {
                Some(n) => format!("the spawned workers started once {n} were in the queue"),
                None => "workers already running took them as they landed".into(),
            };
            let _ = writeln!(s, "Backlog of {} jobs{which}: {started}.", p.enqueued);
        }
        if !backlogs.is_empty() {
            let _ = writeln!(
                s,
                "\nA backlog's throughput counts from its first result to its last; its latency \
                 includes each job's wait in the queue.\n"
            );
        }
    }

    /// One row per workload kind.
    fn md_by_kind(&self, s: &mut String) {
        if !self.by_kind.is_empty() {
            let _ = writeln!(
                s,
                "## By workload\n\n| kind | sent | completed | unexpected | p50 ms | p99 ms | statuses |\n|---|---|---|---|---|---|---|"
            );
            for (k, v) in &self.by_kind {
                let statuses: Vec<String> = v
                    .by_status
                    .iter()
                    .map(|(s, n)| format!("{s} {n}"))
                    .collect();
                let _ = writeln!(
                    s,
                    "| {k} | {} | {} | {} | {:.2} | {:.2} | {} |",
                    v.sent,
                    v.completed,
                    v.unexpected,
                    v.latency_ms.p50,
                    v.latency_ms.p99,
                    statuses.join(", ")
                );
            }
        }
    }

    /// The HumanEval tasks that did not pass.
    fn md_humaneval(&self, s: &mut String) {
        if let Some(h) = &self.humaneval {
            let _ = writeln!(s, "\n## HumanEval\n\n{} of {} passed.", h.passed, h.sent);
            for (task, status) in &h.not_passed {
                let _ = writeln!(s, "- {task}: {status}");
            }
        }
    }

    /// What the hostile programs did, and the latency of the others beside them.
    fn md_hostile(&self, s: &mut String) {
        if let Some(h) = &self.hostile {
            let _ = writeln!(
                s,
                "\n## Hostile programs\n\n| program | sent | contained | statuses |\n|---|---|---|---|"
            );
            for (name, p) in &h.programs {
                let statuses: Vec<String> = p
                    .by_status
                    .iter()
                    .map(|(s, n)| format!("{s} {n}"))
                    .collect();
                let _ = writeln!(
                    s,
                    "| {name} | {} | {} | {} |",
                    p.sent,
                    p.contained,
                    statuses.join(", ")
                );
            }
            let _ = writeln!(
                s,
                "\nOther jobs while a hostile job ran: p50 {:.2} ms, p99 {:.2} ms ({} jobs); \
                 while none ran: p50 {:.2} ms, p99 {:.2} ms ({} jobs).",
                h.others_beside_hostile_ms.p50,
                h.others_beside_hostile_ms.p99,
                h.others_beside_hostile_ms.count,
                h.others_apart_ms.p50,
                h.others_apart_ms.p99,
                h.others_apart_ms.count
            );
        }
    }

    /// Throughput against the number of workers.
    fn md_scaling(&self, s: &mut String) {
        if let Some(points) = &self.scaling {
            let _ = writeln!(
                s,
                "\n## Scaling\n\n| workers | jobs/s | speedup vs one worker | p99 ms |\n\
                 |---|---|---|---|"
            );
            for p in points {
                let _ = writeln!(
                    s,
                    "| {} | {:.1} | {:.2}× | {:.2} |",
                    p.workers, p.throughput_jobs_per_s, p.speedup, p.p99_ms
                );
            }
            if let Some(first) = points.first().filter(|p| p.workers > 1) {
                let _ = writeln!(
                    s,
                    "\nNo step ran one worker: its rate is taken as the first step's ÷ {}.",
                    first.workers
                );
            }
            s.push_str("\n![throughput vs workers](scaling.svg)\n");
        }
    }

    /// The ramp's steps and its highest sustainable rate.
    fn md_ramp(&self, s: &mut String) {
        if let Some(r) = &self.ramp {
            let _ = writeln!(
                s,
                "\n## Ramp\n\nHighest sustainable throughput: **{:.1} jobs/s** (p99 ≤ {} ms, \
                 error rate ≤ {}).\n\n| offered jobs/s | achieved jobs/s | p99 ms | error rate | sustained |\n|---|---|---|---|---|",
                r.max_sustainable_jobs_per_s, r.p99_bound_ms, r.max_error_rate
            );
            for st in &r.steps {
                let _ = writeln!(
                    s,
                    "| {:.0} | {:.1} | {:.2} | {:.4} | {} |",
                    st.offered_jobs_per_s,
                    st.achieved_jobs_per_s,
                    st.p99_ms,
                    st.error_rate,
                    if st.sustained { "yes" } else { "no" }
                );
            }
            s.push_str("\n![ramp](ramp.svg)\n");
        }
    }

    /// The faults injected, when.
    fn md_faults(&self, s: &mut String) {
        if !self.faults.is_empty() {
            let _ = writeln!(s, "\n## Faults\n");
            for f in &self.faults {
                let _ = writeln!(s, "- at {:.1} s: {:?}: {}", f.at_s, f.fault, f.detail);
            }
        }
    }

    /// Sample error messages.
    fn md_errors(&self, s: &mut String) {
        if !self.error_samples.is_empty() {
            let _ = writeln!(s, "\n## Sample errors\n");
            for e in &self.error_samples {
                let _ = writeln!(s, "- {e}");
            }
        }
    }

    /// The plots, then the host and the run's parameters.
    fn md_plots_and_environment(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n## Plots\n\n![latency over time](latency.svg)\n\n![throughput over time](throughput.svg)\n"
        );
        let _ = writeln!(
            s,
            "## Environment and parameters\n\n{} cores, kernel {}, Redis {}.\n\n```json\n{}\n```",
            self.environment.cores,
            self.environment.kernel,
            self.environment.redis_version,
            serde_json::to_string_pretty(&self.parameters).unwrap_or_default()
        );
    }
}

/// Joins the windows of consecutive phases that share a second: counts add up, and the
/// latency of the window with more completions stands for the second.
fn merge_windows(mut windows: Vec<Window>) -> Vec<Window> {
    windows.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
    let mut out: Vec<Window> = Vec::with_capacity(windows.len());
    for w in windows {
        match out.last_mut() {
            Some(last) if last.t_s == w.t_s => {
                if w.completed > last.completed {
                    last.latency_ms = w.latency_ms;
                }
                last.enqueued += w.enqueued;
                last.completed += w.completed;
                last.unexpected += w.unexpected;
            }
            _ => out.push(w),
        }
    }
    out
}

/// Scaling points from (workers, throughput, p99) per step, with speedup against the first.
pub fn scaling_points(steps: &[(usize, f64, f64)]) -> Vec<ScalePoint> {
    let base = steps
        .first()
        .map(|&(k, t, _)| t / k.max(1) as f64)
        .unwrap_or(0.0);
    steps
        .iter()
        .map(|&(workers, t, p99)| ScalePoint {
            workers,
            throughput_jobs_per_s: t,
            p99_ms: p99,
            speedup: if base > 0.0 { t / base } else { 0.0 },
        })
        .collect()
}

/// Whether a ramp step is sustained: p99 within bound, errors within bound, and the cluster kept
/// up with the offered rate (a backlog that grows all step long is not sustainable even while
/// the step is too short for its p99 to show it).
pub fn ramp_step(
    offered: f64,
    achieved: f64,
    p99_ms: f64,
    error_rate: f64,
    p99_bound_ms: f64,
    max_error_rate: f64,
) -> RampStep {
    RampStep {
        offered_jobs_per_s: offered,
        achieved_jobs_per_s: achieved,
        p99_ms,
        error_rate,
        sustained: p99_ms <= p99_bound_ms
            && error_rate <= max_error_rate
            && achieved >= 0.9 * offered,
    }
}

/// The highest sustained achieved throughput, stopping at the first unsustained step.
pub fn max_sustainable(steps: &[RampStep]) -> f64 {
    steps
        .iter()
        .take_while(|s| s.sustained)
        .map(|s| s.achieved_jobs_per_s)
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{Recorder, ResultView};
    use std::time::{Duration, Instant};

    fn phase(t0: Instant, n: u64, lose: u64, dup: bool) -> MeasuredPhase {
        let mut rec = Recorder::new(t0, 1);
        for i in 0..n {
            let at = t0 + Duration::from_millis(i * 10);
            let seq = rec.plan(0, Expect::Ok, Some(format!("T/{i}")), at);
            rec.sent(seq, at);
            if i >= lose {
                let r = ResultView {
                    id: "x".into(),
                    status: if i % 2 == 0 { "ok" } else { "failed" }.into(),
                    spawn_us: Some(1000 + i),
                    ..ResultView::default()
                };
                rec.result(seq, at + Duration::from_millis(5), &r);
                if dup && i == n - 1 {
                    rec.result(seq, at + Duration::from_millis(6), &r);
                }
            }
        }
        MeasuredPhase {
            outcome: PhaseOutcome {
                recorder: rec,
                faults: Vec::new(),
                interrupted: false,
                workers_released_after: None,
                started_s: 0.0,
                ended_s: 1.0,
            },
            workers: Some(2),
            load: Load::Closed { concurrency: 4 },
        }
    }

    #[test]
    fn aggregates_phases() {
        let t0 = Instant::now();
        let mut phases = vec![phase(t0, 100, 0, false), phase(t0, 50, 2, true)];
        let r = Report::build(
            &mut phases,
            &["a".into(), "b".into()],
            &["noop".into()],
            serde_json::json!({"jobs": 150}),
            Environment::default(),
        );
        assert_eq!(r.enqueued, 150);
        assert_eq!(r.completed, 148);
        assert_eq!(r.lost, 2);
        assert_eq!(r.duplicated, 1);
        assert!(!r.ok);
        assert_eq!(r.by_status["ok"] + r.by_status["failed"], 148);
        assert_eq!(r.by_kind["noop"].sent, 150);
        assert_eq!(r.by_kind["noop"].unexpected, 74);
        let he = r.humaneval.as_ref().unwrap();
        assert_eq!(he.sent, 150);
        assert_eq!(he.passed, 74);
        assert_eq!(he.not_passed["T/0"], "lost");
        assert_eq!(he.not_passed["T/3"], "failed");
        assert!((r.latency_ms.p99 - 5.0).abs() < 0.01);
        assert!(r.spawn_us.p50 > 1000.0 && r.spawn_us.p50 < 1200.0);
        assert_eq!(r.phases[1].tag, "b");
        // Both phases completed jobs in second 0: one window, counts summed.
        assert_eq!(r.timeline[0].t_s, 0.0);
        assert_eq!(r.timeline[0].completed, 148);
        assert_eq!(r.timeline.iter().filter(|w| w.t_s == 0.0).count(), 1);
        assert_eq!(r.phases[1].lost, 2);
        // Phase 1 ran 0..0.995 s, phase 2 0..0.495 s: 148 jobs over 1.49 s.
        assert!(
            (r.throughput_jobs_per_s - 148.0 / 1.49).abs() < 0.01,
            "{}",
            r.throughput_jobs_per_s
        );
        let json = serde_json::to_value(&r).unwrap();
        for field in [
            "completed",
            "lost",
            "duplicated",
            "by_status",
            "throughput_jobs_per_s",
            "parameters",
        ] {
            assert!(json.get(field).is_some(), "{field}");
        }
        for p in ["p50", "p90", "p99", "p999", "max"] {
            assert!(json["latency_ms"].get(p).is_some(), "{p}");
        }
        assert!(json["spawn_us"].get("p50").is_some() && json["spawn_us"].get("p99").is_some());
        let back: Report = serde_json::from_value(json).unwrap();
        assert_eq!(back, r);
        let md = r.markdown();
        assert!(md.contains("FAILED"));
        assert!(md.contains("| lost | 2 |"));
        assert!(md.contains("74 of 150 passed"));
    }

    #[test]
    fn scaling_speedup_and_ramp_bounds() {
        let pts = scaling_points(&[(1, 100.0, 5.0), (2, 180.0, 6.0), (4, 200.0, 30.0)]);
        assert_eq!(pts[0].speedup, 1.0);
        assert!((pts[1].speedup - 1.8).abs() < 1e-9);
        assert!((pts[2].speedup - 2.0).abs() < 1e-9);
        assert!(scaling_points(&[]).is_empty());
        // The report says how one worker's rate was found.
        let mut r = Report::empty();
        r.scaling = Some(pts);
        assert!(!r.markdown().contains("No step ran one worker"));
        r.scaling = Some(scaling_points(&[(2, 180.0, 6.0), (4, 200.0, 30.0)]));
        assert!((r.scaling.as_ref().unwrap()[1].speedup - 200.0 / 90.0).abs() < 1e-9);
        let md = r.markdown();
        assert!(md.contains("No step ran one worker: its rate is taken as the first step's ÷ 2"));

        let steps = vec![
            ramp_step(100.0, 99.0, 10.0, 0.0, 100.0, 0.01),
            ramp_step(200.0, 199.0, 20.0, 0.0, 100.0, 0.01),
            ramp_step(300.0, 250.0, 40.0, 0.0, 100.0, 0.01),
            ramp_step(400.0, 399.0, 20.0, 0.0, 100.0, 0.01),
        ];
        assert!(steps[1].sustained);
        assert!(!steps[2].sustained, "fell behind the offered rate");
        assert!(!ramp_step(100.0, 100.0, 150.0, 0.0, 100.0, 0.01).sustained);
        assert!(!ramp_step(100.0, 100.0, 10.0, 0.05, 100.0, 0.01).sustained);
        // A later lucky step does not count once the node saturated.
        assert_eq!(max_sustainable(&steps), 199.0);
        assert_eq!(max_sustainable(&[]), 0.0);
    }

    #[test]
    fn backlog_phases_are_told_apart_by_their_worker_count() {
        let backlog = |workers: usize| {
            let mut p =
                PhaseSummary::for_test(workers, serde_json::json!({"mode": "backlog"}), 0.0);
            p.enqueued = 50;
            p.workers_started_after = Some(50);
            p
        };
        let mut r = Report::empty();
        r.phases = vec![backlog(1)];
        let md = r.markdown();
        assert!(md.contains("Backlog of 50 jobs: the spawned workers started once 50 were"));
        assert_eq!(md.matches("counts from its first result").count(), 1);
        r.phases = vec![backlog(1), backlog(2)];
        let md = r.markdown();
        assert!(md.contains("Backlog of 50 jobs (K=1): "), "{md}");
        assert!(md.contains("Backlog of 50 jobs (K=2): "), "{md}");
        assert_eq!(md.matches("counts from its first result").count(), 1);
        r.phases[0].load = serde_json::json!({"mode": "closed", "concurrency": 4});
        assert!(!r.markdown().contains("(K=1)"));
    }
}
