//! The protocol contract as data, for clients in other languages.
//!
//! [`contract`] describes, from the types and constants of this crate, what a client must
//! agree with: the job's fields, the limit names and their ranges, the defaults and a node's default
//! maximums, the key layout,
//! the stream fields, the statuses, and the enqueue script's source. `forkbox schema --json`
//! prints it; the Python SDK ships it as `forkbox/schema.json` and its tests compare the SDK
//! against it, and this module's test fails when that checked-in copy drifts from the code.

use serde_json::{json, Value};

use crate::keys::{Keys, GROUP, JOB_FIELD, RESULT_FIELD, VETTED_FIELD};
use crate::queue::QueueConfig;
use crate::schema::{
    CompileStage, EffectiveLimits, FileData, Job, JobCeilings, Limits, Network, OutputMode,
    Runtime, StageLimits, StageStatus, Status, DEFAULT_MAX_JOB_BYTES, DEFAULT_TIMEOUT_MS,
    MAX_ATTEMPTS, MAX_BATCH_LEN, MAX_ID_LEN, MAX_RESULT_TTL_S, MAX_TIMEOUT_MS,
};

/// The enqueue script every client runs to add a job (idempotency marker, `vetted`, batch
/// `total` counted once per id).
pub const ENQUEUE_LUA: &str = include_str!("../lua/enqueue.lua");

/// The script that says where a job is (queued, running, finished or unknown), read-only.
pub const JOB_STATE_LUA: &str = include_str!("../lua/job_state.lua");

/// The contract, as JSON (see the module documentation).
pub fn contract() -> Value {
    let every_field = Job {
        id: Some("x".into()),
        stdin: Some(FileData::Text("x".into())),
        env: [("A".to_owned(), "1".to_owned())].into(),
        files: [("f".to_owned(), FileData::Text("x".into()))].into(),
        cwd: Some("x".into()),
        timeout_ms: Some(1),
        limits: Limits {
            memory_mb: Some(1),
            ..Limits::default()
        },
        collect: vec!["x".into()],
        batch: Some("x".into()),
        result_ttl_s: Some(1),
        max_attempts: Some(1),
        reply_to: Some("x".into()),
        runtime: Some(Runtime::Python),
        output_mode: Some(OutputMode::Truncate),
        network: Some(Network::Loopback),
        compile: Some(CompileStage::shell("x")),
        session: Some(crate::session::SessionSpec::default()),
        ..Job::shell("x")
    };
    let mut job_fields: Vec<String> = object_keys(&every_field);
    job_fields.push("argv".into());
    job_fields.sort();
    let limits: Vec<Value> = Limits::ranges()
        .iter()
        .map(|(name, min, max)| json!({"name": name, "min": min, "max": max}))
        .collect();
    let mut compile_fields: Vec<String> = object_keys(&CompileStage {
        timeout_ms: Some(1),
        limits: StageLimits {
            memory_mb: Some(1),
            ..StageLimits::default()
        },
        ..CompileStage::shell("x")
    });
    compile_fields.push("argv".into());
    compile_fields.sort();
    let stage_limits: Vec<&str> = object_keys(&StageLimits {
        memory_mb: Some(1),
        cpu_ms: Some(1),
        pids: Some(1),
        output_bytes: Some(1),
    })
    .into_iter()
    .map(|name| {
        Limits::ranges()
            .into_iter()
            .find(|(n, _, _)| *n == name)
            .map(|(n, _, _)| n)
            .expect("a stage limit is a job limit")
    })
    .collect();
    let q = Keys::new("Q").expect("a valid queue name");
    let queue = QueueConfig::default();
    json!({
        "protocol": 1,
        "job_fields": job_fields,
        "limits": limits,
        "defaults": {
            "timeout_ms": DEFAULT_TIMEOUT_MS,
            "max_timeout_ms": MAX_TIMEOUT_MS,
            "max_job_bytes": DEFAULT_MAX_JOB_BYTES,
            "max_id_len": MAX_ID_LEN,
            "max_batch_len": MAX_BATCH_LEN,
            "max_max_attempts": MAX_ATTEMPTS,
            "max_result_ttl_s": MAX_RESULT_TTL_S,
            "result_ttl_s": queue.result_ttl_s,
            "max_attempts": queue.max_attempts,
            "limits": serde_json::to_value(EffectiveLimits::default()).expect("serializes"),
        },
        "node_maximums": serde_json::to_value(JobCeilings::default()).expect("serializes"),
        "networks": Network::ALL.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
        "statuses": Status::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "compile": {
            "fields": compile_fields,
            "limits": stage_limits,
            "statuses": StageStatus::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        },
        "output_modes": [OutputMode::Kill.as_str(), OutputMode::Truncate.as_str()],
        "group": GROUP,
        "stream_fields": {"job": JOB_FIELD, "vetted": VETTED_FIELD, "result": RESULT_FIELD},
        "keys": {
            "prefix": q.prefix(),
            "jobs": q.jobs(),
            "result": q.result("<id>"),
            "done": q.done("<id>"),
            "wake": q.wake("<id>"),
            "results": q.results(),
            "dead": q.dead(),
            "batch": q.batch("<batch>"),
            "batch_lines": q.batch_lines("<batch>"),
            "cancelled": q.cancelled(),
            "cancel_channel": q.cancel_channel(),
            "cancel_ahead": q.cancel_ahead(),
            "worker": q.worker("<name>"),
            "runtimes": q.runtimes("<name>"),
            "idem": q.idem("<id>"),
            "replies": q.replies("<name>"),
            "meta": q.meta(),
        },
        "partitions": partitions_contract(),
        "scripts": {
            "enqueue": ENQUEUE_LUA,
            "job_state": JOB_STATE_LUA,
            "session_call": SESSION_CALL_LUA,
            "session_open": SESSION_OPEN_LUA,
            "session_end": SESSION_END_LUA,
            "session_fork": SESSION_FORK_LUA,
        },
        "sessions": sessions_contract(&q),
    })
}

