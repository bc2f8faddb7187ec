//! A session's `checkpoint`, `restore` and `drop_checkpoint` calls served by a real
//! `forkbox worker` against a private redis-server, and by the CLI: a restore is a new live
//! session with the state the session had at the checkpoint, naming its parent and how it was
//! made; a session's checkpoints are listed in its record and its `info`, are bounded in
//! number, end at their ttl, when dropped or with their session (and their disk's copy with
//! them); a restore past the node's capacity, or of a checkpoint no longer there, says so.

mod node_support;

use std::path::Path;
use std::time::Duration;

use forkbox_queue::session::{checkpoint_session, Call, CallOp};
use forkbox_queue::{FileData, Job, Queue, SessionOpened};
use forkbox_testkit::RedisServer;
use node_support::*;
use serde_json::Value;

fn create() -> Job {
    let mut job = session_job();
    job.files
        .insert("notes.txt".into(), FileData::Text("created\n".into()));
    job
}

fn checkpoint(sid: &str, ttl_s: Option<u64>) -> Call {
    Call {
        ttl_s,
        ..Call::new(sid, CallOp::Checkpoint)
    }
}

fn on_checkpoint(cp: &str, op: CallOp) -> Call {
    Call {
        checkpoint: Some(cp.to_owned()),
        ..Call::new(checkpoint_session(cp).expect("a checkpoint's id"), op)
    }
}

/// The checkpoints' directories the node keeps under its temporary directory `tmp`.
fn disk_copies(tmp: &Path) -> usize {
    std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("forkbox-checkpoint-")
        })
        .count()
}

