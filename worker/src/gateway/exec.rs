//! The request every foreign API is translated into ([`Execution`]), the job it becomes, and
//! what a finished job means for each stage ([`Executed`]).
//!
//! A compiled language runs as a staged job: the compile stage, then (if it exited 0) the run
//! stage, in one sandbox, so the binary never leaves it. Each stage has its own wall-clock
//! timeout and limits, and reports its own status, output and usage.
//!
//! [`Staging::Native`] sends the job's `compile` stage (docs/protocol.md), which the node runs
//! with the stage's own limits and reports in the result's `compile`. [`Staging::Shell`] is for
//! fleets whose workers predate the compile stage (they refuse a job carrying it as
//! `invalid`): one shell script runs the compile command under `timeout -s KILL`, its output
//! sent to files under [`STAGE_DIR`] that the job collects, then replaces itself with the run
//! command (`exec`), so the job's status, exit code, signal and output are the run stage's.
//! There the job's wall-clock limit is the sum of the two stages', its memory limit the
//! larger, and its CPU time and peak memory cover both stages.

use std::collections::BTreeMap;

use forkbox_queue::schema::{
    self, FileData, Job, JobResult, Limits, OutputMode, StageOutcome, Status,
};

use crate::gateway::catalogue::Language;
use crate::runtimes::{CompileLimits, SourceFile};

/// Where the compile stage's output and status are kept in the working directory.
pub const STAGE_DIR: &str = ".forkbox-compile";

/// One program to run, in the gateway's own terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    pub language: Language,
    /// The main source file's name and content.
    pub source_name: String,
    pub source: Vec<u8>,
    /// More files written beside it (relative paths).
    pub files: BTreeMap<String, Vec<u8>>,
    pub stdin: Vec<u8>,
    /// Arguments after the run command.
    pub args: Vec<String>,
    pub compile: StageLimits,
    pub run: StageLimits,
    /// Files returned with the result (relative paths or globs).
    pub collect: Vec<String>,
    /// The job's output cap, if the API sets one.
    pub output_bytes: Option<u64>,
    /// The run stage's standard error goes to its standard output.
    pub merge_stderr: bool,
}

/// What the gateway lets a request ask for, and what it gives one that asks nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Longest compile stage a request may ask for.
    pub max_compile_timeout_ms: u64,
    /// Longest run stage a request may ask for.
    pub max_run_timeout_ms: u64,
    /// Most memory a request may ask for, per stage.
    pub max_memory_mb: u64,
    /// The compile stage's memory when a request sets none (compilers need more than most
    /// programs: javac and g++ with `<bits/stdc++.h>` take a few hundred MB).
    pub compile_memory_mb: u64,
    /// Piston's output cap, in characters per stream.
    pub piston_output_chars: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_compile_timeout_ms: 60_000,
            max_run_timeout_ms: 60_000,
            max_memory_mb: 4096,
            compile_memory_mb: 1024,
            piston_output_chars: 1024,
        }
    }
}

/// One stage's limits (`None`: the node's default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageLimits {
    pub timeout_ms: u64,
    pub memory_mb: Option<u64>,
    pub cpu_ms: Option<u64>,
    pub pids: Option<u64>,
    /// Per stream.
    pub output_bytes: Option<u64>,
}

/// What a request asked of its compile stage, already checked against the ceilings (`None`:
/// it did not say).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AskedCompile {
    pub timeout_ms: Option<u64>,
    pub memory_mb: Option<u64>,
}

impl Bounds {
    /// A compile stage's limits: each the request's own, else the language's in the runtime
    /// catalogue, else the gateway's (`default_timeout_ms`, `compile_memory_mb`); a default
    /// is held to the ceilings a request is (so an operator's catalogue cannot pass them).
    pub fn compile_limits(
        &self,
        language: &CompileLimits,
        asked: AskedCompile,
        default_timeout_ms: u64,
    ) -> StageLimits {
        let timeout_ms = asked
            .timeout_ms
            .or(language.timeout_ms)
            .unwrap_or(default_timeout_ms);
        let memory_mb = asked
            .memory_mb
            .or(language.memory_mb)
            .unwrap_or(self.compile_memory_mb);
        StageLimits {
            timeout_ms: timeout_ms.min(self.max_compile_timeout_ms),
            memory_mb: Some(memory_mb.min(self.max_memory_mb)),
            cpu_ms: None,
            pids: language.pids,
            output_bytes: language.output_bytes,
        }
    }
}

