//! Counts the kernel keeps per host user, filled by one job, against the next sandbox: the
//! descriptors in flight in Unix sockets, and the epoll watches.
//!
//! Every sandbox of a node maps to one host uid (the node's own when it runs rootless; as host
//! root, another id than the zygote's). Run through `forkbox run --json` as host root and as
//! `nobody` (via `runuser`); the root variants are SKIPPED when the tests do not run as root.

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
        forkbox_testkit::skipped("needs root to run forkbox as root and as nobody through runuser");
    }
}

/// Adds epoll watches in `argv[1]` processes of `argv[2]` epoll instances over `argv[2]`
/// duplicates of one pipe each, until the kernel refuses one (ENOSPC: the host user's
/// `fs.epoll.max_user_watches` are taken); then prints how many it added, renames itself to
/// `argv[3]` so the host sees it is done, and holds them.
const WATCHER: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int procs = atoi(argv[1]), n = atoi(argv[2]);
    for (int p = 0; p < procs; p++) {
        if (fork() != 0) continue;
        int pipe_fds[2], *ep = calloc(n, sizeof(int)), *fd = calloc(n, sizeof(int));
        long added = 0;
        if (pipe(pipe_fds)) return 1;
        for (int i = 0; i < n; i++) ep[i] = epoll_create1(0);
        for (int i = 0; i < n; i++) fd[i] = dup(pipe_fds[0]);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                struct epoll_event ev = {.events = EPOLLIN};
                if (epoll_ctl(ep[i], EPOLL_CTL_ADD, fd[j], &ev) != 0) {
                    printf("%s after %ld\n", strerror(errno), added);
                    fflush(stdout);
                    prctl(PR_SET_NAME, argv[3], 0, 0, 0);
                    pause();
                }
                added++;
            }
        pause();
    }
    pause();
}
"#;

