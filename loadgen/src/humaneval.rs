//! The HumanEval workload: 164 problems, each run as its canonical solution followed by its
//! tests, so every job is expected to pass.
//!
//! The data set ships gzip-compressed; it is decompressed by spawning `gzip -dc` rather than by
//! adding a compression crate for one file read once per run.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};
use forkbox_queue::{FileData, Job};
use serde::Deserialize;

/// One problem of the data set (the fields we use).
#[derive(Debug, Clone, Deserialize)]
pub struct Problem {
    pub task_id: String,
    pub prompt: String,
    pub canonical_solution: String,
    pub test: String,
    pub entry_point: String,
}

impl Problem {
    /// The program the reference harness runs: prompt, solution, tests, then the check call.
    pub fn program(&self) -> String {
        format!(
            "{}{}\n{}\ncheck({})\n",
            self.prompt, self.canonical_solution, self.test, self.entry_point
        )
    }

    pub fn job(&self) -> Job {
        Job {
            files: [("main.py".to_owned(), FileData::Text(self.program()))].into(),
            timeout_ms: Some(30_000),
            ..Job::argv(["python3", "main.py"])
        }
    }
}

/// Where the data set is: `--humaneval`, else `FORKBOX_HUMANEVAL`, else
/// `../shared/data/HumanEval.jsonl.gz` next to the workspace.
pub fn locate(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_owned();
    }
    if let Some(p) = std::env::var_os("FORKBOX_HUMANEVAL") {
        return PathBuf::from(p);
    }
    crate::workspace_root().join("../shared/data/HumanEval.jsonl.gz")
}

/// Reads a `.jsonl` or `.jsonl.gz` file of problems.
pub fn load(path: &Path) -> anyhow::Result<Vec<Problem>> {
    let bytes = if path.extension().is_some_and(|e| e == "gz") {
        let out = Command::new("gzip")
            .arg("-dc")
            .arg(path)
            .output()
            .context("running gzip -dc")?;
        if !out.status.success() {
            bail!(
                "gzip -dc {}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        out.stdout
    } else {
        std::fs::read(path).with_context(|| format!("reading {}", path.display()))?
    };
    parse(&bytes).with_context(|| format!("parsing {}", path.display()))
}

pub fn parse(bytes: &[u8]) -> anyhow::Result<Vec<Problem>> {
    let text = std::str::from_utf8(bytes).context("not UTF-8")?;
    let mut problems = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let p: Problem = serde_json::from_str(line).with_context(|| format!("line {}", n + 1))?;
        problems.push(p);
    }
    if problems.is_empty() {
        bail!("no problems");
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"task_id":"T/0","prompt":"def f(x):\n","canonical_solution":"    return x\n","test":"def check(c):\n    assert c(1) == 1\n","entry_point":"f"}"#;

    #[test]
    fn program_is_prompt_solution_test_check() {
        let p = &parse(LINE.as_bytes()).unwrap()[0];
        assert_eq!(
            p.program(),
            "def f(x):\n    return x\n\ndef check(c):\n    assert c(1) == 1\n\ncheck(f)\n"
        );
        let job = p.job();
        assert_eq!(job.command(), ["python3", "main.py"]);
        job.validate().unwrap();
    }

    #[test]
    fn reads_gzip_through_gzip_dc() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("p.jsonl");
        std::fs::write(&plain, format!("{LINE}\n{LINE}\n")).unwrap();
        let st = Command::new("gzip").arg("-k").arg(&plain).status().unwrap();
        assert!(st.success());
        let problems = load(&dir.path().join("p.jsonl.gz")).unwrap();
        assert_eq!(problems.len(), 2);
        assert_eq!(load(&plain).unwrap().len(), 2);
    }

    #[test]
    fn shared_data_set_has_164_problems_when_present() {
        let path = locate(None);
        if !path.exists() {
            forkbox_testkit::skipped(format!("{} is absent", path.display()));
            return;
        }
        let problems = load(&path).unwrap();
        assert_eq!(problems.len(), 164);
        assert!(problems.iter().all(|p| p.job().validate().is_ok()));
    }
}
