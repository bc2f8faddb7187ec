//! The runtime catalogue on a live node: the node probes its catalogue (the built-in one with
//! the operator's file over it) in its sandboxes, publishes what answered with its heartbeat,
//! and `forkbox runtimes` lists what the fleet can run with how many nodes offer it.

mod node_support;

use std::process::Command;
use std::time::Duration;

use node_support::{poll, start_redis, WorkerProc, BIN};

/// The operator's file: `bash` replaced by an entry whose probe prints a version of its own,
/// `c` replaced by one whose compiler does not exist, and a new language with compile limits.
const OVERRIDE: &str = r#"
[[language]]
name = "bash"
source_file = "main.sh"
run = ["bash", "{source}"]
version = ["/bin/sh", "-c", "echo 'GNU bash, version 9.8.7(1)-release'"]

[[language]]
name = "c"
source_file = "main.c"
compile = ["no-such-compiler-here", "{source}"]
run = ["./main"]
version = ["no-such-compiler-here", "--version"]

[[language]]
name = "echo-lang"
source_file = "main.echo"
compile = ["cp", "{source}", "copy"]
compile_limits = { timeout_ms = 7000, memory_mb = 300 }
run = ["cat", "copy"]
version = ["/bin/sh", "-c", "echo echo-lang 1.2.3 >&2"]
"#;

fn runtimes_json(url: &str, queue: &str, catalogue: &str) -> Option<Vec<serde_json::Value>> {
    let out = Command::new(BIN)
        .args(["runtimes", "--redis", url, "--queues", queue, "--json"])
        .args(["--runtimes", catalogue])
        .output()
        .unwrap();
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).ok()?;
    (!rows.is_empty()).then_some(rows)
}

fn row<'a>(rows: &'a [serde_json::Value], language: &str) -> Option<&'a serde_json::Value> {
    rows.iter().find(|r| r["language"] == language)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_publish_what_they_can_run_and_the_fleet_lists_it() {
    let server = start_redis();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("runtimes.toml");
    std::fs::write(&file, OVERRIDE).unwrap();
    let file = file.to_str().unwrap();
    let args = ["--queues", "rtq", "--slots", "2", "--runtimes", file];
    let mut one = WorkerProc::start(&url, "rt-one", &args);
    let mut two = WorkerProc::start(&url, "rt-two", &args);
    one.wait_ready();
    two.wait_ready();

    let rows = poll(Duration::from_secs(60), "both nodes' runtimes", || {
        let url = url.clone();
        async move {
            let rows = runtimes_json(&url, "rtq", file)?;
            (row(&rows, "echo-lang")?["nodes"] == 2).then_some(rows)
        }
    })
    .await;
    let echo = row(&rows, "echo-lang").unwrap();
    assert_eq!(echo["version"], "1.2.3", "{rows:?}");
    assert_eq!(
        echo["compile_limits"],
        serde_json::json!({"timeout_ms": 7000, "memory_mb": 300}),
        "the catalogue's compile limits: {rows:?}"
    );
    let bash = row(&rows, "bash").expect("bash, from the operator's entry");
    assert_eq!(bash["version"], "9.8.7");
    assert_eq!(bash["nodes"], 2);
    assert_eq!(
        bash["compile_limits"],
        serde_json::Value::Null,
        "no compile stage"
    );
    assert!(
        row(&rows, "c").is_none(),
        "a language whose probe fails is absent: {rows:?}"
    );
    // Built-in entries the file leaves alone are probed too (sh is on every node).
    assert!(
        rows.iter().all(|r| r["nodes"] == 2 && r["version"] != ""),
        "{rows:?}"
    );

    let text = Command::new(BIN)
        .args([
            "runtimes",
            "--redis",
            &url,
            "--queues",
            "rtq",
            "--runtimes",
            file,
        ])
        .output()
        .unwrap();
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["LANGUAGE", "VERSION", "NODES", "COMPILE_LIMITS"]
    );
    let has = |want: [&str; 4]| {
        lines
            .iter()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == want)
    };
    assert!(
        has(["echo-lang", "1.2.3", "2", "timeout=7s,memory=300MB"]),
        "{text}"
    );
    assert!(has(["bash", "9.8.7", "2", "-"]), "{text}");

    // A node that stops cleanly takes its runtimes with it.
    two.signal(nix::sys::signal::Signal::SIGTERM);
    two.wait_exit(Duration::from_secs(30));
    poll(Duration::from_secs(30), "one node left", || {
        let url = url.clone();
        async move {
            let rows = runtimes_json(&url, "rtq", file)?;
            (row(&rows, "echo-lang")?["nodes"] == 1).then_some(())
        }
    })
    .await;
    drop(one);
}

#[test]
fn a_catalogue_file_that_cannot_be_read_stops_the_node_and_is_named() {
    let out = Command::new(BIN)
        .args([
            "worker",
            "--redis",
            "redis://127.0.0.1:1",
            "--runtimes",
            "/nonexistent/runtimes.toml",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("reading the runtime catalogue /nonexistent/runtimes.toml"),
        "{err}"
    );
}

#[test]
fn no_live_worker_means_nothing_to_list() {
    let server = start_redis();
    let out = Command::new(BIN)
        .args(["runtimes", "--redis", &server.url(), "--queues", "empty-q"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no live worker of empty-q"));
}
