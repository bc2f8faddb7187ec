//! A session's `fork` call on its node: room for the branches in the node's session capacity
//! (all or none), the engine's fork ([`Engine::fork_session`]), the branches recorded in Redis
//! as live sessions naming their parent (`lua/session_fork.lua`), and a task started for
//! each. Run by the parent's task between its calls, so the parent's interpreter is idle.
//! Each branch succeeds or fails on its own; the call's result names each.

use std::sync::Weak;
use std::time::{Duration, Instant};

use forkbox_queue::Queue;
use serde_json::{json, Map, Value};

use crate::node::config::SessionSettings;
use crate::node::health::Backoff;
use crate::node::seam::Boxed;
use crate::node::session_task::{BranchSeats, Forker, TaskSetup};
use crate::sandbox::{Engine, ForkedBranch, SessionSpec};

/// What a session's task needs to fork it, beside its sandbox.
pub(crate) struct ForkRights {
    pub(crate) sessions: Weak<dyn BranchSeats>,
    pub(crate) engine: Engine,
    /// The sandbox's spec the session was opened with (its files included: the branch's
    /// disk is the parent's, copied).
    pub(crate) spec: SessionSpec,
    /// The create job as recorded in the session's hash (`spec`), and the lifetime asked.
    pub(crate) spec_json: String,
    pub(crate) ttl_s: u64,
    pub(crate) sandbox_ttl_ms: u64,
}

/// How many of `n` branches of `memory_mb` each fit in the node's session capacity, with
/// `live` sessions using `used_mb`.
pub(crate) fn branches_that_fit(
    settings: &SessionSettings,
    live: usize,
    used_mb: u64,
    memory_mb: u64,
    n: usize,
) -> usize {
    let by_count = settings.max_sessions.saturating_sub(live);
    let room = settings.memory_mb.saturating_sub(used_mb);
    let by_memory = room.checked_div(memory_mb).unwrap_or(u64::MAX);
    n.min(by_count)
        .min(usize::try_from(by_memory).unwrap_or(usize::MAX))
}

/// How long the branches' record may wait for Redis.
const RECORD_PATIENCE: Duration = Duration::from_secs(30);

impl Forker for ForkRights {
    fn fork<'a>(
        &'a self,
        parent: &'a mut crate::sandbox::SandboxSession,
        setup: &'a TaskSetup,
        queue: &'a Queue,
        n: usize,
    ) -> Boxed<'a, Map<String, Value>> {
        Box::pin(fork(self, parent, setup, queue, n))
    }
}

