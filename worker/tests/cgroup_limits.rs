//! Limits on a host that delegates cgroup v2 to the node, checked on the real kernel: the VM
//! tier (`make test-vm`) runs this binary as root in a guest whose cgroup2 offers every
//! controller. Where this process has no delegated cgroup, each test prints why it is SKIPPED.
//!
//! Checked: delegation is detected and named; an out-of-memory kill is `memory_limit` and takes
//! the whole job; `--pids` stops a fork loop; two spinning threads get at most one CPU; the CPU
//! budget holds for the job as a whole; the node sits in its `supervisor` leaf and every job in
//! a cgroup of its own, removed after the job, deadline kills included; a node started inside a
//! delegated, non-root cgroup (as systemd's `Delegate=` gives it) works the same, and one that
//! shares its cgroup with another process says why it cannot use it.

mod limits_support;
mod sandbox_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use limits_support::{delegated_cgroup, installed, parse, run_argv};
use sandbox_support::{is_root, Identity, BIN};

/// The delegated cgroup of this (root) process, or why the test is skipped.
fn delegated(test: &str) -> Option<PathBuf> {
    if !is_root() {
        forkbox_testkit::skipped(format!(
            "{test}: the cgroup tests run as root (the VM tier)"
        ));
        return None;
    }
    match delegated_cgroup() {
        Ok(dir) => Some(dir),
        Err(reason) => {
            forkbox_testkit::skipped(format!(
                "{test}: no cgroup v2 delegation here ({reason}); `make test-vm` runs it"
            ));
            None
        }
    }
}

/// A deadline far beyond what any of these jobs needs: the emulated guest is slow, and a job
/// that ends at its deadline would hide the limit under test.
const SLOW_GUEST_TIMEOUT: &str = "300000";

