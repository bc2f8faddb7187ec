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
/// Longest accepted batch name.
pub const MAX_BATCH_LEN: usize = 128;
/// Upper bound on `result_ttl_s` (one year): Redis refuses an expire time past its range, and
/// a node's own maximum ([`JobCeilings::result_ttl_s`]) is normally far lower.
pub const MAX_RESULT_TTL_S: u64 = 365 * 86_400;
/// Upper bound on `max_attempts`; a node's own maximum is normally far lower.
pub const MAX_ATTEMPTS: u32 = 1000;
/// The kernel's limit on one argument or environment string at exec, its NUL included
/// (`MAX_ARG_STRLEN`, 32 pages): a longer one fails exec with E2BIG.
pub const MAX_ARG_STRLEN: usize = 128 * 1024;
/// Upper bound on what the program's argv and environment take at exec (strings, their NULs
/// and one pointer each). The kernel allows a quarter of the stack rlimit (2 MiB under the
/// usual 8 MiB, at least 128 KiB, at most 6 MiB); the engine also checks the bound of its own
/// stack rlimit.
pub const MAX_EXEC_ARGS_BYTES: usize = 1024 * 1024;
/// Most bytes the `collect` patterns may take together, encoded as JSON: they travel to the
/// sandbox's init in one control message of at most 64 KiB, beside the job's other settings.
pub const MAX_COLLECT_JSON_BYTES: usize = 16 * 1024;
/// What the environment the engine adds (`PATH`, `HOME`, `LANG`) may take at exec, reserved
/// out of [`MAX_EXEC_ARGS_BYTES`].
const EXEC_ENV_RESERVE: usize = 4096;

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
    /// What the output cap (`limits.output_bytes`) does to a job that writes past it: `kill`
    /// it (the default: it bounds the node's work), or `truncate` its output and let it run
    /// on, so its own exit decides its status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_mode: Option<OutputMode>,
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
    /// Run the program in the node's warm runtime (an interpreter initialised before the
    /// sandbox existed); absent runs it as any other program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,
    /// The network the job's sandbox has; absent takes the node's default (`none` unless the
    /// node says otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// A compile stage run first, in the same sandbox: the program (`cmd`/`argv`) runs only
    /// when it exits 0, and sees what it wrote. Absent runs the program alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile: Option<CompileStage>,
    /// Open a session (a long-lived sandbox served calls through Redis) instead of running a
    /// program: such a job has no `cmd`/`argv` (see `session`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionSpec>,
}

/// The compile stage of a staged job: a command with its own wall-clock limit and limits, run
/// in the job's working directory (same files, environment, network and disk) before the
/// program, with empty standard input.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompileStage {
    /// A shell string, run as `/bin/sh -c CMD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
    /// A program and its arguments, resolved through the job's `PATH`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// The stage's wall-clock limit, measured from its exec; the job's `timeout_ms` is the
    /// run stage's alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The stage's own limits; each one left out is the job's (`limits`, then the node's
    /// default).
    #[serde(default, skip_serializing_if = "StageLimits::is_empty")]
    pub limits: StageLimits,
}

/// The limits a compile stage may set for itself; the sandbox-wide ones (`disk_mb`,
/// `file_size_mb`, `open_files`) are the job's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
}

impl StageLimits {
    pub fn is_empty(&self) -> bool {
        *self == StageLimits::default()
    }

    /// As job limits: the values set here, the others left for the job's to fill.
    pub fn as_limits(&self) -> Limits {
        Limits {
            memory_mb: self.memory_mb,
            cpu_ms: self.cpu_ms,
            pids: self.pids,
            output_bytes: self.output_bytes,
            ..Limits::default()
        }
    }
}

impl CompileStage {
    /// A shell-string compile stage (its command set as [`Job::shell`] sets a job's).
    pub fn shell(cmd: impl Into<String>) -> CompileStage {
        CompileStage::running(Job::shell(cmd))
    }

    /// An argv compile stage (its command set as [`Job::argv`] sets a job's).
    pub fn argv<I, S>(argv: I) -> CompileStage
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        CompileStage::running(Job::argv(argv))
    }

    /// A compile stage with `job`'s command (`cmd` or `argv`) and nothing else set.
    fn running(job: Job) -> CompileStage {
        CompileStage {
            cmd: job.cmd,
            argv: job.argv,
            ..CompileStage::default()
        }
    }

    /// The program and arguments to exec: `argv`, or `/bin/sh -c CMD`.
    pub fn command(&self) -> Vec<String> {
        command_of(self.cmd.as_deref(), self.argv.as_deref())
    }

    /// The stage's wall-clock limit.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)
    }

    /// The stage's limits: its own, then the job's `job_limits` (already resolved).
    pub fn resolve(&self, job_limits: &EffectiveLimits) -> EffectiveLimits {
        self.limits.as_limits().resolve(job_limits)
    }
}

/// The network a job's sandbox has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// No network at all: only Unix sockets can be made (any other family fails with
    /// EAFNOSUPPORT), in a namespace no concurrent job shares.
    #[default]
    None,
    /// A network namespace of its own with only `lo` up: IPv4, IPv6 and netlink sockets work
    /// within the sandbox and reach nothing outside it.
    Loopback,
}

impl Network {
    pub const ALL: [Network; 2] = [Network::None, Network::Loopback];

    pub fn as_str(self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Loopback => "loopback",
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Network {
    type Err = String;
    fn from_str(s: &str) -> Result<Network, String> {
        Network::ALL
            .into_iter()
            .find(|n| n.as_str() == s)
            .ok_or_else(|| format!("unknown network {s:?} (known: none, loopback)"))
    }
}

/// A warm runtime a job may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Runtime {
    /// The program is a `python3 ...` command line, run by a pre-initialised CPython.
    Python,
}

impl Runtime {
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Python => "python",
        }
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Runtime {
    type Err = String;
    fn from_str(s: &str) -> Result<Runtime, String> {
        match s {
            "python" => Ok(Runtime::Python),
            other => Err(format!("unknown runtime {other:?} (known: python)")),
        }
    }
}

/// What the output cap does to a job that writes past it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputMode {
    /// Kill the job (status `output_limit`).
    #[default]
    Kill,
    /// Keep the first `output_bytes` of each stream, discard the rest, and let the job run to
    /// its own end (its `*_truncated` flags say what was cut).
    Truncate,
}

impl OutputMode {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputMode::Kill => "kill",
            OutputMode::Truncate => "truncate",
        }
    }
}

impl std::str::FromStr for OutputMode {
    type Err = String;
    fn from_str(s: &str) -> Result<OutputMode, String> {
        match s {
            "kill" => Ok(OutputMode::Kill),
            "truncate" => Ok(OutputMode::Truncate),
            other => Err(format!("unknown output mode {other:?} (kill or truncate)")),
        }
    }
}

/// How a job that asked for a runtime was run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeUse {
    pub name: Runtime,
    /// Whether the program ran in the warm interpreter (else it was exec'd as usual).
    pub warm: bool,
    /// Why it ran cold, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
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

