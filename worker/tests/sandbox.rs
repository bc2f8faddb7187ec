//! End-to-end tests of the sandbox with real namespaces, overlays and seccomp filters.
//!
//! Every behaviour is checked through `forkbox run --json` both as host root (the sandbox's
//! root maps to an unprivileged host id) and as an ordinary user (`nobody`, via `runuser`), and
//! asserted on what can be observed: exit codes, bytes, errnos, host files and host processes.
//! When the tests do not run as root, the unprivileged identity is the current user and the
//! root variant is reported as SKIPPED.

mod sandbox_support;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use forkbox::sandbox::cgroup::Delegation;
use forkbox::sandbox::{seccomp::DENIED, CgroupSource, Engine, EngineConfig};
use forkbox_queue::schema::{FileData, Job, Limits, Status};
use sandbox_support::wait_until;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_forkbox");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Identity {
    Root,
    Unprivileged,
}

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// The identities this host lets us test; prints why one is skipped.
fn identities() -> Vec<Identity> {
    if is_root() {
        vec![Identity::Root, Identity::Unprivileged]
    } else {
        println!(
            "SKIPPED: root variant (tests run as uid {})",
            nix::unistd::Uid::effective()
        );
        vec![Identity::Unprivileged]
    }
}

/// The binary as `nobody` can reach it: a checkout under a private home directory is not
/// traversable by other users, so it is copied to a world-readable place once.
fn unprivileged_bin() -> &'static Path {
    static COPY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        let reachable = Command::new("runuser")
            .args(["-u", "nobody", "--", "test", "-x", BIN])
            .status();
        if reachable.is_ok_and(|s| s.success()) {
            return PathBuf::from(BIN);
        }
        let dir = std::env::temp_dir().join(format!("forkbox-test-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join("forkbox");
        std::fs::copy(BIN, &copy).unwrap();
        for p in [&dir, &copy] {
            std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
        copy
    })
}

fn command(who: Identity) -> Command {
    match (who, is_root()) {
        (Identity::Unprivileged, true) => {
            let mut c = Command::new("runuser");
            c.args(["-u", "nobody", "--"]).arg(unprivileged_bin());
            c
        }
        _ => Command::new(BIN),
    }
}

struct Ran {
    json: Value,
    code: i32,
    stderr: String,
}

impl Ran {
    fn status(&self) -> &str {
        self.json["status"].as_str().unwrap_or("?")
    }
    fn stdout(&self) -> &str {
        self.json["stdout"].as_str().unwrap_or("")
    }
    fn err(&self) -> &str {
        self.json["stderr"].as_str().unwrap_or("")
    }
}

fn run_json(who: Identity, opts: &[&str], shell: &str) -> Ran {
    let mut c = command(who);
    c.arg("run").arg("--json").args(opts).arg("-c").arg(shell);
    finish(
        who,
        c.stdin(Stdio::null()).output().expect("spawning forkbox"),
    )
}

fn finish(who: Identity, out: Output) -> Ran {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "{who:?}: not JSON ({e}): stdout={stdout} stderr={}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    Ran {
        json,
        code: out.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn python_prog(who: Identity, opts: &[&str], program: &str) -> Ran {
    let mut c = command(who);
    c.arg("run")
        .arg("--json")
        .args(opts)
        .args(["--", "python3", "-c", program]);
    finish(
        who,
        c.stdin(Stdio::null()).output().expect("spawning forkbox"),
    )
}

fn host_pids_matching(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(marker) && !text.contains("forkbox") {
                found.push(pid);
            }
        }
    }
    found
}

// ---------------------------------------------------------------------------------------------
// 1. Escapes

#[test]
fn denied_syscalls_fail_with_eperm_including_x32_numbers() {
    let calls: Vec<(String, i32)> = DENIED
        .iter()
        .map(|n| {
            (
                n.to_string(),
                i32::from(libseccomp::ScmpSyscall::from_name(n).unwrap()),
            )
        })
        .collect();
    let list = serde_json::to_string(&calls).unwrap();
    let program = format!(
        r#"
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {{}}
for name, nr in json.loads('{list}'):
    for label, number in ((name, nr), ("x32:" + name, nr | 0x40000000)):
        ctypes.set_errno(0)
        r = libc.syscall(ctypes.c_long(number), 0, 0, 0, 0, 0, 0)
        out[label] = (r, ctypes.get_errno())
print(json.dumps(out))
"#
    );
    for who in identities() {
        let ran = python_prog(who, &[], &program);
        assert_eq!(ran.status(), "ok", "{who:?}: {}", ran.err());
        let results: serde_json::Map<String, Value> =
            serde_json::from_str(ran.stdout().trim()).unwrap();
        assert_eq!(results.len(), DENIED.len() * 2);
        for (label, v) in &results {
            assert_eq!(v[0].as_i64(), Some(-1), "{who:?}: {label} returned {v}");
            assert_eq!(
                v[1].as_i64(),
                Some(libc::EPERM as i64),
                "{who:?}: {label} errno {v}"
            );
        }
    }
}