fn root_run(opts: &[&str], argv: &[&str]) -> limits_support::Ran {
    let mut all = vec!["--timeout-ms", SLOW_GUEST_TIMEOUT];
    all.extend(opts);
    run_argv(Identity::Root, &all, argv)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// A process's cgroup, relative to the cgroup2 mount ("/" for the root).
fn cgroup_of(pid: u32) -> String {
    read(Path::new(&format!("/proc/{pid}/cgroup")))
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        .unwrap_or_default()
}

/// The job cgroups of the engine in process `pid`.
fn job_cgroups(dir: &Path, pid: u32) -> Vec<PathBuf> {
    let prefix = format!("job-{pid}-");
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = std::time::Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn_run(opts: &[&str], argv: &[&str]) -> Child {
    Command::new(BIN)
        .arg("run")
        .arg("--json")
        .args(opts)
        .arg("--")
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning forkbox run")
}

const PY_HOG: &str = "a = []\nwhile True: a.append(bytearray(1 << 20))";

#[test]
fn delegation_is_detected_and_named_by_check() {
    let Some(dir) = delegated("check") else {
        return;
    };
    let out = Command::new(BIN).arg("check").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for controller in ["memory", "pids", "cpu"] {
        let want = format!(
            "ok    cgroup v2 {controller}: delegated at {}",
            dir.display()
        );
        assert!(text.contains(&want), "no {want:?} in\n{text}");
    }
    for needle in [
        "limit memory       memory.max",
        "limit processes    pids.max",
        "limit cpu time     cpu.stat",
    ] {
        assert!(text.contains(needle), "no {needle:?} in\n{text}");
    }
    assert!(!text.contains("RLIMIT_DATA"), "{text}");
    assert!(!text.contains("hint"), "{text}");
}

#[test]
fn out_of_memory_kills_are_memory_limit_with_the_cgroup_peak() {
    if delegated("memory.max").is_none() {
        return;
    }
    let ran = root_run(&["--memory-mb", "128"], &["python3", "-c", PY_HOG]);
    assert_eq!(ran.status(), "memory_limit", "{}", ran.dump());
    // memory.peak: the job reached its limit and no further.
    let peak = ran.u64("max_rss_kb");
    assert!((100 * 1024..=128 * 1024).contains(&peak), "{}", ran.dump());
    // One allocation beyond the limit: no rlimit refuses it, the OOM killer ends the job.
    let ran = root_run(
        &["--memory-mb", "128"],
        &[
            "python3",
            "-c",
            "b = bytearray(512 << 20); print('allocated')",
        ],
    );
    assert_eq!(
        (ran.status(), ran.stdout()),
        ("memory_limit", ""),
        "{}",
        ran.dump()
    );
    if installed("node") {
        let ran = root_run(
            &["--memory-mb", "128"],
            &[
                "node",
                "-e",
                "const a = []; for (;;) a.push(Buffer.alloc(1 << 20).fill(1))",
            ],
        );
        assert_eq!(ran.status(), "memory_limit", "{}", ran.dump());
    }
}

/// A python3 program that writes `disk` MiB to a file on the job's disk, then fills `shm` MiB
/// of SysV shared memory and detaches it (the segment lives on in the job's ipc namespace,
/// mapped by no process), and prints what it holds.
fn holder(disk: u64, shm: u64) -> String {
    format!(
        "import ctypes\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         libc.shmat.restype = ctypes.c_void_p\n\
         libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]\n\
         libc.shmdt.argtypes = [ctypes.c_void_p]\n\
         MiB = 1 << 20\n\
         with open('/tmp/fill', 'wb') as f:\n\
         \x20   for _ in range({disk}):\n\
         \x20       f.write(b'\\1' * MiB)\n\
         if {shm}:\n\
         \x20   sid = libc.shmget(0, {shm} * MiB, 0o1600)\n\
         \x20   assert sid >= 0, ctypes.get_errno()\n\
         \x20   addr = libc.shmat(sid, None, 0)\n\
         \x20   assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()\n\
         \x20   ctypes.memset(addr, 1, {shm} * MiB)\n\
         \x20   assert libc.shmdt(addr) == 0, ctypes.get_errno()\n\
         print('held', {disk}, {shm})\n"
    )
}

/// Memory a job holds outside its processes counts in its peak: files on its disk (tmpfs) and
/// SysV shared memory that no process maps any more. With cgroups the kernel charges them to
/// the job (`memory.peak`, `max_rss_kb`), and beyond `memory.max` they end the job as
/// `memory_limit` like any other memory. Without, the init adds what the job still holds when
/// it ends to its largest process's peak; the memory rlimit does not count them (their bound
/// is the disk and the ipc limits), so only the peak is checked there.
#[test]
fn memory_held_outside_the_jobs_processes_counts_in_its_peak() {
    let cgroups = is_root() && delegated_cgroup().is_ok();
    let opts = [
        "--memory-mb",
        "128",
        "--disk-mb",
        "200",
        "--file-size-mb",
        "200",
    ];
    let hold = |disk, shm| {
        let ran = root_run(&opts, &["python3", "-c", &holder(disk, shm)]);
        let said = format!("held {disk} {shm}\n");
        assert_eq!(
            (ran.status(), ran.stdout()),
            ("ok", said.as_str()),
            "{}",
            ran.dump()
        );
        ran
    };
    let base = hold(0, 0);
    let held = hold(30, 40);
    let grew_kb = held
        .u64("max_rss_kb")
        .saturating_sub(base.u64("max_rss_kb"));
    assert!(
        grew_kb >= 60 * 1024,
        "70 MiB held outside the process, the peak grew by {grew_kb} kB (cgroups: {cgroups}): \
         {} / {}",
        base.dump(),
        held.dump()
    );
    println!("measured: the peak grew by {grew_kb} kB (cgroups: {cgroups})");
    if !cgroups {
        return;
    }
    // 100 MiB on the disk (under the 200 MiB disk limit) and 60 MiB of shared memory (under
    // the ipc limit of half the memory limit) are over 128 MiB together.
    let over = root_run(&opts, &["python3", "-c", &holder(100, 60)]);
    assert_eq!(
        (over.status(), over.stdout()),
        ("memory_limit", ""),
        "{}",
        over.dump()
    );
}

/// memory.oom.group: a hog in a child process takes its idle parent with it, so the job ends
/// as `memory_limit` rather than running on to its deadline.
#[test]
fn an_out_of_memory_kill_takes_the_whole_job() {
    if delegated("memory.oom.group").is_none() {
        return;
    }
    let program = format!(
        "import os, time\nif os.fork() == 0:\n    {}\nelse:\n    time.sleep(120)",
        PY_HOG.replace('\n', "\n    ")
    );
    let ran = root_run(&["--memory-mb", "128"], &["python3", "-c", &program]);
    assert_eq!(ran.status(), "memory_limit", "{}", ran.dump());
}

#[test]
fn pids_max_stops_a_fork_loop_at_16() {
    if delegated("pids.max").is_none() {
        return;
    }
    let program = "import os\n\
                   r, w = os.pipe()\n\
                   n = 0\n\
                   while True:\n\
                   \x20   try:\n\
                   \x20       pid = os.fork()\n\
                   \x20   except OSError as e:\n\
                   \x20       print(n, e.errno)\n\
                   \x20       break\n\
                   \x20   if pid == 0:\n\
                   \x20       os.close(w); os.read(r, 1); os._exit(0)\n\
                   \x20   n += 1\n";
    let ran = root_run(&["--pids", "16"], &["python3", "-c", program]);
    // 16 tasks: the sandbox's init, the program and 14 children; then EAGAIN.
    assert_eq!(
        (ran.status(), ran.stdout()),
        ("ok", "14 11\n"),
        "{}",
        ran.dump()
    );
}

/// Two threads spinning until 3 s of their wall time have passed, then the CPU time the process
/// used meanwhile and that wall time in milliseconds (perl threads are OS threads with no
/// shared lock; perl's start-up is left out of both).
const SPIN_PL: &str = "use strict; use threads; use Time::HiRes qw(time);\n\
    my ($u0, $s0) = times; my $t0 = time;\n\
    my @t = map { threads->create(sub { my $n = 0; $n++ while time - $t0 < 3; $n }) } 1 .. 2;\n\
    $_->join for @t;\n\
    my ($u, $s) = times;\n\
    printf \"%.0f %.0f\\n\", ($u + $s - $u0 - $s0) * 1000, (time - $t0) * 1000;\n";

/// cpu.max: two threads spinning for 3 s of their own wall time use about one CPU's worth of
/// it, not two (the guest has two CPUs).
#[test]
fn two_spinning_threads_get_at_most_one_cpu() {
    if delegated("cpu.max").is_none() {
        return;
    }
    let ran = root_run(&[], &["perl", "-e", SPIN_PL]);
    assert_eq!(ran.status(), "ok", "{}", ran.dump());
    let nums: Vec<f64> = ran
        .stdout()
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect();
    let [cpu_ms, wall_ms] = nums[..] else {
        panic!("{}", ran.dump());
    };
    println!("two spinning threads: {cpu_ms} ms CPU in {wall_ms} ms");
    // One CPU's worth, with a period of slack; two CPUs would give twice the wall time.
    assert!(cpu_ms <= wall_ms * 1.15 + 100.0, "{}", ran.dump());
    assert!(cpu_ms >= 100.0, "the threads did not spin: {}", ran.dump());
    // The job's own account (cpu.stat) agrees.
    assert!(
        ran.u64("cpu_ms") as f64 <= ran.json["duration_ms"].as_f64().unwrap() * 1.15 + 100.0,
        "{}",
        ran.dump()
    );
}

/// `cpu_ms` holds for the job as a whole (cpu.stat), not per process (RLIMIT_CPU): four
/// processes spinning share one budget of 2 s instead of getting 2 s each.
#[test]
fn the_cpu_budget_holds_across_processes() {
    if delegated("cpu.stat").is_none() {
        return;
    }
    let ran = root_run(
        &["--cpu-ms", "2000"],
        &[
            "bash",
            "-c",
            "spin() { while :; do :; done; }; spin & spin & spin & spin & wait; echo survived",
        ],
    );
    assert_eq!(ran.status(), "cpu_limit", "{}", ran.dump());
    assert_eq!(ran.stdout(), "", "{}", ran.dump());
    // The budget per process would have let the four use 8 s; the kill lands within the
    // time the (slow) guest takes to deliver it.
    let cpu = ran.u64("cpu_ms");
    assert!((2000..4000).contains(&cpu), "{}", ran.dump());
}

/// While a job runs: the engine's process and its zygote are in the `supervisor` leaf, the job's
/// processes in a cgroup of its own with the job's limits. Afterwards the job's cgroup is gone,
/// whether the job exited, was killed at its deadline with children left, or ran out of memory.
#[test]
fn jobs_get_cgroups_of_their_own_removed_after_each_job() {
    let Some(dir) = delegated("job cgroups") else {
        return;
    };
    let child = spawn_run(
        &[
            "--memory-mb",
            "200",
            "--pids",
            "20",
            "--timeout-ms",
            "20000",
        ],
        &[
            "sh",
            "-c",
            "sleep 100 & sleep 100 & echo started; sleep 100",
        ],
    );
    let pid = child.id();
    let job = poll(Duration::from_secs(120), || {
        job_cgroups(&dir, pid)
            .into_iter()
            .find(|j| read(&j.join("cgroup.procs")).lines().count() >= 4)
    })
    .expect("the job's cgroup with its processes");
    assert_eq!(read(&job.join("memory.max")), (200u64 << 20).to_string());
    assert_eq!(read(&job.join("memory.swap.max")), "0");
    assert_eq!(read(&job.join("memory.oom.group")), "1");
    assert_eq!(read(&job.join("pids.max")), "20");
    assert_eq!(read(&job.join("cpu.max")), "100000 100000");
    let supervisor = dir.join("supervisor");
    let rel = |p: &Path| {
        let mount = Path::new("/sys/fs/cgroup");
        format!("/{}", p.strip_prefix(mount).unwrap().display()).replace("//", "/")
    };
    assert_eq!(cgroup_of(pid), rel(&supervisor), "the engine's process");
    let zygotes = read(Path::new(&format!("/proc/{pid}/task/{pid}/children")));
    assert!(!zygotes.is_empty(), "no zygote under {pid}");
    for z in zygotes.split_whitespace() {
        assert_eq!(
            cgroup_of(z.parse().unwrap()),
            rel(&supervisor),
            "zygote {z}"
        );
    }
    for p in read(&job.join("cgroup.procs")).lines() {
        assert_eq!(cgroup_of(p.parse().unwrap()), rel(&job), "job process {p}");
    }
    let ran = parse(Identity::Root, child.wait_with_output().unwrap());
    assert_eq!(ran.status(), "timeout", "{}", ran.dump());
    assert!(
        job_cgroups(&dir, pid).is_empty(),
        "left after a deadline kill: {:?}",
        job_cgroups(&dir, pid)
    );

    for (argv, status) in [
        (&["true"][..], "ok"),
        (&["python3", "-c", PY_HOG][..], "memory_limit"),
    ] {
        let child = spawn_run(
            &["--memory-mb", "128", "--timeout-ms", SLOW_GUEST_TIMEOUT],
            argv,
        );
        let pid = child.id();
        let ran = parse(Identity::Root, child.wait_with_output().unwrap());
        assert_eq!(ran.status(), status, "{}", ran.dump());
        assert!(job_cgroups(&dir, pid).is_empty(), "left after {argv:?}");
    }
}

/// A cgroup made for this test below the delegated one, with the controllers enabled for it,
/// as systemd creates a unit's cgroup with `Delegate=`; removed on drop.
struct Slice {
    dir: PathBuf,
}

impl Slice {
    fn new(parent: &Path, name: &str) -> Result<Slice, String> {
        let control = parent.join("cgroup.subtree_control");
        std::fs::write(&control, "+memory +pids +cpu")
            .map_err(|e| format!("enable controllers in {}: {e}", control.display()))?;
        let dir = parent.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        Ok(Slice { dir })
    }

    /// Two slices, for two node starts: a node leaves its cgroup an inner node (controllers
    /// enabled for its children), where no process may be placed again, as systemd recreates a
    /// unit's cgroup for each start. `None`, said as the skip of `test`, only where this
    /// process's own cgroup holds other processes (not the root).
    fn two(parent: &Path, name: &str, test: &str) -> Option<[Slice; 2]> {
        match ["a", "b"].map(|s| Slice::new(parent, &format!("{name}-{s}"))) {
            [Ok(a), Ok(b)] => Some([a, b]),
            slices => {
                forkbox_testkit::skipped(format!("{test}: {:?}", slices.map(|s| s.err())));
                None
            }
        }
    }

    /// `sh` moves itself into the slice, then runs `cmd` there.
    fn command(&self, cmd: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && {cmd}",
                self.dir.display()
            ))
            .stdin(Stdio::null());
        c
    }
}

