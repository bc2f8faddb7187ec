//! A session's `checkpoint` and `restore` calls on its node: the engine's checkpoint
//! ([`Engine::checkpoint_session`]) kept by the session's task, and a restore made as a fork's
//! branch is: room in the node's session capacity, the engine's restore, the new session
//! recorded in Redis naming its parent, how it was made and the checkpoint
//! (`lua/session_fork.lua`), and its task started. Run by the session's task between its
//! calls; the checkpoints themselves live in that task (they end with the session).

use std::time::{Duration, Instant};

use forkbox_queue::Queue;
use serde_json::{json, Map, Value};

use crate::node::seam::Boxed;
use crate::node::session_fork::{record_branches, ForkRights};
use crate::node::session_task::{Checkpointer, TaskSetup};
use crate::sandbox::{SandboxSession, SessionCheckpoint};

impl Checkpointer for ForkRights {
    fn checkpoint<'a>(
        &'a self,
        session: &'a mut SandboxSession,
    ) -> Boxed<'a, Result<SessionCheckpoint, String>> {
        Box::pin(async move {
            self.engine
                .checkpoint_session(session, &self.spec)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn restore<'a>(
        &'a self,
        cp: &'a mut SessionCheckpoint,
        id: &'a str,
        setup: &'a TaskSetup,
        queue: &'a Queue,
    ) -> Boxed<'a, Map<String, Value>> {
        Box::pin(restore(self, cp, id, setup, queue))
    }
}

/// Restores the checkpoint `cp` (`id`) of the session of `setup`: the call's result's fields.
async fn restore(
    rights: &ForkRights,
    cp: &mut SessionCheckpoint,
    id: &str,
    setup: &TaskSetup,
    queue: &Queue,
) -> Map<String, Value> {
    let Some(sessions) = rights.sessions.upgrade() else {
        return failed("the node is stopping".into());
    };
    let sid = uuid::Uuid::now_v7().to_string();
    if sessions
        .reserve_branches(std::slice::from_ref(&sid), setup.memory_mb)
        .is_err()
    {
        return failed(format!(
            "session capacity: node {} has no room for the restored session of {} MiB \
             (--max-sessions, --session-memory-mb)",
            setup.node, setup.memory_mb
        ));
    }
    let b = match rights.engine.restore_checkpoint(cp, &rights.spec).await {
        Ok(b) => b,
        Err(e) => {
            sessions.release_branch(&sid);
            return failed(format!("checkpoint {id}: {e}"));
        }
    };
    let now_ms = forkbox_queue::now_ms();
    let expires_ms = now_ms + rights.ttl_s * 1000;
    let made = [
        ("made_by", "restore".to_owned()),
        ("checkpoint", id.to_owned()),
    ];
    let ids = std::slice::from_ref(&sid);
    if !record_branches(queue, setup, rights, ids, (now_ms, expires_ms), &made).await {
        b.session.kill().await;
        sessions.release_branch(&sid);
        return failed(
            "the restored session could not be recorded: its parent is no longer live".into(),
        );
    }
    let mut out = Map::new();
    out.insert("ok".into(), json!(true));
    out.insert("error".into(), Value::Null);
    out.insert("id".into(), json!(sid));
    out.insert("checkpoint".into(), json!(id));
    out.insert("execution_count".into(), json!(b.execution_count));
    out.insert("not_carried".into(), json!(b.not_carried));
    let restored = TaskSetup {
        sid: sid.clone(),
        parent: Some(setup.sid.clone()),
        made_by: Some("restore"),
        from_checkpoint: Some(id.to_owned()),
        created_ms: now_ms,
        expires_ms,
        sandbox_deadline: Instant::now() + Duration::from_millis(rights.sandbox_ttl_ms),
        ..setup.clone()
    };
    sessions.start_branch(queue.clone(), b.session, restored);
    out
}

fn failed(why: String) -> Map<String, Value> {
    Map::from_iter([
        ("ok".to_owned(), json!(false)),
        ("error".to_owned(), json!(why)),
    ])
}
