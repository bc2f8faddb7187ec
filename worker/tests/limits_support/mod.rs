//! Helpers of the limit tests: `forkbox run --json` as host root and as `nobody`, and what the
//! host offers (runtimes, cgroup delegation).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::Value;

use crate::sandbox_support::{forkbox, Identity};

/// A job's result as `forkbox run --json` printed it.
pub struct Ran {
    pub json: Value,
    pub who: Identity,
}

impl Ran {
    pub fn status(&self) -> &str {
        self.json["status"].as_str().unwrap_or("?")
    }
    pub fn stdout(&self) -> &str {
        self.json["stdout"].as_str().unwrap_or("")
    }
    pub fn stderr(&self) -> &str {
        self.json["stderr"].as_str().unwrap_or("")
    }
    pub fn u64(&self, field: &str) -> u64 {
        self.json[field].as_u64().unwrap_or(0)
    }
    /// The whole result, for failure messages.
    pub fn dump(&self) -> String {
        format!("{:?}: {}", self.who, self.json)
    }
}

/// Parses the JSON result of a finished `forkbox run --json`.
pub fn parse(who: Identity, out: std::process::Output) -> Ran {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "{who:?}: not JSON ({e}): stdout={stdout} stderr={}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    Ran { json, who }
}

/// `forkbox run --json OPTS -c SHELL` as `who`.
pub fn run_shell(who: Identity, opts: &[&str], shell: &str) -> Ran {
    let out = forkbox(who)
        .arg("run")
        .arg("--json")
        .args(opts)
        .arg("-c")
        .arg(shell)
        .stdin(Stdio::null())
        .output()
        .expect("spawning forkbox");
    parse(who, out)
}

/// `forkbox run --json OPTS -- ARGV` as `who`.
pub fn run_argv(who: Identity, opts: &[&str], argv: &[&str]) -> Ran {
    let out = forkbox(who)
        .arg("run")
        .arg("--json")
        .args(opts)
        .arg("--")
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .expect("spawning forkbox");
    parse(who, out)
}

/// Whether `program` is on the host's PATH (the sandbox sees the host's /usr).
pub fn installed(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|d| {
            let p = d.join(program);
            p.is_file() && nix::unistd::access(&p, nix::unistd::AccessFlags::X_OK).is_ok()
        })
    })
}

/// Whether the suite was told that every runtime must be present (the Makefile installs them).
pub fn runtimes_required() -> bool {
    std::env::var_os("FORKBOX_REQUIRE_RUNTIMES").is_some_and(|v| v == "1")
}

/// The cgroup v2 directory delegated to this process (as the node sees it), if any.
pub fn delegated_cgroup() -> Result<PathBuf, String> {
    use forkbox::sandbox::{probe_cgroup as probe, Delegation};
    match probe(
        Path::new("/proc/self/mountinfo"),
        Path::new("/proc/self/cgroup"),
    )
    .delegation
    {
        Delegation::Delegated(dir) => Ok(dir),
        Delegation::Unavailable(reason) => Err(reason),
    }
}