impl Drop for Slice {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for p in procs.split_whitespace() {
                let _ = Command::new("kill").args(["-9", p]).status();
            }
        }
        let _ = poll(Duration::from_secs(10), || {
            let _ = std::fs::remove_dir(self.dir.join("supervisor"));
            std::fs::remove_dir(&self.dir).ok()
        });
    }
}

#[test]
fn a_node_in_a_delegated_non_root_cgroup_works_the_same() {
    let Some(parent) = delegated("non-root cgroup") else {
        return;
    };
    let Some([slice, second]) = Slice::two(&parent, "forkbox-delegated", "non-root cgroup") else {
        return;
    };
    let argv =
        format!("exec {BIN} run --json --memory-mb 128 --timeout-ms {SLOW_GUEST_TIMEOUT} -- ");
    let out = slice
        .command(&format!("{argv} cat /proc/self/cgroup"))
        .output()
        .unwrap();
    let ran = parse(Identity::Root, out);
    let rel = format!(
        "0::/{}/job-",
        slice.dir.strip_prefix("/sys/fs/cgroup").unwrap().display()
    );
    assert_eq!(ran.status(), "ok", "{}", ran.dump());
    assert!(ran.stdout().starts_with(&rel), "{}", ran.dump());
    let out = second
        .command(&format!("{argv} python3 -c '{PY_HOG}'"))
        .output()
        .unwrap();
    let ran = parse(Identity::Root, out);
    assert_eq!(ran.status(), "memory_limit", "{}", ran.dump());
    for s in [&slice, &second] {
        // The node's pre-warmed sandboxes end after it, as their channels close.
        let procs = s.dir.join("supervisor/cgroup.procs");
        assert!(
            poll(Duration::from_secs(120), || read(&procs)
                .is_empty()
                .then_some(()))
            .is_some(),
            "the node's leaf still holds processes: {}",
            read(&procs)
        );
        let jobs: Vec<_> = std::fs::read_dir(&s.dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("job-"))
            .map(|e| e.path())
            .collect();
        assert!(jobs.is_empty(), "job cgroups left: {jobs:?}");
    }
}