/// One job holds every epoll watch its host user may have. The next sandbox, on a new engine
/// and zygote, is built and runs: as host root the zygote's watches are another user's. Rootless
/// there is one user, so only root is tested (a rootless node's own watches are the jobs').
#[test]
fn a_job_holding_every_epoll_watch_of_its_user_does_not_stop_the_next_sandbox() {
    if !is_root() {
        forkbox_testkit::skipped("needs root: rootless, the node and its jobs are one user");
        return;
    }
    let max: u64 = std::fs::read_to_string("/proc/sys/fs/epoll/max_user_watches")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // About 200 bytes of kernel memory per watch: past 12 million, filling them takes GiBs.
    if max > 12_000_000 {
        forkbox_testkit::skipped(format!(
            "fs.epoll.max_user_watches is {max}: filling it would take over 2 GiB of kernel memory"
        ));
        return;
    }
    // Names of this run's own, so that no other run's processes are taken for them.
    let (running, full) = (
        format!("fbxw{}", std::process::id()),
        format!("fbxf{}", std::process::id()),
    );
    let dir = tempfile::tempdir().unwrap();
    let (src, bin) = (dir.path().join("w.c"), dir.path().join(&running));
    std::fs::write(&src, WATCHER).unwrap();
    let built = Command::new("gcc")
        .arg("-O2")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("gcc (make deps installs it)");
    assert!(built.success());
    // 2040 instances over 2040 descriptors: 4.16 million watches per process.
    let per_process = 2040u64 * 2040;
    let procs = (max / per_process + 2).to_string();
    let file = format!("{running}={}", bin.display());
    let holder = forkbox_run("root", &["--open-files", "4096", "--pids", "16"])
        .args(["--timeout-ms", "120000", "--file", &file, "--", "sh", "-c"])
        .arg(format!(
            "chmod +x {running} && exec ./{running} {procs} 2040 {full}"
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning forkbox");
    let watcher = || {
        std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            (comm.trim() == full).then(|| e.file_name().to_string_lossy().into_owned())
        })
    };
    assert!(
        sandbox_support::wait_until(Duration::from_secs(90), || watcher().is_some()),
        "the job never filled its user's epoll watches"
    );
    let mut second = forkbox_run("root", &["--", "echo", "second"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning forkbox");
    let finished = sandbox_support::wait_until(Duration::from_secs(60), || {
        second.try_wait().unwrap().is_some()
    });
    // Ends the holder's processes, which ends its job.
    for name in [&full, &running] {
        let _ = Command::new("pkill").args(["-KILL", "-x", name]).status();
    }
    if !finished {
        let _ = second.kill();
    }
    let out = second.wait_with_output().unwrap();
    assert!(
        finished,
        "the second sandbox never finished while the watches were held"
    );
    let held = holder.wait_with_output().unwrap();
    let held: Value = serde_json::from_slice(&held.stdout).expect("holder outcome is JSON");
    assert!(
        held["stdout"]
            .as_str()
            .is_some_and(|s| s.starts_with("No space left on device after ")),
        "the holder did not reach the limit: {held}"
    );
    let second: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(second["status"], "ok", "{second}");
    assert_eq!(second["stdout"], "second\n", "{second}");
}

/// Queues real-time signals to itself, then makes POSIX timers, then POSIX message queues of the
/// default sizes, each until the kernel refuses one; prints what it got and why it stopped,
/// renames itself to `argv[1]` so the host sees it is done, and holds them.
const QUEUER: &str = r#"
import ctypes, json, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
sig = signal.SIGRTMIN
signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
out = {}
n = 0
while n < 200000:
    ctypes.set_errno(0)
    if libc.sigqueue(os.getpid(), sig, ctypes.c_void_p(n)) != 0:
        break
    n += 1
out["signals"] = [n, ctypes.get_errno()]
timers = []
while len(timers) < 200000:
    t = ctypes.c_void_p()
    ctypes.set_errno(0)
    if libc.timer_create(1, None, ctypes.byref(t)) != 0:
        break
    timers.append(t)
out["timers"] = [len(timers), ctypes.get_errno()]
q = 0
while q < 4096:
    ctypes.set_errno(0)
    if libc.mq_open(("/fbx%d" % q).encode(), os.O_CREAT | os.O_RDWR, 0o600, None) < 0:
        break
    q += 1
out["queues"] = [q, ctypes.get_errno()]
print(json.dumps(out), flush=True)
libc.prctl(15, sys.argv[1].encode(), 0, 0, 0)
time.sleep(60)
"#;

/// What the host user can still do while the job holds its counts: queue a signal, make a
/// timer, and open as many default message queues as it can (up to 16), each closed and
/// unlinked again.
const HOST_SIDE: &str = r#"
import ctypes, json, os, signal
libc = ctypes.CDLL(None, use_errno=True)
sig = signal.SIGRTMIN
signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
out = {}
ctypes.set_errno(0)
out["sigqueue"] = [libc.sigqueue(os.getpid(), sig, ctypes.c_void_p(1)), ctypes.get_errno()]
t = ctypes.c_void_p()
ctypes.set_errno(0)
out["timer_create"] = [libc.timer_create(1, None, ctypes.byref(t)), ctypes.get_errno()]
opened, why = [], 0
while len(opened) < 16:
    name = ("/fbx-host-%d-%d" % (os.getpid(), len(opened))).encode()
    ctypes.set_errno(0)
    fd = libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)
    if fd < 0:
        why = ctypes.get_errno()
        break
    opened.append(name)
for name in opened:
    libc.mq_unlink(name)
out["mq_open"] = [len(opened), why]
print(json.dumps(out))
"#;

/// The host user's side, as `who`.
fn host_side(who: &str) -> Value {
    let out = Command::new("runuser")
        .args(["-u", who, "--", "python3", "-c", HOST_SIDE])
        .stdin(Stdio::null())
        .output()
        .expect("python3 on the host");
    assert!(out.status.success(), "{who}: host side: {out:?}");
    serde_json::from_slice(&out.stdout).expect("host side prints JSON")
}

fn check_counts(who: &str) {
    let before = host_side(who);
    let done = format!("fbxq{}", std::process::id());
    let holder = forkbox_run(who, &["--timeout-ms", "30000"])
        .args(["--", "python3", "-c", QUEUER, &done])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning forkbox");
    let ready = sandbox_support::wait_until(Duration::from_secs(60), || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .any(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == done))
    });
    let during = ready.then(|| host_side(who));
    let _ = Command::new("pkill").args(["-KILL", "-x", &done]).status();
    let held = holder.wait_with_output().unwrap();
    assert!(ready, "{who}: the job never filled its counts");
    let held: Value = serde_json::from_slice(&held.stdout).expect("holder outcome is JSON");
    let got: Value = serde_json::from_str(held["stdout"].as_str().unwrap_or("").trim())
        .unwrap_or_else(|e| panic!("{who}: job output not JSON ({e}): {held}"));
    let during = during.unwrap();
    // Meanwhile the host user's own calls work as before.
    assert_eq!(
        during["sigqueue"],
        serde_json::json!([0, 0]),
        "{who}: {during}"
    );
    assert_eq!(
        during["timer_create"],
        serde_json::json!([0, 0]),
        "{who}: {during}"
    );
    let queues = |v: &Value| v["mq_open"][0].as_u64().unwrap();
    assert!(
        queues(&during) + 1 >= queues(&before),
        "{who}: the host user opened {} message queues while the job held its own, {} before",
        queues(&during),
        queues(&before)
    );
    // The job stops at its own count, far below the node's (96,367 signals on a 24 GiB host).
    let signals = got["signals"][0].as_u64().unwrap();
    assert!(
        signals <= 256,
        "{who}: the job queued {signals} signals: {got}"
    );
    assert_eq!(got["signals"][1], libc::EAGAIN, "{who}: {got}");
    // Timers take from the same count.
    assert!(
        signals + got["timers"][0].as_u64().unwrap() <= 256,
        "{who}: {got}"
    );
    assert_eq!(got["timers"][1], libc::EAGAIN, "{who}: {got}");
    assert!(got["queues"][0].as_u64().unwrap() <= 1, "{who}: {got}");
    assert_eq!(got["queues"][1], libc::EMFILE, "{who}: {got}");
}

