//! Workload mixes: which jobs a run sends, in which proportions.
//!
//! A mix is a list of `KIND[:ARG][:WEIGHT]` entries (`noop:80,python:15,sleep:250ms:5`), given
//! inline or as a file with one entry per line. Kinds are picked by smooth weighted round robin
//! rather than at random, so a run of N jobs has exactly the proportions asked for and two runs
//! with the same parameters send the same sequence of jobs: a comparison between runs then
//! measures the cluster, not the dice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use forkbox_queue::schema::{DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS};
use forkbox_queue::{Job, Limits, Network};

use crate::humaneval::Problem;

/// Default duration of a `sleep` job.
pub const DEFAULT_SLEEP: Duration = Duration::from_millis(100);
/// Default CPU time of a `cpu` job.
pub const DEFAULT_CPU: Duration = Duration::from_millis(50);
/// The `python` workload: a short CPU-bound snippet (about 10 ms of work after start-up).
pub const PYTHON_SNIPPET: &str = "print(sum(i * i for i in range(200000)))";
/// The `loopback` workload: a TCP round trip over the sandbox's own `lo`, which a job has only
/// when it asks for `"network": "loopback"`.
pub const LOOPBACK_SNIPPET: &str = "import socket\n\
    s = socket.create_server(('127.0.0.1', 0))\n\
    c = socket.create_connection(s.getsockname())\n\
    a, _ = s.accept(); c.sendall(b'ping'); print(a.recv(4).decode())";

#[derive(Debug, thiserror::Error)]
pub enum MixError {
    #[error("mix entry {entry:?}: {reason}")]
    Entry { entry: String, reason: String },
    #[error("mix is empty")]
    Empty,
    #[error("reading mix file {path}: {source}")]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn bad(entry: &str, reason: impl Into<String>) -> MixError {
    MixError::Entry {
        entry: entry.to_owned(),
        reason: reason.into(),
    }
}

/// One of the hostile programs: each must be contained by the sandbox's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hostile {
    ForkBomb,
    MemoryBomb,
    InfiniteLoop,
    OutputFlood,
}

impl Hostile {
    pub const ALL: [Hostile; 4] = [
        Hostile::ForkBomb,
        Hostile::MemoryBomb,
        Hostile::InfiniteLoop,
        Hostile::OutputFlood,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Hostile::ForkBomb => "forkbomb",
            Hostile::MemoryBomb => "memorybomb",
            Hostile::InfiniteLoop => "loop",
            Hostile::OutputFlood => "flood",
        }
    }

    fn parse(s: &str) -> Option<Hostile> {
        Hostile::ALL.into_iter().find(|h| h.name() == s)
    }

    /// The job, with limits tight enough that containment is quick.
    pub fn job(self) -> Job {
        match self {
            Hostile::ForkBomb => Job {
                timeout_ms: Some(2_000),
                limits: Limits {
                    pids: Some(32),
                    ..Limits::default()
                },
                ..Job::shell("bomb() { bomb | bomb & }; bomb; wait")
            },
            Hostile::MemoryBomb => Job {
                timeout_ms: Some(5_000),
                limits: Limits {
                    memory_mb: Some(64),
                    ..Limits::default()
                },
                ..Job::argv([
                    "python3",
                    "-c",
                    "a = []\nwhile True:\n    a.append(bytearray(1 << 20))",
                ])
            },
            Hostile::InfiniteLoop => Job {
                timeout_ms: Some(1_000),
                ..Job::shell("while :; do :; done")
            },
            Hostile::OutputFlood => Job {
                timeout_ms: Some(2_000),
                limits: Limits {
                    output_bytes: Some(64 * 1024),
                    ..Limits::default()
                },
                ..Job::argv(["yes", "flood"])
            },
        }
    }
}

/// What a mix entry sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    /// `/bin/true`.
    Noop,
    /// [`PYTHON_SNIPPET`] through `python3`.
    Python,
    /// [`LOOPBACK_SNIPPET`] through `python3`, with a loopback network.
    Loopback,
    /// `sleep` for a duration.
    Sleep(Duration),
    /// A CPU busy loop of a duration (measured in process CPU time, after interpreter start-up).
    Cpu(Duration),
    /// The HumanEval problems, in order, each expected to pass.
    HumanEval,
    /// One hostile program, or all of them in turn.
    Hostile(Option<Hostile>),
    /// Jobs read from a JSON-lines file, in order.
    Jsonl(PathBuf),
}

