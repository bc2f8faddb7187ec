//! A job the sandbox stops (its timeout, its output cap, its CPU time, a cancel) still reports
//! what it used: judges give time and memory with a time-limit verdict. Each job first holds
//! 64 MiB and burns half a CPU second, says so on stderr, then goes on burning until it is
//! stopped; its outcome must count at least that, cold and in the warm Python runtime.

mod sandbox_support;

use std::process::Stdio;
use std::time::Duration;

use forkbox_queue::schema::{Job, Limits, Outcome, Runtime, Status};

use sandbox_support::session::warm_engine;
use sandbox_support::{emulated_guest, forkbox, identities, BIN};

/// What every job holds and burns before it is stopped.
const HELD_KB: u64 = 64 * 1024;
const BURNED_MS: u64 = 500;

/// Holds 64 MiB (written, so resident), burns `BURNED_MS` of CPU, says so, then runs `then`.
fn program(then: &str) -> String {
    format!(
        "import sys, time\n\
         held = b'x' * ({HELD_KB} * 1024)\n\
         t = time.process_time()\n\
         while time.process_time() - t < {BURNED_MS} / 1000: pass\n\
         print('burned', file=sys.stderr, flush=True)\n\
         {then}\n"
    )
}

const SPIN: &str = "while True: pass";

/// The wall time a job is given before it is stopped from outside (its timeout, a cancel):
/// enough to start Python, hold its memory and burn its share, and several times that in the VM
/// tier's emulated guest, where starting the interpreter alone takes seconds. The outcome says
/// whether it was enough ("stopped too early").
fn grace_ms() -> u64 {
    if emulated_guest() {
        20_000
    } else {
        4_000
    }
}

/// The CPU limit of the `cpu_limit` case: past what starting Python and holding its memory take
/// before the burn (in the emulated guest that start alone has taken over a CPU second).
fn cpu_limit_ms() -> u64 {
    if emulated_guest() {
        8_000
    } else {
        1_500
    }
}

fn python(program: &str, warm: bool) -> Job {
    Job {
        runtime: warm.then_some(Runtime::Python),
        ..Job::argv(["python3", "-c", program])
    }
}

/// What is wrong with `out`, if anything.
fn miscounted(what: &str, out: &Outcome, status: Status) -> Option<String> {
    let shown = format!(
        "{what}: status={} cpu_ms={} max_rss_kb={} error={:?} stderr={}",
        out.status,
        out.cpu_ms,
        out.max_rss_kb,
        out.error,
        out.stderr.trim()
    );
    if out.status != status {
        Some(format!("want {status}: {shown}"))
    } else if !out.stderr.contains("burned") {
        Some(format!("stopped too early: {shown}"))
    } else if out.cpu_ms < BURNED_MS || out.max_rss_kb < HELD_KB {
        Some(format!("usage not counted: {shown}"))
    } else {
        None
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_job_reports_the_cpu_time_and_memory_it_used() {
    let engine = tokio::task::spawn_blocking(|| warm_engine(BIN, 2))
        .await
        .unwrap();
    let mut wrong = Vec::new();
    let mut check =
        |what: String, out: Outcome, status| wrong.extend(miscounted(&what, &out, status));
    for warm in [false, true] {
        let kind = if warm { "warm" } else { "cold" };
        let timed_out = Job {
            timeout_ms: Some(grace_ms()),
            ..python(&program(SPIN), warm)
        };
        let out = engine.run(&timed_out).await;
        check(format!("{kind} timeout"), out, Status::Timeout);

        let flooded = Job {
            limits: Limits {
                output_bytes: Some(1000),
                ..Limits::default()
            },
            timeout_ms: Some(3 * grace_ms()),
            ..python(&program("while True: sys.stdout.write('y' * 4096)"), warm)
        };
        let out = engine.run(&flooded).await;
        check(format!("{kind} output_limit"), out, Status::OutputLimit);

        let over_cpu = Job {
            limits: Limits {
                cpu_ms: Some(cpu_limit_ms()),
                ..Limits::default()
            },
            timeout_ms: Some(3 * grace_ms()),
            ..python(&program(SPIN), warm)
        };
        let out = engine.run(&over_cpu).await;
        check(format!("{kind} cpu_limit"), out, Status::CpuLimit);

        // Cancelled once it has had the time to burn its share (the outcome says whether it
        // did).
        let cancelled = Job {
            timeout_ms: Some(3 * grace_ms()),
            ..python(&program(SPIN), warm)
        };
        let cancel = tokio::time::sleep(Duration::from_millis(grace_ms()));
        let out = engine
            .run_in(engine.slot().await, &cancelled, cancel, None)
            .await
            .outcome;
        check(format!("{kind} cancelled"), out, Status::Cancelled);
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Through `forkbox run`, as host root and as an ordinary user (whose zygote reads the
/// sandbox's `/proc` with no privilege on the host).
#[test]
fn a_timed_out_run_reports_its_usage_as_root_and_as_nobody() {
    let timeout_ms = grace_ms().to_string();
    for who in identities() {
        let out = forkbox(who)
            .args(["run", "--json", "--timeout-ms", &timeout_ms, "--"])
            .args(["python3", "-c", &program(SPIN)])
            .stdin(Stdio::null())
            .output()
            .expect("spawning forkbox");
        let outcome: Outcome = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{who:?}: not an outcome ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let wrong = miscounted(&format!("{who:?}"), &outcome, Status::Timeout);
        assert!(wrong.is_none(), "{}", wrong.unwrap_or_default());
    }
}
