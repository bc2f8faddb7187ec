//! Judge0 CE 1.13.1, as pure translations: `/languages`, `/statuses`, `/about`,
//! `/config_info`, and submissions in and out.
//!
//! What clients depend on, kept as Judge0 does it: language and status ids are Judge0 CE's;
//! `/config_info` has every key of 1.13.1's (the official Python client's constructor builds
//! a model that requires all 39 of them, the network pair included) and `/about` says version 1.13.1 (the client picks its language ids by it);
//! `time` and `wall_time` are strings of seconds, `memory` is in KB, empty output is `null`;
//! with `base64_encoded=true` text goes both ways in base64, wrapped every 60 characters as
//! Ruby's `Base64.encode64` wraps it; `expected_output` is compared after right-stripping each
//! line (and trailing blank lines); a bad field is HTTP 422 with `{"field": ["message"]}`.
//!
//! A submission's request is kept in Redis beside its job (the gateway keeps nothing), so a
//! `GET` with `fields=*` can return what was asked and judge the output against
//! `expected_output`.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::gateway::catalogue::Catalogue;
use crate::gateway::exec::{
    AskedCompile, Bounds, Executed, Execution, Stage, StageLimits, StageStatus,
};

/// The version `/about` reports.
pub const VERSION: &str = "1.13.1";
/// Most submissions in one batch.
pub const MAX_BATCH: usize = 20;

/// Judge0's statuses, by id.
pub const STATUSES: [(u32, &str); 14] = [
    (1, "In Queue"),
    (2, "Processing"),
    (3, "Accepted"),
    (4, "Wrong Answer"),
    (5, "Time Limit Exceeded"),
    (6, "Compilation Error"),
    (7, "Runtime Error (SIGSEGV)"),
    (8, "Runtime Error (SIGXFSZ)"),
    (9, "Runtime Error (SIGFPE)"),
    (10, "Runtime Error (SIGABRT)"),
    (11, "Runtime Error (NZEC)"),
    (12, "Runtime Error (Other)"),
    (13, "Internal Error"),
    (14, "Exec Format Error"),
];

/// Request fields sent in base64 under `base64_encoded=true`.
const ENCODED_FIELDS: [&str; 3] = ["source_code", "stdin", "expected_output"];

/// Fields a `GET` returns without `fields`.
pub const DEFAULT_FIELDS: [&str; 8] = [
    "token",
    "stdout",
    "stderr",
    "compile_output",
    "message",
    "status",
    "time",
    "memory",
];

/// Every field `fields=*` returns.
pub const ALL_FIELDS: [&str; 35] = [
    "source_code",
    "language_id",
    "stdin",
    "expected_output",
    "stdout",
    "status_id",
    "created_at",
    "finished_at",
    "time",
    "memory",
    "stderr",
    "token",
    "number_of_runs",
    "cpu_time_limit",
    "cpu_extra_time",
    "wall_time_limit",
    "memory_limit",
    "stack_limit",
    "max_processes_and_or_threads",
    "enable_per_process_and_thread_time_limit",
    "enable_per_process_and_thread_memory_limit",
    "max_file_size",
    "compile_output",
    "exit_code",
    "exit_signal",
    "message",
    "wall_time",
    "compiler_options",
    "command_line_arguments",
    "redirect_stderr_to_stdout",
    "callback_url",
    "additional_files",
    "enable_network",
    "status",
    "language",
];

/// Judge0's defaults and maximums for the limits a submission may set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub cpu_time_limit: (f64, f64),
    pub cpu_extra_time: (f64, f64),
    pub wall_time_limit: (f64, f64),
    /// KB.
    pub memory_limit: (u64, u64),
    pub stack_limit: (u64, u64),
    pub max_processes_and_or_threads: (u64, u64),
    /// KB.
    pub max_file_size: (u64, u64),
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpu_time_limit: (5.0, 15.0),
            cpu_extra_time: (1.0, 5.0),
            wall_time_limit: (10.0, 20.0),
            memory_limit: (128_000, 512_000),
            stack_limit: (64_000, 128_000),
            max_processes_and_or_threads: (60, 120),
            max_file_size: (1024, 4096),
        }
    }
}

/// A rejected request: HTTP status and Judge0's body.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub status: u16,
    pub body: Value,
}

/// A 422 naming `field`.
fn invalid(field: &str, message: impl Into<String>) -> Rejection {
    Rejection {
        status: 422,
        body: json!({ field: [message.into()] }),
    }
}

/// A 400 with Judge0's `error`.
pub fn error(status: u16, message: impl Into<String>) -> Rejection {
    Rejection {
        status,
        body: json!({"error": message.into()}),
    }
}