/// How one stage ended: the protocol's own statuses, for the run stage as for the compile stage.
pub use forkbox_queue::schema::StageStatus;

/// How a staged job reaches the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Staging {
    /// The job's own `compile` stage.
    #[default]
    Native,
    /// One shell script, for workers that predate the compile stage.
    Shell,
}

impl std::str::FromStr for Staging {
    type Err = String;

    fn from_str(s: &str) -> Result<Staging, String> {
        match s {
            "native" => Ok(Staging::Native),
            "shell" => Ok(Staging::Shell),
            _ => Err(format!("staging is native or shell, not {s:?}")),
        }
    }
}

/// What one stage did.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    pub status: StageStatus,
    /// Exit code as a shell reports it (128+N when killed by signal N).
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub duration_ms: f64,
    pub cpu_ms: u64,
    pub max_rss_kb: u64,
}

/// What running an [`Execution`] gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Executed {
    /// The program ran: the compile stage (compiled languages) and the run stage.
    Ran {
        compile: Option<Stage>,
        run: Stage,
        files: BTreeMap<String, FileData>,
    },
    /// The compile stage failed; the run stage did not start.
    CompileFailed { compile: Stage },
    /// The sandbox or the queue failed: the program's fate is unknown.
    Internal { error: String },
}

impl Execution {
    /// The job that runs this execution, under id `id`: the runtime catalogue's expansion
    /// of the language (files, compile stage, run command and arguments), with the stages'
    /// limits, or why the files cannot make one.
    pub fn to_job(&self, id: &str, staging: Staging) -> Result<Job, String> {
        let mut sources = vec![SourceFile {
            name: Some(self.source_name.clone()),
            content: FileData::from_bytes(self.source.clone()),
        }];
        sources.extend(self.files.iter().map(|(name, bytes)| SourceFile {
            name: Some(name.clone()),
            content: FileData::from_bytes(bytes.clone()),
        }));
        let mut job = self
            .language
            .runtime
            .expand(&sources, &self.args)
            .map_err(|e| e.to_string())?;
        job.id = Some(id.to_owned());
        job.stdin = (!self.stdin.is_empty()).then(|| FileData::from_bytes(self.stdin.clone()));
        job.timeout_ms = Some(self.run.timeout_ms);
        job.limits = Limits {
            memory_mb: self.run.memory_mb,
            cpu_ms: self.run.cpu_ms,
            pids: self.run.pids,
            output_bytes: self.output_bytes,
            ..Limits::default()
        };
        job.output_mode = self.output_bytes.map(|_| OutputMode::Truncate);
        job.collect = self.collect.clone();
        let mut run = job.argv.take().unwrap_or_default();
        if self.merge_stderr {
            // Through a shell, which the warm runtime cannot take: such a job runs cold.
            let mut wrapped = vec![
                "/bin/sh".into(),
                "-c".into(),
                "exec \"$@\" 2>&1".into(),
                "sh".into(),
            ];
            wrapped.append(&mut run);
            run = wrapped;
            job.runtime = None;
        }
        if let Some(stage) = job.compile.as_mut() {
            match staging {
                Staging::Native => {
                    stage.timeout_ms = Some(self.compile.timeout_ms);
                    stage.limits = schema::StageLimits {
                        memory_mb: self.compile.memory_mb,
                        cpu_ms: self.compile.cpu_ms,
                        pids: self.compile.pids,
                        output_bytes: self.compile.output_bytes,
                    };
                }
                Staging::Shell => {
                    let compile = shell_words(&stage.command());
                    job.compile = None;
                    job.runtime = None;
                    job.collect.push(format!("{STAGE_DIR}/*"));
                    job.timeout_ms = Some(self.compile.timeout_ms + self.run.timeout_ms);
                    job.limits.memory_mb = match (self.compile.memory_mb, self.run.memory_mb) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => None,
                    };
                    job.limits.pids = self.compile.pids.max(self.run.pids);
                    let script =
                        staged_script(&compile, self.compile.timeout_ms, &shell_words(&run));
                    run = vec!["/bin/sh".into(), "-c".into(), script];
                }
            }
        }
        job.argv = Some(run);
        Ok(job)
    }

    /// Whether this execution has a compile stage.
    pub fn is_staged(&self) -> bool {
        self.language.is_compiled()
    }
}

