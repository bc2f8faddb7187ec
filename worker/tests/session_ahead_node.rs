//! Session sandboxes opened ahead of demand by a real `forkbox worker` (`--session-pool`):
//! a create takes a prepared sandbox and its session starts with its own environment and
//! files and sees nothing of another from the same pool; the pool gives its room to
//! sessions, refills once there is room, and a node stopping leaves no process behind.

mod node_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use forkbox_queue::session::{Call, CallOp};
use forkbox_queue::{FileData, Job, Limits, Queue, SessionError, SessionOpened, Status};
use node_support::*;
use serde_json::Value;

fn create(env: &[(&str, &str)], files: &[(&str, &str)]) -> Job {
    Job {
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        files: files
            .iter()
            .map(|(k, v)| (k.to_string(), FileData::Text(v.to_string())))
            .collect::<BTreeMap<_, _>>(),
        ..session_job()
    }
}

async fn open(q: &Queue, job: &Job) -> SessionOpened {
    open_session(q, job).await
}

async fn result(q: &Queue, call: Call) -> serde_json::Map<String, Value> {
    session_result(q, call, Duration::from_secs(30)).await
}

async fn run_code(q: &Queue, sid: &str, code: &str) -> serde_json::Map<String, Value> {
    result(q, Call::run_code(sid, code)).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_create_takes_a_prepared_sandbox_and_starts_as_a_fresh_session() {
    let (_server, mut w, q) = session_node("ahead-node-1", &["--slots", "2"]).await;
    let metrics = w.metrics_addr();
    metric_reaches(metrics, "forkbox_session_pool_ready", &[], 1.0);

    let a = open(
        &q,
        &create(
            &[("WHO", "a")],
            &[("conf/a.txt", "for a"), ("main.py", "X = 1\n")],
        ),
    )
    .await;
    metric_reaches(metrics, "forkbox_sessions_from_pool_total", &[], 1.0);
    let r = run_code(
        &q,
        &a.id,
        "import os; (os.environ['WHO'], open('/work/conf/a.txt').read())",
    )
    .await;
    assert_eq!(r["text"], "('a', 'for a')", "{r:?}");
    assert_eq!(r["execution_count"], 1, "{r:?}");
    let r = result(&q, Call::exec_shell(&a.id, "echo $WHO; cat main.py")).await;
    assert_eq!(r["stdout"], "a\nX = 1\n", "{r:?}");

    // The pool refills, and the next create of the same shape takes that sandbox too.
    metric_reaches(metrics, "forkbox_session_pool_ready", &[], 1.0);
    let b = open(&q, &create(&[("WHO", "b")], &[])).await;
    metric_reaches(metrics, "forkbox_sessions_from_pool_total", &[], 2.0);
    run_code(
        &q,
        &a.id,
        "secret = 42\nimport subprocess\np = subprocess.Popen(['sleep', '777'])",
    )
    .await;
    let r = run_code(
        &q,
        &b.id,
        "import os\n('secret' in globals(), os.environ['WHO'], sorted(os.listdir('/work')), any(b'777' in open('/proc/%s/cmdline' % p, 'rb').read() for p in os.listdir('/proc') if p.isdigit()))",
    )
    .await;
    assert_eq!(r["text"], "(False, 'b', [], False)", "{r:?}");
    let r = run_code(&q, &a.id, "secret").await;
    assert_eq!(r["text"], "42", "{r:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pool_gives_way_to_sessions_and_a_stop_leaves_no_process() {
    let (_server, mut w, q) =
        session_node("ahead-node-2", &["--slots", "1", "--max-sessions", "1"]).await;
    let metrics = w.metrics_addr();
    metric_reaches(metrics, "forkbox_session_pool_ready", &[], 1.0);

    // The pool's sandbox is the one session's room: a create takes it, a second is refused.
    let a = open(&q, &create(&[], &[])).await;
    metric_reaches(metrics, "forkbox_sessions_from_pool_total", &[], 1.0);
    let refused = q
        .open_session(&create(&[], &[]), Duration::from_secs(60))
        .await;
    match refused {
        Err(SessionError::NotOpened { status, error, .. }) => {
            assert_eq!(status, Status::Error);
            assert!(error.contains("1 of 1"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(result(&q, Call::new(&a.id, CallOp::Kill)).await["ok"], true);
    // Room again: the pool refills, and a create of another shape takes the room from it.
    metric_reaches(metrics, "forkbox_session_pool_ready", &[], 1.0);
    let other = Job {
        limits: Limits {
            memory_mb: Some(100),
            ..Limits::default()
        },
        ..create(&[], &[])
    };
    let c = open(&q, &other).await;
    let r = run_code(&q, &c.id, "6 * 7").await;
    assert_eq!(r["text"], "42", "{r:?}");
    metric_reaches(metrics, "forkbox_session_pool_ready", &[], 0.0);
    metric_reaches(metrics, "forkbox_sessions_from_pool_total", &[], 1.0);
    assert_eq!(result(&q, Call::new(&c.id, CallOp::Kill)).await["ok"], true);
    // The pool now keeps the shape asked last.
    metric_reaches(metrics, "forkbox_session_pool_ready", &[], 1.0);
    let d = open(&q, &other).await;
    metric_reaches(metrics, "forkbox_sessions_from_pool_total", &[], 2.0);
    assert_eq!(result(&q, Call::new(&d.id, CallOp::Kill)).await["ok"], true);
    metric_reaches(metrics, "forkbox_session_pool_ready", &[], 1.0);

    // Every process under the node, the prepared sandbox's among them, ends with it.
    let under = descendants(w.pid());
    assert!(
        under.len() >= 5,
        "two zygotes, a sandbox and more: {under:?}"
    );
    w.signal(nix::sys::signal::Signal::SIGTERM);
    w.wait_exit(Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(30);
    while under.iter().any(|(pid, start)| start_time(*pid) == *start) {
        assert!(Instant::now() < deadline, "left behind: {under:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every process under `root`, with its start time (so a recycled pid is not taken for it).
fn descendants(root: i32) -> Vec<(i32, String)> {
    let mut parent: Vec<(i32, i32)> = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            parent.push((pid, ppid));
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found
        .into_iter()
        .skip(1)
        .map(|p| (p, start_time(p)))
        .filter(|(_, s)| !s.is_empty())
        .collect()
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
