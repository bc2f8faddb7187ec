//! Kernel state a job must not reach: new namespaces, host-wide socket families, event
//! monitoring, the sysctls of its own namespaces, the scheduler's autogroups of host processes,
//! memory kept in ipc objects, and what a network namespace remembers after its job.
//!
//! Run through `forkbox run --json` as host root and as `nobody` (via `runuser`), like the
//! main sandbox suite; the root variant is SKIPPED when the tests do not run as root.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

mod sandbox_support;

use sandbox_support::{forkbox as command, forkbox_argv, identities, timeout_args, Identity};

fn parse(who: Identity, out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "{who:?}: not JSON ({e}): stdout={stdout} stderr={}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Runs a Python program in a sandbox; its stdout must be one JSON document, returned.
fn python(who: Identity, opts: &[&str], program: &str) -> Value {
    let out = command(who)
        .arg("run")
        .arg("--json")
        .args(opts)
        .args(timeout_args(opts))
        .args(["--", "python3", "-c", program])
        .stdin(Stdio::null())
        .output()
        .expect("spawning forkbox");
    let outcome = parse(who, &out);
    assert_eq!(
        outcome["status"], "ok",
        "{who:?}: {} {}",
        outcome["stderr"], outcome["error"]
    );
    let stdout = outcome["stdout"].as_str().unwrap_or("");
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{who:?}: program output not JSON ({e}): {stdout}"))
}

const PRELUDE: &str = r#"
import ctypes, errno, json, os, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return r, ctypes.get_errno()
out = {}
"#;

// ---------------------------------------------------------------------------------------------
// Namespaces

#[test]
fn clone_with_any_namespace_flag_fails_with_eperm_and_clone3_with_enosys() {
    let program = format!(
        r#"{PRELUDE}
import subprocess, threading, multiprocessing
SIGCHLD = 17
flags = {{"NEWNS": 0x20000, "NEWCGROUP": 0x2000000, "NEWUTS": 0x4000000, "NEWIPC": 0x8000000,
         "NEWUSER": 0x10000000, "NEWPID": 0x20000000, "NEWNET": 0x40000000, "NEWTIME": 0x80,
         "NEWUSER|NEWNET|NEWUTS|NEWIPC": 0x10000000 | 0x40000000 | 0x4000000 | 0x8000000,
         "NEWUSER, high bits set": 0xffffffff00000000 | 0x10000000}}
for name, flag in flags.items():
    # A child made in spite of the policy leaves at once; its parent reaps it.
    r, e = sc(56, flag | SIGCHLD, 0, 0, 0, 0)
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
    out["clone " + name] = [r, e]
# clone3(struct clone_args {{flags, pidfd, child_tid, parent_tid, exit_signal, ...}}, 88)
for name, flag in (("plain", 0), ("NEWUSER", 0x10000000)):
    args = ctypes.create_string_buffer(struct.pack("11Q", flag, 0, 0, 0, SIGCHLD, 0, 0, 0, 0, 0, 0))
    r, e = sc(435, ctypes.addressof(args), 88)
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
    out["clone3 " + name] = [r, e]
# What programs do every day still works: threads, fork, vfork (posix_spawn), subprocess,
# multiprocessing.
seen = []
t = threading.Thread(target=lambda: seen.append("thread")); t.start(); t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
seen.append("fork %d" % os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
pid = os.posix_spawn("/bin/sh", ["sh", "-c", "exit 3"], os.environ)
seen.append("spawn %d" % os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
seen.append(subprocess.run(["echo", "sub"], capture_output=True, text=True).stdout.strip())
with multiprocessing.Pool(2) as p:
    seen.append("pool %d" % sum(p.map(abs, [-1, -2, -3])))
out["works"] = seen
print(json.dumps(out))
"#
    );
    for who in identities() {
        let got = python(who, &[], &program);
        let map = got.as_object().unwrap();
        for (label, v) in map {
            if label == "works" {
                continue;
            }
            let want = if label.starts_with("clone3") {
                libc::ENOSYS
            } else {
                libc::EPERM
            };
            assert_eq!(v[0], -1, "{who:?}: {label} made a child: {v}");
            assert_eq!(v[1], want, "{who:?}: {label} errno {v}");
        }
        assert_eq!(map.len(), 13, "{who:?}: {got}");
        assert_eq!(
            got["works"],
            serde_json::json!(["thread", "fork 7", "spawn 3", "sub", "pool 6"]),
            "{who:?}"
        );
    }
}

#[test]
fn node_and_go_threads_and_children_still_work() {
    let node = Path::new("/usr/bin/node").exists();
    let go = Path::new("/usr/bin/go").exists();
    if !node || !go {
        forkbox_testkit::skipped(format!("node or go missing (node {node}, go {go})"));
        return;
    }
    // libuv's thread pool and worker threads, and the Go runtime's threads, start through
    // clone3 where libc has it and fall back to clone on ENOSYS; children through vfork/clone.
    let script = r#"node -e '
const { Worker } = require("worker_threads");
const w = new Worker("require(\"worker_threads\").parentPort.postMessage(6*7)", { eval: true });
w.on("message", (m) => {
  require("fs").readFile("/etc/hostname", () => {
    console.log("node " + m + " " + require("child_process").execSync("echo child").toString().trim());
    w.terminate();
  });
});'
cd /tmp && printf 'package main
import ("fmt"; "os/exec"; "sync")
func main() {
  var wg sync.WaitGroup; n := 0; var mu sync.Mutex
  for i := 0; i < 16; i++ { wg.Add(1); go func() { defer wg.Done(); mu.Lock(); n++; mu.Unlock() }() }
  wg.Wait(); o, _ := exec.Command("echo", "child").Output(); fmt.Printf("go %%d %%s", n, o)
}
' > m.go && HOME=/tmp GOCACHE=/tmp/gocache GOFLAGS=-mod=mod go run m.go"#;
    for who in identities() {
        let out = command(who)
            .args([
                "run",
                "--json",
                "--memory-mb",
                "8192",
                "--max-memory-mb",
                "8192",
            ])
            .args(["--disk-mb", "512"])
            .args(["--timeout-ms", "120000", "-c", script])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let outcome = parse(who, &out);
        assert_eq!(outcome["status"], "ok", "{who:?}: {}", outcome["stderr"]);
        assert_eq!(
            outcome["stdout"], "node 42 child\ngo 16 child\n",
            "{who:?}: {}",
            outcome["stderr"]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Socket families, event monitoring, memfd

/// With a loopback network, Unix, IPv4, IPv6 and netlink sockets can be made; with none, Unix
/// alone. Every other family fails with EAFNOSUPPORT, whatever the type or the high bits.
#[test]
fn only_unix_inet_and_netlink_sockets_can_be_created() {
    let program = format!(
        r#"{PRELUDE}
refused = {{"VSOCK": 40, "PACKET": 17, "ALG": 38, "KEY": 15, "TIPC": 30, "RDS": 21,
           "BLUETOOTH": 31, "CAN": 29, "XDP": 44, "APPLETALK": 5, "X25": 9, "LLC": 26,
           "NFC": 39, "QIPCRTR": 42, "MCTP": 45, "beyond AF_MAX": 46}}
for name, family in refused.items():
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW):
        r, e = sc(41, family, kind, 0)
        if r >= 0:
            os.close(r)
        out["socket %s %d" % (name, kind)] = [r, e]
    r, e = sc(53, family, socket.SOCK_STREAM, 0, 0)
    out["socketpair " + name] = [r, e]
# The kernel reads the family as an int: a high half must not smuggle a family through.
r, e = sc(41, (1 << 32) | 40, socket.SOCK_STREAM, 0)
out["socket VSOCK, high bits set"] = [r, e]
allowed = []
for family, kind in ((socket.AF_UNIX, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_DGRAM),
                     (socket.AF_INET6, socket.SOCK_DGRAM), (socket.AF_NETLINK, socket.SOCK_RAW)):
    try:
        with socket.socket(family, kind) as s:
            allowed.append(int(s.family))
    except OSError as e:
        out["socket %d" % family] = [-1, e.errno]
pair = ctypes.create_string_buffer(8)
for family in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK):
    out["socketpair %d" % family] = list(sc(53, family, socket.SOCK_DGRAM, 0, ctypes.addressof(pair)))
a, b = socket.socketpair()
a.sendall(b"x"); allowed.append(b.recv(1).decode())
out["allowed"] = allowed
print(json.dumps(out))
"#
    );
    for (network, allowed, refused) in [
        ("none", serde_json::json!([1, "x"]), 3 + 3),
        ("loopback", serde_json::json!([1, 2, 10, 16, "x"]), 0),
    ] {
        for who in identities() {
            let got = python(who, &["--network", network], &program);
            let map = got.as_object().unwrap();
            let mut failed = 0;
            for (label, v) in map {
                if label == "allowed" {
                    continue;
                }
                if label.starts_with("socketpair ") && label[11..].parse::<i32>().is_ok() {
                    // socketpair of an inet or netlink family: EOPNOTSUPP from the kernel
                    // where it is allowed, refused by the filter where it is not.
                    if v[1] == libc::EOPNOTSUPP && network == "loopback" {
                        continue;
                    }
                }
                assert_eq!(v[0], -1, "{who:?} {network}: {label} made a socket: {v}");
                assert_eq!(
                    v[1],
                    libc::EAFNOSUPPORT,
                    "{who:?} {network}: {label} errno {v}"
                );
                failed += 1;
            }
            assert_eq!(failed, 16 * 5 + 1 + refused, "{who:?} {network}: {got}");
            assert_eq!(got["allowed"], allowed, "{who:?} {network}");
        }
    }
}

#[test]
fn inotify_and_memfd_are_unavailable_and_programs_fall_back() {
    let program = format!(
        r#"{PRELUDE}
import subprocess
out["inotify_init"] = sc(253)
out["inotify_init1"] = sc(294, 0)
out["fanotify_init"] = sc(300, 0x100, 0)
out["memfd_create"] = sc(319, ctypes.addressof(ctypes.create_string_buffer(b"x")), 0)
try:
    os.memfd_create("hog")
    out["os.memfd_create"] = "created"
except OSError as e:
    out["os.memfd_create"] = e.errno
# tail -f falls back to polling without inotify: a line appended later still shows.
with open("/tmp/log", "w") as f:
    f.write("one\n")
tail = subprocess.Popen(["tail", "-f", "-s", "0.05", "/tmp/log"], stdout=subprocess.PIPE, text=True)
first = tail.stdout.readline()
with open("/tmp/log", "a") as f:
    f.write("two\n")
second = tail.stdout.readline()
tail.kill()
out["tail"] = [first.strip(), second.strip()]
print(json.dumps(out))
"#
    );
    for who in identities() {
        let got = python(who, &[], &program);
        for (call, want) in [
            ("inotify_init", libc::ENOSYS),
            ("inotify_init1", libc::ENOSYS),
            ("fanotify_init", libc::EPERM),
            ("memfd_create", libc::ENOSYS),
        ] {
            assert_eq!(got[call], serde_json::json!([-1, want]), "{who:?}: {call}");
        }
        assert_eq!(got["os.memfd_create"], libc::ENOSYS, "{who:?}");
        assert_eq!(got["tail"], serde_json::json!(["one", "two"]), "{who:?}");
    }
}

#[test]
fn dnotify_and_kernel_aio_are_unavailable_and_other_fcntl_calls_work() {
    let program = format!(
        r#"{PRELUDE}
import fcntl
d = os.open("/usr/bin", os.O_RDONLY | os.O_DIRECTORY)
out["F_NOTIFY"] = sc(72, d, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_MULTISHOT)
# The command is an int: a high half must not carry F_NOTIFY past the filter.
out["F_NOTIFY, high bits set"] = sc(72, d, (1 << 32) | fcntl.F_NOTIFY, fcntl.DN_ACCESS)
try:
    fcntl.fcntl(d, fcntl.F_NOTIFY, fcntl.DN_ACCESS)
    out["fcntl.F_NOTIFY"] = "watching"
except OSError as e:
    out["fcntl.F_NOTIFY"] = e.errno
ctx = ctypes.c_ulong(0)
out["io_setup"] = sc(206, 1, ctypes.addressof(ctx))
# fcntl's other commands, and locks on the job's own files, are untouched.
out["F_GETFD"] = fcntl.fcntl(d, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
with open("/tmp/lock", "w") as f:
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    out["locks"] = "held"
print(json.dumps(out))
"#
    );
    for who in identities() {
        let got = python(who, &[], &program);
        assert_eq!(
            got["F_NOTIFY"],
            serde_json::json!([-1, libc::EINVAL]),
            "{who:?}"
        );
        assert_eq!(
            got["F_NOTIFY, high bits set"],
            serde_json::json!([-1, libc::EINVAL]),
            "{who:?}"
        );
        assert_eq!(got["fcntl.F_NOTIFY"], libc::EINVAL, "{who:?}");
        assert_eq!(
            got["io_setup"],
            serde_json::json!([-1, libc::ENOSYS]),
            "{who:?}"
        );
        assert_eq!(got["F_GETFD"], 1, "{who:?}");
        assert_eq!(got["locks"], "held", "{who:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// /proc/sys and ipc memory

#[test]
fn proc_sys_is_read_only_to_the_job() {
    // Every one of these is writable by a user namespace's root for namespaces it owns (ipc,
    // mqueue, uts, user) or whose owner maps to the same host id (net).
    let program = format!(
        r#"{PRELUDE}
for path, value in (("kernel/msgmnb", "536870912"), ("kernel/shmmax", "1099511627776"),
                    ("kernel/shmall", "1099511627776"), ("kernel/msgmni", "32000"),
                    ("kernel/sem", "32000 1024000000 500 32000"),
                    ("fs/mqueue/queues_max", "1024"), ("fs/mqueue/msg_max", "1000"),
                    ("kernel/hostname", "evil"), ("net/ipv4/ip_unprivileged_port_start", "0"),
                    ("user/max_inotify_instances", "1")):
    full = "/proc/sys/" + path
    before = open(full).read()
    try:
        with open(full, "w") as f:
            f.write(value)
        result = "written"
    except OSError as e:
        result = e.errno
    out[path] = [result, open(full).read() == before]
print(json.dumps(out))
"#
    );
    for who in identities() {
        let got = python(who, &[], &program);
        let map = got.as_object().unwrap();
        assert_eq!(map.len(), 10, "{who:?}");
        for (path, v) in map {
            assert_eq!(v[0], libc::EROFS, "{who:?}: {path}: {v}");
            assert_eq!(v[1], true, "{who:?}: {path} changed");
        }
    }
}

/// Holds as much as it can (up to `cap` bytes) in each kind of ipc object and reports how much
/// it got and the errno that stopped it.
const IPC_HOGS: &str = r#"
cap = CAP
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
IPC_PRIVATE, IPC_CREAT, IPC_NOWAIT, IPC_STAT, IPC_SET = 0, 0o1000, 0o4000, 2, 1
def err():
    return ctypes.get_errno()
# SysV shared memory: 4 MiB segments, each filled and detached (the memory stays).
held, why = 0, None
while held < cap:
    ctypes.set_errno(0)
    shm = libc.shmget(IPC_PRIVATE, 4 << 20, IPC_CREAT | 0o600)
    if shm < 0:
        why = err(); break
    addr = libc.shmat(shm, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        why = err(); break
    ctypes.memset(addr, 1, 4 << 20)
    libc.shmdt(ctypes.c_void_p(addr))
    held += 4 << 20
out["shm"] = [held, why]
ctypes.set_errno(0)
out["shm one segment of the whole cap"] = [libc.shmget(IPC_PRIVATE, cap, IPC_CREAT | 0o600), err()]
# SysV message queues: first try to raise the limit for new queues, and one queue's own limit.
try:
    with open("/proc/sys/kernel/msgmnb", "w") as f:
        f.write(str(512 << 20))
    out["raise msgmnb"] = "written"
except OSError as e:
    out["raise msgmnb"] = e.errno
q = libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600)
ds = ctypes.create_string_buffer(120)
libc.msgctl(q, IPC_STAT, ds)
qbytes = struct.unpack_from("Q", ds, 88)[0]
out["qbytes is msgmnb"] = qbytes == int(open("/proc/sys/kernel/msgmnb").read())
struct.pack_into("Q", ds, 88, 512 << 20)
ctypes.set_errno(0)
out["raise qbytes"] = [libc.msgctl(q, IPC_SET, ds), err()]
msg = ctypes.create_string_buffer(struct.pack("q", 1) + b"m" * 8192)
held, why, queues = 0, None, [q]
while held < cap:
    ctypes.set_errno(0)
    if libc.msgsnd(queues[-1], msg, 8192, IPC_NOWAIT) == 0:
        held += 8192
        continue
    if err() != errno.EAGAIN:
        why = err(); break
    nq = libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600)
    if nq < 0:
        why = err(); break
    queues.append(nq)
out["msg"] = [held, why, len(queues)]
# SysV semaphores: sets of 250 until refused.
sems, why = 0, None
while sems < 1000000:
    ctypes.set_errno(0)
    if libc.semget(IPC_PRIVATE, 250, IPC_CREAT | 0o600) < 0:
        why = err(); break
    sems += 250
out["sem"] = [sems, why]
# POSIX message queues of the largest size allowed, until refused.
class attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long), ("cur", ctypes.c_long), ("pad", ctypes.c_long * 4)]
a = attr(0, 10, 2048, 0)
n, why = 0, None
while n < 4096:
    ctypes.set_errno(0)
    if libc.mq_open(("/q%d" % n).encode(), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a)) < 0:
        why = err(); break
    n += 1
out["mqueue"] = [n, why]
print(json.dumps(out))
"#;

#[test]
fn ipc_objects_are_stopped_near_the_memory_limit() {
    // With 64 MiB of memory: SysV shared memory up to half of it, message queues up to 16 of
    // 16 KiB, semaphores 4096, POSIX queues one of the largest size (the job's 32 KiB
    // `RLIMIT_MSGQUEUE`, then EMFILE). Without those bounds each hog runs to its cap of 256 MiB
    // (1 GiB and more, unbounded).
    let program = format!(
        "{PRELUDE}{}",
        IPC_HOGS.replace("CAP", &(256u64 << 20).to_string())
    );
    for who in identities() {
        let got = python(
            who,
            &[
                "--memory-mb",
                "64",
                "--disk-mb",
                "64",
                "--timeout-ms",
                "60000",
            ],
            &program,
        );
        let n = |v: &Value| v.as_u64().unwrap_or(u64::MAX);
        assert_eq!(
            got["shm"],
            serde_json::json!([32u64 << 20, libc::ENOSPC]),
            "{who:?}"
        );
        assert_eq!(
            got["shm one segment of the whole cap"],
            serde_json::json!([-1, libc::EINVAL]),
            "{who:?}"
        );
        assert_eq!(got["raise msgmnb"], libc::EROFS, "{who:?}");
        assert_eq!(got["qbytes is msgmnb"], true, "{who:?}");
        assert_eq!(
            got["raise qbytes"],
            serde_json::json!([-1, libc::EPERM]),
            "{who:?}"
        );
        let msg = &got["msg"];
        assert!(n(&msg[0]) <= 16 * 16384, "{who:?}: {msg}");
        assert_eq!(msg[1], libc::ENOSPC, "{who:?}: {msg}");
        assert_eq!(msg[2], 16, "{who:?}: {msg}");
        assert_eq!(
            got["sem"],
            serde_json::json!([4096 / 250 * 250, libc::ENOSPC]),
            "{who:?}"
        );
        assert_eq!(
            got["mqueue"],
            serde_json::json!([1, libc::EMFILE]),
            "{who:?}"
        );
    }
}

#[test]
fn ipc_limits_follow_the_jobs_own_memory_limit() {
    // A limit other than the node's default is set by the init before the job starts.
    let program = format!(
        r#"{PRELUDE}
for p in ("kernel/shmall", "kernel/shmmax", "kernel/msgmnb"):
    out[p] = int(open("/proc/sys/" + p).read())
print(json.dumps(out))
"#
    );
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .unwrap()
        .unwrap() as u64;
    for who in identities() {
        for mb in [64u64, 512, 2048] {
            let got = python(who, &["--memory-mb", &mb.to_string()], &program);
            assert_eq!(got["kernel/shmmax"], (mb << 20) / 2, "{who:?} {mb}");
            assert_eq!(got["kernel/shmall"], (mb << 20) / 2 / page, "{who:?} {mb}");
            assert_eq!(
                got["kernel/msgmnb"],
                (mb << 20) / 4 / 16 / 64,
                "{who:?} {mb}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Autogroups

/// `(autogroup line, nice)` of a host process, read from the host.
fn host_priority(pid: i32) -> (String, i32) {
    let group = std::fs::read_to_string(format!("/proc/{pid}/autogroup"))
        .unwrap()
        .trim()
        .to_owned();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let nice = after_comm.split(' ').nth(16).unwrap().parse().unwrap();
    (group, nice)
}

#[test]
fn autogroup_and_priority_writes_reach_only_the_jobs_own_processes() {
    if !Path::new("/proc/self/autogroup").exists() {
        forkbox_testkit::skipped("the kernel has no autogroups");
        return;
    }
    // Every process the job can see, and every way of naming them.
    // The kernel takes one autogroup write per 100 ms from the whole host (EAGAIN otherwise):
    // the job tries its own init's again until one lands.
    let job = "for p in /proc/[0-9]*; do echo 19 > $p/autogroup; done 2>/dev/null; \
               i=0; until echo 19 > /proc/1/autogroup; do i=$((i+1)); [ $i -lt 100 ] || break; \
               sleep 0.02; done 2>/dev/null; \
               renice -n 19 -p 1 >/dev/null 2>&1; renice -n 19 -u 0 >/dev/null 2>&1; \
               renice -n 19 -g 0 >/dev/null 2>&1; echo 17 > /proc/1/oom_score_adj; \
               echo 1 > /proc/1/timerslack_ns; cat /proc/1/autogroup";
    for who in identities() {
        let dir = tempfile::tempdir().unwrap();
        let out_path = dir.path().join("out.json");
        // The worker runs in a session of its own, whose leader outlives it: the session's
        // autogroup and the leader's priority are read from the host once the job is done.
        let mut argv = forkbox_argv(who);
        argv.extend(["run", "--json", "-c", job].map(String::from));
        let mut leader = Command::new("setsid")
            .arg("sh")
            .arg("-c")
            .arg(r#"out="$1"; shift; : > "$out.ready"; "$@" > "$out"; exec sleep 120"#)
            .arg("sh")
            .arg(&out_path)
            .args(&argv)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pid = leader.id() as i32;
        // The shell runs once `setsid` has returned, its autogroup attached: only then is the
        // leader's session its own and its autogroup the one to compare.
        let ready = dir.path().join("out.json.ready");
        assert!(sandbox_support::wait_until(Duration::from_secs(10), || {
            ready.exists()
        }));
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
        assert_eq!(after_comm.split(' ').nth(3), Some(pid.to_string().as_str()));
        let before = host_priority(pid);
        let done = sandbox_support::wait_until(Duration::from_secs(60), || {
            std::fs::read_to_string(&out_path)
                .ok()
                .and_then(|s| serde_json::from_str::<Value>(&s).ok())
                .is_some()
        });
        let after = host_priority(pid);
        let mine = host_priority(std::process::id() as i32);
        let _ = leader.kill();
        let _ = leader.wait();
        assert!(done, "{who:?}: the job did not finish");
        let outcome: Value =
            serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
        assert_eq!(outcome["status"], "ok", "{who:?}: {}", outcome["stderr"]);
        // The write took effect, on the sandbox's own autogroup.
        let inside = outcome["stdout"].as_str().unwrap();
        assert!(inside.ends_with("nice 19\n"), "{who:?}: {inside}");
        assert_eq!(after, before, "{who:?}: the worker's session was reniced");
        assert_eq!(after.1, 0, "{who:?}");
        // A process in the kernel's default autogroup (a session never made by `setsid`, as
        // under some CI supervisors) reads an empty file: that group is the root task group,
        // which no autogroup write can renice, so only a named group has a level to check.
        for (whose, (group, _)) in [("the worker's session", &after), ("the test's", &mine)] {
            assert!(
                group.is_empty() || group.ends_with("nice 0"),
                "{who:?}: {whose} autogroup is {group:?}"
            );
        }
    }
}

/// A node run at `oom_score_adj` -1000 (systemd's `OOMScoreAdjust=-1000`) passes none of it to
/// its jobs: a job runs at 1000, the host OOM killer's first choice. Under a node that holds
/// `CAP_SYS_RESOURCE` (host root with every capability) the zygote makes 0 the floor: a job may
/// go back to 0, never below, so it can never make itself unkillable. A rootless node's jobs can
/// go back as far as the node's own floor. Putting the node at -1000 takes that capability
/// too; where this test lacks it (a container's root) the node runs at the test's own value,
/// and the VM tier's guest, whose root has it, must run the whole case.
#[test]
fn jobs_are_the_oom_killers_first_choice_even_under_a_node_at_minus_1000() {
    // What the job reads, then what each write gives: `ok` or the errno's name.
    let job = "import errno, os\n\
               def adj(value=None):\n\
               \x20   if value is None:\n\
               \x20       return open('/proc/self/oom_score_adj').read().strip()\n\
               \x20   fd = os.open('/proc/self/oom_score_adj', os.O_WRONLY)\n\
               \x20   try:\n\
               \x20       os.write(fd, str(value).encode()); return 'ok'\n\
               \x20   except OSError as e:\n\
               \x20       return errno.errorcode[e.errno]\n\
               \x20   finally:\n\
               \x20       os.close(fd)\n\
               print(adj(), adj(-1000), adj(-1), adj(0), adj())";
    let at_minus_1000 = r#"echo -1000 > /proc/self/oom_score_adj 2>/dev/null || exit 3; exec "$@""#;
    for who in identities() {
        let mut argv = forkbox_argv(who);
        argv.extend(["run", "--json", "--", "python3", "-c", job].map(String::from));
        let wrapped = |script: &str| {
            Command::new("sh")
                .arg("-c")
                .arg(script)
                .arg("sh")
                .args(&argv)
                .stdin(Stdio::null())
                .output()
                .unwrap()
        };
        let mut out = wrapped(at_minus_1000);
        let node_at_minus_1000 = out.status.code() != Some(3);
        if !node_at_minus_1000 {
            assert!(
                !sandbox_support::emulated_guest(),
                "the VM guest's root could not set oom_score_adj -1000"
            );
            out = wrapped(r#"exec "$@""#);
        }
        let outcome = parse(who, &out);
        assert_eq!(outcome["status"], "ok", "{who:?}: {outcome}");
        let seen: Vec<&str> = outcome["stdout"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(seen.first(), Some(&"1000"), "{who:?}: {outcome}");
        if who == Identity::Root {
            // Below the floor refused, the floor itself taken.
            assert_eq!(
                seen[1..],
                ["EACCES", "EACCES", "ok", "0"],
                "{who:?}: {outcome}"
            );
        }
        println!("{who:?}, node at -1000: {node_at_minus_1000}; the job saw {seen:?}");
    }
}
