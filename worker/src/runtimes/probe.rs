//! Probing a catalogue on this node: each language's version command runs in a sandbox, as a
//! job would run it, so a toolchain the sandboxes cannot see (outside the exposed
//! directories, or missing) is simply absent.

use std::time::Duration;

use forkbox_queue::schema::{Job, Status};

use super::{parse_version, Available, Catalogue, Language};
use crate::sandbox::Engine;

/// How long one version command may take (a JVM's start-up is the slowest).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// What a node can run: every language of `catalogue` whose version command exits 0 within
/// `timeout` and prints a version, in catalogue order. The probes run one at a time beside the
/// engine's slots, so a node serves its jobs at full width while it probes.
pub async fn probe(engine: &Engine, catalogue: &Catalogue, timeout: Duration) -> Vec<Available> {
    let mut found = Vec::new();
    for lang in catalogue.languages() {
        if let Some(available) = probe_one(engine, lang, timeout).await {
            found.push(available);
        }
    }
    found
}

async fn probe_one(engine: &Engine, lang: &Language, timeout: Duration) -> Option<Available> {
    let job = Job {
        timeout_ms: Some(timeout.as_millis().max(1) as u64),
        ..Job::argv(lang.version.clone())
    };
    let outcome = engine.run_beside_slots(&job).await;
    if outcome.status != Status::Ok {
        tracing::debug!(
            language = lang.name,
            status = %outcome.status,
            "runtime probe: {:?} did not answer; the language is not offered",
            lang.version
        );
        return None;
    }
    let version = parse_version(&outcome.stdout).or_else(|| parse_version(&outcome.stderr))?;
    Some(Available {
        language: lang.name.clone(),
        version,
    })
}

/// Probes `catalogue` and leaves what answered in `published`, as the JSON the node publishes
/// with its heartbeat (a list of [`Available`]).
pub async fn publish_when_probed(
    engine: Engine,
    catalogue: Catalogue,
    published: std::sync::Arc<std::sync::OnceLock<String>>,
) {
    let found = probe(&engine, &catalogue, PROBE_TIMEOUT).await;
    let names: Vec<String> = found
        .iter()
        .map(|a| format!("{} {}", a.language, a.version))
        .collect();
    tracing::info!(
        "runtimes: {} of {} language(s) available: {}",
        found.len(),
        catalogue.languages().len(),
        names.join(", ")
    );
    let json = serde_json::to_string(&found).expect("a list of runtimes serializes");
    let _ = published.set(json);
}