/// A language's display name (`C++ (GCC 12.2.0)`).
fn language_name(l: &crate::gateway::catalogue::Language) -> String {
    let sep = if l.judge0_label.ends_with('(') {
        ""
    } else {
        " "
    };
    format!("{}{sep}{})", l.judge0_label, l.version)
}

/// `GET /languages`.
pub fn languages(catalogue: &Catalogue) -> Value {
    Value::Array(
        catalogue
            .judge0_ids()
            .into_iter()
            .map(|(id, l)| json!({"id": id, "name": language_name(l)}))
            .collect(),
    )
}

/// `GET /languages/{id}`.
pub fn language(catalogue: &Catalogue, id: &str) -> Result<Value, Rejection> {
    let l = id
        .parse::<u32>()
        .ok()
        .and_then(|id| catalogue.by_judge0_id(id))
        .ok_or_else(|| error(404, format!("language with id {id} doesn't exist")))?;
    let file = &l.runtime.source_file;
    let (compile, run) = l.commands(file);
    Ok(json!({
        "id": id.parse::<u32>().unwrap_or_default(),
        "name": language_name(l),
        "is_archived": false,
        "source_file": file,
        "compile_cmd": compile.map(|c| c.join(" ")),
        "run_cmd": run.join(" "),
    }))
}

/// `GET /statuses`.
pub fn statuses() -> Value {
    Value::Array(
        STATUSES
            .iter()
            .map(|(id, d)| json!({"id": id, "description": d}))
            .collect(),
    )
}

/// `GET /about`.
pub fn about() -> Value {
    json!({
        "version": VERSION,
        "homepage": "https://github.com/forkbox",
        "source_code": "https://github.com/forkbox",
        "maintainer": "Forkbox gateway (Judge0 CE API)",
    })
}

/// `GET /config_info`: Judge0 1.13.1's keys (39 with the network pair), saying what this
/// gateway does.
pub fn config_info(limits: &Limits) -> Value {
    json!({
        "maintenance_mode": false,
        "enable_wait_result": true,
        "enable_compiler_options": false,
        "allowed_languages_for_compile_options": [],
        "enable_command_line_arguments": true,
        "enable_submission_delete": false,
        "enable_callbacks": false,
        "callbacks_max_tries": 0,
        "callbacks_timeout": 0.0,
        "enable_additional_files": false,
        "max_queue_size": 100_000,
        "cpu_time_limit": limits.cpu_time_limit.0,
        "max_cpu_time_limit": limits.cpu_time_limit.1,
        "cpu_extra_time": limits.cpu_extra_time.0,
        "max_cpu_extra_time": limits.cpu_extra_time.1,
        "wall_time_limit": limits.wall_time_limit.0,
        "max_wall_time_limit": limits.wall_time_limit.1,
        "memory_limit": limits.memory_limit.0,
        "max_memory_limit": limits.memory_limit.1,
        "stack_limit": limits.stack_limit.0,
        "max_stack_limit": limits.stack_limit.1,
        "max_processes_and_or_threads": limits.max_processes_and_or_threads.0,
        "max_max_processes_and_or_threads": limits.max_processes_and_or_threads.1,
        "enable_per_process_and_thread_time_limit": false,
        "allow_enable_per_process_and_thread_time_limit": false,
        "enable_per_process_and_thread_memory_limit": false,
        "allow_enable_per_process_and_thread_memory_limit": false,
        "max_file_size": limits.max_file_size.0,
        "max_max_file_size": limits.max_file_size.1,
        "number_of_runs": 1,
        "max_number_of_runs": 1,
        "redirect_stderr_to_stdout": false,
        "max_extract_size": 0,
        "enable_batched_submissions": true,
        "max_submission_batch_size": MAX_BATCH,
        "submission_cache_duration": 0.0,
        "use_docs_as_homepage": false,
        "allow_enable_network": false,
        "enable_network": false,
    })
}

/// A submission's request, decoded, with every limit decided: what is kept in Redis beside
/// the job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Submission {
    pub source_code: String,
    pub language_id: u32,
    pub stdin: Option<String>,
    pub expected_output: Option<String>,
    pub command_line_arguments: Option<String>,
    pub cpu_time_limit: f64,
    pub cpu_extra_time: f64,
    pub wall_time_limit: f64,
    pub memory_limit: u64,
    pub stack_limit: u64,
    pub max_processes_and_or_threads: u64,
    pub max_file_size: u64,
    pub redirect_stderr_to_stdout: bool,
    pub created_at_ms: u64,
}

