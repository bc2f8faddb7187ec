//! The v1 job and result JSON schemas.
//!
//! A job arrives from any Redis client, so parsing is strict and every rejection names the field
//! at fault: unknown fields, wrong types, paths that would leave the working directory, limits
//! out of range. The same types are used by the queue, the local daemon and `forkbox run`, so a
//! job behaves the same whichever way it was submitted.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Default wall-clock limit when a job sets no `timeout_ms`.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// Upper bound on `timeout_ms` (one day).
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;
/// Default size limit of a job's JSON payload.
pub const DEFAULT_MAX_JOB_BYTES: usize = 10 * 1024 * 1024;
/// Longest accepted job id.
pub const MAX_ID_LEN: usize = 128;

/// One execution job (v1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Caller-chosen id; generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// A shell string, run as `/bin/sh -c CMD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
    /// A program and its arguments, resolved through the job's `PATH`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// Bytes fed to the program's standard input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<FileData>,
    /// Extra environment, on top of the clean default (`PATH`, `HOME=/work`, `LANG=C.UTF-8`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Files written into the working directory before the program starts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, FileData>,
    /// Working directory inside the sandbox; relative paths are taken from `/work`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Wall-clock limit, measured from the program's exec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub limits: Limits,
    /// Globs (relative to `/work`) of files returned with the result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collect: Vec<String>,
    /// Batch this job counts towards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    /// How long the result stays in Redis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_ttl_s: Option<u64>,
    /// Deliveries allowed before the job is dead-lettered (infrastructure faults only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// An extra stream the result is also appended to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
}

/// Per-job resource limits; `None` takes the node's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_size_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u64>,
}

/// Limits with every value decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectiveLimits {
    pub memory_mb: u64,
    pub pids: u64,
    pub cpu_ms: u64,
    pub output_bytes: u64,
    pub disk_mb: u64,
    pub file_size_mb: u64,
    pub open_files: u64,
}

impl Default for EffectiveLimits {
    fn default() -> Self {
        EffectiveLimits {
            memory_mb: 512,
            pids: 64,
            cpu_ms: MAX_TIMEOUT_MS,
            output_bytes: 1024 * 1024,
            disk_mb: 64,
            file_size_mb: 64,
            open_files: 256,
        }
    }
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// Fills unset values from `defaults`.
    pub fn resolve(&self, defaults: &EffectiveLimits) -> EffectiveLimits {
        EffectiveLimits {
            memory_mb: self.memory_mb.unwrap_or(defaults.memory_mb),
            pids: self.pids.unwrap_or(defaults.pids),
            cpu_ms: self.cpu_ms.unwrap_or(defaults.cpu_ms),
            output_bytes: self.output_bytes.unwrap_or(defaults.output_bytes),
            disk_mb: self.disk_mb.unwrap_or(defaults.disk_mb),
            file_size_mb: self.file_size_mb.unwrap_or(defaults.file_size_mb),
            open_files: self.open_files.unwrap_or(defaults.open_files),
        }
    }

    fn fields(&self) -> [(&'static str, Option<u64>, u64, u64); 7] {
        const T: u64 = 1 << 40;
        [
            ("memory_mb", self.memory_mb, 1, 1 << 20),
            ("pids", self.pids, 2, 1 << 16),
            ("cpu_ms", self.cpu_ms, 1, MAX_TIMEOUT_MS),
            ("output_bytes", self.output_bytes, 0, T),
            ("disk_mb", self.disk_mb, 1, 1 << 20),
            ("file_size_mb", self.file_size_mb, 1, 1 << 20),
            ("open_files", self.open_files, 8, 1 << 20),
        ]
    }
}

/// File content: UTF-8 text as a JSON string, or arbitrary bytes as `{"b64": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileData {
    Text(String),
    Base64(String),
}