/// A node's maximums for what a job may ask: a job asking for more is `invalid`, and the
/// node's defaults must lie within them. Set per node (`--max-disk-mb`, ...), so operators
/// decide what one job may take of the host; the schema's own ranges only keep values within
/// what the kernel and Redis accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobCeilings {
    pub timeout_ms: u64,
    /// Largest value of each of the job's `limits`.
    pub limits: EffectiveLimits,
    pub max_attempts: u32,
    pub result_ttl_s: u64,
}

impl Default for JobCeilings {
    fn default() -> Self {
        JobCeilings {
            timeout_ms: 3_600_000,
            limits: EffectiveLimits {
                memory_mb: 4096,
                pids: 1024,
                // The default: CPU time is bounded by the wall clock unless a job says less.
                cpu_ms: MAX_TIMEOUT_MS,
                output_bytes: 16 * 1024 * 1024,
                disk_mb: 1024,
                file_size_mb: 1024,
                open_files: 4096,
            },
            max_attempts: 10,
            result_ttl_s: 7 * 86_400,
        }
    }
}

impl JobCeilings {
    fn limit_fields(&self) -> [(&'static str, u64); 7] {
        let l = &self.limits;
        [
            ("memory_mb", l.memory_mb),
            ("pids", l.pids),
            ("cpu_ms", l.cpu_ms),
            ("output_bytes", l.output_bytes),
            ("disk_mb", l.disk_mb),
            ("file_size_mb", l.file_size_mb),
            ("open_files", l.open_files),
        ]
    }

    /// Refuses a job that asks for more than these maximums, naming the field and the maximum.
    /// Values the job leaves out take the node's defaults, which
    /// [`JobCeilings::clamp_defaults`] keeps within the maximums.
    pub fn check(&self, job: &Job) -> Result<(), JobError> {
        let over = |field: String, got: u64, max: u64| {
            invalid(field, format!("{got} is over this node's maximum of {max}"))
        };
        if let Some(t) = job.timeout_ms {
            if t > self.timeout_ms {
                return Err(over("timeout_ms".into(), t, self.timeout_ms));
            }
        }
        for ((name, asked, _, _), (_, max)) in job.limits.fields().iter().zip(self.limit_fields()) {
            if let Some(v) = *asked {
                if v > max {
                    return Err(over(format!("limits.{name}"), v, max));
                }
            }
        }
        if let Some(a) = job.max_attempts {
            if a > self.max_attempts {
                return Err(over(
                    "max_attempts".into(),
                    u64::from(a),
                    u64::from(self.max_attempts),
                ));
            }
        }
        if let Some(t) = job.result_ttl_s {
            if t > self.result_ttl_s {
                return Err(over("result_ttl_s".into(), t, self.result_ttl_s));
            }
        }
        self.check_compile(job)
    }

    /// A compile stage is held to the same maximums as the program.
    fn check_compile(&self, job: &Job) -> Result<(), JobError> {
        let Some(stage) = &job.compile else {
            return Ok(());
        };
        let over = |field: String, got: u64, max: u64| {
            invalid(field, format!("{got} is over this node's maximum of {max}"))
        };
        if let Some(t) = stage.timeout_ms {
            if t > self.timeout_ms {
                return Err(over("compile.timeout_ms".into(), t, self.timeout_ms));
            }
        }
        let limits = stage.limits.as_limits();
        for ((name, asked, _, _), (_, max)) in limits.fields().iter().zip(self.limit_fields()) {
            if let Some(v) = *asked {
                if v > max {
                    return Err(over(format!("compile.limits.{name}"), v, max));
                }
            }
        }
        Ok(())
    }

    /// The wall-clock limit `job`'s compile stage runs with, if it has one: its own, else the
    /// default lowered to the maximum.
    pub fn compile_timeout_ms(&self, job: &Job) -> Option<u64> {
        let stage = job.compile.as_ref()?;
        Some(
            stage
                .timeout_ms
                .unwrap_or_else(|| DEFAULT_TIMEOUT_MS.min(self.timeout_ms)),
        )
    }

    /// `defaults` (what a job that sets nothing gets) lowered to the maximums where they are
    /// above, so a node whose maximum is below a built-in default serves with the maximum.
    pub fn clamp_defaults(&self, defaults: &EffectiveLimits) -> EffectiveLimits {
        let (d, c) = (defaults, &self.limits);
        EffectiveLimits {
            memory_mb: d.memory_mb.min(c.memory_mb),
            pids: d.pids.min(c.pids),
            cpu_ms: d.cpu_ms.min(c.cpu_ms),
            output_bytes: d.output_bytes.min(c.output_bytes),
            disk_mb: d.disk_mb.min(c.disk_mb),
            file_size_mb: d.file_size_mb.min(c.file_size_mb),
            open_files: d.open_files.min(c.open_files),
        }
    }

    /// The wall-clock limit `job` runs with: its own, else the default lowered to the maximum.
    pub fn timeout_ms(&self, job: &Job) -> u64 {
        job.timeout_ms
            .unwrap_or_else(|| DEFAULT_TIMEOUT_MS.min(self.timeout_ms))
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

    /// Every limit's name with its accepted range (inclusive).
    pub fn ranges() -> Vec<(&'static str, u64, u64)> {
        Limits::default()
            .fields()
            .iter()
            .map(|&(name, _, min, max)| (name, min, max))
            .collect()
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

pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> JobError {
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

    /// Checks the rules that types alone cannot express: one step per field group, in this
    /// order, the first broken rule being the error. A new field group is one more step.
    pub fn validate(&self) -> Result<(), JobError> {
        self.check_id()?;
        self.check_command()?;
        self.check_env()?;
        self.check_exec_size()?;
        self.check_stdin()?;
        self.check_files()?;
        self.check_collect()?;
        self.check_batch()?;
        self.check_reply_to()?;
        self.check_cwd()?;
        self.check_bounds()?;
        self.check_compile_stage()?;
        check_session_create(self)?;
        Ok(())
    }

    /// What the program's argv and the job's `env` take at exec ([`exec_footprint`]; the
    /// engine's own `PATH`, `HOME`, `LANG` come on top).
    pub fn exec_bytes(&self) -> usize {
        let args: Vec<&str> = match (&self.argv, &self.cmd) {
            (Some(argv), _) => argv.iter().map(String::as_str).collect(),
            (None, Some(cmd)) => vec!["/bin/sh", "-c", cmd],
            (None, None) => Vec::new(),
        };
        exec_footprint(args, self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// The program and arguments to exec: `argv`, or `/bin/sh -c CMD`.
    pub fn command(&self) -> Vec<String> {
        command_of(self.cmd.as_deref(), self.argv.as_deref())
    }

    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)
    }
}

/// The steps of [`Job::validate`], one per field group.
impl Job {
    /// The id, when given: printable ASCII of bounded length.
    fn check_id(&self) -> Result<(), JobError> {
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
        Ok(())
    }

    /// `cmd` or `argv`, exactly one, non-empty, each string without NUL and within
    /// `MAX_ARG_STRLEN`.
    fn check_command(&self) -> Result<(), JobError> {
        if self.session.is_some() {
            // A session has no program of its own: `session::check_create` refuses one.
            return Ok(());
        }
        check_command("", "a job", self.cmd.as_deref(), self.argv.as_deref())
    }

    /// Variable names and values as exec takes them.
    fn check_env(&self) -> Result<(), JobError> {
        for (k, v) in &self.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(invalid(
                    format!("env.{k}"),
                    "names must be non-empty, without '=' or NUL",
                ));
            }
            no_nul(&format!("env.{k}"), v)?;
            exec_string(&format!("env.{k}"), k.len() + 1 + v.len())?;
        }
        Ok(())
    }

    /// The command and env together within [`MAX_EXEC_ARGS_BYTES`], the engine's own variables
    /// reserved (after the command and env checks, which bound each string).
    fn check_exec_size(&self) -> Result<(), JobError> {
        check_exec_bytes("", self.argv.is_some(), self.exec_bytes())
    }

    /// `stdin` decodes.
    fn check_stdin(&self) -> Result<(), JobError> {
        if let Some(stdin) = &self.stdin {
            stdin
                .to_bytes()
                .map_err(|e| invalid("stdin", format!("invalid base64: {e}")))?;
        }
        Ok(())
    }

    /// Each file relative, decoding, named once, and none inside another: the launcher would
    /// fail writing them.
    fn check_files(&self) -> Result<(), JobError> {
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
        Ok(())
    }

    /// The collect patterns: bounded in size, relative, each wildcard component a valid glob.
    fn check_collect(&self) -> Result<(), JobError> {
        let collect_bytes = serde_json::to_vec(&self.collect).map_or(usize::MAX, |v| v.len());
        if collect_bytes > MAX_COLLECT_JSON_BYTES {
            return Err(invalid(
                "collect",
                format!(
                    "the patterns take {collect_bytes} bytes as JSON, over the limit of \
                     {MAX_COLLECT_JSON_BYTES}"
                ),
            ));
        }
        for (i, pattern) in self.collect.iter().enumerate() {
            let field = format!("collect[{i}]");
            check_relative(&field, pattern)?;
            // As the collector reads it: one wildcard per path component, `**` on its own.
            for part in pattern.split('/') {
                if part != "**" && part.contains(['*', '?', '[']) {
                    glob::Pattern::new(part).map_err(|e| {
                        invalid(&field, format!("invalid glob pattern {part:?}: {e}"))
                    })?;
                }
            }
        }
        Ok(())
    }

    /// The batch name, when given.
    fn check_batch(&self) -> Result<(), JobError> {
        if let Some(batch) = &self.batch {
            if batch.is_empty() || batch.len() > MAX_BATCH_LEN {
                return Err(invalid(
                    "batch",
                    format!("must be 1 to {MAX_BATCH_LEN} bytes"),
                ));
            }
            if batch.chars().any(char::is_control) {
                return Err(invalid("batch", "must not contain control characters"));
            }
        }
        Ok(())
    }

    /// The reply stream, when given, is one the key layout allows.
    fn check_reply_to(&self) -> Result<(), JobError> {
        if let Some(reply_to) = &self.reply_to {
            crate::keys::parse_reply_to(reply_to).map_err(|m| invalid("reply_to", m))?;
        }
        Ok(())
    }

    /// The working directory stays inside the sandbox's.
    fn check_cwd(&self) -> Result<(), JobError> {
        if let Some(cwd) = &self.cwd {
            no_nul("cwd", cwd)?;
            if cwd.split('/').any(|c| c == "..") {
                return Err(invalid("cwd", "must not contain '..'"));
            }
        }
        Ok(())
    }

    /// The numeric settings within their bounds: timeout, limits, attempts, result TTL.
    fn check_bounds(&self) -> Result<(), JobError> {
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
        if let Some(a) = self.max_attempts {
            if a == 0 || a > MAX_ATTEMPTS {
                return Err(invalid(
                    "max_attempts",
                    format!("must be between 1 and {MAX_ATTEMPTS}, got {a}"),
                ));
            }
        }
        if let Some(t) = self.result_ttl_s {
            if t == 0 || t > MAX_RESULT_TTL_S {
                return Err(invalid(
                    "result_ttl_s",
                    format!("must be between 1 and {MAX_RESULT_TTL_S}, got {t}"),
                ));
            }
        }
        Ok(())
    }

    /// The compile stage's rules: one command, within what exec takes, a timeout and limits
    /// in range, and no warm runtime (the run stage of a staged job is exec'd).
    fn check_compile_stage(&self) -> Result<(), JobError> {
        let Some(stage) = &self.compile else {
            return Ok(());
        };
        check_command(
            "compile.",
            "a compile stage",
            stage.cmd.as_deref(),
            stage.argv.as_deref(),
        )?;
        let command = stage.command();
        let env = self.env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let bytes = exec_footprint(command.iter().map(String::as_str), env);
        check_exec_bytes("compile.", stage.argv.is_some(), bytes)?;
        if let Some(t) = stage.timeout_ms {
            if t == 0 || t > MAX_TIMEOUT_MS {
                return Err(invalid(
                    "compile.timeout_ms",
                    format!("must be between 1 and {MAX_TIMEOUT_MS}"),
                ));
            }
        }
        for (name, value, min, max) in stage.limits.as_limits().fields() {
            if let Some(v) = value {
                if v < min || v > max {
                    return Err(invalid(
                        format!("compile.limits.{name}"),
                        format!("must be between {min} and {max}, got {v}"),
                    ));
                }
            }
        }
        if self.runtime.is_some() {
            return Err(invalid(
                "compile",
                "a staged job runs its program exec'd: it cannot ask for a warm `runtime`",
            ));
        }
        Ok(())
    }
}

/// What `args` and `env` take at exec, as the kernel counts them against its bound: each
/// string with its NUL (`KEY=VALUE` for a variable) and one pointer.
pub fn exec_footprint<'a>(
    args: impl IntoIterator<Item = &'a str>,
    env: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> usize {
    let ptr = std::mem::size_of::<usize>();
    let args: usize = args.into_iter().map(|a| a.len() + 1 + ptr).sum();
    let env: usize = env
        .into_iter()
        .map(|(k, v)| k.len() + v.len() + 2 + ptr)
        .sum();
    args + env
}

/// The kernel's bound on argv and environment at exec for a process whose soft
/// `RLIMIT_STACK` is `stack_soft` bytes: a quarter of it, at least 128 KiB (`ARG_MAX`), at most
/// three quarters of 8 MiB (`_STK_LIM`). [`MAX_EXEC_ARGS_BYTES`] is what a job may take on any
/// node; a node also checks this bound for its own stack limit.
pub fn exec_args_limit(stack_soft: u64) -> usize {
    const ARG_MAX: u64 = 128 * 1024;
    const STK_LIM: u64 = 8 * 1024 * 1024;
    let limit = (STK_LIM / 4 * 3).min(stack_soft / 4).max(ARG_MAX);
    usize::try_from(limit).unwrap_or(usize::MAX)
}

/// A command given as `cmd` or `argv`, a job's (`at` empty) or its compile stage's (`at`
/// `compile.`): exactly one, non-empty, each string without NUL and within `MAX_ARG_STRLEN`.
/// `whose` names what needs it in the error for neither.
fn check_command(
    at: &str,
    whose: &str,
    cmd: Option<&str>,
    argv: Option<&[String]>,
) -> Result<(), JobError> {
    let field = |name: &str| format!("{at}{name}");
    match (cmd, argv) {
        (None, None) => Err(invalid(
            field("cmd"),
            format!("{whose} needs `cmd` (a shell string) or `argv` (an array)"),
        )),
        (Some(_), Some(_)) => Err(invalid(field("cmd"), "give `cmd` or `argv`, not both")),
        (Some(cmd), None) => {
            no_nul(&field("cmd"), cmd)?;
            if cmd.trim().is_empty() {
                return Err(invalid(field("cmd"), "is empty"));
            }
            exec_string(&field("cmd"), cmd.len())
        }
        (None, Some(argv)) => {
            match argv.first() {
                None => return Err(invalid(field("argv"), "is empty")),
                Some(a) if a.is_empty() => return Err(invalid(field("argv[0]"), "is empty")),
                _ => {}
            }
            for (i, a) in argv.iter().enumerate() {
                let name = field(&format!("argv[{i}]"));
                no_nul(&name, a)?;
                exec_string(&name, a.len())?;
            }
            Ok(())
        }
    }
}

/// `bytes` of a command and env at exec (as [`exec_footprint`] counts them), with the
/// engine's own variables reserved, within [`MAX_EXEC_ARGS_BYTES`]; the error names the
/// command's field (`at` as for [`check_command`]).
fn check_exec_bytes(at: &str, is_argv: bool, bytes: usize) -> Result<(), JobError> {
    let exec = bytes + EXEC_ENV_RESERVE;
    if exec > MAX_EXEC_ARGS_BYTES {
        let name = if is_argv { "argv" } else { "cmd" };
        return Err(invalid(
            format!("{at}{name}"),
            format!(
                "the command and env take {exec} bytes at exec, over the limit of \
                 {MAX_EXEC_ARGS_BYTES} bytes"
            ),
        ));
    }
    Ok(())
}

/// What a command given as `cmd` or `argv` execs: `argv`, or `/bin/sh -c CMD`.
fn command_of(cmd: Option<&str>, argv: Option<&[String]>) -> Vec<String> {
    match (argv, cmd) {
        (Some(argv), _) => argv.to_vec(),
        (None, Some(cmd)) => vec!["/bin/sh".into(), "-c".into(), cmd.to_owned()],
        (None, None) => Vec::new(),
    }
}

/// One argument or environment string of `len` bytes must fit the kernel's `MAX_ARG_STRLEN`.
fn exec_string(field: &str, len: usize) -> Result<(), JobError> {
    if len + 1 > MAX_ARG_STRLEN {
        return Err(invalid(
            field,
            format!(
                "is {len} bytes; the kernel takes at most {} bytes per argument or \
                 environment string (MAX_ARG_STRLEN)",
                MAX_ARG_STRLEN - 1
            ),
        ));
    }
    Ok(())
}

pub(crate) fn no_nul(field: &str, s: &str) -> Result<(), JobError> {
    if s.contains('\0') {
        return Err(invalid(field, "contains a NUL byte"));
    }
    Ok(())
}

/// A path must stay inside the working directory: relative, no `..`, no empty name.
pub(crate) fn check_relative(field: &str, path: &str) -> Result<(), JobError> {
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

/// A session's lifetime when its create job sets no `session.ttl_s`.
pub const DEFAULT_SESSION_TTL_S: u64 = 600;
/// A session's idle timeout when its create job sets no `session.idle_s`.
pub const DEFAULT_SESSION_IDLE_S: u64 = 120;
/// Upper bound on `ttl_s` and `idle_s` (one week); a node's own maximums are normally lower.
pub const MAX_SESSION_S: u64 = 7 * 86_400;
/// The `session` object of a create job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSpec {
    /// Lifetime in seconds from the open ([`DEFAULT_SESSION_TTL_S`] when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// Ends the session when no call came for this long ([`DEFAULT_SESSION_IDLE_S`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_s: Option<u64>,
}

impl SessionSpec {
    pub fn ttl_s(&self) -> u64 {
        self.ttl_s.unwrap_or(DEFAULT_SESSION_TTL_S)
    }

    pub fn idle_s(&self) -> u64 {
        self.idle_s.unwrap_or(DEFAULT_SESSION_IDLE_S)
    }
}

/// The create job's rules: no program or program-only setting, `ttl_s`/`idle_s` in range.
pub(crate) fn check_session_create(job: &Job) -> Result<(), JobError> {
    let Some(spec) = &job.session else {
        return Ok(());
    };
    let given = [
        ("cmd", job.cmd.is_some()),
        ("argv", job.argv.is_some()),
        ("stdin", job.stdin.is_some()),
        ("cwd", job.cwd.is_some()),
        ("timeout_ms", job.timeout_ms.is_some()),
        ("output_mode", job.output_mode.is_some()),
        ("collect", !job.collect.is_empty()),
        ("batch", job.batch.is_some()),
        ("reply_to", job.reply_to.is_some()),
        ("compile", job.compile.is_some()),
    ];
    if let Some((field, _)) = given.iter().find(|(_, set)| *set) {
        return Err(invalid(
            *field,
            "a session's create job has no program of its own; each call gives its own \
             command and timeout_ms (allowed with `session`: id, limits, env, files, network, \
             runtime, result_ttl_s, max_attempts)",
        ));
    }
    for (name, value) in [("ttl_s", spec.ttl_s), ("idle_s", spec.idle_s)] {
        if let Some(v) = value {
            if v == 0 || v > MAX_SESSION_S {
                return Err(invalid(
                    format!("session.{name}"),
                    format!("must be between 1 and {MAX_SESSION_S}, got {v}"),
                ));
            }
        }
    }
    Ok(())
}

/// The `session` object of the create job's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionOpened {
    pub id: String,
    /// The node serving it (its worker name).
    pub node: String,
    /// When its lifetime ends (Unix ms).
    pub expires_ms: u64,
    pub idle_s: u64,
    /// The warm runtime serving `run_code`, when the create job asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeUse>,
}

/// What bounded a job's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryBound {
    /// The job's cgroup: `memory.max` over everything it made resident.
    Cgroup,
    /// Without cgroups: one budget over the sandbox's processes kept by its init (anonymous
    /// and shared memory, page tables), with `RLIMIT_DATA` per process.
    SandboxBudget,
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
    /// The compile stage of a staged job did not exit 0 (see the result's `compile`); the
    /// program did not run.
    CompileError,
}