/// Forks the session of `setup` into `n` branches; the fields of the call's result.
async fn fork(
    rights: &ForkRights,
    parent: &mut crate::sandbox::SandboxSession,
    setup: &TaskSetup,
    queue: &Queue,
    n: usize,
) -> Map<String, Value> {
    let Some(sessions) = rights.sessions.upgrade() else {
        return failed("the node is stopping".into());
    };
    let sids: Vec<String> = (0..n).map(|_| uuid::Uuid::now_v7().to_string()).collect();
    if let Err(could) = sessions.reserve_branches(&sids, setup.memory_mb) {
        return failed(format!(
            "session capacity: node {} can make {could} of the {n} branches asked \
             (--max-sessions, --session-memory-mb)",
            setup.node
        ));
    }
    let forked = rights.engine.fork_session(parent, &rights.spec, n).await;
    let fork = match forked {
        Ok(f) => f,
        Err(e) => {
            sids.iter().for_each(|s| sessions.release_branch(s));
            return failed(e.to_string());
        }
    };
    let mut made: Vec<(String, ForkedBranch)> = Vec::new();
    let mut branches = Vec::new();
    for (sid, b) in sids.into_iter().zip(fork.branches) {
        match b {
            Ok(b) => made.push((sid, b)),
            Err(e) => {
                sessions.release_branch(&sid);
                branches.push(json!({"ok": false, "error": e.to_string()}));
            }
        }
    }
    let now_ms = forkbox_queue::now_ms();
    let expires_ms = now_ms + rights.ttl_s * 1000;
    let ids: Vec<String> = made.iter().map(|(s, _)| s.clone()).collect();
    let by = [("made_by", "fork".to_owned())];
    let times = (now_ms, expires_ms);
    if !made.is_empty() && !record_branches(queue, setup, rights, &ids, times, &by).await {
        for (sid, b) in made {
            b.session.kill().await;
            sessions.release_branch(&sid);
        }
        return failed("the branches could not be recorded: the parent is no longer live".into());
    }
    for (sid, b) in made {
        branches.push(json!({
            "ok": true,
            "id": sid,
            "execution_count": b.execution_count,
            "not_carried": b.not_carried,
            "reseeded": b.reseeded,
        }));
        let branch = TaskSetup {
            sid: sid.clone(),
            parent: Some(setup.sid.clone()),
            made_by: Some("fork"),
            from_checkpoint: None,
            created_ms: now_ms,
            expires_ms,
            sandbox_deadline: Instant::now() + Duration::from_millis(rights.sandbox_ttl_ms),
            ..setup.clone()
        };
        sessions.start_branch(queue.clone(), b.session, branch);
    }
    let mut out = Map::new();
    let ok = !ids.is_empty();
    out.insert("ok".into(), json!(ok));
    let error = (!ok).then(|| {
        let first = branches[0]["error"].as_str().unwrap_or_default();
        format!("no branch could be made: {first}")
    });
    out.insert("error".into(), json!(error));
    out.insert("children".into(), json!(ids));
    out.insert("branches".into(), Value::Array(branches));
    out.insert(
        "parent_pause_us".into(),
        json!(fork.parent_pause.as_micros() as u64),
    );
    out
}

fn failed(why: String) -> Map<String, Value> {
    Map::from_iter([
        ("ok".to_owned(), json!(false)),
        ("error".to_owned(), json!(why)),
    ])
}

/// Records the branches (or a restored session), with the fields `made` saying how they were
/// made; retried while Redis is away. `false`: not recorded.
pub(crate) async fn record_branches(
    queue: &Queue,
    setup: &TaskSetup,
    rights: &ForkRights,
    ids: &[String],
    (now_ms, expires_ms): (u64, u64),
    made: &[(&'static str, String)],
) -> bool {
    let mut fields = vec![
        ("node", setup.node.clone()),
        ("state", "live".to_owned()),
        ("created_ms", now_ms.to_string()),
        ("expires_ms", expires_ms.to_string()),
        ("idle_s", setup.idle_s.to_string()),
        ("last_call_ms", now_ms.to_string()),
        ("spec", rights.spec_json.clone()),
        ("runtime", setup.runtime.clone()),
        ("memory_mb", setup.memory_mb.to_string()),
    ];
    fields.extend(made.iter().cloned());
    let started = Instant::now();
    let mut backoff = Backoff::default();
    loop {
        match queue
            .fork_session_record(&setup.sid, &setup.node, ids, expires_ms, &fields)
            .await
        {
            Ok(recorded) => return recorded,
            Err(e) if e.is_connection() && started.elapsed() < RECORD_PATIENCE => {
                setup.health.failed("recording a session's branches", &e);
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(e) => {
                tracing::warn!("session {}: its branches were not recorded: {e}", setup.sid);
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_branches_that_fit_are_bounded_by_count_and_memory() {
        let settings = SessionSettings {
            max_sessions: 8,
            memory_mb: 4096,
            ..SessionSettings::default()
        };
        let cases = [
            // (live, used MiB, each MiB, asked, fit)
            (1, 512, 512, 4, 4),
            (6, 512, 512, 4, 2),
            (8, 512, 512, 4, 0),
            (1, 3072, 512, 4, 2),
            (1, 4096, 512, 4, 0),
            (0, 0, 0, 16, 8),
        ];
        for (live, used, each, asked, fit) in cases {
            assert_eq!(
                branches_that_fit(&settings, live, used, each, asked),
                fit,
                "{live} live, {used} MiB used, {each} MiB each, {asked} asked"
            );
        }
    }
}
