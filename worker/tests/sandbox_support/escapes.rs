//! The escape checks every sandbox must pass, a job's and a session's alike: each is a
//! program (a shell script or Python) and a check of what it printed. The job battery
//! (`sandbox.rs`) runs them through `forkbox run`, the session tests (`session_engine.rs`)
//! through a session's `exec` and `run_code`, as root and as `nobody`: one list, so a check
//! added here holds for both.

use forkbox_queue::Network;
use serde_json::Value;

/// What an escape check runs.
pub enum Program {
    /// A `/bin/sh` script.
    Shell(String),
    /// A Python program (it also runs as a session's cell as it is).
    Python(String),
}

/// Reads a check's standard output; `Err` says what got through.
pub type Check = Box<dyn Fn(&str) -> Result<(), String>>;

/// One escape check: a program, and what its standard output must show.
pub struct Escape {
    pub name: &'static str,
    pub program: Program,
    pub check: Check,
}

impl Escape {
    /// The argv of a command that runs the program.
    pub fn argv(&self) -> Vec<String> {
        match &self.program {
            Program::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
            Program::Python(p) => vec!["python3".into(), "-c".into(), p.clone()],
        }
    }

    /// The program as a Python cell: Python as it is, a script through `/bin/sh` with its
    /// output printed.
    pub fn cell(&self) -> String {
        match &self.program {
            Program::Python(p) => p.clone(),
            Program::Shell(s) => format!(
                "import subprocess as _sp, sys as _sys\n\
                 _sys.stdout.write(_sp.run(['/bin/sh', '-c', {}], capture_output=True, \
                 text=True).stdout)",
                serde_json::to_string(s).unwrap()
            ),
        }
    }
}

/// The check named `name` of [`escapes`].
pub fn escape(network: Network, name: &str) -> Escape {
    escapes(network)
        .into_iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no escape check {name}"))
}

/// Every escape check, for a sandbox of `network`.
pub fn escapes(network: Network) -> Vec<Escape> {
    vec![
        allow_list(),
        denied_calls(),
        capabilities(),
        host_files(),
        proc_views(network),
        privileged_calls(),
    ]
}

/// `[return value, errno]` pairs by label, as the Python checks print them.
fn pairs(stdout: &str) -> Result<serde_json::Map<String, Value>, String> {
    let line = stdout.trim().lines().last().unwrap_or_default();
    serde_json::from_str(line).map_err(|e| format!("not the check's JSON ({e}): {stdout}"))
}

fn expect(got: &serde_json::Map<String, Value>, label: &str, want: [i64; 2]) -> Result<(), String> {
    match got.get(label) {
        Some(v) if *v == serde_json::json!(want) => Ok(()),
        other => Err(format!("{label}: {other:?}, not {want:?}")),
    }
}

const SYSCALL_PRELUDE: &str = r#"
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return [r, ctypes.get_errno()]
"#;

/// The policy is an allow list: a call it does not list fails with ENOSYS, as on a kernel
/// without it (a number no kernel has yet, `sethostname`, `uselib`), `personality` sets only
/// Docker's personas, and the calls Docker's profile refuses without capabilities fail with
/// EPERM.
fn allow_list() -> Escape {
    let program = format!(
        r#"{SYSCALL_PRELUDE}
print(json.dumps({{
    "unknown 600": sc(600),
    "sethostname": sc(170, 0, 0),
    "uselib": sc(134, 0),
    "personality ADDR_NO_RANDOMIZE": sc(135, 0x0040000),
    "personality READ_IMPLIES_EXEC": sc(135, 0x0400000),
    "personality query": sc(135, 0xffffffff),
    "kcmp": sc(312, 1, 1, 0, 0, 0),
    "get_mempolicy": sc(239, 0, 0, 0, 0, 0),
    "futex_waitv": sc(449, 0, 0, 0, 0, 0),
    "landlock_create_ruleset": sc(444, 0, 0, 1),
}}))
"#
    );
    Escape {
        name: "allow_list",
        program: Program::Python(program),
        check: Box::new(|out| {
            let got = pairs(out)?;
            for call in [
                "unknown 600",
                "sethostname",
                "uselib",
                "personality ADDR_NO_RANDOMIZE",
                "personality READ_IMPLIES_EXEC",
            ] {
                expect(&got, call, [-1, libc::ENOSYS as i64])?;
            }
            // The query returns the current persona, Linux (0).
            expect(&got, "personality query", [0, 0])?;
            for call in [
                "kcmp",
                "get_mempolicy",
                "futex_waitv",
                "landlock_create_ruleset",
            ] {
                expect(&got, call, [-1, libc::EPERM as i64])?;
            }
            Ok(())
        }),
    }
}

