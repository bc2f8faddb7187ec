//! Sessions at the engine level: a warm engine, call frames sent with fresh ids and read up to
//! their answer, and a test binary's re-run by `nobody` (the rootless node).

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use forkbox::sandbox::{Engine, EngineConfig, PythonRuntime, PythonSettings, SandboxSession};
use serde_json::{json, Value};

/// The zygote named by the environment variable `var` (a copy of the binary that `nobody`
/// can execute, for the rootless re-runs), else the binary under test.
pub fn zygote(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| super::BIN.into())
}

/// An engine of `slots` job slots on `zygote` with the warm Python runtime, which must be
/// available on this host.
pub fn warm_engine(zygote: &str, slots: usize) -> Engine {
    let engine = Engine::start(EngineConfig {
        zygote_exe: zygote.into(),
        slots,
        python: Some(PythonSettings::default()),
        ..EngineConfig::default()
    })
    .expect("engine");
    if let PythonRuntime::Unavailable(why) = &engine.mechanisms().python {
        panic!("the warm runtime is unavailable on this host: {why}");
    }
    engine
}

/// What one call produced: its streamed events and its terminal event (result or error).
pub struct Answer {
    pub events: Vec<Value>,
    pub result: Value,
}

impl Answer {
    /// The data of the streamed events of `kind`, joined.
    pub fn streamed(&self, kind: &str) -> String {
        self.events
            .iter()
            .filter(|e| e["kind"] == kind)
            .map(|e| e["data"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

static NEXT: AtomicU64 = AtomicU64::new(1);

/// Sends `call` with a fresh id and reads its events up to its result or error, each within
/// 60 s; every event must be this call's.
pub async fn call(session: &mut SandboxSession, mut call: Value) -> Answer {
    let id = format!("c{}", NEXT.fetch_add(1, Ordering::Relaxed));
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

/// Runs a cell and returns its terminal event.
pub async fn run(session: &mut SandboxSession, code: &str) -> Value {
    call(session, json!({"op": "run_code", "code": code}))
        .await
        .result
}

/// Runs a cell and returns its value's text, failing on any exception.
pub async fn value(session: &mut SandboxSession, code: &str) -> String {
    let r = run(session, code).await;
    assert_eq!(r["ok"], true, "{code}: {r}");
    r["text"].as_str().unwrap_or_default().to_owned()
}

/// Runs each of `tests` of this test binary (`name`) again as `nobody`, from a copy it can
/// execute, with `zygote_var` naming a zygote it can execute and `env` (`NAME=value`) set,
/// and asserts that each passes. Skipped, and says so, when this run is not root's.
pub fn rerun_as_nobody(name: &str, zygote_var: &str, env: &[&str], tests: &[&str]) {
    if !super::is_root() {
        forkbox_testkit::skipped("the rootless re-run starts from root (this run is unprivileged)");
        return;
    }
    let me = std::env::current_exe().unwrap();
    let dir = std::env::temp_dir().join(format!("forkbox-{name}-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join(name);
    std::fs::copy(&me, &copy).unwrap();
    for p in [&dir, &copy] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let zygote = format!("{zygote_var}={}", super::unprivileged_bin().display());
    let failed: Vec<String> = tests
        .iter()
        .filter_map(|test| {
            let out = Command::new("runuser")
                .args(["-u", "nobody", "--", "env", &zygote])
                .args(env)
                .arg(&copy)
                .args(["--exact", test, "--nocapture", "--test-threads", "1"])
                .current_dir(&dir)
                .output()
                .unwrap();
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let passed = out.status.success() && text.contains("1 passed");
            (!passed).then(|| format!("{test} as nobody:\n{text}"))
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// `a` writes a file and starts a process; `b` sees neither, while `a` sees its process (so
/// the check can fail).
pub async fn assert_unseen_by(a: &mut SandboxSession, b: &mut SandboxSession) {
    call(
        a,
        json!({"op": "files_write", "path": "secret", "data": "a's"}),
    )
    .await;
    run(
        a,
        "import subprocess\np = subprocess.Popen(['sleep', '777'])",
    )
    .await;
    let r = call(b, json!({"op": "files_read", "path": "secret"}))
        .await
        .result;
    assert_eq!(r["ok"], false, "{r}");
    let seen = "import os\nany(b'777' in open('/proc/%s/cmdline' % p, 'rb').read() for p in os.listdir('/proc') if p.isdigit())";
    assert_eq!(run(b, seen).await["text"], "False");
    assert_eq!(run(a, seen).await["text"], "True", "the check can fail");
}

/// A cell's result that ran out of disk: `OSError`, no space left.
pub fn assert_no_space(r: &Value) {
    assert_eq!(r["exception"]["name"], "OSError", "{r}");
    assert!(
        r["exception"]["value"]
            .as_str()
            .unwrap()
            .contains("No space left"),
        "{r}"
    );
}