/// Judge0's base64 of `bytes`: Ruby's `Base64.encode64`, a line break after every 60
/// characters and at the end (nothing for nothing).
pub fn encode64(bytes: &[u8]) -> String {
    let flat = base64::engine::general_purpose::STANDARD.encode(bytes);
    let mut out = String::with_capacity(flat.len() + flat.len() / 60 + 1);
    for chunk in flat.as_bytes().chunks(60) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out
}

/// Decodes base64 as Judge0 reads it: line breaks and other whitespace are skipped.
fn decode64(field: &str, text: &str) -> Result<String, Rejection> {
    let flat: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(flat.as_bytes())
        .or_else(|_| {
            base64::engine::general_purpose::STANDARD_NO_PAD.decode(flat.trim_end_matches('='))
        })
        .map_err(|e| invalid(field, format!("is not valid base64: {e}")))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Right-strips each line and drops trailing blank lines, as Judge0 compares outputs.
pub fn strip_lines(text: &str) -> String {
    let lines: Vec<&str> = text.split('\n').map(str::trim_end).collect();
    lines.join("\n").trim_end().to_owned()
}

/// Parses one submission (a JSON object) of `POST /submissions`.
pub fn parse_submission(
    body: &Value,
    base64_encoded: bool,
    catalogue: &Catalogue,
    limits: &Limits,
    now_ms: u64,
) -> Result<Submission, Rejection> {
    let obj = body
        .as_object()
        .ok_or_else(|| error(400, "the body must be a JSON object"))?;
    // Only the program's text travels in base64; options and arguments never do.
    let text = |field: &str| -> Result<Option<String>, Rejection> {
        let encoded = base64_encoded && ENCODED_FIELDS.contains(&field);
        match obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if encoded => decode64(field, s).map(Some),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(invalid(field, "must be a string")),
        }
    };
    let number = |field: &str, (default, max): (f64, f64)| -> Result<f64, Rejection> {
        let v = match obj.get(field) {
            None | Some(Value::Null) => return Ok(default),
            Some(Value::Number(n)) => n.as_f64(),
            Some(Value::String(s)) => s.trim().parse::<f64>().ok(),
            Some(_) => None,
        }
        .ok_or_else(|| invalid(field, "is not a number"))?;
        if v < 0.0 {
            return Err(invalid(field, "must be greater than or equal to 0"));
        }
        if v > max {
            return Err(invalid(
                field,
                format!("must be less than or equal to {max}"),
            ));
        }
        Ok(v)
    };
    let integer = |field: &str, (default, max): (u64, u64)| -> Result<u64, Rejection> {
        let v = number(field, (default as f64, max as f64))?;
        if v.fract() != 0.0 {
            return Err(invalid(field, "must be an integer"));
        }
        Ok(v as u64)
    };
    let flag = |field: &str| -> Result<bool, Rejection> {
        match obj.get(field) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(invalid(field, "must be true or false")),
        }
    };
    let source_code = text("source_code")?
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid("source_code", "can't be blank"))?;
    let language_id = match obj.get("language_id") {
        None | Some(Value::Null) => return Err(invalid("language_id", "can't be blank")),
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| invalid("language_id", "is not a number"))?,
    };
    let language_id = u32::try_from(language_id).unwrap_or(u32::MAX);
    if catalogue.by_judge0_id(language_id).is_none() {
        return Err(invalid(
            "language_id",
            format!("language with id {language_id} doesn't exist"),
        ));
    }
    // What this gateway does not do is refused, never dropped.
    if text("compiler_options")?.is_some_and(|s| !s.is_empty()) {
        return Err(invalid(
            "compiler_options",
            "setting compiler options is not allowed",
        ));
    }
    if text("additional_files")?.is_some_and(|s| !s.is_empty()) {
        return Err(invalid(
            "additional_files",
            "additional files are not allowed",
        ));
    }
    if obj.get("callback_url").is_some_and(|v| !v.is_null()) {
        return Err(invalid("callback_url", "callbacks are not allowed"));
    }
    if flag("enable_network")? {
        return Err(invalid("enable_network", "enabling network is not allowed"));
    }
    for field in [
        "enable_per_process_and_thread_time_limit",
        "enable_per_process_and_thread_memory_limit",
    ] {
        if flag(field)? {
            return Err(invalid(field, "is not allowed"));
        }
    }
    if integer("number_of_runs", (1, 1))? != 1 {
        return Err(invalid("number_of_runs", "must be 1"));
    }
    let memory_limit = integer("memory_limit", limits.memory_limit)?;
    if memory_limit < 2048 {
        return Err(invalid(
            "memory_limit",
            "must be greater than or equal to 2048",
        ));
    }
    Ok(Submission {
        source_code,
        language_id,
        stdin: text("stdin")?,
        expected_output: text("expected_output")?,
        command_line_arguments: text("command_line_arguments")?,
        cpu_time_limit: number("cpu_time_limit", limits.cpu_time_limit)?,
        cpu_extra_time: number("cpu_extra_time", limits.cpu_extra_time)?,
        wall_time_limit: number("wall_time_limit", limits.wall_time_limit)?,
        memory_limit,
        stack_limit: integer("stack_limit", limits.stack_limit)?,
        max_processes_and_or_threads: integer(
            "max_processes_and_or_threads",
            limits.max_processes_and_or_threads,
        )?
        .max(1),
        max_file_size: integer("max_file_size", limits.max_file_size)?,
        redirect_stderr_to_stdout: flag("redirect_stderr_to_stdout")?,
        created_at_ms: now_ms,
    })
}