/// The script a client sends a call to a session with (and checks a session's node with).
pub const SESSION_CALL_LUA: &str = include_str!("../lua/session_call.lua");

/// The script a node opens a session with (its create job's result and its record).
pub const SESSION_OPEN_LUA: &str = include_str!("../lua/session_open.lua");

/// The script a node ends a session with.
pub const SESSION_END_LUA: &str = include_str!("../lua/session_end.lua");

/// The script a node records a fork's branches with (and the parent's children).
pub const SESSION_FORK_LUA: &str = include_str!("../lua/session_fork.lua");

/// Sessions (docs/protocol.md "Sessions"): the create job's object, the keys, calls, events,
/// reasons, defaults and bounds.
fn sessions_contract(q: &Keys) -> Value {
    use crate::session::*;
    let ops: serde_json::Map<String, Value> = CallOp::ALL
        .iter()
        .map(|op| {
            let (takes, needs) = op.fields();
            (
                op.as_str().to_owned(),
                json!({"fields": takes, "required": needs, "immediate": op.is_immediate()}),
            )
        })
        .collect();
    json!({
        "create_fields": ["ttl_s", "idle_s"],
        "create_allows": ["id", "limits", "env", "files", "network", "runtime",
                          "result_ttl_s", "max_attempts", "session"],
        "call_fields": ["id", "session", "op", "timeout_ms"],
        "ops": ops,
        "event_kinds": ["stdout", "stderr", "result", "error"],
        "error_reasons": ErrorReason::ALL.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
        "end_reasons": EndReason::ALL.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
        "states": ["starting", "live", "ended"],
        "defaults": {
            "ttl_s": DEFAULT_SESSION_TTL_S,
            "idle_s": DEFAULT_SESSION_IDLE_S,
            "max_s": MAX_SESSION_S,
            "call_timeout_ms": DEFAULT_CALL_TIMEOUT_MS,
            "max_call_bytes": MAX_CALL_BYTES,
            "max_frame_bytes": MAX_FRAME_BYTES,
            "max_event_data_bytes": MAX_EVENT_DATA_BYTES,
            "call_queue_len": CALL_QUEUE_LEN,
            "call_events_linger_ms": CALL_EVENTS_LINGER_MS,
            "calls_maxlen": CALLS_MAXLEN,
            "backstop_grace_ms": BACKSTOP_GRACE_MS,
            "wait_slice_ms": WAIT_SLICE_MS,
            "max_fork_branches": MAX_FORK_BRANCHES,
            "checkpoint_ttl_s": DEFAULT_CHECKPOINT_TTL_S,
            "checkpoint_id_random": CHECKPOINT_ID_RANDOM,
        },
        "node_maximums": serde_json::to_value(SessionCeilings::default()).expect("serializes"),
        "stream_fields": {"call": CALL_FIELD, "event": EVENT_FIELD},
        "keys": {
            "session": q.session("<sid>"),
            "sessions": q.sessions(),
            "calls": q.calls("<node>"),
            "call": q.call("<cid>"),
        },
    })
}