impl Status {
    pub const ALL: [Status; 11] = [
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
        Status::CompileError,
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
            Status::CompileError => "compile_error",
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
    /// What bounded the job's memory (absent for a job that never ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bound_by: Option<MemoryBound>,
    /// Files matched by `collect`.
    #[serde(default)]
    pub files: BTreeMap<String, FileData>,
    /// Paths in `files` whose content was cut short by the node's collect cap (absent when
    /// none was).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_truncated: Vec<String>,
    /// How late the watchdog's kill came after the deadline (timeouts only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog_overshoot_us: Option<i64>,
    /// Which isolation step failed and why, or why the job was rejected.
    #[serde(default)]
    pub error: Option<String>,
    /// For a job that asked for a runtime: whether it ran warm, and if not why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeUse>,
    /// For a staged job: how its compile stage ended (present once the stage ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile: Option<StageOutcome>,
}

/// How a compile stage ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageStatus {
    /// Exit code 0: the program runs next.
    Ok,
    /// Non-zero exit code.
    Failed,
    /// Killed at the stage's wall-clock limit.
    Timeout,
    /// Killed for exceeding the stage's CPU time.
    CpuLimit,
    /// Killed for exceeding the stage's memory.
    MemoryLimit,
    /// Killed for writing more than the stage's output cap.
    OutputLimit,
    /// Killed by a signal of its own doing.
    Signaled,
}