impl FileData {
    /// Text when the bytes are UTF-8, base64 otherwise.
    pub fn from_bytes(bytes: Vec<u8>) -> FileData {
        match String::from_utf8(bytes) {
            Ok(s) => FileData::Text(s),
            Err(e) => {
                FileData::Base64(base64::engine::general_purpose::STANDARD.encode(e.as_bytes()))
            }
        }
    }

    /// The raw bytes; fails only on invalid base64.
    pub fn to_bytes(&self) -> Result<Vec<u8>, base64::DecodeError> {
        match self {
            FileData::Text(s) => Ok(s.as_bytes().to_vec()),
            FileData::Base64(b) => base64::engine::general_purpose::STANDARD.decode(b),
        }
    }

    /// How many bytes [`FileData::to_bytes`] gives, from the length alone: exact for valid
    /// (padded) base64, which [`Job::validate`] checks, so nothing is decoded twice.
    pub fn byte_len(&self) -> usize {
        match self {
            FileData::Text(s) => s.len(),
            FileData::Base64(b) => {
                let pad = b.bytes().rev().take_while(|&c| c == b'=').count().min(2);
                (b.len() / 4 * 3).saturating_sub(pad)
            }
        }
    }
}

impl Serialize for FileData {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            FileData::Text(t) => s.serialize_str(t),
            FileData::Base64(b) => {
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("b64", b)?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for FileData {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FileData;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an object {\"b64\": \"...\"}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<FileData, E> {
                Ok(FileData::Text(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<FileData, E> {
                Ok(FileData::Text(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FileData, A::Error> {
                let mut b64 = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key != "b64" {
                        return Err(de::Error::unknown_field(&key, &["b64"]));
                    }
                    b64 = Some(map.next_value::<String>()?);
                }
                let b64 = b64.ok_or_else(|| de::Error::missing_field("b64"))?;
                base64::engine::general_purpose::STANDARD
                    .decode(&b64)
                    .map_err(|e| de::Error::custom(format_args!("invalid base64: {e}")))?;
                Ok(FileData::Base64(b64))
            }
        }
        d.deserialize_any(V)
    }
}

/// Why a job was rejected. The message names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    #[error("job payload is {size} bytes, over the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    #[error("job is not valid JSON: {0}")]
    NotJson(String),
    #[error("{path}: {message}")]
    Schema { path: String, message: String },
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> JobError {
    JobError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Job {
    /// A shell-string job.
    pub fn shell(cmd: impl Into<String>) -> Job {
        Job {
            cmd: Some(cmd.into()),
            ..Job::default()
        }
    }

    /// An argv job.
    pub fn argv<I, S>(argv: I) -> Job
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Job {
            argv: Some(argv.into_iter().map(Into::into).collect()),
            ..Job::default()
        }
    }

    /// Parses and validates a job payload of at most `max_bytes`.
    pub fn parse(payload: &[u8], max_bytes: usize) -> Result<Job, JobError> {
        if payload.len() > max_bytes {
            return Err(JobError::TooLarge {
                size: payload.len(),
                limit: max_bytes,
            });
        }
        if payload.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
            // serde would accept a JSON array as a struct, field by field; a job is an object.
            return Err(JobError::Schema {
                path: "job".into(),
                message: "must be a JSON object".into(),
            });
        }
        let mut de = serde_json::Deserializer::from_slice(payload);
        let job: Job = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let inner = e.inner();
            if inner.is_syntax() || inner.is_eof() {
                JobError::NotJson(inner.to_string())
            } else {
                let path = e.path().to_string();
                let path = if path == "." || path.is_empty() {
                    "job".to_owned()
                } else {
                    path
                };
                // serde_json appends " at line L column C"; the path already locates the problem.
                let msg = inner.to_string();
                let msg = msg.split(" at line ").next().unwrap_or(&msg).to_owned();
                JobError::Schema { path, message: msg }
            }
        })?;
        de.end().map_err(|e| JobError::NotJson(e.to_string()))?;
        job.validate()?;
        Ok(job)
    }

    /// Checks the rules that types alone cannot express.
    pub fn validate(&self) -> Result<(), JobError> {
        if let Some(id) = &self.id {
            if id.is_empty() || id.len() > MAX_ID_LEN {
                return Err(invalid(
                    "id",
                    format!("must be 1 to {MAX_ID_LEN} characters"),
                ));
            }
            if !id.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(invalid("id", "must be printable ASCII without spaces"));
            }
        }
        match (&self.cmd, &self.argv) {
            (None, None) => {
                return Err(invalid(
                    "cmd",
                    "a job needs `cmd` (a shell string) or `argv` (an array)",
                ))
            }
            (Some(_), Some(_)) => return Err(invalid("cmd", "give `cmd` or `argv`, not both")),
            (Some(cmd), None) => {
                no_nul("cmd", cmd)?;
                if cmd.trim().is_empty() {
                    return Err(invalid("cmd", "is empty"));
                }
            }
            (None, Some(argv)) => {
                match argv.first() {
                    None => return Err(invalid("argv", "is empty")),
                    Some(a) if a.is_empty() => return Err(invalid("argv[0]", "is empty")),
                    _ => {}
                }
                for (i, a) in argv.iter().enumerate() {
                    no_nul(&format!("argv[{i}]"), a)?;
                }
            }
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(invalid(
                    format!("env.{k}"),
                    "names must be non-empty, without '=' or NUL",
                ));
            }
            no_nul(&format!("env.{k}"), v)?;
        }
        if let Some(stdin) = &self.stdin {
            stdin
                .to_bytes()
                .map_err(|e| invalid("stdin", format!("invalid base64: {e}")))?;
        }
        // Each file once, and none inside another: the launcher would fail writing them.
        let mut names = BTreeMap::new();
        for (path, data) in &self.files {
            let field = format!("files.{path}");
            check_relative(&field, path)?;
            if let FileData::Base64(_) = data {
                data.to_bytes()
                    .map_err(|e| invalid(&field, format!("invalid base64: {e}")))?;
            }
            let name: Vec<&str> = path
                .split('/')
                .filter(|c| !c.is_empty() && *c != ".")
                .collect();
            if let Some(other) = names.insert(name.join("/"), path) {
                return Err(invalid(
                    field,
                    format!("names the same file as files.{other}"),
                ));
            }
        }
        for (name, path) in &names {
            let mut dir = name.as_str();
            while let Some((parent, _)) = dir.rsplit_once('/') {
                if let Some(file) = names.get(parent) {
                    return Err(invalid(
                        format!("files.{path}"),
                        format!("its directory {parent} is also a file (files.{file})"),
                    ));
                }
                dir = parent;
            }
        }
        for (i, pattern) in self.collect.iter().enumerate() {
            check_relative(&format!("collect[{i}]"), pattern)?;
        }
        if let Some(cwd) = &self.cwd {
            no_nul("cwd", cwd)?;
            if cwd.split('/').any(|c| c == "..") {
                return Err(invalid("cwd", "must not contain '..'"));
            }
        }
        if let Some(t) = self.timeout_ms {
            if t == 0 || t > MAX_TIMEOUT_MS {
                return Err(invalid(
                    "timeout_ms",
                    format!("must be between 1 and {MAX_TIMEOUT_MS}"),
                ));
            }
        }
        for (name, value, min, max) in self.limits.fields() {
            if let Some(v) = value {
                if v < min || v > max {
                    return Err(invalid(
                        format!("limits.{name}"),
                        format!("must be between {min} and {max}, got {v}"),
                    ));
                }
            }
        }
        if self.max_attempts == Some(0) {
            return Err(invalid("max_attempts", "must be at least 1"));
        }
        if self.result_ttl_s == Some(0) {
            return Err(invalid("result_ttl_s", "must be at least 1"));
        }
        Ok(())
    }