impl Workload {
    /// A short label for per-kind statistics.
    pub fn label(&self) -> String {
        match self {
            Workload::Noop => "noop".into(),
            Workload::Python => "python".into(),
            Workload::Loopback => "loopback".into(),
            Workload::Sleep(d) => format!("sleep:{}ms", d.as_millis()),
            Workload::Cpu(d) => format!("cpu:{}ms", d.as_millis()),
            Workload::HumanEval => "humaneval".into(),
            Workload::Hostile(None) => "hostile".into(),
            Workload::Hostile(Some(h)) => format!("hostile:{}", h.name()),
            Workload::Jsonl(p) => format!("jsonl:{}", p.display()),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct MixEntry {
    pub workload: Workload,
    pub weight: u32,
}

/// A parsed `--mix`.
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    pub entries: Vec<MixEntry>,
}

/// Parses `250ms`, `1.5s`, `2m` or a bare number of milliseconds.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1e-3)
    };
    let v: f64 = num.trim().parse().ok()?;
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    Some(Duration::from_secs_f64(v * scale))
}

fn parse_weight(entry: &str, s: &str) -> Result<u32, MixError> {
    match s.parse::<u32>() {
        Ok(0) => Err(bad(entry, "weight must be at least 1")),
        Ok(w) => Ok(w),
        Err(_) => Err(bad(entry, format!("weight {s:?} is not a whole number"))),
    }
}

fn parse_entry(entry: &str) -> Result<MixEntry, MixError> {
    let (kind, rest) = match entry.split_once(':') {
        Some((k, r)) => (k.trim(), Some(r.trim())),
        None => (entry.trim(), None),
    };
    if kind == "jsonl" {
        // The file name may itself hold colons; a trailing `:N` is the weight.
        let rest = rest.ok_or_else(|| bad(entry, "jsonl needs a file: jsonl:FILE[:WEIGHT]"))?;
        let (path, weight) = match rest.rsplit_once(':') {
            Some((p, w)) if !p.is_empty() && w.parse::<u32>().is_ok() => {
                (p, parse_weight(entry, w)?)
            }
            _ => (rest, 1),
        };
        if path.is_empty() {
            return Err(bad(entry, "jsonl needs a file: jsonl:FILE[:WEIGHT]"));
        }
        return Ok(MixEntry {
            workload: Workload::Jsonl(PathBuf::from(path)),
            weight,
        });
    }
    let (arg, weight) = match rest {
        None => (None, 1),
        Some(r) => match r.split_once(':') {
            Some((a, w)) => (Some(a.trim()), parse_weight(entry, w.trim())?),
            None if r.parse::<u32>().is_ok() => (None, parse_weight(entry, r)?),
            None => (Some(r), 1),
        },
    };
    let duration = |default: Duration| -> Result<Duration, MixError> {
        match arg {
            None => Ok(default),
            Some(a) => parse_duration(a)
                .ok_or_else(|| bad(entry, format!("{a:?} is not a duration (e.g. 250ms, 1.5s)"))),
        }
    };
    let no_arg = |w: Workload| -> Result<Workload, MixError> {
        match arg {
            None => Ok(w),
            Some(a) => Err(bad(entry, format!("{kind} takes no argument, got {a:?}"))),
        }
    };
    let workload = match kind {
        "noop" => no_arg(Workload::Noop)?,
        "python" => no_arg(Workload::Python)?,
        "loopback" => no_arg(Workload::Loopback)?,
        "humaneval" => no_arg(Workload::HumanEval)?,
        "sleep" => Workload::Sleep(duration(DEFAULT_SLEEP)?),
        "cpu" => Workload::Cpu(duration(DEFAULT_CPU)?),
        "hostile" => match arg {
            None => Workload::Hostile(None),
            Some(a) => Workload::Hostile(Some(Hostile::parse(a).ok_or_else(|| {
                bad(
                    entry,
                    format!(
                        "unknown hostile program {a:?}; one of forkbomb, memorybomb, loop, flood"
                    ),
                )
            })?)),
        },
        "" => return Err(bad(entry, "empty kind")),
        other => {
            return Err(bad(
                entry,
                format!(
                    "unknown kind {other:?}; one of noop, python, loopback, sleep, cpu, humaneval, \
                     hostile, jsonl"
                ),
            ))
        }
    };
    Ok(MixEntry { workload, weight })
}