impl StageStatus {
    pub const ALL: [StageStatus; 7] = [
        StageStatus::Ok,
        StageStatus::Failed,
        StageStatus::Timeout,
        StageStatus::CpuLimit,
        StageStatus::MemoryLimit,
        StageStatus::OutputLimit,
        StageStatus::Signaled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StageStatus::Ok => "ok",
            StageStatus::Failed => "failed",
            StageStatus::Timeout => "timeout",
            StageStatus::CpuLimit => "cpu_limit",
            StageStatus::MemoryLimit => "memory_limit",
            StageStatus::OutputLimit => "output_limit",
            StageStatus::Signaled => "signaled",
        }
    }
}

/// What a compile stage did: the run stage's fields, for the stage alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageOutcome {
    pub status: StageStatus,
    /// As the result's `exit_code`: 124 on timeout, 128+N when killed by signal N.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Wall time from the stage's exec to its end.
    pub duration_ms: f64,
    pub cpu_ms: u64,
    pub max_rss_kb: u64,
}

impl Outcome {
    /// The outcome of a staged job whose compile stage did not succeed: status
    /// `compile_error`, the stage in `compile`, and no run (empty output, no time or memory);
    /// `exit_code` and `signal` are the stage's, as `compile && run` in a shell reports them.
    pub fn compile_error(stage: StageOutcome) -> Outcome {
        let mut outcome = Outcome::not_run(Status::CompileError, "");
        outcome.error = None;
        outcome.exit_code = stage.exit_code;
        outcome.signal = stage.signal;
        outcome.compile = Some(stage);
        outcome
    }
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
            memory_bound_by: None,
            files: BTreeMap::new(),
            files_truncated: Vec::new(),
            watchdog_overshoot_us: None,
            error: Some(error.into()),
            runtime: None,
            compile: None,
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
    /// When the job was put on the stream (ms since the Unix epoch, from its entry id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enqueued_at_ms: Option<u64>,
    /// When the worker handed the job to a sandbox (absent for a job that never started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<u64>,
    /// When the worker had the job's outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    /// For a session's create job that opened it: the session (see the `session` module).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionOpened>,
}

