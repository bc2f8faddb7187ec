//! Session sandboxes opened ahead of demand, at the engine level: a session handed a
//! prepared sandbox starts as a fresh one does (environment, files, limits, argv, the
//! kernel's first cell), two sessions from prepared sandboxes of one shape see nothing of
//! each other, a spec of another shape is refused, and a prepared sandbox dropped leaves no
//! process behind.

mod sandbox_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use forkbox::sandbox::{
    Engine, OpenError, PreparedSession, SandboxSession, SessionShape, SessionSpec,
};
use forkbox_queue::schema::{FileData, Limits, Runtime};
use sandbox_support::session::{assert_unseen_by, call, run, warm_engine};
use serde_json::{json, Value};

fn engine() -> Engine {
    warm_engine(sandbox_support::BIN, 2)
}

/// A spec with an environment, text and binary files in a subdirectory, and limits of its
/// own.
fn spec() -> SessionSpec {
    SessionSpec {
        limits: Limits {
            memory_mb: Some(192),
            pids: Some(24),
            open_files: Some(200),
            ..Limits::default()
        },
        env: BTreeMap::from([
            ("GREETING".to_owned(), "hello there".to_owned()),
            ("MPLBACKEND".to_owned(), "svg".to_owned()),
        ]),
        files: BTreeMap::from([
            ("main.py".to_owned(), FileData::Text("X = 41\n".into())),
            (
                "data/blob.bin".to_owned(),
                FileData::from_bytes(vec![0, 159, 146, 150, 255]),
            ),
        ]),
        runtime: Some(Runtime::Python),
        ttl_ms: 120_000,
        ..SessionSpec::default()
    }
}

async fn prepare(engine: &Engine, spec: &SessionSpec) -> PreparedSession {
    let shape = SessionShape::of(spec).expect("the spec can be served prepared");
    engine.prepare_session(shape).await.expect("prepared")
}