impl Mix {
    /// Parses an inline spec: entries separated by commas or newlines, `#` starts a comment.
    pub fn parse(spec: &str) -> Result<Mix, MixError> {
        let mut entries = Vec::new();
        for line in spec.lines() {
            let line = line.split('#').next().unwrap_or("");
            for entry in line.split(',') {
                if entry.trim().is_empty() {
                    continue;
                }
                entries.push(parse_entry(entry.trim())?);
            }
        }
        if entries.is_empty() {
            return Err(MixError::Empty);
        }
        Ok(Mix { entries })
    }

    /// `--mix`: a file when the argument names one (or starts with `@`), an inline spec
    /// otherwise.
    pub fn from_arg(arg: &str) -> Result<Mix, MixError> {
        let path = arg.strip_prefix('@').map(Path::new).or_else(|| {
            let p = Path::new(arg);
            p.is_file().then_some(p)
        });
        match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| MixError::ReadFile {
                    path: p.to_owned(),
                    source,
                })?;
                Mix::parse(&text)
            }
            None => Mix::parse(arg),
        }
    }

    pub fn needs_humaneval(&self) -> bool {
        self.entries
            .iter()
            .any(|e| e.workload == Workload::HumanEval)
    }
}

/// What a job's result should look like, to count results that are not what the workload
/// expects (`unexpected`) and hostile programs that were not contained.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expect {
    /// Status `ok`.
    Ok,
    /// Any status but `error` or `invalid`, finishing within its time limit, with output within
    /// its cap: the sandbox held.
    Contained {
        hostile: Hostile,
        timeout_ms: u64,
        output_bytes: Option<u64>,
        memory_mb: Option<u64>,
    },
    /// A user-supplied job: any status but `error` or `invalid`.
    Ran,
}

/// One job to send: the job (without an id), its kind label and what its result should be.
#[derive(Debug, Clone)]
pub struct Planned {
    pub kind: usize,
    pub job: Job,
    pub expect: Expect,
    /// For HumanEval jobs, the task id.
    pub task: Option<String>,
}

/// Produces the sequence of jobs for a mix.
#[derive(Debug)]
pub struct JobSource {
    entries: Vec<MixEntry>,
    current: Vec<i64>,
    total_weight: i64,
    /// Labels of the entries, indexed by `Planned::kind`.
    labels: Vec<String>,
    humaneval: Vec<Problem>,
    jsonl: BTreeMap<PathBuf, Vec<Job>>,
    /// Per-entry counters, to rotate through problems, hostile programs and file lines.
    turns: Vec<usize>,
    /// The runtime the python and humaneval jobs ask for (`--runtime`).
    runtime: Option<forkbox_queue::Runtime>,
    /// The network every job asks for unless it sets its own (`--network`).
    network: Option<Network>,
}

impl JobSource {
    /// `humaneval` must be non-empty when the mix has a `humaneval` entry; `jsonl` files are
    /// read here.
    pub fn new(mix: &Mix, humaneval: Vec<Problem>) -> anyhow::Result<JobSource> {
        let mut jsonl = BTreeMap::new();
        for e in &mix.entries {
            match &e.workload {
                Workload::Jsonl(path) if !jsonl.contains_key(path) => {
                    jsonl.insert(path.clone(), read_jsonl(path)?);
                }
                Workload::HumanEval if humaneval.is_empty() => {
                    anyhow::bail!("the mix has humaneval but no problems were loaded")
                }
                _ => {}
            }
        }
        let labels = mix.entries.iter().map(|e| e.workload.label()).collect();
        Ok(JobSource {
            current: vec![0; mix.entries.len()],
            total_weight: mix.entries.iter().map(|e| i64::from(e.weight)).sum(),
            entries: mix.entries.clone(),
            labels,
            humaneval,
            jsonl,
            turns: vec![0; mix.entries.len()],
            runtime: None,
            network: None,
        })
    }

    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// Smooth weighted round robin: over any window of `total_weight` picks, each entry is
    /// picked exactly `weight` times, spread out rather than in runs.
    fn pick(&mut self) -> usize {
        let mut best = 0;
        for (i, e) in self.entries.iter().enumerate() {
            self.current[i] += i64::from(e.weight);
            if self.current[i] > self.current[best] {
                best = i;
            }
        }
        self.current[best] -= self.total_weight;
        best
    }

    pub fn next_job(&mut self) -> Planned {
        let kind = self.pick();
        let turn = self.turns[kind];
        self.turns[kind] += 1;
        let (job, expect, task) = self.job(kind, turn);
        Planned {
            kind,
            job,
            expect,
            task,
        }
    }

