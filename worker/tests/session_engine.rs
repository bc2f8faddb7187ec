//! Sessions at the engine level: real sandboxes running the session supervisor, no Redis.
//! Each test opens sessions, sends call frames and asserts what comes back: results, streamed
//! events, errors, and how a session ends.

use std::collections::BTreeMap;
use std::time::Duration;

use forkbox::sandbox::{
    EndReason, Engine, EngineConfig, PythonRuntime, PythonSettings, SandboxSession, SessionSpec,
};
use forkbox_queue::schema::{Limits, Runtime};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_forkbox");

fn engine() -> Engine {
    let engine = Engine::start(EngineConfig {
        zygote_exe: BIN.into(),
        slots: 2,
        python: Some(PythonSettings::default()),
        ..EngineConfig::default()
    })
    .expect("engine");
    if let PythonRuntime::Unavailable(why) = &engine.mechanisms().python {
        panic!("the warm runtime is unavailable on this host: {why}");
    }
    engine
}

fn spec() -> SessionSpec {
    SessionSpec {
        runtime: Some(Runtime::Python),
        ttl_ms: 120_000,
        ..SessionSpec::default()
    }
}

async fn open(engine: &Engine, spec: SessionSpec) -> SandboxSession {
    engine.open_session(spec).await.expect("session opens")
}

/// What one call produced: its streamed events and its terminal result.
struct Answer {
    events: Vec<Value>,
    result: Value,
}

impl Answer {
    fn streamed(&self, kind: &str) -> String {
        self.events
            .iter()
            .filter(|e| e["kind"] == kind)
            .map(|e| e["data"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Sends `call` (with a fresh id) and reads its events up to its result.
async fn call(session: &mut SandboxSession, mut call: Value) -> Answer {
    let id = format!(
        "c{}",
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    call["id"] = json!(id);
    session
        .send(&serde_json::to_vec(&call).unwrap())
        .await
        .expect("send");
    let mut events = Vec::new();
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(60), session.recv())
            .await
            .expect("an answer within 60 s")
            .unwrap_or_else(|end| panic!("session ended: {}", end.message()));
        let event: Value = serde_json::from_slice(&frame).unwrap();
        assert_eq!(event["call"], json!(id), "{event}");
        if event["kind"] == "result" || event["kind"] == "error" {
            return Answer {
                events,
                result: event,
            };
        }
        events.push(event);
    }
}

async fn run(session: &mut SandboxSession, code: &str) -> Value {
    call(session, json!({"op": "run_code", "code": code}))
        .await
        .result
}

#[tokio::test(flavor = "multi_thread")]
async fn state_persists_across_run_code_calls() {
    let engine = engine();
    let mut s = open(&engine, spec()).await;
    assert_eq!(s.hello()["kind"], "ready");
    assert!(s.runtime().is_some_and(|r| r.warm), "{:?}", s.runtime());
    let r = run(&mut s, "import math\nx = 40\ndef f(y):\n    return y + 2").await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["execution_count"], 1);
    assert_eq!(r["text"], Value::Null);
    let r = run(&mut s, "f(x) + int(math.sqrt(0))").await;
    assert_eq!(r["text"], "42", "{r}");
    assert_eq!(r["data"]["text/plain"], "42");
    assert_eq!(r["execution_count"], 2);
    let end = s.kill().await;
    assert_eq!(end.reason, EndReason::Killed);
}