impl JobResult {
    /// A result without timestamps; set them with the `*_at_ms` fields.
    pub fn new(id: String, outcome: Outcome, attempt: u32, worker: String) -> JobResult {
        JobResult {
            id,
            outcome,
            attempt,
            worker,
            batch: None,
            enqueued_at_ms: None,
            started_at_ms: None,
            finished_at_ms: None,
            session: None,
        }
    }

    /// Time from enqueue to start, when both are known.
    pub fn queue_wait_ms(&self) -> Option<u64> {
        Some(self.started_at_ms?.saturating_sub(self.enqueued_at_ms?))
    }

    /// A stored result's JSON, parsed: what `serde_json::from_slice` gives, at about half
    /// the cost. The derived parse of the flattened [`Outcome`] first copies every key and
    /// value into a buffer of its own, allocating for each; here the outcome and the queue's
    /// bookkeeping are each read straight from the bytes, each pass skipping the other's
    /// fields without copying them.
    pub fn from_slice(bytes: &[u8]) -> serde_json::Result<JobResult> {
        /// The fields of [`JobResult`] beside its outcome, as they are (de)serialized there.
        #[derive(Deserialize)]
        struct Bookkeeping {
            id: String,
            attempt: u32,
            worker: String,
            #[serde(default)]
            batch: Option<String>,
            #[serde(default)]
            enqueued_at_ms: Option<u64>,
            #[serde(default)]
            started_at_ms: Option<u64>,
            #[serde(default)]
            finished_at_ms: Option<u64>,
            #[serde(default)]
            session: Option<SessionOpened>,
        }
        let b: Bookkeeping = serde_json::from_slice(bytes)?;
        let outcome: Outcome = serde_json::from_slice(bytes)?;
        Ok(JobResult {
            id: b.id,
            outcome,
            attempt: b.attempt,
            worker: b.worker,
            batch: b.batch,
            enqueued_at_ms: b.enqueued_at_ms,
            started_at_ms: b.started_at_ms,
            finished_at_ms: b.finished_at_ms,
            session: b.session,
        })
    }
}

impl JobResult {
    /// The result JSON, cut to at most `max_bytes` (a node's result-size maximum, below what
    /// Redis accepts in one value): standard output and error are shortened from the end,
    /// longest first, with their `*_truncated` flag set; when they are empty and it is still
    /// too long, the collected files are dropped and `error` says so. Nothing else changes.
    pub fn to_json_within(&self, max_bytes: usize) -> String {
        let json = serde_json::to_string(self).expect("a result always serializes");
        if json.len() <= max_bytes {
            return json;
        }
        let mut r = self.clone();
        let mut json = json;
        // Each pass takes off at least the excess (a byte of text is at least a byte of JSON).
        while json.len() > max_bytes {
            let over = json.len() - max_bytes;
            let o = &mut r.outcome;
            if !o.stdout.is_empty() || !o.stderr.is_empty() {
                let (text, flag) = if o.stdout.len() >= o.stderr.len() {
                    (&mut o.stdout, &mut o.stdout_truncated)
                } else {
                    (&mut o.stderr, &mut o.stderr_truncated)
                };
                truncate_chars(text, text.len().saturating_sub(over));
                *flag = true;
            } else if !o.files.is_empty() {
                let note = format!(
                    "the result was over {max_bytes} bytes: {} collected file(s) dropped",
                    o.files.len()
                );
                o.files.clear();
                o.files_truncated.clear();
                o.error = Some(match o.error.take() {
                    Some(e) => format!("{e}; {note}"),
                    None => note,
                });
            } else if let Some(e) = o.error.as_mut().filter(|e| !e.is_empty()) {
                truncate_chars(e, e.len().saturating_sub(over));
            } else {
                break;
            }
            json = serde_json::to_string(&r).expect("a result always serializes");
        }
        json
    }
}