#[test]
fn host_files_never_change() {
    let before = std::fs::read("/etc/hosts").unwrap();
    for who in identities() {
        let ran = run_json(
            who,
            &[],
            "echo x >> /etc/hosts; echo y > /usr/forkbox-probe; cat /etc/hosts | tail -1",
        );
        assert_eq!(std::fs::read("/etc/hosts").unwrap(), before, "{who:?}");
        assert!(!Path::new("/usr/forkbox-probe").exists(), "{who:?}");
        assert_ne!(
            ran.stdout().lines().last(),
            Some("x"),
            "{who:?}: the write was visible"
        );
    }
}

#[test]
fn one_sandbox_leaves_nothing_for_the_next() {
    for who in identities() {
        let first = run_json(who, &[], "echo secret > /tmp/m && echo secret > /work/m && echo secret > /dev/shm/m && echo written");
        assert_eq!(first.stdout(), "written\n", "{who:?}: {}", first.err());
        let second = run_json(who, &[], "cat /tmp/m /work/m /dev/shm/m 2>&1; echo done");
        assert!(
            !second.stdout().contains("secret"),
            "{who:?}: {}",
            second.stdout()
        );
    }
}

#[test]
fn proc_network_and_host_paths_are_private() {
    for who in identities() {
        // The shell's descriptors are listed first, straight to stdout: while a pipeline or a
        // redirection is set up, the shell itself holds an extra descriptor.
        let ran = run_json(
            who,
            &[],
            "ls /proc/$$/fd; echo --; \
             ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '; echo; \
             cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' ' | tr '\\n' ' '; echo; \
             tr '\\0' ' ' </proc/1/cmdline; echo; \
             for f in environ maps; do cat /proc/1/$f >/dev/null 2>&1 && echo open:$f; done; \
             for f in fd/0 root exe; do readlink /proc/1/$f >/dev/null 2>&1 && echo open:$f; done; \
             for d in /root /home /run /var /srv /sys; do [ -e $d ] && echo visible:$d; done; \
             (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && echo tcp-open; \
             python3 -c 'import socket; s=socket.socket(); s.settimeout(2); print(s.connect_ex((\"127.0.0.1\", 6379)))'",
        );
        assert_eq!(ran.status(), "ok", "{who:?}: {}", ran.err());
        let (fds, rest) = ran.stdout().split_once("--\n").expect("marker");
        assert_eq!(fds, "0\n1\n2\n", "{who:?}: descriptors");
        let lines: Vec<&str> = rest.lines().collect();
        let pids: Vec<i32> = lines[0]
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        assert!(
            pids.contains(&1) && pids.len() < 10 && pids.iter().all(|p| *p < 100),
            "{who:?}: pids {pids:?}"
        );
        assert_eq!(lines[1].trim(), "lo", "{who:?}: interfaces");
        // Anyone may read a process's command line: the init's names no host path.
        assert_eq!(
            lines[2].trim(),
            "forkbox __zygote",
            "{who:?}: pid 1's command line"
        );
        assert!(
            !ran.stdout().contains("visible:"),
            "{who:?}: {}",
            ran.stdout()
        );
        assert!(!ran.stdout().contains("tcp-open"));
        assert!(!ran.stdout().contains("open:"), "{who:?}: {}", ran.stdout());
        assert_eq!(
            lines.last().unwrap().trim(),
            libc::ECONNREFUSED.to_string(),
            "{who:?}: host redis reachable?"
        );
    }
}