/// A job that queues signals, makes timers and opens message queues until refused stops at
/// counts of its own, and the host user the sandbox is charged to (host root, or the rootless
/// node's) can still queue a signal, make a timer and open message queues meanwhile.
#[test]
fn signals_timers_and_message_queues_of_a_job_leave_the_host_users_own() {
    if is_root() {
        check_counts("root");
        check_counts("nobody");
    } else {
        forkbox_testkit::skipped("needs root to run forkbox as root and as nobody through runuser");
    }
}

/// Every count the kernel keeps per user namespace is at 0 in the sandbox's: whatever the job
/// makes, it is refused there before it counts against the host uid.
#[test]
fn the_sandbox_user_namespace_has_no_counts_to_fill() {
    let program = r#"
import json, os
print(json.dumps({n: open("/proc/sys/user/" + n).read().strip() for n in sorted(os.listdir("/proc/sys/user"))}))
"#;
    let whos: &[&str] = if is_root() { &["root", "nobody"] } else { &[] };
    if whos.is_empty() {
        forkbox_testkit::skipped("needs root to run forkbox as root and as nobody");
    }
    for who in whos {
        let out = forkbox_run(who, &["--", "python3", "-c", program])
            .output()
            .expect("spawning forkbox");
        let ran: Value = serde_json::from_slice(&out.stdout).expect("outcome is JSON");
        assert_eq!(ran["status"], "ok", "{who}: {ran}");
        let got: Value = serde_json::from_str(ran["stdout"].as_str().unwrap().trim()).unwrap();
        let got = got.as_object().unwrap();
        assert!(got.len() >= 10, "{who}: {got:?}");
        for (name, value) in got {
            assert_eq!(value, "0", "{who}: {name}");
        }
    }
}