/// The partition rule (docs/protocol.md "Partitioned queues") with worked examples, so other
/// languages check their implementation of it against this crate's.
fn partitions_contract() -> Value {
    use crate::keys::{partition_of, partition_tag, tag_slot, MAX_PARTITIONS, PARTITIONS_FIELD};
    let tags = |queue: &str, n: usize| -> Vec<Value> {
        (0..n)
            .map(|p| {
                let tag = partition_tag(queue, p, n);
                serde_json::json!({"partition": p, "tag": tag, "slot": tag_slot(&tag)})
            })
            .collect()
    };
    let ids = [
        "hello-p1",
        "job-1",
        "a",
        "0190a0b0-0000-7000-8000-000000000000",
    ];
    serde_json::json!({
        "meta_field": PARTITIONS_FIELD,
        "max": MAX_PARTITIONS,
        "slots": crate::keys::CLUSTER_SLOTS,
        "tag_examples": [
            {"queue": "default", "partitions": 3, "tags": tags("default", 3)},
            {"queue": "evals", "partitions": 5, "tags": tags("evals", 5)},
        ],
        "id_examples": ids
            .iter()
            .map(|id| serde_json::json!({"id": id, "partitions": 3, "partition": partition_of(id, 3)}))
            .collect::<Vec<_>>(),
    })
}

fn object_keys<T: serde::Serialize>(v: &T) -> Vec<String> {
    match serde_json::to_value(v).expect("serializes") {
        Value::Object(m) => m.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SDK's copy of the contract is this crate's, byte for byte once pretty-printed.
    /// `FORKBOX_REGENERATE=1 cargo test -p forkbox-queue contract` rewrites it.
    #[test]
    fn the_python_sdk_ships_the_current_contract() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../sdk/python/src/forkbox/schema.json");
        let want = serde_json::to_string_pretty(&contract()).unwrap() + "\n";
        if std::env::var_os("FORKBOX_REGENERATE").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} is out of date with forkbox-queue; regenerate it with \
             FORKBOX_REGENERATE=1 cargo test -p forkbox-queue contract",
            path.display()
        );
    }

    #[test]
    fn every_job_field_is_listed() {
        let c = contract();
        let fields: Vec<&str> = c["job_fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for f in [
            "id",
            "cmd",
            "argv",
            "limits",
            "batch",
            "reply_to",
            "max_attempts",
        ] {
            assert!(fields.contains(&f), "{f} missing from {fields:?}");
        }
        let unknown = format!("{{\"cmd\":\"x\",\"{}\":1}}", "nope");
        assert!(Job::parse(unknown.as_bytes(), 1 << 20).is_err());
        assert_eq!(c["limits"].as_array().unwrap().len(), 7);
    }
}
