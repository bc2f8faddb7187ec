//! Staged jobs (a `compile` stage before the program) on this engine: until the sandbox runs
//! the two stages, a staged job is refused as `invalid` with `compile` named, never run as its
//! program alone.

mod sandbox_support;

use forkbox::sandbox::{Engine, EngineConfig};
use forkbox_queue::schema::{CompileStage, FileData, Job, Status};

const BIN: &str = env!("CARGO_BIN_EXE_forkbox");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_job_is_refused_not_run_without_its_compile_stage() {
    let engine = Engine::start(EngineConfig {
        zygote_exe: BIN.into(),
        slots: 1,
        ..EngineConfig::default()
    })
    .expect("engine");
    let job = Job {
        files: [("marker".to_owned(), FileData::Text("x".into()))].into(),
        compile: Some(CompileStage::shell("touch compiled")),
        ..Job::shell("echo ran; ls")
    };
    let outcome = engine.run(&job).await;
    assert_eq!(outcome.status, Status::Invalid, "{outcome:?}");
    assert!(outcome.stdout.is_empty(), "the program did not run");
    let error = outcome.error.unwrap_or_default();
    assert!(error.starts_with("compile: "), "{error}");
    // The same job without the stage runs.
    let plain = engine
        .run(&Job {
            compile: None,
            ..job
        })
        .await;
    assert_eq!(plain.status, Status::Ok, "{plain:?}");
    assert_eq!(plain.stdout, "ran\nmarker\n");
}
