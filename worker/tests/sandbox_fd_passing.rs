//! Descriptors kept in flight in Unix sockets by one job, against every other job of the node.
//!
//! The kernel counts in-flight descriptors per user, and every sandbox of a node maps to one
//! host uid (the node's own when it runs rootless). Run through `forkbox run --json` as host
//! root and as `nobody` (via `runuser`); the root variant is SKIPPED when the tests do not run
//! as root.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

mod sandbox_support;

use sandbox_support::{is_root, unprivileged_bin, BIN};

/// `forkbox run --json ARGS` as `who` ("root" or "nobody"), with a soft open files limit of
/// 1024 (a common default, and below the jobs' default maximum of 4096).
fn forkbox_run(who: &str, args: &[&str]) -> Command {
    let bin = if who == "root" {
        PathBuf::from(BIN)
    } else {
        unprivileged_bin().to_path_buf()
    };
    let mut c = Command::new("runuser");
    c.args([
        "-u",
        who,
        "--",
        "sh",
        "-c",
        r#"ulimit -Sn 1024 && exec "$@""#,
        "sh",
    ])
    .arg(bin)
    .args(["run", "--json"])
    .args(args)
    .stdin(Stdio::null());
    c
}

/// Fills the in-flight count of its user up to its own open files limit, renames itself so the
/// host sees it is done, and holds the descriptors in flight until its timeout.
const HOLDER: &str = r#"
import array, ctypes, socket, time
fds = array.array("i", [0] * 253)
pairs = []
try:
    while True:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        a.setblocking(False)
        pairs.append((a, b))
        while True:
            try:
                a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            except BlockingIOError:
                break
except OSError as e:
    print(e.errno, flush=True)
ctypes.CDLL(None).prctl(15, b"fbx-fds-held", 0, 0, 0)
time.sleep(60)
"#;

fn holder_is_ready() -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "fbx-fds-held")
    })
}

fn check(who: &str) {
    let holder = forkbox_run(who, &["--open-files", "4096", "--timeout-ms", "8000"])
        .args(["--", "python3", "-c", HOLDER])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning forkbox");
    assert!(
        sandbox_support::wait_until(Duration::from_secs(60), holder_is_ready),
        "{who}: the holder never filled its in-flight count"
    );
    // A second sandbox of the same identity starts and runs while the first holds them.
    let out = forkbox_run(who, &["--", "echo", "second"])
        .output()
        .expect("spawning forkbox");
    let holder = holder.wait_with_output().unwrap();
    let held: Value = serde_json::from_slice(&holder.stdout).expect("holder outcome is JSON");
    // ETOOMANYREFS (109): the holder reached its own limit, so the count was over 1024.
    assert_eq!(held["stdout"], "109\n", "{who}: holder: {held}");
    let second: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{who}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(second["status"], "ok", "{who}: {second}");
    assert_eq!(second["stdout"], "second\n", "{who}: {second}");
}

#[test]
fn descriptors_a_job_keeps_in_flight_never_stop_the_next_sandbox() {
    if is_root() {
        check("root");
        check("nobody");
    } else {
        forkbox_queue::skip::skipped(
            "needs root to run forkbox as root and as nobody through runuser",
        );
    }
}