    /// The program and arguments to exec: `argv`, or `/bin/sh -c CMD`.
    pub fn command(&self) -> Vec<String> {
        match (&self.argv, &self.cmd) {
            (Some(argv), _) => argv.clone(),
            (None, Some(cmd)) => vec!["/bin/sh".into(), "-c".into(), cmd.clone()],
            (None, None) => Vec::new(),
        }
    }

    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)
    }
}

fn no_nul(field: &str, s: &str) -> Result<(), JobError> {
    if s.contains('\0') {
        return Err(invalid(field, "contains a NUL byte"));
    }
    Ok(())
}

/// A path must stay inside the working directory: relative, no `..`, no empty name.
fn check_relative(field: &str, path: &str) -> Result<(), JobError> {
    no_nul(field, path)?;
    if path.is_empty() {
        return Err(invalid(field, "path is empty"));
    }
    if path.starts_with('/') {
        return Err(invalid(
            field,
            "absolute paths are not allowed; paths are relative to the working directory",
        ));
    }
    if path.split('/').any(|c| c == "..") {
        return Err(invalid(
            field,
            "'..' is not allowed; paths must stay inside the working directory",
        ));
    }
    if path.split('/').all(|c| c.is_empty() || c == ".") {
        return Err(invalid(field, "path names no file"));
    }
    Ok(())
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Exit code 0.
    Ok,
    /// Non-zero exit code.
    Failed,
    /// Killed at the wall-clock deadline.
    Timeout,
    /// Killed for exceeding its CPU time.
    CpuLimit,
    /// Killed by the out-of-memory handler of its cgroup.
    MemoryLimit,
    /// Killed for writing more than its output cap.
    OutputLimit,
    /// Killed by a signal of its own doing.
    Signaled,
    /// Cancelled by a client.
    Cancelled,
    /// Rejected before running: the job was malformed.
    Invalid,
    /// The sandbox could not be set up; the program did not run.
    Error,
}

