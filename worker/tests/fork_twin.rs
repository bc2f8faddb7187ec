//! The twin copy, end to end with real sandboxes: a warm Python job A builds state and forks a
//! branch F that stops itself; a second warm job B of the same engine stops itself (T); the
//! copy makes T a copy of F. T then computes what F computes, with fresh randomness, on B's
//! own files, and with every isolation step of B's sandbox still on. Run by host root and by
//! `nobody` (the rootless node).

mod sandbox_support;

use std::time::Duration;

use forkbox::sandbox::{make_twin, Engine, TwinError, TwinLimits};
use forkbox_queue::schema::{FileData, Job, Outcome, Runtime};
use nix::unistd::Pid;
use sandbox_support::session::{warm_engine, zygote};
use serde_json::Value;

/// Job A: the session's state, then a branch that stops itself and, once continued (as F or
/// as a twin made from F), prints what its state computes. argv: token, MiB of state.
const SESSION: &str = r#"
import os, sys, signal, random, re, hashlib, json, socket
tok, mb = sys.argv[1], int(sys.argv[2])
try:
    import numpy as np
except ImportError:
    np = None
import decimal  # imported at run time: a C extension mapped after the sandbox was made

class Account:
    def __init__(self): self.total = 0
    def add(self, x):
        self.total += x
        return self.total

def counter():
    i = 0
    while True:
        i += 1
        yield i * i

g = {"d": {f"k{i}": "v" * (i % 50) + str(i) for i in range(mb * 6000)}}
g["arr"] = np.arange(mb * 1024 * 16, dtype=np.int64) if np is not None else None
g["gen"] = counter(); next(g["gen"])
g["rx"] = re.compile(r"[a-z](\d+)")
base = 41
g["clo"] = lambda x: x + base
g["obj"] = Account(); g["obj"].add(5)
g["dec"] = decimal.Decimal(1) / decimal.Decimal(7)
g["f"] = open("data.bin", "rb"); g["f"].read(100)
g["log"] = open("log.txt", "a"); g["log"].write("A\n"); g["log"].flush()
g["sock"] = socket.socketpair()

def digest():
    h = hashlib.sha256()
    h.update(repr(sorted(g["d"].items())[:1000]).encode() + str(len(g["d"])).encode())
    if np is not None:
        h.update(g["arr"].tobytes())
    h.update(repr([next(g["gen"]) for _ in range(3)]).encode())
    h.update(repr(g["rx"].findall("a1 b22 c333")).encode())
    h.update(g["clo"](5).to_bytes(8, "little"))
    h.update(str(g["obj"].add(3)).encode() + str(g["dec"]).encode())
    h.update(g["f"].read(16))
    return h.hexdigest()[:16]

sys.stdout.flush()
pid = os.fork()
if pid == 0:
    with open("/proc/self/comm", "w") as c:
        c.write("F" + tok)
    os.kill(os.getpid(), signal.SIGSTOP)
    # A branch resumes here: as F, or as a twin made from F.
    random.seed()
    out = {"digest": digest(), "rand": repr(random.random()), "numpy": np is not None}
    g["log"].write(f"branch {out['rand']}\n"); g["log"].flush()
    out["log"] = open("log.txt").read()
    status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
    out["cap_eff"], out["seccomp"] = status["CapEff"].strip(), status["Seccomp"].strip()
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    out["unshare"] = (libc.unshare(0x10000000), ctypes.get_errno())
    print(json.dumps(out), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"parent_log": open("log.txt").read()}), flush=True)
"#;

/// Job B: a fresh fork of the same zygote that stops itself; it prints only if it resumes as
/// itself (the copy failed).
const TWIN: &str = r#"
import os, sys, signal
with open("/proc/self/comm", "w") as c:
    c.write("T" + sys.argv[1])
os.kill(os.getpid(), signal.SIGSTOP)
print("the twin resumed as itself", flush=True)
os._exit(3)
"#;

fn job(program: &str, args: &[&str]) -> Job {
    let mut argv = vec!["python3".to_owned(), "-c".to_owned(), program.to_owned()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let mut job = Job::argv(argv);
    job.runtime = Some(Runtime::Python);
    job.timeout_ms = Some(60_000);
    job.limits.memory_mb = Some(512);
    let data: String = (0..4096u32)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    job.files.insert("data.bin".into(), FileData::Text(data));
    job.files
        .insert("log.txt".into(), FileData::Text("init\n".into()));
    job
}

/// The host pid of the stopped process whose name is `comm`.
fn stopped(comm: &str) -> Option<Pid> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .map(|(_, r)| r.trim_start().chars().next());
        if name.trim() == comm && state == Some(Some('T')) {
            return Some(Pid::from_raw(pid));
        }
    }
    None
}

fn engine() -> Engine {
    warm_engine(&zygote("FORKBOX_TWIN_ZYGOTE"), 2)
}

fn lines(o: &Outcome) -> Vec<Value> {
    o.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}\n{}", o.stderr)))
        .collect()
}