#[test]
fn host_root_is_never_mapped_into_the_sandbox() {
    for who in identities() {
        let marker = format!("98{}{}", std::process::id(), who as u8);
        let mut child = command(who)
            .args([
                "run",
                "--json",
                "--timeout-ms",
                "20000",
                "--",
                "sleep",
                &marker,
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut pids = Vec::new();
        assert!(wait_until(Duration::from_secs(10), || {
            pids = host_pids_matching(&format!("sleep {marker}"));
            !pids.is_empty()
        }));
        let pid = pids[0];
        let uid_map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let uids: Vec<u32> = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .unwrap()
            .split_whitespace()
            .skip(1)
            .map(|u| u.parse().unwrap())
            .collect();
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        child.wait().unwrap();
        // Seen from the host: the sandbox's root is an unprivileged id, and no line maps host 0.
        assert!(
            uids.iter().all(|u| *u != 0),
            "{who:?}: sandbox runs as host uid {uids:?}"
        );
        for line in uid_map.lines() {
            let f: Vec<u64> = line
                .split_whitespace()
                .map(|x| x.parse().unwrap())
                .collect();
            assert!(f[1] != 0, "{who:?}: host uid 0 mapped: {line}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Limits

#[test]
fn timeout_kills_the_whole_tree() {
    for who in identities() {
        let marker = format!("77{}{}", std::process::id(), who as u8);
        let ran = run_json(
            who,
            &["--timeout-ms", "500"],
            &format!("sleep {marker} & sleep {marker} & while :; do :; done"),
        );
        assert_eq!(ran.status(), "timeout", "{who:?}");
        assert_eq!(ran.code, 124, "{who:?}");
        assert_eq!(ran.json["exit_code"], 124);
        assert_eq!(ran.json["timed_out"], true);
        assert!(ran.json["watchdog_overshoot_us"].as_i64().unwrap() >= 0);
        assert!(
            wait_until(Duration::from_secs(2), || host_pids_matching(&format!(
                "sleep {marker}"
            ))
            .is_empty()),
            "{who:?}: background sleep survived"
        );
    }
}

#[test]
fn fork_bomb_is_contained() {
    for who in identities() {
        let ran = run_json(
            who,
            &["--pids", "32", "--timeout-ms", "2000"],
            "bomb() { bomb | bomb & }; bomb; wait; echo after",
        );
        assert!(
            ["timeout", "ok", "failed"].contains(&ran.status()),
            "{who:?}: {}",
            ran.status()
        );
        // The host stays responsive: a process starts and finishes at once.
        let t = Instant::now();
        assert!(Command::new("/bin/true").status().unwrap().success());
        assert!(t.elapsed() < Duration::from_secs(5));
        // Nothing of it is left.
        assert!(
            wait_until(Duration::from_secs(3), || host_pids_matching("bomb")
                .is_empty()),
            "{who:?}: bomb survived"
        );
    }
}

#[test]
fn memory_limit_stops_a_large_allocation() {
    for who in identities() {
        let ran = python_prog(
            who,
            &["--memory-mb", "256"],
            "b = bytearray(1 << 30); print('allocated', len(b))",
        );
        assert!(
            !ran.stdout().contains("allocated"),
            "{who:?}: allocation succeeded"
        );
        match ran.status() {
            // Without cgroup delegation the allocation fails inside the program.
            "failed" => assert!(ran.err().contains("MemoryError"), "{who:?}: {}", ran.err()),
            "memory_limit" => {}
            other => panic!("{who:?}: unexpected status {other}"),
        }
    }
}

#[test]
fn programs_hold_no_capabilities_and_no_new_privs() {
    for who in identities() {
        let ran = run_json(
            who,
            &[],
            "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status",
        );
        let fields: Vec<(&str, &str)> = ran
            .stdout()
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k, v.trim()))
            .collect();
        assert_eq!(fields.len(), 7, "{who:?}: {}", ran.stdout());
        for (k, v) in fields {
            let want = match k {
                "NoNewPrivs" => "1",
                "Seccomp" => "2",
                _ => "0000000000000000",
            };
            assert_eq!(v, want, "{who:?}: {k}");
        }
    }
}

#[test]
fn programs_run_at_normal_priority() {
    // The zygote may raise its own priority for the watchdog; jobs must not inherit it.
    for who in identities() {
        let ran = run_json(who, &[], "cut -d' ' -f19 /proc/self/stat");
        assert_eq!(ran.stdout(), "0\n", "{who:?}: nice value");
    }
}

#[test]
fn cpu_limit_kills_a_busy_loop() {
    for who in identities() {
        let ran = run_json(
            who,
            &["--cpu-ms", "500", "--timeout-ms", "10000"],
            "while :; do :; done",
        );
        assert_eq!(ran.status(), "cpu_limit", "{who:?}");
        assert_eq!(ran.json["signal"], libc::SIGXCPU);
        assert_eq!(ran.code, 128 + libc::SIGXCPU);
        assert!(ran.json["cpu_ms"].as_u64().unwrap() >= 500);
    }
}

#[test]
fn output_of_exactly_the_cap_is_not_flagged() {
    for who in identities() {
        let ran = run_json(who, &["--output-bytes", "1000"], "head -c 1000 /dev/zero");
        assert_eq!(ran.status(), "ok", "{who:?}");
        assert_eq!(ran.json["stdout_truncated"], false);
        assert_eq!(ran.stdout().len(), 1000);
        let ran = run_json(who, &["--output-bytes", "1000"], "head -c 1001 /dev/zero");
        assert_eq!(ran.status(), "output_limit", "{who:?}");
        assert_eq!(ran.json["stdout_truncated"], true);
        assert_eq!(ran.stdout().len(), 1000);
    }
}

#[test]
fn output_is_capped_and_flagged() {
    for who in identities() {
        let before =
            nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap();
        let ran = run_json(
            who,
            &["--output-bytes", "100000", "--timeout-ms", "5000"],
            "yes",
        );
        assert_eq!(ran.status(), "output_limit", "{who:?}");
        assert_eq!(ran.json["stdout_truncated"], true);
        assert_eq!(ran.stdout().len(), 100_000);
        assert!(ran.stdout().starts_with("y\ny\n"));
        let after =
            nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap();
        // The node's own memory stays bounded (max RSS of any waited-for child, in KiB).
        assert!(
            after.max_rss().max(before.max_rss()) < 200 * 1024,
            "forkbox used {} KiB",
            after.max_rss()
        );
    }
}

#[test]
fn disk_cap_gives_enospc() {
    for who in identities() {
        let ran = run_json(
            who,
            &["--disk-mb", "8"],
            "dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1; ls -l /tmp/fill",
        );
        assert!(
            ran.stdout().contains("No space left on device"),
            "{who:?}: {}",
            ran.stdout()
        );
        let size: u64 = ran
            .stdout()
            .lines()
            .last()
            .unwrap()
            .split_whitespace()
            .nth(4)
            .unwrap()
            .parse()
            .unwrap();
        assert!(size <= 8 * 1024 * 1024, "{who:?}: wrote {size}");
    }
}

/// `/tmp`, the working directory and `/dev/shm` draw on one budget: what a job writes to one
/// leaves that much less for the others, with the node's default size and with a job's own.
#[test]
fn disk_cap_is_one_budget_for_every_writable_directory() {
    for who in identities() {
        for (opts, mb) in [(&["--disk-mb", "8"][..], 5), (&[][..], 40)] {
            let ran = run_json(
                who,
                opts,
                &format!(
                    "for d in /tmp /work /dev/shm; do \
                       if dd if=/dev/zero of=$d/fill bs=1M count={mb} 2>/dev/null; \
                       then echo \"$d ok\"; else echo \"$d full\"; fi; done"
                ),
            );
            assert_eq!(
                ran.stdout(),
                "/tmp ok\n/work full\n/dev/shm full\n",
                "{who:?} {opts:?}: {}",
                ran.stderr
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Behaviour

#[test]
fn exit_codes_pass_through() {
    for who in identities() {
        let ran = run_json(who, &[], "exit 42");
        assert_eq!(
            (ran.status(), ran.code, ran.json["exit_code"].as_i64()),
            ("failed", 42, Some(42))
        );
        let mut c = command(who);
        let out = c
            .args(["run", "--json", "--", "no-such-program-xyz"])
            .output()
            .unwrap();
        let ran = finish(who, out);
        assert_eq!(ran.code, 127, "{who:?}");
        assert!(ran.err().contains("command not found"), "{}", ran.err());
        let ran = run_json(who, &[], "kill -TERM $$");
        assert_eq!((ran.status(), ran.code), ("signaled", 128 + 15));
        // Plain mode passes the bytes through and exits with the job's code.
        let out = command(who)
            .args(["run", "-c", "printf out; printf err >&2; exit 3"])
            .output()
            .unwrap();
        assert_eq!(
            (
                out.stdout.as_slice(),
                out.stderr.as_slice(),
                out.status.code()
            ),
            (&b"out"[..], &b"err"[..], Some(3))
        );
    }
}

#[test]
fn stdin_env_files_and_collect_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let input = dir.path().join("input.bin");
    std::fs::write(&input, [0u8, 1, 2, 255]).unwrap();
    let script = dir.path().join("main.py");
    std::fs::write(&script, "import os,sys\ndata=sys.stdin.buffer.read()\nos.makedirs('out',exist_ok=True)\nopen('out/r.bin','wb').write(bytes(reversed(data)))\nprint(os.environ['GREETING'], os.environ['HOME'], os.getcwd(), len(data))\n").unwrap();
    for who in identities() {
        let file_arg = format!("src/main.py={}", script.display());
        let out = command(who)
            .args([
                "run",
                "--json",
                "--env",
                "GREETING=hello world",
                "--file",
                &file_arg,
                "--collect",
                "out/*.bin",
            ])
            .args([
                "--stdin-file",
                input.to_str().unwrap(),
                "--",
                "python3",
                "src/main.py",
            ])
            .output()
            .unwrap();
        let ran = finish(who, out);
        assert_eq!(ran.status(), "ok", "{who:?}: {}", ran.err());
        assert_eq!(ran.stdout(), "hello world /work /work 4\n");
        let file: FileData =
            serde_json::from_value(ran.json["files"]["out/r.bin"].clone()).unwrap();
        assert_eq!(file.to_bytes().unwrap(), vec![255u8, 2, 1, 0]);
        // The worker's own environment never leaks in.
        let ran = run_json(who, &[], "env | sort | cut -d= -f1 | tr '\\n' ' '");
        assert_eq!(ran.stdout().trim(), "HOME LANG PATH PWD TMPDIR");
    }
}

fn engine(slots: usize) -> Engine {
    Engine::start(EngineConfig {
        zygote_exe: BIN.into(),
        slots,
        ..EngineConfig::default()
    })
    .expect("engine")
}

/// A cancel that lands while the launcher is still writing the job's files, before the program
/// starts, is the job's cancellation and not a failed sandbox: the node retries a failed
/// sandbox, and dead-letters it on the last delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cancelled_before_its_program_starts_is_cancelled_not_failed() {
    let engine = tokio::task::spawn_blocking(|| engine(1)).await.unwrap();
    // 6 MB in 300 files: the launcher writes them for milliseconds before it execs.
    let job = Job {
        files: (0..300)
            .map(|i| (format!("f{i}.txt"), FileData::Text("x".repeat(20_000))))
            .collect(),
        ..Job::shell("echo ran")
    };
    for _ in 0..5 {
        let out = engine.run_cancellable(&job, std::future::ready(())).await;
        assert_eq!(
            out.status,
            Status::Cancelled,
            "{:?} {}",
            out.error,
            out.stderr
        );
        assert_eq!(out.stdout, "");
    }
    // Without the cancel the same job runs, and the engine serves on.
    let ran = engine.run(&job).await;
    assert_eq!((ran.status, ran.stdout.as_str()), (Status::Ok, "ran\n"));
}

/// Jobs that cannot start name why, and are `invalid` (a retry could not help): files beyond the
/// disk before any sandbox is used, a working directory that cannot be made or entered from the
/// launcher's own step, not as a generic failure of the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_cannot_start_says_why() {
    let engine = tokio::task::spawn_blocking(|| engine(1)).await.unwrap();
    let big = Job {
        files: [("big.bin".to_owned(), FileData::Text("x".repeat(3 << 20)))].into(),
        limits: Limits {
            disk_mb: Some(2),
            ..Limits::default()
        },
        ..Job::shell("echo ran")
    };
    let out = engine.run(&big).await;
    assert_eq!(out.status, Status::Invalid, "{:?}", out.error);
    assert_eq!(
        out.error.as_deref(),
        Some("files: 3145728 bytes do not fit the job's disk of 2 MiB (limits.disk_mb)")
    );
    // A working directory the launcher cannot make (inside a file the job brought) or enter
    // (absent outside /work): the job's own fault, so invalid, with the step that failed.
    for (cwd, files, expected) in [
        (
            "sub/inner",
            vec!["sub"],
            "job not run: cwd /work/sub/inner: ",
        ),
        (
            "/nonexistent",
            vec![],
            "job not run: cwd /nonexistent: ENOENT",
        ),
    ] {
        let job = Job {
            files: files
                .into_iter()
                .map(|f| (f.to_owned(), FileData::Text("x".into())))
                .collect(),
            cwd: Some(cwd.into()),
            ..Job::shell("echo ran")
        };
        let out = engine.run(&job).await;
        assert_eq!(out.status, Status::Invalid, "{:?}", out.error);
        let error = out.error.unwrap_or_default();
        assert!(error.starts_with(expected), "{error}");
        assert_eq!(out.stdout, "");
    }
}

/// An engine's staging directory (empty mount points on the host) is named after its process;
/// one left by a process killed outright is removed by the next engine, and nothing else is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staging_left_by_a_killed_process_is_removed_by_the_next_engine() {
    use std::os::unix::fs::PermissionsExt;
    let runtime = tempfile::tempdir().unwrap();
    // The sandboxes' unprivileged root must reach the staging directory inside it.
    std::fs::set_permissions(runtime.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let me = forkbox_queue::owner::tag();
    let gone = format!("{}:1", u32::MAX);
    let make = |name: &str, extra: Option<&str>| {
        let dir = runtime.path().join(name);
        for sub in ["root", "layers"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        if let Some(file) = extra {
            std::fs::write(dir.join(file), "x").unwrap();
        }
        dir
    };
    let stale = make(&format!("forkbox-{gone}-aaaaaa"), None);
    let live = make(&format!("forkbox-{me}-bbbbbb"), None);
    let not_empty = make(&format!("forkbox-{gone}-cccccc"), Some("note"));
    let unmarked = make("forkbox-dddddd", None);
    let listing = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(runtime.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let before = listing();
    let dir = runtime.path().to_owned();
    let engine = tokio::task::spawn_blocking(move || {
        Engine::start(EngineConfig {
            zygote_exe: BIN.into(),
            slots: 1,
            runtime_dir: dir,
            ..EngineConfig::default()
        })
        .expect("engine")
    })
    .await
    .unwrap();
    assert!(!stale.exists(), "{before:?} -> {:?}", listing());
    for kept in [&live, &unmarked] {
        assert!(kept.join("root").is_dir(), "{} removed", kept.display());
    }
    // Only empty directories go: what else is there stays.
    assert!(not_empty.join("note").is_file(), "{:?}", listing());
    // The engine's own, named after this process, serves its sandboxes.
    let own: Vec<String> = listing()
        .into_iter()
        .filter(|n| n.starts_with(&format!("forkbox-{me}-")) && !live.ends_with(n))
        .collect();
    assert_eq!(own.len(), 1, "{:?}", listing());
    assert_eq!(engine.run(&Job::shell("echo ok")).await.stdout, "ok\n");
    drop(engine);
    assert!(!runtime.path().join(&own[0]).exists(), "{:?}", listing());
}

/// Prints the job's network namespace cookie (unique for the kernel's lifetime, unlike its
/// inode number), then whatever `extra` prints.
fn netns_probe(extra: &str) -> Job {
    let program = format!(
        "import socket\n\
         with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:\n    \
             print(int.from_bytes(s.getsockopt(socket.SOL_SOCKET, 71, 8), 'little'))\n\
         {extra}"
    );
    Job::argv(["python3", "-c", &program])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_namespaces_are_reused_only_when_untouched() {
    let engine = tokio::task::spawn_blocking(|| engine(1)).await.unwrap();
    let cookie = |out: &forkbox_queue::schema::Outcome| -> u64 {
        assert_eq!(out.status, Status::Ok, "{:?} {}", out.error, out.stderr);
        out.stdout.lines().next().unwrap().parse().unwrap()
    };
    // Jobs that send nothing leave their namespace as it was: it is handed out again.
    let mut quiet = Vec::new();
    for _ in 0..6 {
        quiet.push(cookie(&engine.run(&netns_probe("")).await));
    }
    let distinct: HashSet<u64> = quiet.iter().copied().collect();
    assert!(
        distinct.len() < quiet.len(),
        "no namespace reused: {quiet:?}"
    );
    // A job that talks over loopback and leaves a connection in TIME_WAIT.
    let noisy = engine
        .run(&netns_probe(
            "srv = socket.create_server(('127.0.0.1', 8000))\n\
             cli = socket.create_connection(('127.0.0.1', 8000))\n\
             conn, _ = srv.accept()\n\
             cli.sendall(b'x'); conn.recv(1)\n\
             cli.close(); conn.close(); srv.close()\n\
             print(open('/proc/net/tcp').read().count('\\n') - 1)",
        ))
        .await;
    let noisy_cookie = cookie(&noisy);
    let lingering: usize = noisy.stdout.lines().nth(1).unwrap().parse().unwrap();
    assert!(
        lingering > 0,
        "the probe left no TCP state: {}",
        noisy.stdout
    );
    // Its namespace is never seen again, and nothing of it shows in the next sandboxes: no TCP
    // entry, and the port binds without SO_REUSEADDR.
    for _ in 0..6 {
        let out = engine
            .run(&netns_probe(
                "print(open('/proc/net/tcp').read().count('\\n') - 1)\n\
                 s = socket.socket(); s.bind(('127.0.0.1', 8000)); s.close(); print('bound')",
            ))
            .await;
        assert_ne!(
            cookie(&out),
            noisy_cookie,
            "a used namespace was handed out again"
        );
        let rest: Vec<&str> = out.stdout.lines().skip(1).collect();
        assert_eq!(rest, ["0", "bound"], "{}", out.stderr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_sandboxes_eight_at_a_time_keep_their_outputs_apart() {
    let engine = tokio::task::spawn_blocking(|| engine(8)).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200u32 {
        let engine = engine.clone();
        tasks.spawn(async move {
            let job = Job {
                stdin: Some(FileData::Text(format!("payload-{i}\n"))),
                files: [("n.txt".to_owned(), FileData::Text(i.to_string()))].into(),
                ..Job::shell("read line; echo \"$line $(cat n.txt) $$\"; echo err-$(cat n.txt) >&2")
            };
            (i, engine.run(&job).await)
        });
    }
    let mut seen = HashSet::new();
    while let Some(r) = tasks.join_next().await {
        let (i, out) = r.unwrap();
        assert_eq!(out.status, Status::Ok, "{i}: {:?}", out.error);
        // $$ is 2: every job is the first program of its own pid namespace.
        assert_eq!(out.stdout, format!("payload-{i} {i} 2\n"));
        assert_eq!(out.stderr, format!("err-{i}\n"));
        seen.insert(i);
    }
    assert_eq!(seen.len(), 200);
}

/// The cgroup path, on a fake cgroupfs tree: this host mounts cgroup v2 without delegating its
/// controllers to us, so a directory of plain files stands in for the node's cgroup. A job's
/// init and launcher (the process that becomes the program) are written to a cgroup of its
/// own, created with the job's limits before the job is handed over; an OOM kill the cgroup
/// reports becomes `memory_limit`; the cgroup is removed after the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_placed_in_a_cgroup_of_their_own_on_a_fake_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let mount = tmp.path().join("cgroup");
    let node = mount.join("forkbox.service");
    std::fs::create_dir_all(&node).unwrap();
    std::fs::write(node.join("cgroup.controllers"), "cpu io memory pids").unwrap();
    std::fs::write(node.join("cgroup.subtree_control"), "").unwrap();
    let mountinfo = tmp.path().join("mountinfo");
    std::fs::write(
        &mountinfo,
        format!(
            "35 22 0:30 / {} rw,nosuid - cgroup2 cgroup2 rw\n",
            mount.display()
        ),
    )
    .unwrap();
    let self_cgroup = tmp.path().join("self_cgroup");
    std::fs::write(&self_cgroup, "0::/forkbox.service\n").unwrap();
    let engine = tokio::task::spawn_blocking(move || {
        Engine::start(EngineConfig {
            zygote_exe: BIN.into(),
            slots: 1,
            cgroup: Some(CgroupSource {
                mountinfo,
                self_cgroup,
            }),
            ..EngineConfig::default()
        })
    })
    .await
    .unwrap()
    .expect("engine");
    assert_eq!(
        engine.mechanisms().cgroup,
        Delegation::Delegated(node.clone())
    );
    let job_dirs = || -> Vec<PathBuf> {
        std::fs::read_dir(&node)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("job-"))
            .collect()
    };
    for round in 0..2 {
        let job = Job {
            limits: Limits {
                memory_mb: Some(100),
                pids: Some(20),
                ..Limits::default()
            },
            ..Job::argv(["/bin/sleep", "0.777"])
        };
        let run = tokio::spawn({
            let engine = engine.clone();
            async move { engine.run(&job).await }
        });
        let mut program = Vec::new();
        assert!(
            wait_until(Duration::from_secs(10), || {
                program = host_pids_matching("sleep 0.777");
                !program.is_empty() && job_dirs().len() == 1
            }),
            "round {round}: no job cgroup, or no program: {:?}",
            job_dirs()
        );
        let dir = job_dirs().remove(0);
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
        // The fake file keeps the last pid written: the launcher's, which is the program's.
        assert_eq!(
            read("cgroup.procs"),
            program[0].to_string(),
            "round {round}"
        );
        assert_eq!(read("memory.max"), (100u64 << 20).to_string());
        assert_eq!(read("memory.swap.max"), "0");
        assert_eq!(read("pids.max"), "20");
        if round == 1 {
            // What the kernel writes after an OOM kill in the cgroup.
            std::fs::write(dir.join("memory.events"), "oom 1\noom_kill 1\n").unwrap();
        }
        let out = run.await.unwrap();
        let expected = [Status::Ok, Status::MemoryLimit][round];
        assert_eq!(out.status, expected, "round {round}: {:?}", out.error);
        assert!(
            job_dirs().is_empty(),
            "round {round}: the job cgroup was left"
        );
    }
}

#[test]
fn many_unprivileged_runs_in_parallel() {
    // The CLI as an ordinary user, 8 at a time, 40 runs: each its own engine and sandbox.
    let who = Identity::Unprivileged;
    let mut handles = Vec::new();
    for chunk in 0..5 {
        let mut children = Vec::new();
        for j in 0..8 {
            let n = chunk * 8 + j;
            let child = command(who)
                .args(["run", "--json", "-c", &format!("echo job-{n}")])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            children.push((n, child));
        }
        for (n, child) in children {
            let ran = finish(who, child.wait_with_output().unwrap());
            assert_eq!(ran.stdout(), format!("job-{n}\n"));
            handles.push(n);
        }
    }
    assert_eq!(handles.len(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_specs_get_clear_errors() {
    let engine = tokio::task::spawn_blocking(|| engine(1)).await.unwrap();
    let job = Job {
        files: [("/etc/passwd".to_owned(), FileData::Text("x".into()))].into(),
        ..Job::shell("true")
    };
    let out = engine.run(&job).await;
    assert_eq!(out.status, Status::Invalid);
    assert!(
        out.error
            .as_deref()
            .unwrap()
            .starts_with("files./etc/passwd: absolute paths are not allowed"),
        "{:?}",
        out.error
    );
    let job = Job {
        files: [("../x".to_owned(), FileData::Text("x".into()))].into(),
        ..Job::shell("true")
    };
    assert!(engine
        .run(&job)
        .await
        .error
        .unwrap()
        .contains("'..' is not allowed"));
    let job = Job {
        limits: Limits {
            pids: Some(0),
            ..Limits::default()
        },
        ..Job::shell("true")
    };
    assert!(engine
        .run(&job)
        .await
        .error
        .unwrap()
        .starts_with("limits.pids"));
    let e = Job::parse(br#"{"cmd":"true","timeout_ms":-1}"#, 1 << 20)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("timeout_ms: invalid value: integer `-1`"),
        "{e}"
    );
    // The CLI: a negative timeout and an absolute file path are refused before anything runs.
    let out = Command::new(BIN)
        .args(["run", "--timeout-ms", "-5", "--", "true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--timeout-ms") && stderr.contains("-5"),
        "{stderr}"
    );
    let out = Command::new(BIN)
        .args(["run", "--file", "/abs=/etc/hostname", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("absolute paths are not allowed"));
}

#[test]
fn rootfs_directory_replaces_the_allowlist() {
    // A minimal root filesystem: dash and the libraries it links.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let ldd = Command::new("ldd").arg("/bin/dash").output().unwrap();
    let mut files: Vec<PathBuf> = vec!["/bin/dash".into()];
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        if let Some(p) = line.split_whitespace().find(|w| w.starts_with('/')) {
            files.push(p.into());
        }
    }
    for f in &files {
        let real = std::fs::canonicalize(f).unwrap();
        for dest in [f.clone(), real.clone()] {
            let target = root.join(dest.strip_prefix("/").unwrap());
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            let _ = std::fs::copy(&real, &target);
        }
    }
    std::fs::create_dir_all(root.join("usr")).unwrap();
    std::fs::write(root.join("marker"), "from-the-image\n").unwrap();
    Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(root)
        .status()
        .unwrap();
    for who in identities() {
        let root_arg = root.to_str().unwrap();
        let out = command(who)
            .args(["run", "--json", "--rootfs", root_arg, "--", "/bin/dash", "-c", "read x < /marker; echo $x; echo > /newfile && echo wrote; [ -e /etc/passwd ] || echo no-host-etc"])
            .output()
            .unwrap();
        let ran = finish(who, out);
        assert_eq!(
            ran.status(),
            "ok",
            "{who:?}: {} {:?}",
            ran.err(),
            ran.json["error"]
        );
        assert_eq!(
            ran.stdout(),
            "from-the-image\nwrote\nno-host-etc\n",
            "{who:?}"
        );
        // Writes landed in RAM: the image is unchanged.
        assert!(!root.join("newfile").exists());
    }
}

#[test]
fn failed_isolation_step_fails_closed() {
    // A limit the kernel refuses to set (an open-files hard limit above the host's, which only
    // host privilege could raise): the rlimit step fails, and the program must not run.
    let hard = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .unwrap()
        .1;
    if hard >= 1 << 20 {
        println!("SKIPPED: fail-closed rlimit check (host NOFILE hard limit {hard} is at the job maximum)");
        return;
    }
    for who in identities() {
        let marker = format!("/tmp/forkbox-fail-closed-{}", std::process::id());
        let out = command(who)
            .args([
                "run",
                "--json",
                "--open-files",
                &(1u64 << 20).to_string(),
                "-c",
                &format!("echo ran; touch {marker}"),
            ])
            .output()
            .unwrap();
        let ran = finish(who, out);
        assert_eq!(ran.status(), "error", "{who:?}: {}", ran.stderr);
        assert_eq!(ran.code, 125);
        assert_eq!(ran.stdout(), "");
        let error = ran.json["error"].as_str().unwrap();
        assert!(
            error.contains("set-up failed") && error.contains("rlimit open files"),
            "{error}"
        );
    }
}

#[test]
fn check_reports_capabilities_and_mechanisms() {
    for who in identities() {
        let out = command(who).arg("check").output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{who:?}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for needle in [
            "user namespaces",
            "overlayfs",
            "seccomp",
            "pidfd",
            "cgroup v2 memory",
            "limit memory",
            "limit processes",
            "sandbox: /bin/true ran",
        ] {
            assert!(
                text.contains(needle),
                "{who:?}: missing {needle:?} in\n{text}"
            );
        }
    }
}
