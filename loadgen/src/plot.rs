//! SVG plots of a report: latency percentiles and throughput over time, throughput against the
//! number of workers for a scaling run, and achieved throughput and p99 against the offered rate
//! for a ramp, which is where an operator sees the node saturate.

use std::path::{Path, PathBuf};

use plotters::chart::SeriesLabelStyle;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::Report;

type PlotResult = Result<(), Box<dyn std::error::Error>>;

const SIZE: (u32, u32) = (960, 480);
const FONT: &str = "sans-serif";

fn series_style(i: usize) -> ShapeStyle {
    let colors = [&BLUE, &GREEN, &RED, &MAGENTA, &CYAN, &BLACK];
    colors[i % colors.len()].stroke_width(2)
}

/// The legend's sample of a line series: a short stroke in its style.
fn legend_mark(style: ShapeStyle) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style)
}

/// Draws the series labels in a framed, translucent box at `position`.
fn draw_legend<'a, 'b, DB, CT>(
    mut labels: SeriesLabelStyle<'a, 'b, DB, CT>,
    position: SeriesLabelPosition,
) -> PlotResult
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
{
    labels
        .position(position)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// A white SVG canvas of the common size at `path`.
fn canvas(path: &Path) -> Result<DrawingArea<SVGBackend<'_>, Shift>, Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root)
}

/// A chart with the common caption font, margin and label areas; the caller sets its axes.
fn chart_builder<'a, 'b, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    caption: &str,
) -> ChartBuilder<'a, 'b, DB> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(caption, (FONT, 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70);
    builder
}

fn max_or(values: impl Iterator<Item = f64>, floor: f64) -> f64 {
    values.fold(floor, f64::max)
}

/// The measured phases of a run that has several (a scaling run's worker counts, a ramp's
/// rates) as (start, end, label), so that a time plot shows which stretch is which; the gaps
/// between them are worker start-up and warm-up.
fn phase_spans(report: &Report) -> Vec<(f64, f64, String)> {
    if report.phases.len() < 2 {
        return Vec::new();
    }
    report
        .phases
        .iter()
        .map(|p| {
            let rate = p.load.get("rate").and_then(serde_json::Value::as_f64);
            let label = match (report.ramp.is_some(), rate, p.workers) {
                (true, Some(r), _) => format!("{r:.0}/s offered"),
                (_, _, Some(k)) => format!("K={k}"),
                _ => p.tag.clone(),
            };
            (p.started_s, p.ended_s, label)
        })
        .collect()
}

/// Marks on a time plot: every other phase shaded and each labelled at the bottom (clear of
/// the legend), and each injected fault as a red line named at the top. `bottom` and `top`
/// are the y values of the plot's edges.
fn draw_time_marks<DB, CT>(
    chart: &mut ChartContext<'_, DB, CT>,
    report: &Report,
    bottom: f64,
    top: f64,
) -> PlotResult
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    CT: CoordTranslate<From = (f64, f64)>,
{
    let spans = phase_spans(report);
    chart.draw_series(spans.iter().step_by(2).map(|(start, end, _)| {
        Rectangle::new([(*start, bottom), (*end, top)], BLACK.mix(0.06).filled())
    }))?;
    let at_bottom = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Bottom));
    chart.draw_series(
        spans
            .iter()
            .map(|(start, _, label)| Text::new(label.clone(), (*start, bottom), at_bottom.clone())),
    )?;
    for f in &report.faults {
        let name = match f.fault {
            crate::driver::Fault::KillWorker => "worker killed",
            crate::driver::Fault::RestartRedis => "Redis restarted",
            crate::driver::Fault::KillRedisPrimary => "Redis primary killed",
        };
        let line = RED.mix(0.6).stroke_width(1);
        chart.draw_series(LineSeries::new(vec![(f.at_s, bottom), (f.at_s, top)], line))?;
        chart.draw_series(std::iter::once(Text::new(
            name,
            (f.at_s, top),
            (FONT, 13).into_font().color(&RED),
        )))?;
    }
    Ok(())
}