impl Status {
    pub const ALL: [Status; 10] = [
        Status::Ok,
        Status::Failed,
        Status::Timeout,
        Status::CpuLimit,
        Status::MemoryLimit,
        Status::OutputLimit,
        Status::Signaled,
        Status::Cancelled,
        Status::Invalid,
        Status::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "failed",
            Status::Timeout => "timeout",
            Status::CpuLimit => "cpu_limit",
            Status::MemoryLimit => "memory_limit",
            Status::OutputLimit => "output_limit",
            Status::Signaled => "signaled",
            Status::Cancelled => "cancelled",
            Status::Invalid => "invalid",
            Status::Error => "error",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Exit code reported for a timeout, as coreutils `timeout` does.
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit code reported when the sandbox itself failed or the job was invalid.
pub const EXIT_SANDBOX_ERROR: i32 = 125;

/// What running a job produced (the result JSON without the queue's bookkeeping).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub status: Status,
    /// The program's exit code; 124 on timeout, 128+N when killed by signal N, 125 when the
    /// sandbox failed, as a shell would report them.
    pub exit_code: i32,
    /// The signal that ended the program, if any.
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// Standard output, decoded as UTF-8 (invalid sequences replaced).
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Wall time from exec to exit.
    pub duration_ms: f64,
    /// Time from the request to the program's exec.
    pub spawn_us: u64,
    pub cpu_ms: u64,
    pub max_rss_kb: u64,
    /// Files matched by `collect`.
    #[serde(default)]
    pub files: BTreeMap<String, FileData>,
    /// How late the watchdog's kill came after the deadline (timeouts only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog_overshoot_us: Option<i64>,
    /// Which isolation step failed and why, or why the job was rejected.
    #[serde(default)]
    pub error: Option<String>,
}

impl Outcome {
    /// An outcome for a job that never ran.
    pub fn not_run(status: Status, error: impl Into<String>) -> Outcome {
        Outcome {
            status,
            exit_code: EXIT_SANDBOX_ERROR,
            signal: None,
            timed_out: false,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: 0.0,
            spawn_us: 0,
            cpu_ms: 0,
            max_rss_kb: 0,
            files: BTreeMap::new(),
            watchdog_overshoot_us: None,
            error: Some(error.into()),
        }
    }
}

/// The v1 result JSON: an [`Outcome`] plus the queue's bookkeeping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    pub id: String,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Which delivery of the job produced this result (1 for the first).
    pub attempt: u32,
    /// The worker that ran it.
    pub worker: String,
    /// The batch the job belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Job, JobError> {
        Job::parse(s.as_bytes(), DEFAULT_MAX_JOB_BYTES)
    }

    fn err(s: &str) -> String {
        parse(s).unwrap_err().to_string()
    }

    #[test]
    fn minimal_shell_job() {
        let job = parse(r#"{"cmd":"echo hi"}"#).unwrap();
        assert_eq!(job.command(), ["/bin/sh", "-c", "echo hi"]);
        assert_eq!(job.timeout_ms(), DEFAULT_TIMEOUT_MS);
    }

    #[test]
    fn full_job_round_trips() {
        let text = r#"{"id":"j-1","argv":["python3","main.py"],"stdin":{"b64":"AAE="},
            "env":{"A":"1"},"files":{"main.py":"print(1)","d/x.bin":{"b64":"/w=="}},
            "cwd":"sub","timeout_ms":500,"limits":{"memory_mb":256,"pids":16},
            "collect":["out/*.txt"],"batch":"b1","result_ttl_s":60,"max_attempts":2,"reply_to":"r"}"#;
        let job = parse(text).unwrap();
        assert_eq!(
            job.stdin.as_ref().unwrap().to_bytes().unwrap(),
            vec![0u8, 1]
        );
        assert_eq!(job.files["d/x.bin"].to_bytes().unwrap(), vec![0xffu8]);
        let again = parse(&serde_json::to_string(&job).unwrap()).unwrap();
        assert_eq!(job, again);
    }

    #[test]
    fn errors_name_the_field() {
        assert!(err(r#"{"cmd":"x","bogus":1}"#).contains("unknown field `bogus`"));
        assert!(err(r#"{"cmd":"x","timeout_ms":"soon"}"#).starts_with("timeout_ms: invalid type"));
        assert!(err(r#"{"cmd":"x","timeout_ms":-5}"#).starts_with("timeout_ms: invalid value"));
        let e = err(r#"{"cmd":"x","limits":{"memory":1}}"#);
        assert!(
            e.starts_with("limits") && e.contains("unknown field `memory`"),
            "{e}"
        );
        assert!(
            err(r#"{"cmd":"x","limits":{"pids":0}}"#).starts_with("limits.pids: must be between")
        );
        assert!(err(r#"{"cmd":"x","files":{"a":5}}"#).starts_with("files.a: invalid type"));
        assert!(err(r#"{"cmd":"x","files":{"a":{"b64":"!!"}}}"#).contains("invalid base64"));
        assert!(err(r#"{"env":{}}"#).starts_with("cmd: a job needs"));
        assert!(err(r#"{"cmd":"a","argv":["b"]}"#).contains("not both"));
        assert!(err(r#"{"argv":[]}"#).starts_with("argv: is empty"));
        assert!(err(r#"{"cmd":"x","timeout_ms":0}"#).starts_with("timeout_ms: must be between"));
        assert!(err(r#"{"cmd":"x","env":{"A=B":"1"}}"#).starts_with("env.A=B"));
        assert!(err("not json").starts_with("job is not valid JSON"));
        assert!(err(r#"{"cmd":"x"} trailing"#).starts_with("job is not valid JSON"));
        let e = err(r#"["cmd"]"#);
        assert_eq!(e, "job: must be a JSON object");
    }

    #[test]
    fn file_paths_stay_inside_the_work_dir() {
        for bad in ["/etc/passwd", "../x", "a/../../x", "", ".", "a\u{0}b"] {
            let job = Job {
                files: [(bad.to_owned(), FileData::Text(String::new()))].into(),
                ..Job::shell("true")
            };
            let e = job.validate().unwrap_err().to_string();
            assert!(e.starts_with("files."), "{bad:?}: {e}");
        }
        let ok = Job {
            files: [("a/b/c.txt".to_owned(), FileData::Text("x".into()))].into(),
            ..Job::shell("true")
        };
        ok.validate().unwrap();
        let e = Job {
            collect: vec!["../*".into()],
            ..Job::shell("true")
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().starts_with("collect[0]"));
    }

    #[test]
    fn files_the_launcher_could_not_write_are_invalid_up_front() {
        let with = |files: &[(&str, FileData)]| Job {
            files: files
                .iter()
                .map(|(p, d)| (p.to_string(), d.clone()))
                .collect(),
            ..Job::shell("true")
        };
        let text = |s: &str| FileData::Text(s.into());
        let err = |job: Job| job.validate().unwrap_err().to_string();
        assert_eq!(
            err(with(&[("a", text("1")), ("a/b", text("2"))])),
            "files.a/b: its directory a is also a file (files.a)"
        );
        assert_eq!(
            err(with(&[("d/a", text("1")), ("d/a/x/y", text("2"))])),
            "files.d/a/x/y: its directory d/a is also a file (files.d/a)"
        );
        assert_eq!(
            err(with(&[("./a", text("1")), ("a", text("2"))])),
            "files.a: names the same file as files../a"
        );
        let e = err(with(&[("bin", FileData::Base64("not base64!".into()))]));
        assert!(e.starts_with("files.bin: invalid base64"), "{e}");
        let e = err(Job {
            stdin: Some(FileData::Base64("%%".into())),
            ..Job::shell("true")
        });
        assert!(e.starts_with("stdin: invalid base64"), "{e}");
        with(&[("d/a", text("1")), ("d/b", text("2")), ("da", text("3"))])
            .validate()
            .unwrap();
        for bytes in [&b""[..], b"h", b"hi", b"hi!", b"hi!\xff", b"\0\0\0\0\0"] {
            let data = FileData::Base64(base64::engine::general_purpose::STANDARD.encode(bytes));
            assert_eq!(data.byte_len(), bytes.len(), "{data:?}");
        }
        assert_eq!(text("héllo").byte_len(), 6);
    }

    #[test]
    fn oversized_payload_is_rejected_before_parsing() {
        let e = Job::parse(&[b' '; 100], 10).unwrap_err();
        assert_eq!(
            e,
            JobError::TooLarge {
                size: 100,
                limit: 10
            }
        );
    }

    #[test]
    fn limits_resolve_against_defaults() {
        let l = Limits {
            memory_mb: Some(128),
            ..Limits::default()
        };
        let e = l.resolve(&EffectiveLimits::default());
        assert_eq!(e.memory_mb, 128);
        assert_eq!(e.pids, EffectiveLimits::default().pids);
    }

    #[test]
    fn result_json_is_flat() {
        let r = JobResult {
            id: "x".into(),
            outcome: Outcome::not_run(Status::Invalid, "bad"),
            attempt: 1,
            worker: "w".into(),
            batch: None,
        };
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["status"], "invalid");
        assert_eq!(v["exit_code"], 125);
        assert_eq!(v["id"], "x");
        let back: JobResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn binary_output_becomes_base64() {
        assert_eq!(
            FileData::from_bytes(b"hi".to_vec()),
            FileData::Text("hi".into())
        );
        let b = FileData::from_bytes(vec![0xff, 0]);
        assert_eq!(serde_json::to_string(&b).unwrap(), r#"{"b64":"/wA="}"#);
    }
}