/// Every call the policy denies fails with EPERM, and so does its x32 number.
fn denied_calls() -> Escape {
    let calls = forkbox::sandbox::denied_numbers().unwrap();
    let n = calls.len();
    let list = serde_json::to_string(&calls).unwrap();
    let program = format!(
        r#"{SYSCALL_PRELUDE}
out = {{}}
for name, nr in json.loads('{list}'):
    for label, number in ((name, nr), ("x32:" + name, nr | 0x40000000)):
        out[label] = sc(number, 0, 0, 0, 0, 0, 0)
print(json.dumps(out))
"#
    );
    Escape {
        name: "denied_calls",
        program: Program::Python(program),
        check: Box::new(move |out| {
            let got = pairs(out)?;
            if got.len() != n * 2 {
                return Err(format!("{} results for {n} calls", got.len()));
            }
            for label in got.keys() {
                expect(&got, label, [-1, libc::EPERM as i64])?;
            }
            Ok(())
        }),
    }
}

/// No capability in any set, `no_new_privs`, and the seccomp filter on.
fn capabilities() -> Escape {
    Escape {
        name: "capabilities",
        program: Program::Shell(
            "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status".into(),
        ),
        check: Box::new(|out| {
            let fields: Vec<(&str, &str)> = out
                .lines()
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k, v.trim()))
                .collect();
            if fields.len() != 7 {
                return Err(format!("7 fields expected: {out}"));
            }
            for (k, v) in fields {
                let want = match k {
                    "NoNewPrivs" => "1",
                    "Seccomp" => "2",
                    _ => "0000000000000000",
                };
                if v != want {
                    return Err(format!("{k}: {v}, not {want}"));
                }
            }
            Ok(())
        }),
    }
}

/// The host's files are neither written (checked on the host too) nor read where the host
/// keeps them private.
fn host_files() -> Escape {
    const MARK: &str = "forkbox-escape-probe";
    Escape {
        name: "host_files",
        program: Program::Shell(format!(
            "echo {MARK} >> /etc/hosts; echo y > /usr/{MARK}; tail -1 /etc/hosts; \
             cat /etc/shadow >/dev/null 2>&1 && echo read:shadow; echo done"
        )),
        check: Box::new(|out| {
            use std::os::unix::fs::PermissionsExt;
            let shadow =
                std::fs::metadata("/etc/shadow").map_err(|e| format!("/etc/shadow: {e}"))?;
            if shadow.permissions().mode() & 0o004 != 0 {
                return Err(format!(
                    "the host's /etc/shadow is readable by every user (mode {:o}): nothing a \
                     job reads of it proves anything",
                    shadow.permissions().mode() & 0o7777
                ));
            }
            if std::fs::read_to_string("/etc/hosts").is_ok_and(|h| h.contains(MARK)) {
                return Err("the host's /etc/hosts was written".into());
            }
            if std::path::Path::new(&format!("/usr/{MARK}")).exists() {
                return Err(format!("/usr/{MARK} appeared on the host"));
            }
            if out.lines().any(|l| l == MARK || l == "read:shadow") || !out.ends_with("done\n") {
                return Err(format!("a write was visible or /etc/shadow read: {out}"));
            }
            Ok(())
        }),
    }
}