/// `argv` as one shell command line, each word single-quoted.
fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The shell script of a staged job: the compile stage under its own timeout, its output,
/// status and duration in [`STAGE_DIR`], then the run stage in place of the shell when the
/// compile exited 0.
fn staged_script(compile: &str, timeout_ms: u64, run: &str) -> String {
    let secs = timeout_ms as f64 / 1000.0;
    format!(
        "mkdir -p {d} && s=$(date +%s%N) && \
         {{ timeout -s KILL {secs:.3} {compile} </dev/null >{d}/stdout 2>{d}/stderr; echo $? >{d}/status; }} && \
         echo $(( ($(date +%s%N) - s) / 1000 )) >{d}/duration_us && \
         if [ \"$(cat {d}/status)\" != 0 ]; then exit 0; fi && exec {run}",
        d = STAGE_DIR,
    )
}

/// What a finished job means for the execution it ran.
pub fn interpret(exec: &Execution, staging: Staging, result: &JobResult) -> Executed {
    let o = &result.outcome;
    let run_stage = || Stage {
        status: match o.status {
            Status::Ok => StageStatus::Ok,
            Status::Failed => StageStatus::Failed,
            Status::Timeout => StageStatus::Timeout,
            Status::CpuLimit => StageStatus::CpuLimit,
            Status::MemoryLimit => StageStatus::MemoryLimit,
            Status::OutputLimit => StageStatus::OutputLimit,
            _ => StageStatus::Signaled,
        },
        exit_code: o.exit_code,
        signal: o.signal,
        stdout: o.stdout.clone(),
        stderr: o.stderr.clone(),
        duration_ms: o.duration_ms,
        cpu_ms: o.cpu_ms,
        max_rss_kb: o.max_rss_kb,
    };
    if let Some(stage) = &o.compile {
        let compile = from_stage_outcome(stage);
        if o.status == Status::CompileError {
            return Executed::CompileFailed { compile };
        }
        if !matches!(
            o.status,
            Status::Invalid | Status::Error | Status::Cancelled
        ) {
            return Executed::Ran {
                compile: Some(compile),
                run: run_stage(),
                files: o.files.clone(),
            };
        }
    }
    if matches!(
        o.status,
        Status::Invalid | Status::Error | Status::Cancelled | Status::CompileError
    ) {
        return Executed::Internal {
            error: format!(
                "job {}: {}",
                o.status,
                o.error.as_deref().unwrap_or("no detail")
            ),
        };
    }
    if exec.is_staged() && staging == Staging::Native {
        // A worker that predates the compile stage refuses it (`invalid`, above); one that
        // took the job and reported no stage did not run it.
        return Executed::Internal {
            error: format!(
                "worker {} ran the job without its compile stage (gateway --staging shell serves such workers)",
                result.worker
            ),
        };
    }
    let mut files = o.files.clone();
    if !exec.is_staged() {
        return Executed::Ran {
            compile: None,
            run: run_stage(),
            files,
        };
    }
    let take = |files: &mut BTreeMap<String, FileData>, name: &str| -> Option<String> {
        let data = files.remove(&format!("{STAGE_DIR}/{name}"))?;
        Some(String::from_utf8_lossy(&data.to_bytes().ok()?).into_owned())
    };
    let status = take(&mut files, "status");
    let stdout = take(&mut files, "stdout").unwrap_or_default();
    let stderr = take(&mut files, "stderr").unwrap_or_default();
    let duration_us = take(&mut files, "duration_us");
    let Some(code) = status.and_then(|s| s.trim().parse::<i32>().ok()) else {
        // The compile stage never finished: the job's own limit ended it.
        let mut compile = run_stage();
        compile.stdout = stdout;
        compile.stderr = stderr;
        return Executed::CompileFailed { compile };
    };
    let duration_ms = duration_us
        .and_then(|d| d.trim().parse::<f64>().ok())
        .map_or(0.0, |us| us / 1000.0);
    let timed_out =
        code == 128 + libc::SIGKILL && duration_ms + 1.0 >= exec.compile.timeout_ms as f64;
    let compile = Stage {
        status: if code == 0 {
            StageStatus::Ok
        } else if timed_out {
            StageStatus::Timeout
        } else if code > 128 {
            StageStatus::Signaled
        } else {
            StageStatus::Failed
        },
        exit_code: code,
        signal: (code > 128).then_some(code - 128),
        stdout,
        stderr,
        duration_ms,
        cpu_ms: 0,
        max_rss_kb: 0,
    };
    if code != 0 {
        return Executed::CompileFailed { compile };
    }
    let mut run = run_stage();
    // The job's usage covers both stages; its wall time from the compile's start.
    run.duration_ms = (run.duration_ms - duration_ms).max(0.0);
    Executed::Ran {
        compile: Some(compile),
        run,
        files,
    }
}