/// A node whose temporary directory is `tmp`, with `args`.
async fn node(tmp: &Path, name: &str, args: &[&str]) -> (RedisServer, WorkerProc, Queue) {
    let server = start_redis();
    let env = format!("TMPDIR={}", tmp.display());
    let mut w = WorkerProc::start_under(&["env", &env], &server.url(), name, args);
    w.wait_ready();
    let q = queue(&server.url(), "default").await;
    (server, w, q)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_restores_through_redis_and_ends_at_its_ttl_or_drop() {
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--max-sessions", "3", "--max-session-checkpoints", "2"];
    let (_server, _w, q) = node(tmp.path(), "cp-node-1", &args).await;
    let p: SessionOpened = open_session(&q, &create()).await;
    run_code_text(
        &q,
        &p.id,
        "x = 41\nopen('notes.txt', 'a').write('checkpointed\\n')",
    )
    .await;

    let r = call_result(&q, checkpoint(&p.id, None)).await;
    assert_eq!(r["ok"], true, "{r:?}");
    let cp = r["checkpoint"]["id"].as_str().unwrap().to_owned();
    assert_eq!(checkpoint_session(&cp), Some(p.id.as_str()));
    let created = r["checkpoint"]["created_ms"].as_u64().unwrap();
    let expires = r["checkpoint"]["expires_ms"].as_u64().unwrap();
    assert_eq!(expires - created, 600_000, "the default ttl");
    assert_eq!(disk_copies(tmp.path()), 1);
    // Listed in the session's record and in its info.
    let info = q.session_info(&p.id).await.unwrap().unwrap();
    assert_eq!(info.checkpoints.len(), 1, "{info:?}");
    assert_eq!(info.checkpoints[0].id, cp);
    let r = call_result(&q, Call::new(&p.id, CallOp::Info)).await;
    assert_eq!(r["info"]["checkpoints"][0]["id"], Value::from(cp.clone()));

    // The session breaks its environment; the restore is a new session from before.
    run_code_text(&q, &p.id, "x = None\nimport os\nos.remove('notes.txt')").await;
    let r = call_result(&q, on_checkpoint(&cp, CallOp::Restore)).await;
    assert_eq!(r["ok"], true, "{r:?}");
    let back = r["id"].as_str().unwrap().to_owned();
    assert_eq!(run_code_text(&q, &back, "x + 1").await, "42");
    assert_eq!(
        run_code_text(&q, &back, "open('notes.txt').read()").await,
        "'created\\ncheckpointed\\n'"
    );
    let info = q.session_info(&back).await.unwrap().expect("recorded");
    assert_eq!(info.state, "live");
    assert_eq!(info.parent.as_deref(), Some(p.id.as_str()));
    assert_eq!(info.made_by.as_deref(), Some("restore"));
    assert_eq!(info.checkpoint.as_deref(), Some(cp.as_str()));
    let r = call_result(&q, Call::new(&back, CallOp::Info)).await;
    assert_eq!(r["info"]["made_by"], "restore", "{r:?}");

    // Bounded in number (two here); a checkpoint's ttl ends it, and its disk's copy.
    let r = call_result(&q, checkpoint(&p.id, Some(1))).await;
    assert_eq!(r["ok"], true, "{r:?}");
    let short = r["checkpoint"]["id"].as_str().unwrap().to_owned();
    let r = call_result(&q, checkpoint(&p.id, None)).await;
    assert_eq!(r["ok"], false, "{r:?}");
    assert!(
        r["error"].as_str().unwrap().contains("holds 2 checkpoints"),
        "{r:?}"
    );
    let q2 = q.clone();
    let pid = p.id.clone();
    poll(
        Duration::from_secs(10),
        "the short checkpoint's end",
        || {
            let (q, pid) = (q2.clone(), pid.clone());
            async move {
                let info = q.session_info(&pid).await.unwrap().unwrap();
                (info.checkpoints.len() == 1).then_some(())
            }
        },
    )
    .await;
    assert_eq!(disk_copies(tmp.path()), 1);
    let r = call_result(&q, on_checkpoint(&short, CallOp::Restore)).await;
    assert_eq!(r["ok"], false, "{r:?}");
    let error = r["error"].as_str().unwrap();
    assert!(
        error.contains(&short) && error.contains("is unknown"),
        "{error}"
    );

    // Past the node's capacity (three sessions: the parent and two restored), said so.
    let r = call_result(&q, on_checkpoint(&cp, CallOp::Restore)).await;
    assert_eq!(r["ok"], true, "{r:?}");
    let r = call_result(&q, on_checkpoint(&cp, CallOp::Restore)).await;
    assert_eq!(r["ok"], false, "{r:?}");
    assert!(
        r["error"].as_str().unwrap().contains("session capacity"),
        "{r:?}"
    );

    // Dropped, it is gone, with its disk's copy.
    let r = call_result(&q, on_checkpoint(&cp, CallOp::DropCheckpoint)).await;
    assert_eq!(r["ok"], true, "{r:?}");
    assert_eq!(disk_copies(tmp.path()), 0);
    let info = q.session_info(&p.id).await.unwrap().unwrap();
    assert!(info.checkpoints.is_empty(), "{info:?}");
    let r = call_result(&q, on_checkpoint(&cp, CallOp::Restore)).await;
    assert!(r["error"].as_str().unwrap().contains("is unknown"), "{r:?}");

    // A checkpoint ends with its session (it lives in the session's sandbox).
    let r = call_result(&q, checkpoint(&p.id, None)).await;
    assert_eq!(r["ok"], true, "{r:?}");
    assert_eq!(disk_copies(tmp.path()), 1);
    call_result(&q, Call::new(&p.id, CallOp::Kill)).await;
    let tmp_path = tmp.path().to_owned();
    poll(Duration::from_secs(10), "the checkpoint's end", || {
        let tmp = tmp_path.clone();
        async move { (disk_copies(&tmp) == 0).then_some(()) }
    })
    .await;
    // The restored session lives on.
    assert_eq!(run_code_text(&q, &back, "x").await, "41");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_checkpoints_restores_and_drops() {
    let (server, _w, q) = session_node("cp-node-2", &["--max-sessions", "4"]).await;
    let url = server.url();
    let (code, out, err) = forkbox_cli(&url, &["session", "create", "--runtime", "python"]);
    assert_eq!(code, 0, "{err}");
    let sid = out.trim().to_owned();
    let (code, _, err) = forkbox_cli(&url, &["session", "run-code", &sid, "y = 6 * 7"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = forkbox_cli(&url, &["session", "checkpoint", &sid, "--ttl", "300"]);
    assert_eq!(code, 0, "{err}");
    let cp = out.trim().to_owned();
    assert_eq!(checkpoint_session(&cp), Some(sid.as_str()), "{out}");
    let (code, _, err) = forkbox_cli(&url, &["session", "run-code", &sid, "y = 0"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = forkbox_cli(&url, &["session", "restore", &cp]);
    assert_eq!(code, 0, "{err}");
    let back = out.trim().to_owned();
    let (code, out, err) = forkbox_cli(&url, &["session", "run-code", &back, "y"]);
    assert_eq!((code, out.as_str()), (0, "42\n"), "{err}");
    // Another session cannot be asked for it: the call names the session it is not of.
    let other = open_session(&q, &session_job()).await;
    let call = Call {
        checkpoint: Some(cp.clone()),
        ..Call::new(&other.id, CallOp::Restore)
    };
    let refused = match q
        .call_session(&call, Duration::from_secs(60), &mut |_| {})
        .await
    {
        Ok(event) => format!("{event:?}"),
        Err(e) => e.to_string(),
    };
    assert!(refused.contains("is a checkpoint of session"), "{refused}");
    let (code, _, err) = forkbox_cli(&url, &["session", "drop-checkpoint", &cp]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = forkbox_cli(&url, &["session", "restore", &cp]);
    assert_ne!(code, 0);
    assert!(err.contains("is unknown"), "{err}");
    let (code, _, err) = forkbox_cli(&url, &["session", "restore", "not-a-checkpoint"]);
    assert_ne!(code, 0);
    assert!(err.contains("is not a checkpoint's id"), "{err}");
}
