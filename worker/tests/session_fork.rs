//! A live session's fork at the engine level, with real sandboxes: the parent builds state,
//! forks into branches, and each branch computes what the parent computes on its next cell,
//! then goes its own way (its files, its variables, its randomness), under its own limits and
//! isolation; what cannot be carried is named. Run by host root and by `nobody` (the rootless
//! node).

mod sandbox_support;

use std::collections::BTreeMap;
use std::time::Duration;

use forkbox::sandbox::{Engine, ForkError, OpenError, SessionSpec};
use forkbox_queue::schema::{FileData, Limits, Runtime};
use sandbox_support::session::{assert_no_space, run, value, warm_engine, zygote};

fn engine() -> Engine {
    warm_engine(&zygote("FORKBOX_SESSION_ZYGOTE"), 2)
}

fn spec() -> SessionSpec {
    let data: String = (0..4096u32)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    let mut files = BTreeMap::new();
    files.insert("data.bin".to_owned(), FileData::Text(data));
    files.insert("log.txt".to_owned(), FileData::Text("init\n".into()));
    SessionSpec {
        runtime: Some(Runtime::Python),
        ttl_ms: 180_000,
        limits: Limits {
            memory_mb: Some(256),
            disk_mb: Some(16),
            ..Limits::default()
        },
        files,
        ..SessionSpec::default()
    }
}

/// The parent's state: a closure, a class instance, a generator mid-iteration, a file open at
/// an offset and one for appending, a compiled regex, a module imported at run time (a C
/// extension mapped after the sandbox was made), numpy when it is importable; and what cannot
/// be carried: a socket pair, a thread, a background process.
const STATE: &str = r#"
import hashlib, re, random, socket, subprocess, threading, time
try:
    import numpy as np
except ImportError:
    np = None
import decimal

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

base = 41
clo = lambda x: x + base
acct = Account(); acct.add(5)
gen = counter(); next(gen); next(gen)
rx = re.compile(r"[a-z](\d+)")
dec = decimal.Decimal(1) / decimal.Decimal(7)
big = {f"k{i}": "v" * (i % 50) + str(i) for i in range(60000)}
arr = np.arange(1 << 18, dtype=np.int64) * 3 if np is not None else None
f = open("data.bin", "rb"); f.read(100)
log = open("log.txt", "a"); log.write("parent\n"); log.flush()
pair = socket.socketpair()
ticker = threading.Thread(target=time.sleep, args=(600,), name="ticker", daemon=True)
ticker.start()
sleeper = subprocess.Popen(["sleep", "600"])

def digest():
    h = hashlib.sha256()
    h.update(repr(sorted(big.items())[:1000]).encode() + str(len(big)).encode())
    if np is not None:
        h.update(arr.tobytes())
    h.update(repr([next(gen) for _ in range(3)]).encode())
    h.update(repr(rx.findall("a1 b22 c333")).encode())
    h.update(str(clo(5)).encode() + str(acct.add(3)).encode() + str(dec).encode())
    h.update(f.read(16))
    return h.hexdigest()[:16]
"#;

const RANDOM: &str = r#"
import uuid, secrets
(random.random(), str(uuid.uuid4()), secrets.token_hex(8))
"#;

/// The processes of the sandbox that are stopped or not yet reaped.
const STOPPED: &str = r#"
import os
def state(p):
    try:
        return open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
[p for p in os.listdir("/proc") if p.isdigit() and state(p) in ("T", "t", "Z")]
"#;

