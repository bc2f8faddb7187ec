//! The product binary's command tree: benchmark drivers live in `forkbox-bench` (bench/), and
//! `forkbox` has none.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_forkbox");

/// The command names `forkbox --help` lists.
fn commands() -> Vec<String> {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let listed: Vec<String> = help
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    assert!(listed.iter().any(|c| c == "worker"), "{help}");
    listed
}

#[test]
fn the_product_binary_has_no_benchmark_command() {
    let listed = commands();
    assert!(
        !listed.iter().any(|c| c.contains("bench")),
        "forkbox --help lists a benchmark command (benchmark drivers belong in forkbox-bench): {listed:?}"
    );
    let out = Command::new(BIN).args(["bench", "spawn"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unrecognized subcommand 'bench'"),
        "{stderr}"
    );
}
