//! The benchmark drivers end to end, at a size that runs in seconds: each prints the figures
//! `bench/run.sh` and `bench/seccomp_cost.py` read, and bad input is refused with its name.

use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_forkbox-bench"))
        .args(args)
        .output()
        .expect("running forkbox-bench")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "forkbox-bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("forkbox-bench --json prints JSON")
}

/// A figure of a report, by its dotted path (as bench/seccomp_cost.py digs it).
fn figure(report: &serde_json::Value, path: &str) -> f64 {
    let value = path.split('.').fold(report, |v, k| &v[k]);
    value
        .as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number in {report}"))
}

#[test]
fn spawn_reports_the_sandbox_against_bare_fork_exec() {
    let report = json(&bench(&[
        "spawn",
        "--json",
        "--iterations",
        "10",
        "--overshoot-runs",
        "1",
        "--pace-us",
        "100",
        "--python-preload",
        "none",
    ]));
    for path in [
        "forkbox.p50_us",
        "forkbox.mean_us",
        "forkbox_spawn_us.p50_us",
        "forkbox_per_s",
        "forkbox_cpu.tree_us",
        "bare_fork_exec.p50_us",
        "forkbox_vs_bare_p50",
    ] {
        assert!(figure(&report, path) > 0.0, "{path} in {report}");
    }
    assert_eq!(figure(&report, "forkbox.n"), 10.0);
    assert_eq!(figure(&report, "bare_fork_exec.n"), 10.0);
    assert_eq!(figure(&report, "watchdog_overshoot.n"), 1.0);
}

#[test]
fn queue_runs_every_job_through_a_node_and_writes_its_section() {
    let dir = tempfile::tempdir().unwrap();
    let section = dir.path().join("queue-overhead.json");
    let report = json(&bench(&[
        "queue",
        "--json",
        "--jobs",
        "12",
        "--latency-jobs",
        "3",
        "--slots",
        "1",
        "--python-preload",
        "none",
        "--section",
        section.to_str().unwrap(),
    ]));
    assert_eq!(figure(&report, "jobs"), 12.0);
    assert_eq!(figure(&report, "queue_latency.n"), 3.0);
    for path in [
        "raw_engine_per_s",
        "queue_per_s",
        "queue_vs_raw",
        "round_trips_per_job",
    ] {
        assert!(figure(&report, path) > 0.0, "{path} in {report}");
    }
    let section: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&section).unwrap()).unwrap();
    assert_eq!(section["section"], "queue-overhead");
    let intro = section["intro"].as_str().unwrap();
    assert!(
        intro.starts_with("`forkbox-bench queue --jobs 12 --slots 1`"),
        "{intro}"
    );
}

#[test]
fn no_jobs_is_refused_with_the_flag_named() {
    let out = bench(&["queue", "--jobs", "0"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--jobs"), "{stderr}");
}

#[test]
fn init_copy_forks_the_warm_process_in_every_mode_and_leaves_out_what_the_warm_up_added() {
    let report = json(&bench(&[
        "init-copy",
        "--iterations",
        "20",
        "--rounds",
        "2",
        "--json",
    ]));
    // The interpreter was loaded: the warm-up added mappings, some of them anonymous, which
    // the lean forks marked out of their children (every child exited 0, or the run failed).
    assert!(figure(&report, "modules") > 10.0, "{report}");
    assert!(figure(&report, "added_ranges") > 0.0, "{report}");
    assert!(figure(&report, "added_anon_kib") > 0.0, "{report}");
    let modes: Vec<&str> = report["figures"]
        .as_array()
        .expect("figures")
        .iter()
        .map(|f| f["mode"].as_str().expect("mode"))
        .collect();
    for mode in ["plain", "whole", "lean", "leanest"] {
        assert_eq!(
            modes.iter().filter(|m| **m == mode).count(),
            2,
            "{mode} once a round: {modes:?}"
        );
    }
    // Entering namespaces needs a user namespace: measured, or said why not.
    let entering = modes.iter().filter(|m| **m == "entering").count();
    if entering == 0 {
        let why = report["entering_skipped"].as_str().expect("a reason");
        println!("SKIPPED: entering: {why}");
    } else {
        assert_eq!(entering, 2, "{modes:?}");
    }
}

#[test]
fn no_rounds_is_refused_with_the_flag_named() {
    let out = bench(&["init-copy", "--rounds", "0"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--rounds"), "{stderr}");
}