/// What a session's code can see of how it started, as text: its first cell's number, the
/// environment, argv, working directory and umask, `/work` (paths, modes, bytes), its
/// resource limits, open descriptors, and what its exec'd children see.
async fn start_seen_by(session: &mut SandboxSession) -> (Value, String, String) {
    let probe = r#"
import os, resource, sys, stat
def tree():
    out = []
    for root, dirs, files in os.walk('/work'):
        dirs.sort()
        for n in sorted(dirs + files):
            p = os.path.join(root, n)
            st = os.lstat(p)
            body = open(p, 'rb').read() if stat.S_ISREG(st.st_mode) else None
            out.append((p, oct(st.st_mode), st.st_uid, st.st_gid, body))
    return out
limits = {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith('RLIMIT_')}
um = os.umask(0); os.umask(um)
import linecache
(sorted(os.environ.items()), sys.argv, os.getcwd(), oct(um), tree(), sorted(limits.items()),
 sorted(os.listdir('/proc/self/fd')), sorted(sys.modules), sorted(globals()),
 sorted(linecache.cache))
"#;
    // A prepared kernel ran a throwaway cell before its session: nothing of it shows (its
    // output, its names, its number, its source).
    let first = run(session, "1").await;
    assert_eq!(
        (&first["stdout"], &first["stderr"]),
        (&json!(""), &json!("")),
        "{first}"
    );
    let seen = run(session, probe).await;
    assert_eq!(seen["ok"], true, "{seen}");
    let exec = call(
        session,
        json!({"op": "exec", "cmd": "env | sort; umask; ls -la /work"}),
    )
    .await
    .result;
    assert_eq!(exec["exit_code"], 0, "{exec}");
    (
        first["execution_count"].clone(),
        seen["text"].as_str().unwrap().to_owned(),
        exec["stdout"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prepared_session_starts_as_a_fresh_one_does() {
    let engine = engine();
    let mut fresh = engine.open_session(spec()).await.expect("fresh session");
    let prepared = prepare(&engine, &spec()).await;
    let mut handed = prepared
        .hand_over(&engine, &spec())
        .await
        .expect("handed over");
    assert_eq!(handed.hello()["kind"], "ready");
    assert_eq!(handed.runtime(), fresh.runtime());

    let (first_f, seen_f, exec_f) = start_seen_by(&mut fresh).await;
    let (first_h, seen_h, exec_h) = start_seen_by(&mut handed).await;
    assert_eq!(first_h, first_f);
    assert_eq!(first_h, 1, "the kernel's first cell is the session's");
    assert!(seen_h.contains("'GREETING', 'hello there'"), "{seen_h}");
    assert!(seen_h.contains("'/work/data/blob.bin'"), "{seen_h}");
    // Everything but the ls times and the sandbox's own pid numbers is the same.
    assert_eq!(seen_h, seen_f);
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .map(|l| {
                l.split_whitespace()
                    .filter(|w| !w.contains(':'))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    };
    assert_eq!(strip(&exec_h), strip(&exec_f));
    assert!(exec_h.contains("GREETING=hello there"), "{exec_h}");

    // The setup was the prepared supervisor's first call and its only one.
    let again = call(
        &mut handed,
        json!({"op": "setup", "env": {"GREETING": "x"}}),
    )
    .await
    .result;
    assert_eq!(again["ok"], false, "{again}");
    let r = run(&mut handed, "import os; os.environ['GREETING']").await;
    assert_eq!(r["text"], "'hello there'", "{r}");
    // The limits are the spec's: the pids limit holds.
    let r = call(
        &mut handed,
        json!({"op": "exec", "cmd": "for i in $(seq 40); do sleep 5 & done; wait", "timeout_ms": 20000}),
    )
    .await
    .result;
    assert!(
        r["stderr"].as_str().unwrap_or_default().contains("fork")
            || r["stderr"]
                .as_str()
                .unwrap_or_default()
                .contains("Resource"),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_from_prepared_sandboxes_of_one_shape_see_nothing_of_each_other() {
    let engine = engine();
    let a = prepare(&engine, &spec()).await;
    let b = prepare(&engine, &spec()).await;
    let mut a = a.hand_over(&engine, &spec()).await.expect("a");
    let mut spec_b = spec();
    spec_b.env.insert("GREETING".into(), "b's".into());
    spec_b.files.remove("main.py");
    let mut b = b.hand_over(&engine, &spec_b).await.expect("b");
    assert_unseen_by(&mut a, &mut b).await;
    run(&mut a, "secret = 1").await;
    let r = call(&mut b, json!({"op": "files_read", "path": "main.py"}))
        .await
        .result;
    assert_eq!(r["ok"], false, "{r}");
    let r = run(&mut b, "('secret' in globals(), os.environ['GREETING'])").await;
    assert_eq!(r["text"], "(False, \"b's\")", "{r}");
    let r = run(&mut a, "os.environ['GREETING']").await;
    assert_eq!(r["text"], "'hello there'", "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spec_of_another_shape_or_past_the_disk_is_refused_and_its_sandbox_ended() {
    let engine = engine();
    let prepared = prepare(&engine, &spec()).await;
    let pids = wait_pids(&prepared).await;
    let mut other = spec();
    other.limits.memory_mb = Some(256);
    let err = prepared
        .hand_over(&engine, &other)
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, OpenError::Failed(_)), "{err}");
    assert!(err.to_string().contains("shape"), "{err}");
    wait_gone(&pids).await;

    // A spec a fresh open refuses as invalid is refused as invalid here too.
    let mut bad = spec();
    bad.files
        .insert("../escape".into(), FileData::Text("x".into()));
    let fresh = engine
        .open_session(bad.clone())
        .await
        .err()
        .expect("refused");
    let prepared = prepare(&engine, &bad).await;
    let pids = wait_pids(&prepared).await;
    let err = prepared
        .hand_over(&engine, &bad)
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, OpenError::Invalid(_)), "{err}");
    assert_eq!(err.to_string(), fresh.to_string());
    wait_gone(&pids).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prepared_sandbox_dropped_or_discarded_leaves_no_process() {
    let engine = engine();
    let a = prepare(&engine, &spec()).await;
    let pids = wait_pids(&a).await;
    assert!(pids.iter().all(alive), "{pids:?}");
    a.discard().await;
    wait_gone(&pids).await;

    let b = prepare(&engine, &spec()).await;
    let pids = wait_pids(&b).await;
    drop(b);
    wait_gone(&pids).await;
}

/// The host pids of the sandbox's init and supervisor, with the supervisor's children (its
/// kernel), each with its start time, so a recycled pid is not taken for it.
async fn wait_pids(p: &PreparedSession) -> Vec<(i32, String)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let pids = loop {
        if let Some(pids) = p.host_pids() {
            break pids;
        }
        assert!(Instant::now() < deadline, "no host pids");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let supervisor = pids[1];
    let children =
        std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))
            .unwrap_or_default();
    let all: Vec<i32> = pids
        .into_iter()
        .chain(children.split_whitespace().filter_map(|c| c.parse().ok()))
        .collect();
    assert!(all.len() >= 3, "init, supervisor and kernel: {all:?}");
    all.into_iter().map(|p| (p, start_time(p))).collect()
}

fn start_time(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(19).map(str::to_owned))
        })
        .unwrap_or_default()
}

fn alive(p: &(i32, String)) -> bool {
    !p.1.is_empty() && start_time(p.0) == p.1
}

async fn wait_gone(pids: &[(i32, String)]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while pids.iter().any(alive) {
        assert!(Instant::now() < deadline, "still running: {pids:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