/// Latency percentiles per second (log scale: p50 and p99.9 differ by orders of magnitude).
fn latency(report: &Report, path: &Path) -> PlotResult {
    let tl = &report.timeline;
    let root = canvas(path)?;
    let points = |f: fn(&crate::stats::Window) -> f64| -> Vec<(f64, f64)> {
        tl.iter()
            .filter(|w| w.completed > 0)
            .map(|w| (w.t_s, f(w).max(0.001)))
            .collect()
    };
    let series: [(&str, Vec<(f64, f64)>); 4] = [
        ("p50", points(|w| w.latency_ms.p50)),
        ("p90", points(|w| w.latency_ms.p90)),
        ("p99", points(|w| w.latency_ms.p99)),
        ("p99.9", points(|w| w.latency_ms.p999)),
    ];
    let x_max = max_or(tl.iter().map(|w| w.t_s + 1.0), 1.0);
    let y_max = max_or(series.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)), 1.0) * 1.5;
    let y_min = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .fold(f64::INFINITY, f64::min)
        .min(y_max / 10.0)
        .max(0.001)
        / 1.5;
    let mut chart = chart_builder(&root, "Enqueue-to-result latency per second")
        .build_cartesian_2d(0f64..x_max, (y_min..y_max).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("time since start (s)")
        .y_desc("latency (ms, log)")
        .draw()?;
    draw_time_marks(&mut chart, report, y_min, y_max)?;
    for (i, (name, pts)) in series.into_iter().enumerate() {
        let style = series_style(i);
        chart
            .draw_series(LineSeries::new(pts, style))?
            .label(name)
            .legend(legend_mark(style));
    }
    draw_legend(
        chart.configure_series_labels(),
        SeriesLabelPosition::UpperLeft,
    )?;
    root.present()?;
    Ok(())
}

/// Completed and enqueued jobs per second.
fn throughput(report: &Report, path: &Path) -> PlotResult {
    let tl = &report.timeline;
    let root = canvas(path)?;
    let x_max = max_or(tl.iter().map(|w| w.t_s + 1.0), 1.0);
    let y_max = max_or(tl.iter().map(|w| w.completed.max(w.enqueued) as f64), 1.0) * 1.15;
    let mut chart = chart_builder(&root, "Throughput per second")
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("time since start (s)")
        .y_desc("jobs/s")
        .draw()?;
    draw_time_marks(&mut chart, report, 0.0, y_max)?;
    let lines: [(&str, Vec<(f64, f64)>); 2] = [
        (
            "completed",
            tl.iter().map(|w| (w.t_s, w.completed as f64)).collect(),
        ),
        (
            "enqueued",
            tl.iter().map(|w| (w.t_s, w.enqueued as f64)).collect(),
        ),
    ];
    for (i, (name, pts)) in lines.into_iter().enumerate() {
        let style = series_style(i);
        chart
            .draw_series(LineSeries::new(pts, style))?
            .label(name)
            .legend(legend_mark(style));
    }
    draw_legend(
        chart.configure_series_labels(),
        SeriesLabelPosition::UpperRight,
    )?;
    root.present()?;
    Ok(())
}

/// Throughput against workers, with the linear extrapolation of one worker for reference.
fn scaling(report: &Report, path: &Path) -> PlotResult {
    let Some(points) = &report.scaling else {
        return Ok(());
    };
    let root = canvas(path)?;
    let k_max = points.iter().map(|p| p.workers).max().unwrap_or(1) as f64;
    let base = points
        .first()
        .map_or(0.0, |p| p.throughput_jobs_per_s / p.workers.max(1) as f64);
    let y_max = max_or(
        points
            .iter()
            .map(|p| p.throughput_jobs_per_s)
            .chain(std::iter::once(base * k_max)),
        1.0,
    ) * 1.15;
    let mut chart = chart_builder(&root, "Throughput vs worker nodes")
        .build_cartesian_2d(0f64..k_max + 0.5, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("worker nodes")
        .y_desc("jobs/s")
        .draw()?;
    let measured: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.workers as f64, p.throughput_jobs_per_s))
        .collect();
    let style = series_style(0);
    chart
        .draw_series(LineSeries::new(measured.clone(), style))?
        .label("measured")
        .legend(legend_mark(style));
    chart.draw_series(measured.iter().map(|&p| Circle::new(p, 4, style.filled())))?;
    let ideal = series_style(5);
    chart
        .draw_series(LineSeries::new(
            vec![(0.0, 0.0), (k_max, base * k_max)],
            ideal,
        ))?
        .label("linear from one node")
        .legend(legend_mark(ideal));
    draw_legend(
        chart.configure_series_labels(),
        SeriesLabelPosition::UpperLeft,
    )?;
    root.present()?;
    Ok(())
}