/// Splits a command line as a shell does for words: whitespace separates, single and double
/// quotes group, a backslash escapes the next character.
pub fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if let Some(w) = word.take() {
                    words.push(w);
                }
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err("unterminated single quote".into()),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => w.push(chars.next().ok_or("unterminated double quote")?),
                        Some(c) => w.push(c),
                        None => return Err("unterminated double quote".into()),
                    }
                }
            }
            '\\' => {
                let next = chars.next().ok_or("a trailing backslash")?;
                word.get_or_insert_with(String::new).push(next);
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Ok(words)
}

impl Submission {
    /// The execution this submission asks for.
    pub fn execution(
        &self,
        catalogue: &Catalogue,
        bounds: &Bounds,
    ) -> Result<Execution, Rejection> {
        let lang = catalogue.by_judge0_id(self.language_id).ok_or_else(|| {
            invalid(
                "language_id",
                format!("language with id {} doesn't exist", self.language_id),
            )
        })?;
        let args = match &self.command_line_arguments {
            None => Vec::new(),
            Some(line) => split_words(line).map_err(|e| invalid("command_line_arguments", e))?,
        };
        let secs_ms = |s: f64| (s * 1000.0).ceil() as u64;
        Ok(Execution {
            language: lang.clone(),
            source_name: lang.source_name(&self.source_code),
            source: self.source_code.clone().into_bytes(),
            files: BTreeMap::new(),
            stdin: self.stdin.clone().unwrap_or_default().into_bytes(),
            args,
            // A submission sets no compile limits (Judge0 compiles within its maximums).
            compile: bounds.compile_limits(
                &lang.runtime.compile_limits,
                AskedCompile::default(),
                bounds.max_compile_timeout_ms,
            ),
            run: StageLimits {
                timeout_ms: secs_ms(self.wall_time_limit).max(1),
                memory_mb: Some(self.memory_limit.div_ceil(1024)),
                cpu_ms: Some(secs_ms(self.cpu_time_limit + self.cpu_extra_time).max(1)),
                ..StageLimits::default()
            },
            collect: Vec::new(),
            output_bytes: None,
            merge_stderr: self.redirect_stderr_to_stdout,
        })
    }
}

/// What a submission's run came to, in Judge0's fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub status_id: u32,
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    pub compile_output: Option<String>,
    pub message: Option<String>,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    /// CPU seconds, wall seconds, KB.
    pub time: Option<f64>,
    pub wall_time: Option<f64>,
    pub memory: Option<u64>,
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// The runtime error status of a program killed by `signal`.
fn runtime_error(signal: i32) -> u32 {
    match signal {
        libc::SIGSEGV => 7,
        libc::SIGXFSZ => 8,
        libc::SIGFPE => 9,
        libc::SIGABRT => 10,
        _ => 12,
    }
}

/// Judges a finished submission.
pub fn verdict(sub: &Submission, executed: &Executed) -> Verdict {
    let empty = Verdict {
        status_id: 13,
        stdout: None,
        stderr: None,
        compile_output: None,
        message: None,
        exit_code: None,
        exit_signal: None,
        time: None,
        wall_time: None,
        memory: None,
    };
    match executed {
        Executed::Internal { error } => Verdict {
            message: Some(error.clone()),
            ..empty
        },
        Executed::CompileFailed { compile } => Verdict {
            status_id: 6,
            compile_output: non_empty(&format!("{}{}", compile.stdout, compile.stderr)),
            message: match compile.status {
                StageStatus::Timeout => Some("Compilation time limit exceeded".into()),
                StageStatus::MemoryLimit => Some("Compilation memory limit exceeded".into()),
                _ => None,
            },
            ..empty
        },
        Executed::Ran { compile, run, .. } => {
            let (status_id, message, exit_signal) = judge_run(sub, run);
            Verdict {
                status_id,
                stdout: non_empty(&run.stdout),
                stderr: non_empty(&run.stderr),
                compile_output: compile
                    .as_ref()
                    .and_then(|c| non_empty(&format!("{}{}", c.stdout, c.stderr))),
                message,
                exit_code: Some(if exit_signal.is_some() {
                    0
                } else {
                    run.exit_code
                }),
                exit_signal,
                time: Some(run.cpu_ms as f64 / 1000.0),
                wall_time: Some(run.duration_ms / 1000.0),
                memory: Some(run.max_rss_kb),
            }
        }
    }
}