/// Cuts `s` to at most `len` bytes, at a character boundary.
fn truncate_chars(s: &mut String, len: usize) {
    let mut at = len.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s.truncate(at);
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
            "collect":["out/*.txt"],"batch":"b1","result_ttl_s":60,"max_attempts":2,
            "reply_to":"forkbox:{q}:replies:r"}"#;
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
        let r = JobResult::new(
            "x".into(),
            Outcome::not_run(Status::Invalid, "bad"),
            1,
            "w".into(),
        );
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["status"], "invalid");
        assert_eq!(v["exit_code"], 125);
        assert_eq!(v["id"], "x");
        assert!(
            v.get("started_at_ms").is_none(),
            "unknown times are left out"
        );
        let back: JobResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn the_fast_result_parse_gives_what_the_derived_one_gives() {
        let full = serde_json::json!({
            "id": "j1", "status": "compile_error", "exit_code": 1, "signal": null,
            "timed_out": false, "stdout": "a\"b\u{e9}", "stderr": "e", "stdout_truncated": true,
            "stderr_truncated": false, "duration_ms": 1.5, "spawn_us": 7, "cpu_ms": 3,
            "max_rss_kb": 9, "files": {"out.txt": "hi"}, "files_truncated": ["out.txt"],
            "error": "x", "attempt": 2, "worker": "w", "batch": "b", "enqueued_at_ms": 1,
            "started_at_ms": 2, "finished_at_ms": 3,
            "compile": {"status": "failed", "exit_code": 1, "signal": null, "timed_out": false,
                        "stdout": "", "stderr": "syntax", "stdout_truncated": false,
                        "stderr_truncated": false, "duration_ms": 2.0, "cpu_ms": 1, "max_rss_kb": 5},
            "session": {"id": "s", "node": "n", "expires_ms": 5, "idle_s": 6},
            "a_field_of_a_later_node": [1, {"x": 2}]
        });
        let mut samples = vec![
            full.to_string(),
            serde_json::to_string(&JobResult::new(
                "x".into(),
                Outcome::not_run(Status::Invalid, "bad"),
                1,
                "w".into(),
            ))
            .unwrap(),
        ];
        // Corrupt results: a bookkeeping field and an outcome field missing or mistyped.
        for (k, v) in [
            ("id", None),
            ("status", None),
            ("attempt", Some(serde_json::json!("1"))),
            ("stdout", Some(serde_json::json!(5))),
        ] {
            let mut bad = full.clone();
            match v {
                None => drop(bad.as_object_mut().unwrap().remove(k)),
                Some(v) => bad[k] = v,
            }
            samples.push(bad.to_string());
        }
        samples.push("[1]".into());
        samples.push("{\"id\": ".into());
        for text in &samples {
            let derived = serde_json::from_str::<JobResult>(text);
            let fast = JobResult::from_slice(text.as_bytes());
            match (&derived, &fast) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{text}"),
                (Err(_), Err(_)) => {}
                _ => panic!("{text}: derived {derived:?}, fast {fast:?}"),
            }
        }
        if let Err(e) = JobResult::from_slice(samples[0].as_bytes()) {
            panic!("the full sample: {e}");
        }
    }

    #[test]
    fn result_times_round_trip_and_older_results_still_parse() {
        let r = JobResult {
            enqueued_at_ms: Some(1_000),
            started_at_ms: Some(1_250),
            finished_at_ms: Some(1_300),
            ..JobResult::new("x".into(), Outcome::not_run(Status::Ok, "-"), 1, "w".into())
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["enqueued_at_ms"], 1_000);
        assert_eq!(v["started_at_ms"], 1_250);
        assert_eq!(v["finished_at_ms"], 1_300);
        assert_eq!(r.queue_wait_ms(), Some(250));
        let mut old = v.clone();
        for k in ["enqueued_at_ms", "started_at_ms", "finished_at_ms"] {
            old.as_object_mut().unwrap().remove(k);
        }
        let back: JobResult = serde_json::from_value(old).unwrap();
        assert_eq!(back.started_at_ms, None);
        assert_eq!(back.queue_wait_ms(), None);
    }

    #[test]
    fn values_that_reach_redis_are_range_checked() {
        for (job, field) in [
            (
                r#"{"cmd":"x","result_ttl_s":9999999999999999}"#,
                "result_ttl_s:",
            ),
            (r#"{"cmd":"x","result_ttl_s":31536001}"#, "result_ttl_s:"),
            (r#"{"cmd":"x","result_ttl_s":0}"#, "result_ttl_s:"),
            (r#"{"cmd":"x","max_attempts":1001}"#, "max_attempts:"),
            (r#"{"cmd":"x","max_attempts":0}"#, "max_attempts:"),
            (r#"{"cmd":"x","batch":""}"#, "batch:"),
            (r#"{"cmd":"x","batch":"a\u0007b"}"#, "batch:"),
            (r#"{"cmd":"x","reply_to":""}"#, "reply_to:"),
            (
                r#"{"cmd":"x","reply_to":"forkbox:{q}:results"}"#,
                "reply_to:",
            ),
            (
                r#"{"cmd":"x","reply_to":"forkbox:{q}:result:other"}"#,
                "reply_to:",
            ),
            (
                r#"{"cmd":"x","reply_to":"forkbox:{q}:done:other"}"#,
                "reply_to:",
            ),
            (r#"{"cmd":"x","reply_to":"forkbox:{q}:jobs"}"#, "reply_to:"),
            (r#"{"cmd":"x","reply_to":"elsewhere"}"#, "reply_to:"),
        ] {
            let e = err(job);
            assert!(e.starts_with(field), "{job}: {e}");
        }
        let b = "b".repeat(MAX_BATCH_LEN + 1);
        assert!(err(&format!(r#"{{"cmd":"x","batch":"{b}"}}"#)).starts_with("batch:"));
        parse(r#"{"cmd":"x","result_ttl_s":31536000,"max_attempts":1000,"batch":"run 1"}"#)
            .unwrap();
    }

    #[test]
    fn commands_the_kernel_would_refuse_are_invalid() {
        let long = "x".repeat(MAX_ARG_STRLEN);
        let e = Job::shell(long.clone()).validate().unwrap_err().to_string();
        assert!(
            e.starts_with("cmd: is 131072 bytes") && e.contains("MAX_ARG_STRLEN"),
            "{e}"
        );
        let e = Job::argv(["echo", &long])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("argv[1]:"), "{e}");
        let e = Job {
            env: [("K".to_owned(), long.clone())].into(),
            ..Job::shell("true")
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("env.K:"), "{e}");
        // Each string fits, together they do not.
        let piece = "y".repeat(100_000);
        let many: Vec<&str> = std::iter::once("echo")
            .chain(std::iter::repeat_n(piece.as_str(), 11))
            .collect();
        let e = Job::argv(many).validate().unwrap_err().to_string();
        assert!(e.starts_with("argv: the command and env take"), "{e}");
        Job::argv(["echo", &"z".repeat(MAX_ARG_STRLEN - 1)])
            .validate()
            .unwrap();
    }

    #[test]
    fn collect_patterns_over_the_size_limit_are_invalid() {
        // One long valid glob, and many short ones: either way past what the sandbox's init
        // can be handed, which made every delivery a sandbox failure.
        let long = format!("[{}]", "a".repeat(100_000));
        let many: Vec<String> = (0..5000).map(|i| format!("dir{i}/*.txt")).collect();
        for collect in [vec![long], many] {
            let e = Job {
                collect,
                ..Job::shell("true")
            }
            .validate()
            .unwrap_err()
            .to_string();
            assert!(e.starts_with("collect: the patterns take"), "{e}");
        }
        // Escapes count as JSON encodes them: 4000 control characters are 24000 bytes.
        let escaped = Job {
            collect: vec!["\u{1}".repeat(4000)],
            ..Job::shell("true")
        };
        assert!(escaped
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("collect:"));
        let fits = Job {
            collect: (0..200).map(|i| format!("out{i}/**/*.json")).collect(),
            ..Job::shell("true")
        };
        fits.validate().unwrap();
    }

    #[test]
    fn bad_collect_patterns_are_invalid() {
        for bad in ["[", "a/[", "**x", "a[b", "[a/b]"] {
            let e = Job {
                collect: vec!["ok/*".into(), bad.into()],
                ..Job::shell("true")
            }
            .validate()
            .unwrap_err()
            .to_string();
            assert!(e.starts_with("collect[1]: invalid glob"), "{bad}: {e}");
        }
    }

    #[test]
    fn ceilings_name_the_field_and_the_maximum() {
        let c = JobCeilings::default();
        let check = |s: &str| c.check(&parse(s).unwrap()).map_err(|e| e.to_string());
        assert_eq!(
            check(r#"{"cmd":"x","limits":{"disk_mb":1048576}}"#).unwrap_err(),
            "limits.disk_mb: 1048576 is over this node's maximum of 1024"
        );
        let e = check(r#"{"cmd":"x","limits":{"output_bytes":1099511627776}}"#).unwrap_err();
        assert!(
            e.starts_with("limits.output_bytes: 1099511627776 is over"),
            "{e}"
        );
        let e = check(r#"{"cmd":"x","limits":{"pids":65536}}"#).unwrap_err();
        assert!(
            e.starts_with("limits.pids:") && e.ends_with("maximum of 1024"),
            "{e}"
        );
        let e = check(r#"{"cmd":"x","max_attempts":1000}"#).unwrap_err();
        assert!(
            e.starts_with("max_attempts:") && e.ends_with("of 10"),
            "{e}"
        );
        let e = check(r#"{"cmd":"x","result_ttl_s":31536000}"#).unwrap_err();
        assert!(e.starts_with("result_ttl_s:"), "{e}");
        let e = check(r#"{"cmd":"x","timeout_ms":86400000}"#).unwrap_err();
        assert!(e.starts_with("timeout_ms:"), "{e}");
        check(r#"{"cmd":"x","limits":{"disk_mb":1024,"pids":1024},"max_attempts":10}"#).unwrap();
        let d = EffectiveLimits::default();
        assert_eq!(c.clamp_defaults(&d), d);
        let low = JobCeilings {
            timeout_ms: 500,
            limits: EffectiveLimits {
                pids: 8,
                ..c.limits
            },
            ..c
        };
        assert_eq!(low.clamp_defaults(&d), EffectiveLimits { pids: 8, ..d });
        assert_eq!(low.timeout_ms(&Job::shell("x")), 500);
        assert_eq!(c.timeout_ms(&Job::shell("x")), DEFAULT_TIMEOUT_MS);
    }

    #[test]
    fn oversized_results_are_cut_with_the_flags_set() {
        let mut outcome = Outcome::not_run(Status::Ok, "");
        outcome.error = None;
        outcome.stdout = "o\u{1}".repeat(5000);
        outcome.stderr = "é".repeat(3000);
        outcome.files = [("f".to_owned(), FileData::Text("x".repeat(2000)))].into();
        outcome.files_truncated = vec!["f".to_owned()];
        let r = JobResult::new("x".into(), outcome, 1, "w".into());
        let whole = r.to_json_within(usize::MAX);
        assert_eq!(whole, serde_json::to_string(&r).unwrap());
        for max in [20_000, 5000, 600] {
            let cut: JobResult = serde_json::from_str(&r.to_json_within(max)).unwrap();
            assert!(serde_json::to_string(&cut).unwrap().len() <= max, "{max}");
            assert!(cut.outcome.stdout_truncated, "{max}");
            assert!(r.outcome.stdout.starts_with(&cut.outcome.stdout));
            assert!(r.outcome.stderr.starts_with(&cut.outcome.stderr));
            assert_eq!(cut.outcome.status, Status::Ok);
            assert_eq!(cut.id, "x");
        }
        let tiny: JobResult = serde_json::from_str(&r.to_json_within(600)).unwrap();
        assert!(tiny.outcome.stdout.is_empty() && tiny.outcome.stderr_truncated);
        assert!(tiny.outcome.files.is_empty());
        assert!(tiny.outcome.files_truncated.is_empty());
        assert!(tiny
            .outcome
            .error
            .unwrap()
            .contains("1 collected file(s) dropped"));
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

    #[test]
    fn runtime_is_optional_and_strict() {
        let job = parse(r#"{"argv":["python3","-c","1"],"runtime":"python"}"#).unwrap();
        assert_eq!(job.runtime, Some(Runtime::Python));
        assert_eq!(parse(r#"{"argv":["python3"]}"#).unwrap().runtime, None);
        let e = err(r#"{"argv":["node"],"runtime":"node"}"#);
        assert!(e.starts_with("runtime:") && e.contains("python"), "{e}");
        let e = err(r#"{"argv":["x"],"runtime":"Python"}"#);
        assert!(e.starts_with("runtime:"), "{e}");
        let used = RuntimeUse {
            name: Runtime::Python,
            warm: false,
            note: Some("-O".into()),
        };
        let text = serde_json::to_string(&used).unwrap();
        assert_eq!(text, r#"{"name":"python","warm":false,"note":"-O"}"#);
    }

    #[test]
    fn network_is_optional_and_strict() {
        assert_eq!(parse(r#"{"cmd":"true"}"#).unwrap().network, None);
        for (text, want) in [("none", Network::None), ("loopback", Network::Loopback)] {
            let job = parse(&format!(r#"{{"cmd":"true","network":"{text}"}}"#)).unwrap();
            assert_eq!(job.network, Some(want));
            assert_eq!(text.parse::<Network>(), Ok(want));
            assert_eq!(want.to_string(), text);
        }
        assert_eq!(Network::default(), Network::None);
        for bad in [r#""host""#, r#""Loopback""#, r#""""#] {
            let e = err(&format!(r#"{{"cmd":"true","network":{bad}}}"#));
            assert!(e.starts_with("network:"), "{e}");
        }
        let e = "host".parse::<Network>().unwrap_err();
        assert!(e.contains("none, loopback"), "{e}");
    }

    #[test]
    fn the_exec_bound_follows_the_stack_limit() {
        const K: u64 = 1024;
        for (stack, bound) in [
            (8 * K * K, 2 * K * K),  // the usual 8 MiB: a quarter
            (256 * K, 128 * K),      // a small stack: never under ARG_MAX
            (64 * K * K, 6 * K * K), // a large stack: never over 3/4 of _STK_LIM
            (u64::MAX, 6 * K * K),   // unlimited
            (0, 128 * K),            // unknown (0): ARG_MAX
        ] {
            assert_eq!(exec_args_limit(stack), bound as usize, "stack {stack}");
        }
    }

    #[test]
    fn a_shell_command_counts_as_the_argv_it_runs() {
        let ptr = std::mem::size_of::<usize>();
        let shell = Job::shell("echo hi");
        let argv = Job::argv(["/bin/sh", "-c", "echo hi"]);
        assert_eq!(shell.exec_bytes(), argv.exec_bytes());
        assert_eq!(argv.exec_bytes(), 8 + 3 + 8 + 3 * ptr);
        let env = exec_footprint([], [("A", "bc")]);
        assert_eq!(env, "A=bc".len() + 1 + ptr);
    }

    #[test]
    fn a_compile_stage_is_optional_strict_and_named_in_errors() {
        let job = parse(
            r#"{"argv":["./main"],"compile":{"argv":["cc","-o","main","main.c"],
                "timeout_ms":20000,"limits":{"memory_mb":1024,"cpu_ms":5000}}}"#,
        )
        .unwrap();
        let stage = job.compile.as_ref().unwrap();
        assert_eq!(stage.command(), ["cc", "-o", "main", "main.c"]);
        assert_eq!(stage.timeout_ms(), 20_000);
        let job_limits = job.limits.resolve(&EffectiveLimits::default());
        let limits = stage.resolve(&job_limits);
        assert_eq!(limits.memory_mb, 1024);
        assert_eq!(limits.cpu_ms, 5000);
        assert_eq!(limits.disk_mb, job_limits.disk_mb);
        assert_eq!(parse(&serde_json::to_string(&job).unwrap()).unwrap(), job);
        let shell = parse(r#"{"cmd":"./a.out","compile":{"cmd":"cc x.c"}}"#).unwrap();
        assert_eq!(
            shell.compile.as_ref().unwrap().command(),
            ["/bin/sh", "-c", "cc x.c"]
        );
        assert_eq!(shell.compile.unwrap().timeout_ms(), DEFAULT_TIMEOUT_MS);
        for (text, want) in [
            (
                r#"{"cmd":"x","compile":{}}"#,
                "compile.cmd: a compile stage needs",
            ),
            (
                r#"{"cmd":"x","compile":{"cmd":"a","argv":["b"]}}"#,
                "compile.cmd: give `cmd` or `argv`, not both",
            ),
            (
                r#"{"cmd":"x","compile":{"cmd":"  "}}"#,
                "compile.cmd: is empty",
            ),
            (
                r#"{"cmd":"x","compile":{"argv":[]}}"#,
                "compile.argv: is empty",
            ),
            (
                r#"{"cmd":"x","compile":{"argv":[""]}}"#,
                "compile.argv[0]: is empty",
            ),
            (
                r#"{"cmd":"x","compile":{"cmd":"a","timeout_ms":0}}"#,
                "compile.timeout_ms: must be between",
            ),
            (
                r#"{"cmd":"x","compile":{"cmd":"a","limits":{"pids":1}}}"#,
                "compile.limits.pids: must be between",
            ),
            (
                r#"{"cmd":"x","compile":{"cmd":"a","limits":{"disk_mb":1}}}"#,
                "compile.limits.disk_mb: unknown field `disk_mb`",
            ),
            (
                r#"{"cmd":"x","compile":{"cmd":"a","stdin":"x"}}"#,
                "compile.stdin: unknown field `stdin`",
            ),
            (
                r#"{"argv":["python3"],"runtime":"python","compile":{"cmd":"a"}}"#,
                "compile: a staged job",
            ),
        ] {
            let e = err(text);
            assert!(e.starts_with(want), "{text}: {e}");
        }
        let e = Job {
            compile: Some(CompileStage::argv(["cc", &"x".repeat(MAX_ARG_STRLEN)])),
            ..Job::shell("true")
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("compile.argv[1]: is 131072 bytes"), "{e}");
    }

    /// A compile stage's command is built, and refused, as a job's is, under `compile.`.
    #[test]
    fn a_compile_stage_command_follows_the_job_command_rules() {
        assert_eq!(
            CompileStage::shell("cc x.c"),
            CompileStage {
                cmd: Some("cc x.c".into()),
                ..CompileStage::default()
            }
        );
        assert_eq!(
            CompileStage::argv(["cc", "x.c"]),
            CompileStage {
                argv: Some(vec!["cc".into(), "x.c".into()]),
                ..CompileStage::default()
            }
        );
        // Each argument within MAX_ARG_STRLEN, all of them over the total exec takes.
        let many = vec!["y".repeat(100_000); MAX_EXEC_ARGS_BYTES / 100_000 + 1];
        let bad: [(Job, &str); 4] = [
            (Job::shell("a\0b"), "cmd: contains a NUL byte"),
            (Job::argv(["cc", "a\0b"]), "argv[1]: contains a NUL byte"),
            (Job::argv(many.clone()), "argv: the command and env take"),
            (Job::default(), "cmd: a job needs `cmd`"),
        ];
        for (job, want) in bad {
            let e = job.validate().unwrap_err().to_string();
            assert!(e.starts_with(want), "{e}");
            let staged = Job {
                compile: Some(CompileStage {
                    cmd: job.cmd,
                    argv: job.argv,
                    ..CompileStage::default()
                }),
                ..Job::shell("./a.out")
            };
            let e = staged.validate().unwrap_err().to_string();
            let want = format!("compile.{}", want.replace("a job", "a compile stage"));
            assert!(e.starts_with(&want), "{e}");
        }
    }

    #[test]
    fn a_compile_stage_is_held_to_the_node_maximums() {
        let c = JobCeilings::default();
        let check = |s: &str| c.check(&parse(s).unwrap()).map_err(|e| e.to_string());
        assert_eq!(
            check(r#"{"cmd":"x","compile":{"cmd":"a","limits":{"memory_mb":4097}}}"#).unwrap_err(),
            "compile.limits.memory_mb: 4097 is over this node's maximum of 4096"
        );
        assert_eq!(
            check(r#"{"cmd":"x","compile":{"cmd":"a","timeout_ms":3600001}}"#).unwrap_err(),
            "compile.timeout_ms: 3600001 is over this node's maximum of 3600000"
        );
        check(r#"{"cmd":"x","compile":{"cmd":"a","timeout_ms":3600000}}"#).unwrap();
        let low = JobCeilings {
            timeout_ms: 500,
            ..c
        };
        let staged = parse(r#"{"cmd":"x","compile":{"cmd":"a"}}"#).unwrap();
        assert_eq!(low.compile_timeout_ms(&staged), Some(500));
        assert_eq!(c.compile_timeout_ms(&Job::shell("x")), None);
    }

    #[test]
    fn a_compile_error_describes_the_stage_and_no_run() {
        let stage = StageOutcome {
            status: StageStatus::Failed,
            exit_code: 1,
            signal: None,
            timed_out: false,
            stdout: String::new(),
            stderr: "main.c:1: error".into(),
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: 12.5,
            cpu_ms: 10,
            max_rss_kb: 2048,
        };
        let outcome = Outcome::compile_error(stage.clone());
        let v = serde_json::to_value(JobResult::new("x".into(), outcome, 1, "w".into())).unwrap();
        assert_eq!(v["status"], "compile_error");
        assert_eq!(v["exit_code"], 1);
        assert_eq!(v["stdout"], "");
        assert_eq!(v["cpu_ms"], 0);
        assert_eq!(v["error"], serde_json::Value::Null);
        assert_eq!(v["compile"]["status"], "failed");
        assert_eq!(v["compile"]["stderr"], "main.c:1: error");
        assert_eq!(v["compile"]["max_rss_kb"], 2048);
        let back: JobResult = serde_json::from_value(v).unwrap();
        assert_eq!(back.outcome.compile, Some(stage));
        let plain = serde_json::to_value(Outcome::not_run(Status::Ok, "")).unwrap();
        assert!(
            plain.get("compile").is_none(),
            "absent for a job without a stage"
        );
    }
}