/// Achieved throughput (left axis) and p99 (right axis) against the offered rate.
fn ramp(report: &Report, path: &Path) -> PlotResult {
    let Some(ramp) = &report.ramp else {
        return Ok(());
    };
    let root = canvas(path)?;
    let x_max = max_or(ramp.steps.iter().map(|s| s.offered_jobs_per_s), 1.0) * 1.1;
    let y_max = max_or(ramp.steps.iter().map(|s| s.achieved_jobs_per_s), 1.0).max(x_max) * 1.05;
    let p_max = max_or(ramp.steps.iter().map(|s| s.p99_ms), ramp.p99_bound_ms) * 1.2;
    let mut chart = chart_builder(&root, "Ramp: achieved throughput and p99 vs offered rate")
        .right_y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?
        .set_secondary_coord(0f64..x_max, 0f64..p_max);
    chart
        .configure_mesh()
        .x_desc("offered (jobs/s)")
        .y_desc("achieved (jobs/s)")
        .draw()?;
    chart.configure_secondary_axes().y_desc("p99 (ms)").draw()?;
    let achieved = series_style(0);
    chart
        .draw_series(LineSeries::new(
            ramp.steps
                .iter()
                .map(|s| (s.offered_jobs_per_s, s.achieved_jobs_per_s)),
            achieved,
        ))?
        .label("achieved jobs/s")
        .legend(legend_mark(achieved));
    let ideal = series_style(5);
    chart
        .draw_series(LineSeries::new(vec![(0.0, 0.0), (x_max, x_max)], ideal))?
        .label("offered = achieved")
        .legend(legend_mark(ideal));
    let p99 = series_style(2);
    chart
        .draw_secondary_series(LineSeries::new(
            ramp.steps.iter().map(|s| (s.offered_jobs_per_s, s.p99_ms)),
            p99,
        ))?
        .label("p99 ms (right axis)")
        .legend(legend_mark(p99));
    let bound = RED.mix(0.4).stroke_width(1);
    chart.draw_secondary_series(LineSeries::new(
        vec![(0.0, ramp.p99_bound_ms), (x_max, ramp.p99_bound_ms)],
        bound,
    ))?;
    draw_legend(
        chart.configure_series_labels(),
        SeriesLabelPosition::UpperLeft,
    )?;
    root.present()?;
    Ok(())
}