/// Status id, message and signal of a run stage.
fn judge_run(sub: &Submission, run: &Stage) -> (u32, Option<String>, Option<i32>) {
    let over_cpu = run.cpu_ms as f64 > sub.cpu_time_limit * 1000.0;
    match run.status {
        StageStatus::Timeout => (5, Some("Time limit exceeded".into()), Some(libc::SIGKILL)),
        StageStatus::CpuLimit => (5, Some("Time limit exceeded".into()), Some(libc::SIGKILL)),
        StageStatus::MemoryLimit => (
            12,
            Some("Memory limit exceeded".into()),
            Some(libc::SIGKILL),
        ),
        StageStatus::OutputLimit => (8, Some("Output limit exceeded".into()), Some(libc::SIGXFSZ)),
        StageStatus::Signaled => {
            let sig = run.signal.unwrap_or(run.exit_code - 128);
            (
                runtime_error(sig),
                Some(format!("Exited with signal {sig}")),
                Some(sig),
            )
        }
        _ if over_cpu => (5, Some("Time limit exceeded".into()), None),
        StageStatus::Failed if run.exit_code == 126 && run.stderr.contains("Exec format error") => {
            (14, Some("Exec format error".into()), None)
        }
        StageStatus::Failed => (
            11,
            Some(format!("Exited with error status {}", run.exit_code)),
            None,
        ),
        StageStatus::Ok => match &sub.expected_output {
            Some(want) if strip_lines(want) != strip_lines(&run.stdout) => (4, None, None),
            _ => (3, None, None),
        },
    }
}

/// Where a submission is.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    Queued,
    Processing,
    Done {
        verdict: Verdict,
        finished_at_ms: Option<u64>,
    },
}

/// Which fields a response holds: `fields` as given (`*` for all), or the defaults.
pub fn select_fields(fields: Option<&str>) -> Result<Vec<&'static str>, Rejection> {
    match fields.map(str::trim) {
        None | Some("") => Ok(DEFAULT_FIELDS.to_vec()),
        Some("*") => Ok(ALL_FIELDS.to_vec()),
        Some(list) => list
            .split(',')
            .map(|f| {
                let f = f.trim();
                ALL_FIELDS
                    .iter()
                    .find(|a| **a == f)
                    .copied()
                    .ok_or_else(|| error(400, format!("invalid field: {f:?}")))
            })
            .collect(),
    }
}

