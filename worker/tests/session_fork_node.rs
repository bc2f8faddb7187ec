//! A session's `fork` call served by a real `forkbox worker` against a private redis-server:
//! the branches are new live sessions on the parent's node, each a copy of the parent's state
//! that goes its own way; `info` shows the lineage; killing the parent leaves its children
//! alive; a fork past the node's session capacity says how many it could make.

mod node_support;

use std::time::Duration;

use forkbox_queue::session::{Call, CallOp};
use forkbox_queue::{FileData, Job, Queue, SessionOpened};
use node_support::*;

fn create() -> Job {
    let mut job = session_job();
    job.files
        .insert("notes.txt".into(), FileData::Text("parent\n".into()));
    job
}

async fn open(q: &Queue, job: &Job) -> SessionOpened {
    open_session(q, job).await
}

fn fork(sid: &str, n: u32) -> Call {
    Call {
        n: Some(n),
        ..Call::new(sid, CallOp::Fork)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_makes_live_sessions_with_the_parents_state_and_lineage() {
    let (_server, _w, q) = session_node("f-node-1", &["--max-sessions", "4"]).await;
    let p = open(&q, &create()).await;
    run_code_text(&q, &p.id, "x = 41\nf = open('notes.txt', 'a')").await;

    // Past the node's capacity (four sessions, one live): refused, saying how many fit.
    let r = call_result(&q, fork(&p.id, 4)).await;
    assert_eq!(r["ok"], false, "{r:?}");
    let error = r["error"].as_str().unwrap();
    assert!(error.contains("can make 3 of the 4"), "{error}");

    let r = call_result(&q, fork(&p.id, 2)).await;
    assert_eq!(r["ok"], true, "{r:?}");
    let kids: Vec<String> = r["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kids.len(), 2, "{r:?}");
    assert!(r["parent_pause_us"].as_u64().unwrap() > 0, "{r:?}");
    for b in r["branches"].as_array().unwrap() {
        assert_eq!(b["ok"], true, "{b}");
        assert_eq!(b["execution_count"], 1, "{b}");
    }

    // Each branch is a live session of the parent's node with the parent's state.
    for kid in &kids {
        let info = q.session_info(kid).await.unwrap().expect("recorded");
        assert_eq!(info.node, "f-node-1");
        assert_eq!(info.state, "live");
        assert_eq!(info.parent.as_deref(), Some(p.id.as_str()));
        assert_eq!(run_code_text(&q, kid, "x + 1").await, "42");
    }
    run_code_text(&q, &kids[0], "x = 0\nf.write('kid\\n'); f.flush()").await;
    assert_eq!(run_code_text(&q, &kids[1], "x").await, "41");
    assert_eq!(run_code_text(&q, &p.id, "x").await, "41");
    assert_eq!(
        run_code_text(&q, &kids[0], "open('notes.txt').read()").await,
        "'parent\\nkid\\n'"
    );
    assert_eq!(
        run_code_text(&q, &p.id, "open('notes.txt').read()").await,
        "'parent\\n'"
    );

    // Lineage: in the parent's record and in its info.
    let info = q.session_info(&p.id).await.unwrap().unwrap();
    assert_eq!(info.children, kids);
    let r = call_result(&q, Call::new(&p.id, CallOp::Info)).await;
    assert_eq!(r["info"]["children"], serde_json::json!(kids), "{r:?}");
    let r = call_result(&q, Call::new(&kids[1], CallOp::Info)).await;
    assert_eq!(r["info"]["parent"], serde_json::json!(p.id), "{r:?}");

    // Killing the parent leaves its children alive.
    call_result(&q, Call::new(&p.id, CallOp::Kill)).await;
    let ended = wait_for(Duration::from_secs(10), || async {
        q.session_info(&p.id).await.unwrap().unwrap().state == "ended"
    })
    .await;
    assert!(ended, "the parent did not end");
    for kid in &kids {
        assert_eq!(run_code_text(&q, kid, "1 + 1").await, "2");
    }
}

async fn wait_for<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = std::time::Instant::now() + limit;
    while std::time::Instant::now() < until {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_forks_a_session_and_prints_the_new_ids() {
    let (server, _w, _q) = session_node("f-node-2", &["--max-sessions", "4"]).await;
    let url = server.url();
    let (code, out, err) = forkbox_cli(&url, &["session", "create", "--runtime", "python"]);
    assert_eq!(code, 0, "{err}");
    let sid = out.trim().to_owned();
    let (code, _, err) = forkbox_cli(
        &url,
        &[
            "session",
            "run-code",
            &sid,
            "import socket\ny = 6 * 7\npair = socket.socketpair()",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = forkbox_cli(&url, &["session", "fork", &sid, "-n", "2"]);
    assert_eq!(code, 0, "{err}");
    let kids: Vec<&str> = out.lines().collect();
    assert_eq!(kids.len(), 2, "{out}");
    // What a branch does not get is said, per branch.
    assert_eq!(err.matches("not carried: fd").count(), 4, "{err}");
    for kid in &kids {
        let (code, out, err) = forkbox_cli(&url, &["session", "run-code", kid, "y"]);
        assert_eq!((code, out.as_str()), (0, "42\n"), "{err}");
    }
    // Past the node's capacity (four sessions, three live): refused, saying how many fit.
    let (code, _, err) = forkbox_cli(&url, &["session", "fork", &sid, "-n", "2"]);
    assert_ne!(code, 0);
    assert!(err.contains("can make 1 of the 2"), "{err}");
}