/// A node's report of a compile stage, in the gateway's terms.
fn from_stage_outcome(s: &StageOutcome) -> Stage {
    Stage {
        status: s.status,
        exit_code: s.exit_code,
        signal: s.signal,
        stdout: s.stdout.clone(),
        stderr: s.stderr.clone(),
        duration_ms: s.duration_ms,
        cpu_ms: s.cpu_ms,
        max_rss_kb: s.max_rss_kb,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::catalogue::all_at;
    use forkbox_queue::schema::Outcome;

    fn exec(lang: &str) -> Execution {
        let language = all_at("1.0.0").find(lang).unwrap().clone();
        Execution {
            source_name: language.runtime.source_file.clone(),
            language,
            source: b"src".to_vec(),
            files: BTreeMap::new(),
            stdin: b"in".to_vec(),
            args: vec!["a b".into()],
            compile: StageLimits {
                timeout_ms: 10_000,
                memory_mb: Some(512),
                pids: Some(200),
                ..StageLimits::default()
            },
            run: StageLimits {
                timeout_ms: 2_000,
                memory_mb: Some(128),
                cpu_ms: Some(1_000),
                ..StageLimits::default()
            },
            collect: vec!["out.txt".into()],
            output_bytes: None,
            merge_stderr: false,
        }
    }

    #[test]
    fn compile_limits_come_from_the_request_then_the_language_then_the_gateway() {
        let b = Bounds {
            max_compile_timeout_ms: 30_000,
            max_memory_mb: 2048,
            compile_memory_mb: 1024,
            ..Bounds::default()
        };
        let lang = CompileLimits {
            timeout_ms: Some(20_000),
            memory_mb: Some(1536),
            pids: Some(128),
            output_bytes: Some(4096),
        };
        let big = CompileLimits {
            timeout_ms: Some(90_000),
            memory_mb: Some(8192),
            ..CompileLimits::default()
        };
        let asked = |timeout_ms, memory_mb| AskedCompile {
            timeout_ms,
            memory_mb,
        };
        let none = CompileLimits::default();
        for (language, asked, want) in [
            // Nothing asked, nothing in the catalogue: the gateway's.
            (none, asked(None, None), (10_000, 1024, None, None)),
            // The catalogue's.
            (
                lang,
                asked(None, None),
                (20_000, 1536, Some(128), Some(4096)),
            ),
            // The request's over the catalogue's, each on its own.
            (
                lang,
                asked(Some(5_000), None),
                (5_000, 1536, Some(128), Some(4096)),
            ),
            (
                lang,
                asked(None, Some(64)),
                (20_000, 64, Some(128), Some(4096)),
            ),
            // A catalogue's default past the ceilings is held to them.
            (big, asked(None, None), (30_000, 2048, None, None)),
        ] {
            let got = b.compile_limits(&language, asked, 10_000);
            assert_eq!(
                (
                    got.timeout_ms,
                    got.memory_mb.unwrap(),
                    got.pids,
                    got.output_bytes
                ),
                want,
                "{language:?} {asked:?}"
            );
        }
    }

    fn result(outcome: Outcome) -> JobResult {
        JobResult::new("id".into(), outcome, 1, "w".into())
    }

    fn ok_outcome(stdout: &str) -> Outcome {
        let mut o = Outcome::not_run(Status::Ok, "");
        o.error = None;
        o.exit_code = 0;
        o.stdout = stdout.into();
        o.duration_ms = 900.0;
        o.cpu_ms = 700;
        o.max_rss_kb = 4000;
        o
    }

    #[test]
    fn an_interpreted_language_is_one_stage_with_the_run_limits() {
        let e = exec("python3");
        let job = e.to_job("abc", Staging::Native).unwrap();
        assert_eq!(job, e.to_job("abc", Staging::Shell).unwrap());
        job.validate().unwrap();
        assert_eq!(job.timeout_ms, Some(2_000));
        assert_eq!(job.limits.memory_mb, Some(128));
        assert_eq!(job.limits.cpu_ms, Some(1_000));
        assert_eq!(job.argv.as_deref().unwrap(), ["python3", "main.py", "a b"]);
        assert_eq!(
            job.runtime,
            Some(forkbox_queue::Runtime::Python),
            "python runs warm"
        );
        assert_eq!(job.collect, ["out.txt"]);
        assert_eq!(job.stdin, Some(FileData::Text("in".into())));
        // Standard error into standard output goes through a shell, cold.
        let mut merged = exec("python3");
        merged.merge_stderr = true;
        let job = merged.to_job("abc", Staging::Native).unwrap();
        assert_eq!(
            job.argv.as_deref().unwrap()[2..],
            ["exec \"$@\" 2>&1", "sh", "python3", "main.py", "a b"]
        );
        assert_eq!(job.runtime, None);
        let r = interpret(&e, Staging::Native, &result(ok_outcome("hi")));
        let Executed::Ran {
            compile: None, run, ..
        } = r
        else {
            panic!("{r:?}")
        };
        assert_eq!((run.status, run.stdout.as_str()), (StageStatus::Ok, "hi"));
    }

    #[test]
    fn a_compiled_language_sends_its_compile_stage_with_its_own_limits() {
        let e = exec("c++");
        let job = e.to_job("abc", Staging::Native).unwrap();
        job.validate().unwrap();
        assert_eq!(job.timeout_ms, Some(2_000));
        assert_eq!(
            (job.limits.memory_mb, job.limits.cpu_ms),
            (Some(128), Some(1_000))
        );
        let stage = job.compile.as_ref().unwrap();
        assert_eq!(stage.argv.as_ref().unwrap()[0], "g++");
        assert_eq!(stage.timeout_ms, Some(10_000));
        assert_eq!(stage.limits.memory_mb, Some(512));
        assert_eq!(stage.limits.pids, Some(200));
        assert_eq!(job.argv.as_deref().unwrap(), ["./main", "a b"]);
        assert_eq!(job.collect, ["out.txt"]);
    }

    fn native_result(status: Status, compile: schema::StageStatus, code: i32) -> JobResult {
        let mut o = ok_outcome("42");
        o.status = status;
        o.compile = Some(StageOutcome {
            status: compile,
            exit_code: code,
            signal: None,
            timed_out: compile == schema::StageStatus::Timeout,
            stdout: String::new(),
            stderr: "warning".into(),
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: 800.0,
            cpu_ms: 600,
            max_rss_kb: 90_000,
        });
        result(o)
    }

    #[test]
    fn a_nodes_compile_report_is_read_per_stage() {
        let e = exec("c++");
        let r = interpret(
            &e,
            Staging::Native,
            &native_result(Status::Ok, schema::StageStatus::Ok, 0),
        );
        let Executed::Ran {
            compile: Some(c),
            run,
            ..
        } = r
        else {
            panic!("{r:?}")
        };
        assert_eq!(
            (c.status, c.cpu_ms, c.max_rss_kb, c.stderr.as_str()),
            (StageStatus::Ok, 600, 90_000, "warning")
        );
        assert_eq!(
            (run.stdout.as_str(), run.cpu_ms, run.duration_ms),
            ("42", 700, 900.0)
        );
        let r = interpret(
            &e,
            Staging::Native,
            &native_result(Status::CompileError, schema::StageStatus::Timeout, 124),
        );
        let Executed::CompileFailed { compile } = r else {
            panic!("{r:?}")
        };
        assert_eq!(
            (compile.status, compile.exit_code),
            (StageStatus::Timeout, 124)
        );
    }

    #[test]
    fn a_compiled_language_in_one_script_sums_the_stages_limits() {
        let e = exec("c++");
        let job = e.to_job("abc", Staging::Shell).unwrap();
        job.validate().unwrap();
        assert_eq!(job.timeout_ms, Some(12_000));
        assert_eq!(job.limits.memory_mb, Some(512));
        assert_eq!((job.compile.as_ref(), job.runtime), (None, None));
        let script = &job.argv.as_ref().unwrap()[2];
        assert!(
            script.contains("timeout -s KILL 10.000 'g++' '-O2'"),
            "{script}"
        );
        assert!(script.ends_with("exec './main' 'a b'"), "{script}");
        assert!(job.collect.contains(&format!("{STAGE_DIR}/*")));
    }

    fn staged_outcome(status: &str, duration_us: &str, run: Outcome) -> Outcome {
        let mut o = run;
        for (k, v) in [
            ("status", status),
            ("stdout", ""),
            ("stderr", "main.cpp:1: error"),
            ("duration_us", duration_us),
        ] {
            o.files
                .insert(format!("{STAGE_DIR}/{k}"), FileData::Text(v.into()));
        }
        o
    }

    #[test]
    fn compile_results_are_read_back_per_stage() {
        let e = exec("c++");
        // Compiled, then ran.
        let r = interpret(
            &e,
            Staging::Shell,
            &result(staged_outcome("0\n", "300000\n", ok_outcome("42"))),
        );
        let Executed::Ran {
            compile: Some(c),
            run,
            files,
        } = r
        else {
            panic!("{r:?}")
        };
        assert_eq!(c.status, StageStatus::Ok);
        assert_eq!(c.duration_ms, 300.0);
        assert_eq!(run.stdout, "42");
        assert_eq!(run.duration_ms, 600.0);
        assert!(
            files.is_empty(),
            "the stage files are not the client's: {files:?}"
        );
        // The compiler failed.
        let r = interpret(
            &e,
            Staging::Shell,
            &result(staged_outcome("1\n", "5000\n", ok_outcome(""))),
        );
        let Executed::CompileFailed { compile } = r else {
            panic!("{r:?}")
        };
        assert_eq!(
            (compile.status, compile.exit_code),
            (StageStatus::Failed, 1)
        );
        assert_eq!(compile.stderr, "main.cpp:1: error");
        // Killed at the compile timeout.
        let r = interpret(
            &e,
            Staging::Shell,
            &result(staged_outcome("137\n", "10000500\n", ok_outcome(""))),
        );
        let Executed::CompileFailed { compile } = r else {
            panic!("{r:?}")
        };
        assert_eq!(compile.status, StageStatus::Timeout);
        // Killed early by SIGKILL (its memory): a signal, not a timeout.
        let r = interpret(
            &e,
            Staging::Shell,
            &result(staged_outcome("137\n", "20000\n", ok_outcome(""))),
        );
        let Executed::CompileFailed { compile } = r else {
            panic!("{r:?}")
        };
        assert_eq!(
            (compile.status, compile.signal),
            (StageStatus::Signaled, Some(9))
        );
    }

    #[test]
    fn a_job_that_never_ran_is_an_internal_error() {
        let e = exec("python3");
        let r = interpret(
            &e,
            Staging::Native,
            &result(Outcome::not_run(Status::Error, "no sandbox")),
        );
        assert_eq!(
            r,
            Executed::Internal {
                error: "job error: no sandbox".into()
            }
        );
    }
}