const ISOLATION: &str = r#"
import ctypes
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
libc = ctypes.CDLL(None, use_errno=True)
(status["CapEff"].strip(), status["Seccomp"].strip(), libc.unshare(0x10000000), ctypes.get_errno())
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branches_compute_what_the_parent_computes_then_go_their_own_way() {
    let engine = tokio::task::spawn_blocking(engine).await.unwrap();
    let spec = spec();
    let mut parent = engine.open_session(spec.clone()).await.expect("parent");
    value(&mut parent, STATE).await;
    let numpy = value(&mut parent, "np is not None").await == "True";
    let fork = engine
        .fork_session(&mut parent, &spec, 2)
        .await
        .expect("the fork");
    eprintln!("parent's pause: {:?}", fork.parent_pause);
    assert!(fork.parent_pause > Duration::ZERO);
    let mut branches = Vec::new();
    for b in fork.branches {
        let b = b.unwrap_or_else(|e| panic!("a branch failed: {e}"));
        // The interpreter's count goes on from the parent's (two cells ran).
        assert_eq!(b.execution_count, 2);
        assert!(
            b.reseeded.contains(&"random".to_owned()),
            "{:?}",
            b.reseeded
        );
        let named = b.not_carried.join("\n");
        assert!(named.contains("socket:["), "{named}");
        assert!(named.contains("thread ticker"), "{named}");
        assert!(named.contains("(sleep)"), "{named}");
        // The one thread is Python's, named: none is counted as native.
        assert!(!named.contains("native code"), "{named}");
        assert!(b.disk.files >= 2, "{:?}", b.disk);
        eprintln!("{:?}\n{:?}", b.twin, b.not_carried);
        branches.push(b.session);
    }
    // The same state computes the same next cell, in the parent and in each branch.
    let want = value(&mut parent, "digest()").await;
    // The frozen copy is gone from the parent's sandbox (killed, and reaped by its kernel).
    let left = value(&mut parent, STOPPED).await;
    assert_eq!(left, "[]", "stopped or unreaped processes in the parent");
    for b in &mut branches {
        assert_eq!(value(b, "digest()").await, want);
        let r = run(b, "7").await;
        assert_eq!(r["execution_count"], 4, "{r}");
    }
    // Randomness is each one's own.
    let mut seen = vec![value(&mut parent, RANDOM).await];
    for b in &mut branches {
        seen.push(value(b, RANDOM).await);
    }
    for (i, a) in seen.iter().enumerate() {
        for b in &seen[i + 1..] {
            assert_ne!(a, b, "two sessions drew the same randomness");
        }
    }
    // Divergence: files and variables changed in one branch are unchanged elsewhere.
    let (first, rest) = branches.split_first_mut().unwrap();
    value(
        first,
        "base = 100\nlog.write('branch\\n'); log.flush()\nopen('only.txt', 'w').write('x')",
    )
    .await;
    assert_eq!(value(first, "clo(1)").await, "101");
    assert_eq!(
        value(first, "open('log.txt').read()").await,
        repr("init\nparent\nbranch\n")
    );
    for other in rest.iter_mut().chain(std::iter::once(&mut parent)) {
        assert_eq!(value(other, "clo(1)").await, "42");
        assert_eq!(
            value(other, "open('log.txt').read()").await,
            repr("init\nparent\n")
        );
        assert_eq!(
            value(other, "import os; os.path.exists('only.txt')").await,
            "False"
        );
    }
    // The branch's own isolation and limits hold.
    let iso = value(first, ISOLATION).await;
    assert_eq!(
        iso,
        format!("('0000000000000000', '2', -1, {})", libc::EPERM)
    );
    let r = run(first, "open('big', 'wb').write(b'x' * (20 << 20))").await;
    assert_no_space(&r);
    assert_eq!(value(first, "clo(2)").await, "102");
    if !numpy {
        forkbox_testkit::skipped("numpy in the forked state (not importable by python3)");
    }
    for b in branches {
        b.kill().await;
    }
    parent.kill().await;
}

fn repr(s: &str) -> String {
    format!("'{}'", s.replace('\n', "\\n"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_outside_the_warm_runtime_is_refused_by_name() {
    let engine = tokio::task::spawn_blocking(engine).await.unwrap();
    let cold = SessionSpec {
        runtime: None,
        ..spec()
    };
    let mut parent = engine.open_session(cold.clone()).await.expect("parent");
    let err = engine
        .fork_session(&mut parent, &cold, 1)
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, ForkError::NotWarm(_)), "{err}");
    assert!(err.to_string().contains("warm python runtime"), "{err}");
    // The parent is untouched.
    assert_eq!(value(&mut parent, "1 + 1").await, "2");
    parent.kill().await;
}

/// The branch's wait for the copy is the node's to ask for: a session whose own environment
/// names it is refused before any sandbox is made (else its kernel would wait stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cannot_ask_for_a_branchs_wait_itself() {
    let engine = tokio::task::spawn_blocking(engine).await.unwrap();
    let mut asked = spec();
    asked.env.insert("FORKBOX_SESSION_TWIN".into(), "1".into());
    let err = engine.open_session(asked).await.err().expect("refused");
    assert!(matches!(err, OpenError::Invalid(_)), "{err}");
    assert!(err.to_string().contains("FORKBOX_SESSION_TWIN"), "{err}");
}

/// The fork, run again by `nobody`: a rootless node forks its sessions too.
#[test]
fn a_rootless_node_forks_its_sessions() {
    sandbox_support::session::rerun_as_nobody(
        "session_fork",
        "FORKBOX_SESSION_ZYGOTE",
        &[],
        &["branches_compute_what_the_parent_computes_then_go_their_own_way"],
    );
}