/// The sandbox's `/proc` shows its own few processes; pid 1 (its init) names no host path and
/// opens nothing to it; the host's private directories are absent; the host's Redis port is
/// out of reach as the sandbox's `network` says.
fn proc_views(network: Network) -> Escape {
    let tcp = super::host_tcp_errno(network).to_string();
    Escape {
        name: "proc_views",
        program: Program::Shell(
            "ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '; echo; \
             cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' ' | tr '\\n' ' '; echo; \
             tr '\\0' ' ' </proc/1/cmdline; echo; \
             for f in environ maps; do cat /proc/1/$f >/dev/null 2>&1 && echo open:$f; done; \
             for f in fd/0 root exe; do readlink /proc/1/$f >/dev/null 2>&1 && echo open:$f; done; \
             for d in /root /home /run /var /srv /sys; do [ -e $d ] && echo visible:$d; done; \
             (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && echo tcp-open; \
             python3 -c 'import socket\ntry: print(socket.socket().connect_ex((\"127.0.0.1\", 6379)))\nexcept OSError as e: print(e.errno)'"
                .into(),
        ),
        check: Box::new(move |out| {
            let lines: Vec<&str> = out.lines().collect();
            if lines.len() < 4 {
                return Err(format!("short output: {out}"));
            }
            let pids: Vec<i32> = lines[0]
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            // A few processes of its own (a session's calls leave its pid numbers higher).
            if !(pids.contains(&1) && pids.len() < 16) {
                return Err(format!("pids {pids:?}"));
            }
            if lines[1].trim() != "lo" {
                return Err(format!("interfaces {}", lines[1]));
            }
            // Anyone may read a process's command line: the init's names no host path.
            if lines[2].trim() != "forkbox __zygote" {
                return Err(format!("pid 1's command line: {}", lines[2]));
            }
            if out.contains("visible:") || out.contains("tcp-open") || out.contains("open:") {
                return Err(out.to_owned());
            }
            if lines.last().unwrap().trim() != tcp {
                return Err(format!("the host's Redis: {}, not errno {tcp}", lines.last().unwrap()));
            }
            Ok(())
        }),
    }
}

/// What needs a capability, or reaches past the sandbox's namespaces, fails: mounts and
/// unmounts, new namespaces and joining one, tracing, device nodes, sysctl writes, and a
/// signal to a process outside its pid namespace (this test's own, by its host pid).
fn privileged_calls() -> Escape {
    let host_pid = std::process::id();
    let program = format!(
        r#"{SYSCALL_PRELUDE}
def call(f, *args):
    ctypes.set_errno(0)
    r = f(*args)
    return [r, ctypes.get_errno()]
def os_errno(f, *args):
    try:
        f(*args)
        return [0, 0]
    except OSError as e:
        return [-1, e.errno]
out = {{}}
out["mount tmpfs"] = call(libc.mount, b"none", b"/tmp", b"tmpfs", ctypes.c_ulong(0), None)
out["remount / rw"] = call(libc.mount, None, b"/", None, ctypes.c_ulong(32), None)
out["umount /proc"] = call(libc.umount2, b"/proc", 2)
for name, flag in (("user", 0x10000000), ("mnt", 0x20000), ("net", 0x40000000),
                   ("pid", 0x20000000), ("uts", 0x4000000), ("ipc", 0x8000000),
                   ("cgroup", 0x2000000)):
    out["unshare " + name] = call(libc.unshare, flag)
for ns in ("mnt", "net", "user", "pid", "uts"):
    try:
        fd = os.open("/proc/1/ns/" + ns, os.O_RDONLY)
    except OSError:
        fd = os.open("/proc/self/ns/" + ns, os.O_RDONLY)
    out["setns " + ns] = call(libc.setns, fd, 0)
    os.close(fd)
out["ptrace attach 1"] = sc(101, 16, 1, 0, 0)
out["process_vm_readv 1"] = sc(310, 1, 0, 0, 0, 0, 0)
out["mknod char 1,3"] = os_errno(os.mknod, "/tmp/forkbox-null", 0o20666, os.makedev(1, 3))
out["open /dev/mem"] = os_errno(os.open, "/dev/mem", os.O_RDONLY)
out["open /dev/kmsg"] = os_errno(os.open, "/dev/kmsg", os.O_RDONLY)
for sysctl in ("kernel/hostname", "kernel/ns_last_pid", "vm/drop_caches"):
    out["write sysctl " + sysctl] = os_errno(lambda p: open(p, "w").write("1\n"), "/proc/sys/" + sysctl)
out["kill host pid"] = os_errno(os.kill, {host_pid}, 0)
print(json.dumps(out))
"#
    );
    Escape {
        name: "privileged_calls",
        program: Program::Python(program),
        check: Box::new(|out| {
            let got = pairs(out)?;
            if got.len() < 24 {
                return Err(format!("{} results: {out}", got.len()));
            }
            for (label, v) in &got {
                let (r, errno) = (v[0].as_i64(), v[1].as_i64().unwrap_or(0));
                if r != Some(-1) || errno == 0 {
                    return Err(format!("{label} was allowed: {v}"));
                }
            }
            // This process is not in the sandbox's pid namespace: there is no such process.
            expect(&got, "kill host pid", [-1, libc::ESRCH as i64])
        }),
    }
}