    /// Makes the python and humaneval jobs ask for `runtime`.
    pub fn set_runtime(&mut self, runtime: Option<forkbox_queue::Runtime>) {
        self.runtime = runtime;
    }

    /// Makes every job that sets no network of its own ask for `network`.
    pub fn set_network(&mut self, network: Option<Network>) {
        self.network = network;
    }

    /// The job entry `kind` sends on its `turn`-th pick, what its result should be, and the
    /// HumanEval task it is.
    fn job(&self, kind: usize, turn: usize) -> (Job, Expect, Option<String>) {
        let (mut job, expect, task) = self.base_job(kind, turn);
        if matches!(
            self.entries[kind].workload,
            Workload::Python | Workload::HumanEval
        ) {
            job.runtime = self.runtime;
        }
        job.network = job.network.or(self.network);
        (job, expect, task)
    }

    fn base_job(&self, kind: usize, turn: usize) -> (Job, Expect, Option<String>) {
        let mut task = None;
        let (job, expect) = match &self.entries[kind].workload {
            Workload::Noop => (Job::argv(["/bin/true"]), Expect::Ok),
            Workload::Python => (Job::argv(["python3", "-c", PYTHON_SNIPPET]), Expect::Ok),
            Workload::Loopback => (
                Job {
                    network: Some(Network::Loopback),
                    ..Job::argv(["python3", "-c", LOOPBACK_SNIPPET])
                },
                Expect::Ok,
            ),
            Workload::Sleep(d) => (
                with_room(
                    Job::argv(["sleep".to_owned(), format!("{:.3}", d.as_secs_f64())]),
                    *d,
                ),
                Expect::Ok,
            ),
            Workload::Cpu(d) => (with_room(cpu_job(*d), *d), Expect::Ok),
            Workload::HumanEval => {
                let p = &self.humaneval[turn % self.humaneval.len()];
                task = Some(p.task_id.clone());
                (p.job(), Expect::Ok)
            }
            Workload::Hostile(which) => {
                let h = which.unwrap_or(Hostile::ALL[turn % Hostile::ALL.len()]);
                let job = h.job();
                let expect = Expect::Contained {
                    hostile: h,
                    timeout_ms: job.timeout_ms(),
                    output_bytes: job.limits.output_bytes,
                    memory_mb: job.limits.memory_mb,
                };
                (job, expect)
            }
            Workload::Jsonl(path) => {
                let jobs = &self.jsonl[path];
                (jobs[turn % jobs.len()].clone(), Expect::Ran)
            }
        };
        (job, expect, task)
    }

    /// The longest wall-clock limit of any job this source sends, in milliseconds: how long a
    /// healthy worker may take before a result.
    pub fn longest_timeout_ms(&self) -> u64 {
        (0..self.entries.len())
            .flat_map(|kind| {
                let distinct = match &self.entries[kind].workload {
                    Workload::HumanEval => self.humaneval.len(),
                    Workload::Hostile(None) => Hostile::ALL.len(),
                    Workload::Jsonl(path) => self.jsonl[path].len(),
                    _ => 1,
                };
                (0..distinct).map(move |turn| self.job(kind, turn).0.timeout_ms())
            })
            .max()
            .unwrap_or(DEFAULT_TIMEOUT_MS)
    }
}

/// A job that runs for about `d` gets a wall-clock limit with room for start-up and a busy
/// machine (twice `d` plus 5 s) when the default would cut it short.
fn with_room(mut job: Job, d: Duration) -> Job {
    let wanted = d.saturating_mul(2) + Duration::from_secs(5);
    let wanted_ms =
        u64::try_from(wanted.as_millis()).map_or(MAX_TIMEOUT_MS, |ms| ms.min(MAX_TIMEOUT_MS));
    if wanted_ms > job.timeout_ms() {
        job.timeout_ms = Some(wanted_ms);
    }
    job
}

fn cpu_job(d: Duration) -> Job {
    let secs = d.as_secs_f64();
    Job::argv([
        "python3".to_owned(),
        "-c".to_owned(),
        format!(
            "import time\nend = time.process_time() + {secs:.3}\nwhile time.process_time() < end:\n    pass"
        ),
    ])
}