/// The whole scenario, as whoever runs this process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_computes_what_the_frozen_branch_computes_in_its_own_sandbox() {
    let engine = tokio::task::spawn_blocking(engine).await.unwrap();
    let tok = format!("{:08x}", rand_u32());
    let a = job(SESSION, &[&tok, "20"]);
    let b = job(TWIN, &[&tok]);
    let copier = {
        let tok = tok.clone();
        tokio::task::spawn_blocking(move || {
            let mut found = (None, None);
            let ok = sandbox_support::wait_until(Duration::from_secs(60), || {
                found = (stopped(&format!("F{tok}")), stopped(&format!("T{tok}")));
                found.0.is_some() && found.1.is_some()
            });
            assert!(ok, "the branch and the twin did not both stop: {found:?}");
            let (f, t) = (found.0.unwrap(), found.1.unwrap());
            let mut limits = TwinLimits {
                memory_bytes: 1 << 20,
                timeout: Duration::from_secs(30),
                skip_identical: skip_identical(),
            };
            // Over the twin's limit: refused before the twin is touched, and it stays stopped.
            let refused = make_twin(f, t, &limits).unwrap_err();
            assert!(matches!(refused, TwinError::OverLimit { .. }), "{refused}");
            assert!(
                refused.to_string().contains("over the twin's limit"),
                "{refused}"
            );
            // Detached, it goes back into its stop.
            let waits = sandbox_support::wait_until(Duration::from_secs(10), || {
                stopped(&format!("T{tok}")) == Some(t)
            });
            let state = std::fs::read_to_string(format!("/proc/{t}/stat")).unwrap_or_default();
            assert!(waits, "the refused twin no longer waits: {state}");
            limits.memory_bytes = 512 << 20;
            // Past its deadline before the twin is changed: refused, and the twin waits on.
            let late = TwinLimits {
                timeout: Duration::ZERO,
                ..limits.clone()
            };
            let refused = make_twin(f, t, &late).unwrap_err();
            assert!(matches!(refused, TwinError::Deadline { .. }), "{refused}");
            let waits = sandbox_support::wait_until(Duration::from_secs(10), || {
                stopped(&format!("T{tok}")) == Some(t)
            });
            assert!(waits, "the late twin no longer waits");
            let f_private = || private_dirty_kb(f);
            let before = f_private();
            let report = make_twin(f, t, &limits).expect("the copy");
            // Reading F's pages leaves those it shares with A shared (a read that pins them
            // would have F copy each one first).
            let unshared_kb = f_private().saturating_sub(before);
            assert!(
                unshared_kb < 1024,
                "the copy made F copy {unshared_kb} KiB it shared with A ({report:?})"
            );
            // F is the reference: it runs on too.
            nix::sys::signal::kill(f, nix::sys::signal::Signal::SIGCONT).unwrap();
            report
        })
    };
    let (oa, ob) = tokio::join!(engine.run(&a), engine.run(&b));
    let report = copier.await.unwrap();
    assert_eq!(oa.status.as_str(), "ok", "A: {:?} {}", oa.error, oa.stderr);
    assert_eq!(
        ob.status.as_str(),
        "ok",
        "B: {:?} {} {}",
        ob.error,
        ob.stdout,
        ob.stderr
    );
    let (fa, tb) = (lines(&oa), lines(&ob));
    let (f_out, parent) = (&fa[0], &fa[1]);
    assert_eq!(tb.len(), 1, "{}", ob.stdout);
    let t_out = &tb[0];
    assert_eq!(
        t_out["digest"], f_out["digest"],
        "the twin's state differs from F's"
    );
    assert_ne!(
        t_out["rand"], f_out["rand"],
        "the twin repeats F's randomness"
    );
    // Files are each sandbox's own: the twin appended to B's log, F to A's.
    let (rt, rf) = (
        t_out["rand"].as_str().unwrap(),
        f_out["rand"].as_str().unwrap(),
    );
    assert_eq!(t_out["log"], format!("init\nbranch {rt}\n"));
    assert_eq!(f_out["log"], format!("init\nA\nbranch {rf}\n"));
    assert_eq!(parent["parent_log"], f_out["log"]);
    // B's isolation holds in the twin.
    assert_eq!(t_out["cap_eff"], "0000000000000000");
    assert_eq!(t_out["seccomp"], "2");
    assert_eq!(t_out["unshare"], serde_json::json!([-1, libc::EPERM]));
    let carried: Vec<&str> = report.carried_fds.iter().map(|(_, p)| p.as_str()).collect();
    assert_eq!(carried, ["/work/data.bin", "/work/log.txt"], "{report:?}");
    assert_eq!(report.not_carried.len(), 2, "{report:?}");
    assert!(
        report.not_carried.iter().all(|n| n.contains("socket:[")),
        "{report:?}"
    );
    assert!(
        report.copied_bytes + report.identical_bytes >= 20 << 20,
        "{report:?}"
    );
    // Pages the twin already holds equal are found, and not written.
    assert_eq!(report.identical_bytes > 0, skip_identical(), "{report:?}");
    if !f_out["numpy"].as_bool().unwrap() {
        forkbox_testkit::skipped("numpy in the twin's state (not importable by python3)");
    }
    eprintln!("{report:?}");
}

