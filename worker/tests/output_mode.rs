//! `output_mode: truncate`: a job that writes past its output cap has its output cut and runs
//! to its own end, so a judge grading stdout sees the job's own exit code; the default still
//! kills it (`output_limit`). Through `forkbox run --json`, as host root and as `nobody`.

mod sandbox_support;

use std::process::Stdio;

use forkbox_queue::{Outcome, Status};
use sandbox_support::{forkbox, identities, Identity};

/// A correct answer on stdout after 3 MB of stderr, then exit `code`.
fn flood_then(who: Identity, mode: &[&str], code: i32) -> Outcome {
    let out = forkbox(who)
        .args([
            "run",
            "--json",
            "--output-bytes",
            "65536",
            "--timeout-ms",
            "30000",
        ])
        .args(mode)
        .arg("-c")
        .arg(format!(
            "head -c 3000000 /dev/zero | tr '\\0' e >&2; echo 42; exit {code}"
        ))
        .stdin(Stdio::null())
        .output()
        .expect("spawning forkbox");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{who:?}: not an outcome ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn truncate_mode_cuts_the_output_and_keeps_the_exit_code() {
    for who in identities() {
        for (code, status) in [(0, Status::Ok), (3, Status::Failed)] {
            let o = flood_then(who, &["--output-mode", "truncate"], code);
            assert_eq!(
                (o.status, o.exit_code),
                (status, code),
                "{who:?}: {:?}",
                o.error
            );
            assert_eq!(o.stdout, "42\n", "{who:?}");
            assert!(o.stderr_truncated && !o.stdout_truncated, "{who:?}");
            assert_eq!(o.stderr.len(), 65536, "{who:?}");
        }
        // The default, and `kill` named, still stop the job at the cap.
        for mode in [&[][..], &["--output-mode", "kill"][..]] {
            let o = flood_then(who, mode, 0);
            assert_eq!(o.status, Status::OutputLimit, "{who:?} {mode:?}");
            assert!(o.stderr_truncated, "{who:?}");
        }
    }
}
