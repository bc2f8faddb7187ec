//! How a test reports that it could not run here.
//!
//! A test that needs something the host lacks (a capability, a tool, a kernel feature) calls
//! [`skipped`] and returns. The line it prints, `SKIPPED: <reason>`, is what `make test` counts
//! and lists at the end, so a skip is never a silent pass. With `FORKBOX_REQUIRE_PRIVILEGED=1`
//! in the environment a skip is a failure instead, for hosts that are meant to run everything.

use std::fmt::Display;

/// The variable that turns every skip into a failure.
pub const REQUIRE_ALL: &str = "FORKBOX_REQUIRE_PRIVILEGED";

/// Reports a skipped test (or part of one) with its reason; panics when skips are not allowed.
pub fn skipped(reason: impl Display) {
    if std::env::var(REQUIRE_ALL).is_ok_and(|v| v == "1") {
        panic!("{REQUIRE_ALL}=1 and this test cannot run here: {reason}");
    }
    println!("SKIPPED: {reason}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_a_failure_when_every_test_must_run() {
        // The only test in this binary that touches the variable.
        std::env::set_var(REQUIRE_ALL, "1");
        let outcome = std::panic::catch_unwind(|| skipped("no such tool"));
        std::env::remove_var(REQUIRE_ALL);
        let message = outcome.expect_err("a skip must fail under FORKBOX_REQUIRE_PRIVILEGED=1");
        let text = message.downcast_ref::<String>().unwrap();
        assert!(text.contains("no such tool"), "{text}");
    }

    /// Every skip goes through [`skipped`], so `FORKBOX_REQUIRE_PRIVILEGED=1` catches it: no
    /// test of the workspace prints its own `SKIPPED:` line.
    #[test]
    fn no_test_prints_its_own_skip() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut offenders = Vec::new();
        for crate_dir in ["queue", "worker", "loadgen", "private-redis", "testkit"] {
            for dir in ["src", "tests"] {
                scan(&root.join(crate_dir).join(dir), &mut offenders);
            }
        }
        assert!(offenders.is_empty(), "use skip::skipped: {offenders:?}");
    }

    fn scan(dir: &std::path::Path, offenders: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                scan(&path, offenders);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !path.ends_with("testkit/src/skip.rs")
            {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let needle = "println!(\"SKIPPED";
                for (n, line) in text.lines().enumerate() {
                    if line.contains(needle) {
                        offenders.push(format!("{}:{}", path.display(), n + 1));
                    }
                }
            }
        }
    }
}