/// A process's written pages that no other process maps (`Private_Dirty`), in KiB.
fn private_dirty_kb(pid: Pid) -> u64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    rollup
        .lines()
        .find_map(|l| l.strip_prefix("Private_Dirty:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no Private_Dirty in {rollup}"))
}

/// The scenario's variant: the root run copies every private page, the rootless one skips
/// those the twin already holds.
fn skip_identical() -> bool {
    std::env::var_os("FORKBOX_TWIN_SKIP_IDENTICAL").is_some_and(|v| v == "1")
}

/// The same scenario run by `nobody`, skipping identical pages: the rootless node holds what
/// the copy needs (it owns the user namespace above every sandbox of its zygote).
#[test]
fn a_twin_is_made_by_a_rootless_node() {
    sandbox_support::session::rerun_as_nobody(
        "fork_twin",
        "FORKBOX_TWIN_ZYGOTE",
        &["FORKBOX_TWIN_SKIP_IDENTICAL=1"],
        &["a_twin_computes_what_the_frozen_branch_computes_in_its_own_sandbox"],
    );
}

fn rand_u32() -> u32 {
    let mut b = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .unwrap();
    u32::from_ne_bytes(b)
}

/// Job A for the refusals: maps a file of its disk privately (argv[2] `missing`: a file B's
/// disk lacks; `deleted`: one it then deletes), forks F, which stops itself.
const MAPS_A_FILE: &str = r#"
import os, sys, signal, mmap
tok, how = sys.argv[1], sys.argv[2]
with open("only_a.bin", "wb") as f:
    f.write(b"x" * 8192)
fd = os.open("only_a.bin", os.O_RDONLY)
m = mmap.mmap(fd, 8192, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
os.close(fd)
if how == "deleted":
    os.unlink("only_a.bin")
sys.stdout.flush()
pid = os.fork()
if pid == 0:
    with open("/proc/self/comm", "w") as c:
        c.write("F" + tok)
    os.kill(os.getpid(), signal.SIGSTOP)
    os._exit(0)
os.waitpid(pid, 0)
print(m[:2].decode())
"#;

/// A mapping the twin cannot have is an error naming it: a deleted file is refused before the
/// twin is touched (it still waits); a file its own root lacks is found only once the twin is
/// being changed, and the half-made twin is killed, never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapping_the_twin_cannot_have_is_refused_by_name() {
    let engine = tokio::task::spawn_blocking(engine).await.unwrap();
    for how in ["deleted", "missing"] {
        let tok = format!("{:08x}", rand_u32());
        let a = job(MAPS_A_FILE, &[&tok, how]);
        let b = job(TWIN, &[&tok]);
        let copier = {
            let tok = tok.clone();
            tokio::task::spawn_blocking(move || {
                let mut found = (None, None);
                let ok = sandbox_support::wait_until(Duration::from_secs(60), || {
                    found = (stopped(&format!("F{tok}")), stopped(&format!("T{tok}")));
                    found.0.is_some() && found.1.is_some()
                });
                assert!(
                    ok,
                    "{how}: the branch and the twin did not both stop: {found:?}"
                );
                let (f, t) = (found.0.unwrap(), found.1.unwrap());
                let limits = TwinLimits {
                    memory_bytes: 512 << 20,
                    timeout: Duration::from_secs(30),
                    skip_identical: false,
                };
                let err = make_twin(f, t, &limits).unwrap_err();
                let twin_waits = sandbox_support::wait_until(Duration::from_secs(5), || {
                    stopped(&format!("T{tok}")) == Some(t)
                });
                if twin_waits {
                    // Let the refused twin end as itself.
                    nix::sys::signal::kill(t, nix::sys::signal::Signal::SIGCONT).unwrap();
                }
                nix::sys::signal::kill(f, nix::sys::signal::Signal::SIGCONT).unwrap();
                (err, twin_waits)
            })
        };
        let (oa, ob) = tokio::join!(engine.run(&a), engine.run(&b));
        let (err, twin_waits) = copier.await.unwrap();
        let text = err.to_string();
        assert!(text.contains("/work/only_a.bin"), "{how}: {text}");
        assert_eq!(oa.stdout, "xx\n", "{how}: A: {:?} {}", oa.error, oa.stderr);
        match how {
            "deleted" => {
                assert!(matches!(err, TwinError::DeletedMapping { .. }), "{text}");
                assert!(twin_waits, "the twin was touched");
                assert_eq!(ob.exit_code, 3, "{:?} {}", ob.status, ob.stdout);
                assert_eq!(ob.stdout, "the twin resumed as itself\n");
            }
            _ => {
                assert!(
                    matches!(err, TwinError::UnreachableMapping { .. }),
                    "{text}"
                );
                assert!(!twin_waits, "a half-made twin still waits");
                assert_eq!(ob.stdout, "", "a half-made twin ran");
                assert_ne!(ob.status.as_str(), "ok", "{ob:?}");
            }
        }
    }
}