/// The node's own cgroup at its limit (an operator's `MemoryMax=` on the unit) while the job is
/// still under its own: the kernel's OOM killer, choosing among the node's processes, takes the
/// job (sandboxes rank first), the node carries on, and the job's result says it was killed for
/// memory outside its limit, not `memory_limit`.
#[test]
fn a_node_cgroup_at_its_limit_kills_the_job_but_not_as_its_memory_limit() {
    let Some(parent) = delegated("node cgroup at its limit") else {
        return;
    };
    // The second node start prints for a person.
    let Some([slice, second]) =
        Slice::two(&parent, "forkbox-node-limit", "node cgroup at its limit")
    else {
        return;
    };
    for s in [&slice, &second] {
        std::fs::write(s.dir.join("memory.max"), (160u64 << 20).to_string()).unwrap();
        std::fs::write(s.dir.join("memory.swap.max"), "0").unwrap();
    }
    let run = |s: &Slice, json: &str| {
        s.command(&format!(
            "exec {BIN} run {json} --memory-mb 512 --timeout-ms {SLOW_GUEST_TIMEOUT} -- \
             python3 -c '{PY_HOG}'"
        ))
        .output()
        .unwrap()
    };
    let ran = parse(Identity::Root, run(&slice, "--json"));
    assert_eq!(
        (ran.status(), ran.json["signal"].as_i64()),
        ("signaled", Some(9)),
        "{}",
        ran.dump()
    );
    let error = ran.json["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("not this job's memory limit"),
        "{}",
        ran.dump()
    );
    // Killed near the node's limit, far below its own.
    assert!(ran.u64("max_rss_kb") < 160 * 1024, "{}", ran.dump());
    println!("the node's cgroup at 160 MiB: {}", ran.dump());
    // Without --json, the reason is said after the program's own output.
    let out = run(&second, "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{stderr}");
    assert!(
        stderr.contains("forkbox: killed by the kernel's OOM killer"),
        "{stderr}"
    );
}

/// A cgroup shared with another process cannot hand out job cgroups (the kernel's "no internal
/// processes" rule): the node says so, with the fix, and falls back to rlimits.
#[test]
fn a_shared_cgroup_is_refused_with_the_reason() {
    let Some(parent) = delegated("shared cgroup") else {
        return;
    };
    let slice = match Slice::new(&parent, "forkbox-shared") {
        Ok(s) => s,
        Err(e) => {
            forkbox_testkit::skipped(format!("shared cgroup: {e}"));
            return;
        }
    };
    // The shell stays in the slice beside the node.
    let out = slice
        .command(&format!("{BIN} check; echo exit=$?"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("exit=0"), "{text}");
    assert!(text.contains("holds other processes"), "{text}");
    assert!(text.contains("Delegate="), "{text}");
    assert!(
        text.contains("limit memory       one budget for the whole sandbox"),
        "{text}"
    );
}