/// Writes the plots that apply to `report` into `dir`; returns their paths.
pub fn write_all(report: &Report, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    type Plot = fn(&Report, &Path) -> PlotResult;
    let plots: [(&str, Plot, bool); 4] = [
        ("latency.svg", latency, true),
        ("throughput.svg", throughput, true),
        ("scaling.svg", scaling, report.scaling.is_some()),
        ("ramp.svg", ramp, report.ramp.is_some()),
    ];
    for (name, plot, applies) in plots {
        if !applies {
            continue;
        }
        let path = dir.join(name);
        plot(report, &path).map_err(|e| anyhow::anyhow!("plotting {}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{Fault, FaultEvent};
    use crate::report::{ramp_step, scaling_points, PhaseSummary, RampSummary};
    use crate::stats::{Percentiles, Window};

    fn report() -> Report {
        let mut r = Report::empty();
        r.timeline = (0..10)
            .map(|i| Window {
                t_s: i as f64,
                enqueued: 100,
                completed: 90 + i,
                unexpected: 0,
                latency_ms: Percentiles {
                    count: 90,
                    mean: 2.0,
                    p50: 1.0 + i as f64,
                    p90: 2.0 + i as f64,
                    p99: 5.0 + i as f64,
                    p999: 9.0 + i as f64,
                    max: 10.0,
                },
            })
            .collect();
        r
    }

    #[test]
    fn writes_time_series_plots() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_all(&report(), dir.path()).unwrap();
        assert_eq!(written.len(), 2);
        let svg = std::fs::read_to_string(dir.path().join("latency.svg")).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("p99.9") && svg.contains("polyline"));
        let svg = std::fs::read_to_string(dir.path().join("throughput.svg")).unwrap();
        assert!(svg.contains("completed") && svg.contains("enqueued"));
    }

    #[test]
    fn writes_scaling_and_ramp_plots_when_present() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = report();
        r.scaling = Some(scaling_points(&[
            (1, 100.0, 3.0),
            (2, 190.0, 3.5),
            (4, 260.0, 9.0),
        ]));
        r.ramp = Some(RampSummary {
            p99_bound_ms: 50.0,
            max_error_rate: 0.01,
            max_sustainable_jobs_per_s: 200.0,
            steps: vec![
                ramp_step(100.0, 100.0, 5.0, 0.0, 50.0, 0.01),
                ramp_step(200.0, 200.0, 9.0, 0.0, 50.0, 0.01),
                ramp_step(300.0, 240.0, 400.0, 0.0, 50.0, 0.01),
            ],
        });
        let written = write_all(&r, dir.path()).unwrap();
        assert_eq!(written.len(), 4);
        let svg = std::fs::read_to_string(dir.path().join("scaling.svg")).unwrap();
        assert!(svg.contains("linear from one node"));
        let svg = std::fs::read_to_string(dir.path().join("ramp.svg")).unwrap();
        assert!(svg.contains("p99 ms (right axis)"));
    }

    #[test]
    fn time_plots_name_each_phase_and_fault() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = report();
        let closed = serde_json::json!({"mode": "closed", "concurrency": 4});
        r.phases = vec![
            PhaseSummary::for_test(1, closed.clone(), 0.5),
            PhaseSummary::for_test(2, closed, 3.5),
        ];
        r.faults = vec![FaultEvent {
            fault: Fault::KillWorker,
            at_s: 4.0,
            detail: "SIGKILL".into(),
        }];
        write_all(&r, dir.path()).unwrap();
        for name in ["latency.svg", "throughput.svg"] {
            let svg = std::fs::read_to_string(dir.path().join(name)).unwrap();
            for mark in ["K=1", "K=2", "worker killed"] {
                assert!(svg.contains(mark), "{name} lacks {mark:?}");
            }
        }

        let open = |rate: f64| serde_json::json!({"mode": "open", "rate": rate});
        r.phases = vec![
            PhaseSummary::for_test(1, open(50.0), 0.5),
            PhaseSummary::for_test(1, open(100.0), 3.5),
        ];
        r.faults.clear();
        r.ramp = Some(RampSummary {
            p99_bound_ms: 50.0,
            max_error_rate: 0.01,
            max_sustainable_jobs_per_s: 100.0,
            steps: Vec::new(),
        });
        write_all(&r, dir.path()).unwrap();
        let svg = std::fs::read_to_string(dir.path().join("throughput.svg")).unwrap();
        assert!(svg.contains("50/s offered") && svg.contains("100/s offered"));
        assert!(!svg.contains("K=1") && !svg.contains("worker killed"));

        // One phase: nothing to tell apart, so no marks.
        r.phases.truncate(1);
        r.ramp = None;
        write_all(&r, dir.path()).unwrap();
        let svg = std::fs::read_to_string(dir.path().join("throughput.svg")).unwrap();
        assert!(!svg.contains("offered") && !svg.contains("K=1"));
    }

    #[test]
    fn empty_run_still_plots() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = report();
        r.timeline.clear();
        assert_eq!(write_all(&r, dir.path()).unwrap().len(), 2);
    }
}