/// An instant as Judge0 writes it: `2024-05-01T12:00:00.123Z`.
pub fn timestamp(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// A submission as Judge0 returns it, with only `fields`.
pub fn render(
    token: &str,
    sub: &Submission,
    progress: &Progress,
    fields: &[&str],
    catalogue: &Catalogue,
    base64_encoded: bool,
) -> Value {
    let text = |s: &Option<String>| match s {
        None => Value::Null,
        Some(s) if base64_encoded => json!(encode64(s.as_bytes())),
        Some(s) => json!(s),
    };
    let seconds = |s: Option<f64>| s.map_or(Value::Null, |s| json!(format!("{s:.3}")));
    let decimal = |s: f64| json!(format!("{s:?}"));
    let (status_id, verdict, finished) = match progress {
        Progress::Queued => (1, None, None),
        Progress::Processing => (2, None, None),
        Progress::Done {
            verdict,
            finished_at_ms,
        } => (verdict.status_id, Some(verdict), *finished_at_ms),
    };
    let v = |f: fn(&Verdict) -> Value| verdict.map_or(Value::Null, f);
    let description = STATUSES
        .iter()
        .find(|(id, _)| *id == status_id)
        .map_or("", |(_, d)| d);
    let mut out = Map::new();
    for &field in fields {
        let value = match field {
            "token" => json!(token),
            "source_code" => text(&Some(sub.source_code.clone())),
            "language_id" => json!(sub.language_id),
            "language" => json!({
                "id": sub.language_id,
                "name": catalogue.by_judge0_id(sub.language_id).map(language_name),
            }),
            "stdin" => text(&sub.stdin),
            "expected_output" => text(&sub.expected_output),
            "stdout" => verdict.map_or(Value::Null, |v| text(&v.stdout)),
            "stderr" => verdict.map_or(Value::Null, |v| text(&v.stderr)),
            "compile_output" => verdict.map_or(Value::Null, |v| text(&v.compile_output)),
            "message" => verdict.map_or(Value::Null, |v| text(&v.message)),
            "status_id" => json!(status_id),
            "status" => json!({"id": status_id, "description": description}),
            "created_at" => json!(timestamp(sub.created_at_ms)),
            "finished_at" => finished.map_or(Value::Null, |ms| json!(timestamp(ms))),
            "time" => seconds(verdict.and_then(|v| v.time)),
            "wall_time" => seconds(verdict.and_then(|v| v.wall_time)),
            "memory" => v(|v| v.memory.map_or(Value::Null, |m| json!(m))),
            "exit_code" => v(|v| v.exit_code.map_or(Value::Null, |c| json!(c))),
            "exit_signal" => v(|v| v.exit_signal.map_or(Value::Null, |s| json!(s))),
            "number_of_runs" => json!(1),
            "cpu_time_limit" => decimal(sub.cpu_time_limit),
            "cpu_extra_time" => decimal(sub.cpu_extra_time),
            "wall_time_limit" => decimal(sub.wall_time_limit),
            "memory_limit" => json!(sub.memory_limit),
            "stack_limit" => json!(sub.stack_limit),
            "max_processes_and_or_threads" => json!(sub.max_processes_and_or_threads),
            "enable_per_process_and_thread_time_limit" => json!(false),
            "enable_per_process_and_thread_memory_limit" => json!(false),
            "max_file_size" => json!(sub.max_file_size),
            "compiler_options" => Value::Null,
            "command_line_arguments" => json!(sub.command_line_arguments),
            "redirect_stderr_to_stdout" => json!(sub.redirect_stderr_to_stdout),
            "callback_url" => Value::Null,
            "additional_files" => Value::Null,
            "enable_network" => json!(false),
            _ => Value::Null,
        };
        out.insert(field.to_owned(), value);
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    fn catalogue() -> Catalogue {
        crate::gateway::catalogue::all_at("9.9.9")
    }

    fn parse(body: Value, b64: bool) -> Result<Submission, Rejection> {
        parse_submission(
            &body,
            b64,
            &catalogue(),
            &Limits::default(),
            1_700_000_000_123,
        )
    }

    #[test]
    fn config_info_has_every_key_the_official_client_requires() {
        let info = config_info(&Limits::default());
        let keys: Vec<&String> = info.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 39, "{keys:?}");
        // The official client's Config model, field by field.
        for k in [
            "allow_enable_network",
            "allow_enable_per_process_and_thread_memory_limit",
            "allow_enable_per_process_and_thread_time_limit",
            "allowed_languages_for_compile_options",
            "callbacks_max_tries",
            "callbacks_timeout",
            "cpu_extra_time",
            "cpu_time_limit",
            "enable_additional_files",
            "enable_batched_submissions",
            "enable_callbacks",
            "enable_command_line_arguments",
            "enable_compiler_options",
            "enable_network",
            "enable_per_process_and_thread_memory_limit",
            "enable_per_process_and_thread_time_limit",
            "enable_submission_delete",
            "enable_wait_result",
            "maintenance_mode",
            "max_cpu_extra_time",
            "max_cpu_time_limit",
            "max_extract_size",
            "max_file_size",
            "max_max_file_size",
            "max_max_processes_and_or_threads",
            "max_memory_limit",
            "max_number_of_runs",
            "max_processes_and_or_threads",
            "max_queue_size",
            "max_stack_limit",
            "max_submission_batch_size",
            "max_wall_time_limit",
            "memory_limit",
            "number_of_runs",
            "redirect_stderr_to_stdout",
            "stack_limit",
            "submission_cache_duration",
            "use_docs_as_homepage",
            "wall_time_limit",
        ] {
            assert!(info.get(k).is_some(), "{k}");
        }
        assert_eq!(info["max_submission_batch_size"], 20);
    }

    #[test]
    fn judge0_ids_are_judge0_ce_ids() {
        let langs = languages(&catalogue());
        let ids: Vec<u64> = langs
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["id"].as_u64().unwrap())
            .collect();
        for id in [71, 50, 54, 62, 63, 60, 73, 72, 85, 46, 58, 64, 74] {
            assert!(ids.contains(&id), "{id} in {ids:?}");
        }
        assert_eq!(
            language(&catalogue(), "54").unwrap()["name"],
            "C++ (GCC 9.9.9)"
        );
        assert_eq!(
            language(&catalogue(), "71").unwrap()["name"],
            "Python (9.9.9)"
        );
        assert_eq!(language(&catalogue(), "999").unwrap_err().status, 404);
        assert_eq!(statuses().as_array().unwrap().len(), 14);
        assert_eq!(about()["version"], "1.13.1");
    }

    #[test]
    fn base64_is_wrapped_every_60_characters_as_ruby_does() {
        assert_eq!(encode64(b""), "");
        assert_eq!(encode64(b"hello"), "aGVsbG8=\n");
        let long = encode64(&[b'a'; 100]);
        let lines: Vec<&str> = long.split_terminator('\n').collect();
        assert_eq!(
            lines.iter().map(|l| l.len()).collect::<Vec<_>>(),
            [60, 60, 16]
        );
        assert!(long.ends_with('\n'));
        // And read back with its line breaks.
        assert_eq!(decode64("stdin", &long).unwrap(), "a".repeat(100));
    }

    #[test]
    fn submissions_are_parsed_with_defaults_and_each_bad_field_named() {
        let s = parse(json!({"source_code": "cHJpbnQoMSk=", "language_id": 71, "stdin": "NQo=", "expected_output": "NQ=="}), true).unwrap();
        assert_eq!(s.source_code, "print(1)");
        assert_eq!(s.stdin.as_deref(), Some("5\n"));
        assert_eq!(s.expected_output.as_deref(), Some("5"));
        let s = parse(
            json!({"source_code": "eA==", "language_id": 71, "command_line_arguments": "a 'b c'"}),
            true,
        )
        .unwrap();
        assert_eq!(s.command_line_arguments.as_deref(), Some("a 'b c'"));
        assert_eq!(
            (s.cpu_time_limit, s.wall_time_limit, s.memory_limit),
            (5.0, 10.0, 128_000)
        );
        for (body, field, message) in [
            (json!({"language_id": 71}), "source_code", "can't be blank"),
            (json!({"source_code": "x"}), "language_id", "can't be blank"),
            (
                json!({"source_code": "x", "language_id": 999}),
                "language_id",
                "language with id 999 doesn't exist",
            ),
            (
                json!({"source_code": "x", "language_id": 71, "cpu_time_limit": 16}),
                "cpu_time_limit",
                "must be less than or equal to 15",
            ),
            (
                json!({"source_code": "x", "language_id": 71, "memory_limit": "lots"}),
                "memory_limit",
                "is not a number",
            ),
            (
                json!({"source_code": "x", "language_id": 71, "compiler_options": "-O3"}),
                "compiler_options",
                "setting compiler options is not allowed",
            ),
            (
                json!({"source_code": "x", "language_id": 71, "callback_url": "http://x"}),
                "callback_url",
                "callbacks are not allowed",
            ),
            (
                json!({"source_code": "x", "language_id": 71, "enable_network": true}),
                "enable_network",
                "enabling network is not allowed",
            ),
            (
                json!({"source_code": "x", "language_id": 71, "number_of_runs": 3}),
                "number_of_runs",
                "must be less than or equal to 1",
            ),
        ] {
            let r = parse(body.clone(), false).unwrap_err();
            assert_eq!(r.status, 422, "{body}");
            assert_eq!(r.body, json!({field: [message]}), "{body}");
        }
        let r = parse(json!({"source_code": "!!!", "language_id": 71}), true).unwrap_err();
        assert_eq!(
            r.body["source_code"][0].as_str().unwrap().split(':').next(),
            Some("is not valid base64")
        );
    }

    fn sub(expected: Option<&str>) -> Submission {
        parse(json!({"source_code": "x", "language_id": 54, "expected_output": expected, "cpu_time_limit": 1}), false).unwrap()
    }

    #[test]
    fn a_submission_compiles_within_its_languages_catalogue_limits() {
        // Judge0's submissions set no compile limits: the catalogue's for C++ apply.
        let bounds = Bounds::default();
        let e = sub(None).execution(&catalogue(), &bounds).unwrap();
        let cxx = crate::runtimes::Catalogue::builtin()
            .find("c++")
            .unwrap()
            .compile_limits;
        assert_eq!(Some(e.compile.timeout_ms), cxx.timeout_ms);
        assert_eq!(e.compile.memory_mb, cxx.memory_mb);
        // A gateway whose ceiling is lower holds the catalogue's to it.
        let low = Bounds {
            max_compile_timeout_ms: 5_000,
            max_memory_mb: 256,
            ..bounds
        };
        let e = sub(None).execution(&catalogue(), &low).unwrap();
        assert_eq!(
            (e.compile.timeout_ms, e.compile.memory_mb),
            (5_000, Some(256))
        );
    }

    fn ran(
        status: StageStatus,
        exit_code: i32,
        signal: Option<i32>,
        stdout: &str,
        cpu_ms: u64,
    ) -> Executed {
        Executed::Ran {
            compile: None,
            run: Stage {
                status,
                exit_code,
                signal,
                stdout: stdout.into(),
                stderr: String::new(),
                duration_ms: 1500.0,
                cpu_ms,
                max_rss_kb: 2048,
            },
            files: BTreeMap::new(),
        }
    }

    #[test]
    fn verdicts_follow_judge0s_status_ids() {
        use StageStatus::*;
        let cases = [
            (
                sub(Some("1 2\n3  \n\n")),
                ran(Ok, 0, None, "1 2\n3\n", 10),
                3,
            ),
            (sub(Some("1 2\n3")), ran(Ok, 0, None, "1 2\n4\n", 10), 4),
            (sub(Some(" 3")), ran(Ok, 0, None, "3", 10), 4),
            (sub(None), ran(Ok, 0, None, "anything", 10), 3),
            (sub(None), ran(Ok, 0, None, "", 1500), 5),
            (sub(None), ran(Timeout, 124, None, "", 10), 5),
            (sub(None), ran(CpuLimit, 137, Some(9), "", 2000), 5),
            (sub(None), ran(Signaled, 139, Some(11), "", 10), 7),
            (sub(None), ran(OutputLimit, 137, Some(9), "", 10), 8),
            (sub(None), ran(Signaled, 136, Some(8), "", 10), 9),
            (sub(None), ran(Signaled, 134, Some(6), "", 10), 10),
            (sub(None), ran(Failed, 1, None, "", 10), 11),
            (sub(None), ran(MemoryLimit, 137, Some(9), "", 10), 12),
            (sub(None), ran(Signaled, 143, Some(15), "", 10), 12),
            (sub(None), Executed::Internal { error: "x".into() }, 13),
        ];
        for (s, e, want) in cases {
            assert_eq!(verdict(&s, &e).status_id, want, "{e:?}");
        }
        let v = verdict(&sub(None), &ran(Failed, 3, None, "", 12));
        assert_eq!(
            (v.exit_code, v.time, v.memory, v.stdout),
            (Some(3), Some(0.012), Some(2048), None)
        );
        let compile = Stage {
            status: Failed,
            exit_code: 1,
            signal: None,
            stdout: String::new(),
            stderr: "error: x".into(),
            duration_ms: 1.0,
            cpu_ms: 0,
            max_rss_kb: 0,
        };
        let v = verdict(&sub(None), &Executed::CompileFailed { compile });
        assert_eq!(
            (v.status_id, v.compile_output.as_deref(), v.time),
            (6, Some("error: x"), None)
        );
    }

    #[test]
    fn responses_carry_strings_for_times_and_null_for_empty_output() {
        let s = sub(Some("3"));
        let v = verdict(&s, &ran(StageStatus::Ok, 0, None, "3\n", 1));
        let done = Progress::Done {
            verdict: v,
            finished_at_ms: Some(1_700_000_001_000),
        };
        let all = select_fields(Some("*")).unwrap();
        let r = render("tok", &s, &done, &all, &catalogue(), true);
        assert_eq!(r["status"], json!({"id": 3, "description": "Accepted"}));
        assert_eq!(r["time"], "0.001");
        assert_eq!(r["wall_time"], "1.500");
        assert_eq!(r["memory"], 2048);
        assert_eq!(r["stdout"], "Mwo=\n");
        assert_eq!(r["stderr"], Value::Null);
        assert_eq!(r["created_at"], "2023-11-14T22:13:20.123Z");
        assert_eq!(r["finished_at"], "2023-11-14T22:13:21.000Z");
        assert_eq!(r["cpu_time_limit"], "1.0");
        assert_eq!(r["language"]["id"], 54);
        let r = render(
            "tok",
            &s,
            &Progress::Queued,
            &select_fields(None).unwrap(),
            &catalogue(),
            false,
        );
        assert_eq!(r["status"]["id"], 1);
        assert_eq!(r.as_object().unwrap().len(), DEFAULT_FIELDS.len());
        assert_eq!(select_fields(Some("token,bogus")).unwrap_err().status, 400);
    }

    #[test]
    fn command_lines_split_as_a_shell_splits_words() {
        assert_eq!(
            split_words(" a 'b c' \"d\\\"e\" f\\ g ").unwrap(),
            ["a", "b c", "d\"e", "f g"]
        );
        assert_eq!(split_words("").unwrap(), Vec::<String>::new());
        assert!(split_words("'open").is_err());
    }
}