/// Reads a JSON-lines job file; each line must be a valid v1 job. Ids are replaced when sent.
pub fn read_jsonl(path: &Path) -> anyhow::Result<Vec<Job>> {
    use anyhow::Context as _;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut jobs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let job = Job::parse(
            line.as_bytes(),
            forkbox_queue::schema::DEFAULT_MAX_JOB_BYTES,
        )
        .with_context(|| format!("{}:{}", path.display(), n + 1))?;
        jobs.push(job);
    }
    anyhow::ensure!(!jobs.is_empty(), "{} holds no jobs", path.display());
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_issue_example() {
        let mix = Mix::parse("noop:80,python:15,sleep:5").unwrap();
        assert_eq!(
            mix.entries,
            vec![
                MixEntry {
                    workload: Workload::Noop,
                    weight: 80
                },
                MixEntry {
                    workload: Workload::Python,
                    weight: 15
                },
                MixEntry {
                    workload: Workload::Sleep(DEFAULT_SLEEP),
                    weight: 5
                },
            ]
        );
    }

    #[test]
    fn parses_arguments_and_default_weights() {
        let mix = Mix::parse(
            "sleep:250ms:3, cpu:1.5s\nhostile:flood:2 # a comment\nhostile,jsonl:/tmp/a:b.jsonl:7,jsonl:x.jsonl",
        )
        .unwrap();
        let w: Vec<_> = mix
            .entries
            .iter()
            .map(|e| (e.workload.clone(), e.weight))
            .collect();
        assert_eq!(
            w,
            vec![
                (Workload::Sleep(Duration::from_millis(250)), 3),
                (Workload::Cpu(Duration::from_millis(1500)), 1),
                (Workload::Hostile(Some(Hostile::OutputFlood)), 2),
                (Workload::Hostile(None), 1),
                (Workload::Jsonl("/tmp/a:b.jsonl".into()), 7),
                (Workload::Jsonl("x.jsonl".into()), 1),
            ]
        );
    }

    #[test]
    fn rejects_bad_entries_naming_them() {
        for (spec, needle) in [
            ("noop:0", "at least 1"),
            ("noop:x:1", "takes no argument"),
            ("sleep:soon:1", "not a duration"),
            ("bogus:1", "unknown kind"),
            ("hostile:nuke", "unknown hostile"),
            ("jsonl", "needs a file"),
            ("noop:1:2:3", "not a whole number"),
        ] {
            let e = Mix::parse(spec).unwrap_err().to_string();
            assert!(e.contains(needle), "{spec}: {e}");
            assert!(e.contains(spec.split(',').next().unwrap()), "{spec}: {e}");
        }
        assert!(matches!(Mix::parse(" , # nothing"), Err(MixError::Empty)));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Some(Duration::from_secs(60)));
        assert_eq!(parse_duration("500us"), Some(Duration::from_micros(500)));
        assert_eq!(parse_duration("-1s"), None);
        assert_eq!(parse_duration("abc"), None);
    }

    #[test]
    fn weighted_round_robin_is_exact_and_spread() {
        let mix = Mix::parse("noop:80,python:15,sleep:5").unwrap();
        let mut src = JobSource::new(&mix, Vec::new()).unwrap();
        let picks: Vec<usize> = (0..200).map(|_| src.next_job().kind).collect();
        for (kind, want) in [(0, 160), (1, 30), (2, 10)] {
            assert_eq!(picks.iter().filter(|&&k| k == kind).count(), want);
        }
        // Spread: the 5% kind never comes twice within 10 picks.
        let sleeps: Vec<usize> = (0..200).filter(|&i| picks[i] == 2).collect();
        assert!(sleeps.windows(2).all(|w| w[1] - w[0] >= 10), "{sleeps:?}");
    }

    #[test]
    fn long_jobs_get_room_and_the_source_knows_its_longest_limit() {
        let src = JobSource::new(&Mix::parse("noop,sleep:200ms").unwrap(), Vec::new()).unwrap();
        // Short jobs keep the default limit.
        assert_eq!(src.job(1, 0).0.timeout_ms(), DEFAULT_TIMEOUT_MS);
        assert_eq!(src.longest_timeout_ms(), DEFAULT_TIMEOUT_MS);

        let mut src =
            JobSource::new(&Mix::parse("noop,sleep:30s,cpu:8s").unwrap(), Vec::new()).unwrap();
        assert_eq!(src.job(1, 0).0.timeout_ms(), 65_000);
        assert_eq!(src.job(2, 0).0.timeout_ms(), 21_000);
        assert_eq!(src.longest_timeout_ms(), 65_000);
        let sent: Vec<u64> = (0..3).map(|_| src.next_job().job.timeout_ms()).collect();
        assert!(sent.contains(&65_000), "{sent:?}");
        // Never past what a job may ask for.
        let src = JobSource::new(&Mix::parse("sleep:1000000s").unwrap(), Vec::new()).unwrap();
        assert_eq!(src.longest_timeout_ms(), MAX_TIMEOUT_MS);

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("jobs.jsonl");
        std::fs::write(
            &file,
            "{\"cmd\":\"true\"}\n{\"cmd\":\"true\",\"timeout_ms\":90000}\n",
        )
        .unwrap();
        let mix = Mix::parse(&format!("noop,jsonl:{}", file.display())).unwrap();
        let src = JobSource::new(&mix, Vec::new()).unwrap();
        assert_eq!(src.longest_timeout_ms(), 90_000);
    }

    #[test]
    fn hostile_rotates_through_all_programs_with_limits() {
        let mut src = JobSource::new(&Mix::parse("hostile").unwrap(), Vec::new()).unwrap();
        let mut seen = Vec::new();
        for _ in 0..4 {
            let p = src.next_job();
            p.job.validate().unwrap();
            match p.expect {
                Expect::Contained { hostile, .. } => seen.push(hostile),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(seen, Hostile::ALL);
        assert_eq!(Hostile::ForkBomb.job().limits.pids, Some(32));
        assert_eq!(Hostile::OutputFlood.job().limits.output_bytes, Some(65536));
    }

    #[test]
    fn every_builtin_job_is_valid() {
        let mix = Mix::parse("noop,python,sleep,cpu:20ms").unwrap();
        let mut src = JobSource::new(&mix, Vec::new()).unwrap();
        for _ in 0..4 {
            src.next_job().job.validate().unwrap();
        }
        assert_eq!(src.labels(), ["noop", "python", "sleep:100ms", "cpu:20ms"]);
    }

    #[test]
    fn mix_file_and_jsonl_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = dir.path().join("jobs.jsonl");
        std::fs::write(&jobs, "{\"cmd\":\"echo a\"}\n\n{\"argv\":[\"true\"]}\n").unwrap();
        let mixfile = dir.path().join("mix.txt");
        std::fs::write(&mixfile, format!("# ours\njsonl:{}:2\n", jobs.display())).unwrap();
        let mix = Mix::from_arg(mixfile.to_str().unwrap()).unwrap();
        let mut src = JobSource::new(&mix, Vec::new()).unwrap();
        let a = src.next_job();
        let b = src.next_job();
        let c = src.next_job();
        assert_eq!(a.job.cmd.as_deref(), Some("echo a"));
        assert_eq!(b.job.argv.as_deref(), Some(&["true".to_owned()][..]));
        assert_eq!(c.job, a.job);
        assert_eq!(a.expect, Expect::Ran);

        std::fs::write(&jobs, "{\"cmd\":\"x\",\"bogus\":1}\n").unwrap();
        let e = JobSource::new(&mix, Vec::new()).unwrap_err();
        assert!(format!("{e:#}").contains("jobs.jsonl:1"), "{e:#}");
    }

    #[test]
    fn runtime_applies_to_python_jobs_only() {
        let mut src = JobSource::new(&Mix::parse("noop,python").unwrap(), Vec::new()).unwrap();
        src.set_runtime(Some(forkbox_queue::Runtime::Python));
        let jobs: Vec<Planned> = (0..4).map(|_| src.next_job()).collect();
        for p in &jobs {
            let python = p.job.command()[0] == "python3";
            assert_eq!(p.job.runtime.is_some(), python, "{:?}", p.job.command());
        }
        assert!(jobs.iter().any(|p| p.job.runtime.is_some()));
    }

    #[test]
    fn loopback_jobs_keep_their_network_and_the_rest_take_the_flags() {
        let mix = Mix::parse("noop,loopback").unwrap();
        assert_eq!(mix.entries[1].workload, Workload::Loopback);
        let mut src = JobSource::new(&mix, Vec::new()).unwrap();
        let first: Vec<Planned> = (0..2).map(|_| src.next_job()).collect();
        let networks = |jobs: &[Planned]| -> Vec<Option<Network>> {
            jobs.iter().map(|p| p.job.network).collect()
        };
        assert_eq!(networks(&first), [None, Some(Network::Loopback)]);
        src.set_network(Some(Network::None));
        let next: Vec<Planned> = (0..2).map(|_| src.next_job()).collect();
        assert_eq!(
            networks(&next),
            [Some(Network::None), Some(Network::Loopback)]
        );
        assert!(first[1].job.command()[2].contains("127.0.0.1"));
    }
}
