//! Options shared by several commands: what builds an engine (`SandboxOpts`, with the job
//! maximums) and what describes a job (`JobArgs`, for `run` and `submit`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use forkbox::node::config;
use forkbox::sandbox::{self, Engine, EngineConfig, RootSource};
use forkbox_queue::schema::{FileData, Job, Limits, Network};
use serde::Deserialize;

/// Options shared by every command that builds an engine. A worker's `--config` file may set
/// `network_default`, `python_preload` and the job maximums too (the root flags and
/// `--shared-net` are the command line's alone).
///
/// The job maximums: a job asking for more is `invalid`, its error naming the field and the
/// maximum. Unset, they keep the built-in maximums (`JobCeilings::default`).
#[derive(Debug, Clone, Default, PartialEq, Args, Deserialize)]
pub struct SandboxOpts {
    /// Use this unpacked root filesystem instead of the host allowlist.
    #[arg(long, value_name = "DIR")]
    #[serde(skip)]
    pub rootfs: Option<PathBuf>,
    /// More host directories exposed read-only (bind mounts), comma-separated, on top of the
    /// default allowlist (/usr, /bin, /sbin, /lib*, /etc): absolute paths of existing
    /// directories (or symlinks, recreated as such), never `/` itself nor anything under
    /// `/proc`, `/dev`, `/tmp` or the working directory, which every sandbox mounts its own
    /// over. `--allow-only` replaces the default allowlist instead.
    #[arg(
        long,
        value_name = "DIRS",
        value_delimiter = ',',
        value_parser = allow_entry,
        conflicts_with = "rootfs"
    )]
    #[serde(skip)]
    pub allow: Option<Vec<PathBuf>>,
    /// The only host directories exposed read-only, instead of the default allowlist (so no
    /// /bin/sh unless listed); the same entries as `--allow`.
    #[arg(
        long,
        value_name = "DIRS",
        value_delimiter = ',',
        value_parser = allow_entry,
        conflicts_with_all = ["rootfs", "allow"]
    )]
    #[serde(skip)]
    pub allow_only: Option<Vec<PathBuf>>,
    /// Share one network namespace between sandboxes instead of one each.
    #[arg(long)]
    #[serde(skip)]
    pub shared_net: bool,
    /// The network of a job that does not set `network`: `none` (Unix sockets only) or
    /// `loopback` (a namespace of its own with `lo` up). The sandboxes kept ready are built
    /// for it; a job asking for the other waits for one built for it [default: none].
    #[arg(long, env = "FORKBOX_NETWORK_DEFAULT", value_name = "MODE")]
    #[serde(default)]
    pub network_default: Option<Network>,
    /// Modules the warm Python runtime imports before the first sandbox, comma-separated;
    /// `none` turns the runtime off (jobs asking for it run cold); `default` in the list stands
    /// for the default list (`default,unittest` adds one) [default: common standard-library
    /// modules, see docs/operations.md].
    #[arg(long, value_name = "MODULES", value_delimiter = ',')]
    #[serde(default, deserialize_with = "names")]
    pub python_preload: Option<Vec<String>>,
    /// Largest `timeout_ms` a job may set [default: 3600000].
    #[arg(long, env = "FORKBOX_MAX_TIMEOUT_MS", value_name = "MS")]
    pub max_timeout_ms: Option<u64>,
    /// Largest `limits.memory_mb` [default: 4096].
    #[arg(long, env = "FORKBOX_MAX_MEMORY_MB", value_name = "MIB")]
    pub max_memory_mb: Option<u64>,
    /// Largest `limits.pids` [default: 1024].
    #[arg(long, env = "FORKBOX_MAX_PIDS", value_name = "N")]
    pub max_pids: Option<u64>,
    /// Largest `limits.cpu_ms` [default: 86400000].
    #[arg(long, env = "FORKBOX_MAX_CPU_MS", value_name = "MS")]
    pub max_cpu_ms: Option<u64>,
    /// Largest `limits.output_bytes`, per stream [default: 16777216].
    #[arg(long, env = "FORKBOX_MAX_OUTPUT_BYTES", value_name = "BYTES")]
    pub max_output_bytes: Option<u64>,
    /// Largest `limits.disk_mb` (memory-backed: it bounds what one job may take) [default: 1024].
    #[arg(long, env = "FORKBOX_MAX_DISK_MB", value_name = "MIB")]
    pub max_disk_mb: Option<u64>,
    /// Largest `limits.file_size_mb` [default: 1024].
    #[arg(long, env = "FORKBOX_MAX_FILE_SIZE_MB", value_name = "MIB")]
    pub max_file_size_mb: Option<u64>,
    /// Largest `limits.open_files` [default: 4096].
    #[arg(long, env = "FORKBOX_MAX_OPEN_FILES", value_name = "N")]
    pub max_open_files: Option<u64>,
    /// Cap on the bytes of the files a job collects [default: 8388608].
    #[arg(long, env = "FORKBOX_MAX_COLLECT_BYTES", value_name = "BYTES")]
    pub max_collect_bytes: Option<u64>,
}

impl SandboxOpts {
    /// These options where given, else `file`'s (the root flags and `--shared-net` have no file
    /// keys).
    pub fn over(self, file: SandboxOpts) -> SandboxOpts {
        let SandboxOpts {
            rootfs: _,
            allow: _,
            allow_only: _,
            shared_net: _,
            network_default,
            python_preload,
            max_timeout_ms,
            max_memory_mb,
            max_pids,
            max_cpu_ms,
            max_output_bytes,
            max_disk_mb,
            max_file_size_mb,
            max_open_files,
            max_collect_bytes,
        } = file;
        SandboxOpts {
            network_default: self.network_default.or(network_default),
            python_preload: self.python_preload.or(python_preload),
            max_timeout_ms: self.max_timeout_ms.or(max_timeout_ms),
            max_memory_mb: self.max_memory_mb.or(max_memory_mb),
            max_pids: self.max_pids.or(max_pids),
            max_cpu_ms: self.max_cpu_ms.or(max_cpu_ms),
            max_output_bytes: self.max_output_bytes.or(max_output_bytes),
            max_disk_mb: self.max_disk_mb.or(max_disk_mb),
            max_file_size_mb: self.max_file_size_mb.or(max_file_size_mb),
            max_open_files: self.max_open_files.or(max_open_files),
            max_collect_bytes: self.max_collect_bytes.or(max_collect_bytes),
            ..self
        }
    }

    /// Sets the job maximums these options give into `cfg`, keeping its own for the others.
    pub fn apply_ceilings(&self, cfg: &mut EngineConfig) {
        let pick = |value: Option<u64>, into: &mut u64| {
            if let Some(v) = value {
                *into = v;
            }
        };
        let c = &mut cfg.ceilings;
        pick(self.max_timeout_ms, &mut c.timeout_ms);
        let l = &mut c.limits;
        pick(self.max_memory_mb, &mut l.memory_mb);
        pick(self.max_pids, &mut l.pids);
        pick(self.max_cpu_ms, &mut l.cpu_ms);
        pick(self.max_output_bytes, &mut l.output_bytes);
        pick(self.max_disk_mb, &mut l.disk_mb);
        pick(self.max_file_size_mb, &mut l.file_size_mb);
        pick(self.max_open_files, &mut l.open_files);
        pick(self.max_collect_bytes, &mut cfg.collect_max_bytes);
    }

    pub fn engine_config(&self, slots: usize) -> EngineConfig {
        let mut cfg = EngineConfig {
            slots,
            net_per_sandbox: !self.shared_net,
            network_default: self.network_default.unwrap_or_default(),
            ..EngineConfig::default()
        };
        cfg.python = python_settings(self.python_preload.as_deref());
        self.apply_ceilings(&mut cfg);
        if let Some(dir) = &self.rootfs {
            cfg.root = RootSource::Image(dir.clone());
        } else if let Some(dirs) = &self.allow_only {
            cfg.root = RootSource::Allowlist(dirs.clone());
        } else if let Some(extra) = &self.allow {
            let mut dirs: Vec<PathBuf> = sandbox::DEFAULT_ALLOWLIST
                .iter()
                .map(PathBuf::from)
                .collect();
            for dir in extra {
                if !dirs.contains(dir) {
                    dirs.push(dir.clone());
                }
            }
            cfg.root = RootSource::Allowlist(dirs);
        }
        cfg
    }
}

impl SandboxOpts {
    /// Whether none of these options is set (from the command line or the environment): a
    /// running daemon's engine then serves as well as one of our own. Every field is compared,
    /// a new one included, so only [`SandboxOpts::over`] lists the fields.
    pub fn is_unset(&self) -> bool {
        *self == SandboxOpts::default()
    }

    /// The error of an engine that did not start, with the reason when mode bits on the way
    /// to an exposed directory keep the sandboxes out (the kernel's EACCES alone does not say
    /// that a node started as root runs its sandboxes as another host uid).
    pub fn start_failed(&self, e: sandbox::EngineError) -> anyhow::Error {
        let e = anyhow::Error::from(e).context("starting the sandbox engine");
        if !nix::unistd::geteuid().is_root() {
            return e;
        }
        let id = sandbox::DEFAULT_ROOT_MAPPED_ID;
        let dirs = self.allow_only.iter().chain(&self.allow).flatten();
        match dirs.filter_map(|d| unsearchable_above(d, id, id)).next() {
            Some(why) => e.context(why),
            None => e,
        }
    }
}

/// Why host uid `uid` (group `gid`) cannot reach `dir`: the first directory above it whose
/// mode bits deny it search, and what to do about it. ACLs are not read: this only explains a
/// refusal, it never refuses.
fn unsearchable_above(dir: &Path, uid: u32, gid: u32) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let blocked = dir.ancestors().skip(1).find(|above| {
        std::fs::metadata(above).is_ok_and(|m| {
            let bit = if m.uid() == uid {
                0o100
            } else if m.gid() == gid {
                0o010
            } else {
                0o001
            };
            m.mode() & bit == 0
        })
    })?;
    let m = std::fs::metadata(blocked).ok()?;
    let (dir, above) = (dir.display(), blocked.display());
    Some(format!(
        "{dir} cannot be exposed: a node started as root runs its sandboxes as host uid {uid} \
         (host root is never mapped into a sandbox), and {above} (mode {:04o}, owner uid {}) \
         does not let that uid search it. Put the directory outside {above} (for a toolchain, \
         e.g. RUSTUP_HOME=/opt/rustup CARGO_HOME=/opt/cargo, or PYENV_ROOT=/opt/pyenv), or \
         bind-mount it elsewhere (mount --bind {dir} /opt/NAME) and --allow that, or let others \
         search {above} (chmod o+x {above})",
        m.mode() & 0o7777,
        m.uid()
    ))
}

/// One `--allow` entry, refused with the reason unless it is an absolute path below `/`
/// without `..` that names a directory or a symlink (a merged-/usr `/bin`, recreated as a
/// symlink): a file or a missing path would otherwise be left out of the root without a word,
/// and `/` would hand the sandbox the whole host.
fn allow_entry(s: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(s);
    if !path.is_absolute() {
        return Err("not an absolute path".into());
    }
    if path.parent().is_none() {
        return Err(
            "the host's whole root cannot be exposed; name the directories jobs need".into(),
        );
    }
    if path
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err("has a `..` in it; name the directory itself".into());
    }
    for (own, what) in sandbox::own_mount_points(sandbox::DEFAULT_WORK_DIR) {
        if path.starts_with(&own) {
            return Err(format!(
                "every sandbox mounts {what} on {own}, which would hide it"
            ));
        }
    }
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() || m.file_type().is_symlink() => Ok(path),
        Ok(_) => Err("not a directory (only directories, and symlinks, are exposed)".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A list of names in a config file: `"high, default"` or `["high", "default"]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum QueueList {
    Joined(String),
    List(Vec<String>),
}

impl QueueList {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            QueueList::Joined(s) => split_queues(&s),
            QueueList::List(v) => v,
        }
    }
}

/// On the command line a list is one comma-separated value.
impl std::str::FromStr for QueueList {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<QueueList, Self::Err> {
        Ok(QueueList::Joined(s.to_owned()))
    }
}

/// `high, default` → `["high", "default"]`.
pub fn split_queues(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|q| !q.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A [`QueueList`] key read as the list it names.
fn names<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    Ok(Option::<QueueList>::deserialize(d)?.map(QueueList::into_vec))
}

/// The warm Python runtime for a `--python-preload` value (absent: the default list). The
/// word `default` in the list stands for the default list, so `default,unittest` adds to it.
pub fn python_settings(preload: Option<&[String]>) -> Option<sandbox::PythonSettings> {
    use sandbox::DEFAULT_PYTHON_PRELOAD as DEFAULT_PRELOAD;
    let mut settings = sandbox::PythonSettings::default();
    match preload {
        Some([none]) if none == "none" => return None,
        Some(list) => {
            settings.preload.clear();
            let names = list.iter().map(|m| m.trim()).filter(|m| !m.is_empty());
            for name in names.flat_map(|m| match m {
                "default" => DEFAULT_PRELOAD.to_vec(),
                one => vec![one],
            }) {
                if !settings.preload.iter().any(|p| p == name) {
                    settings.preload.push(name.to_owned());
                }
            }
        }
        None => {}
    }
    Some(settings)
}

/// `--redis`, `--cluster` and `--queue` of the client commands.
#[derive(Debug, Clone, Args)]
pub struct ClientOpts {
    /// Redis URL: redis://[USER:PASSWORD@]HOST:PORT[/DB], rediss://... for TLS (see
    /// --redis-ca), redis+unix:///PATH; %-encode @ : / # ? % in a password (with --cluster:
    /// one or more comma-separated seed URLs of a Redis Cluster).
    #[arg(long, env = "FORKBOX_REDIS_URL", value_name = "URL", default_value = config::DEFAULT_REDIS_URL)]
    pub redis: String,
    #[command(flatten)]
    pub redis_tls: RedisTlsOpts,
    /// --redis names a Redis Cluster's seed nodes.
    #[arg(long, env = "FORKBOX_CLUSTER")]
    pub cluster: bool,
    /// Queue name.
    #[arg(long, short = 'q', env = "FORKBOX_QUEUE", default_value = config::DEFAULT_QUEUE)]
    pub queue: String,
    /// Partitions of the queue; must match what the queue was created with (a mismatch is
    /// refused, naming both).
    #[arg(
        long,
        env = "FORKBOX_PARTITIONS",
        value_name = "N",
        default_value_t = 1
    )]
    pub partitions: usize,
}

/// The job-describing options of `run` and `submit`.
#[derive(Debug, Clone, Args)]
pub struct JobArgs {
    /// Run a shell string with /bin/sh -c.
    #[arg(short = 'c', value_name = "SHELL", conflicts_with = "argv")]
    pub shell: Option<String>,
    /// Wall-clock limit from exec, in milliseconds [default: 10000].
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// Memory limit in MiB [default: 512].
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// Maximum number of processes [default: 64].
    #[arg(long)]
    pub pids: Option<u64>,
    /// CPU time limit in milliseconds (enforced with 1 s granularity without cgroups).
    #[arg(long)]
    pub cpu_ms: Option<u64>,
    /// Cap on stdout and on stderr, each, in bytes [default: 1048576].
    #[arg(long)]
    pub output_bytes: Option<u64>,
    /// What the output cap does: `kill` the job (status output_limit) [default], or
    /// `truncate` its output and let it run to its own end (its exit code decides the status;
    /// stdout_truncated and stderr_truncated say what was cut).
    #[arg(long, value_name = "MODE")]
    pub output_mode: Option<forkbox_queue::OutputMode>,
    /// Disk for all the job writes: /tmp, the working directory and /dev/shm together, in MiB
    /// [default: 64].
    #[arg(long)]
    pub disk_mb: Option<u64>,
    /// Largest file the job may write, in MiB.
    #[arg(long)]
    pub file_size_mb: Option<u64>,
    /// Maximum open files.
    #[arg(long)]
    pub open_files: Option<u64>,
    /// Extra environment variable (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Copy a local file into the working directory (repeatable).
    #[arg(long = "file", value_name = "PATH=LOCALFILE")]
    pub files: Vec<String>,
    /// Return files matching this glob, relative to the working directory (repeatable).
    #[arg(long = "collect", value_name = "GLOB")]
    pub collect: Vec<String>,
    /// Feed this local file to the job's stdin ("-" reads our stdin).
    #[arg(long, value_name = "FILE")]
    pub stdin_file: Option<PathBuf>,
    /// Working directory inside the sandbox (relative to /work).
    #[arg(long)]
    pub cwd: Option<String>,
    /// Run the program in a warm runtime: `python` for a `python3 ...` command line.
    #[arg(long, value_name = "RUNTIME")]
    pub runtime: Option<forkbox_queue::Runtime>,
    /// The job's network: `none` (Unix sockets only) or `loopback` (a namespace of its own
    /// with `lo` up) [default: the node's].
    #[arg(long, value_name = "MODE")]
    pub network: Option<Network>,
    /// The program and its arguments.
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    pub argv: Vec<String>,
}

impl JobArgs {
    /// Builds and validates the job; errors name the offending option.
    pub fn to_job(&self) -> anyhow::Result<Job> {
        let mut job = match (&self.shell, self.argv.is_empty()) {
            (Some(cmd), _) => Job::shell(cmd.clone()),
            (None, false) => Job::argv(self.argv.clone()),
            (None, true) => bail!("nothing to run: give `-- CMD [ARGS...]` or `-c 'shell string'`"),
        };
        job.timeout_ms = self.timeout_ms;
        job.cwd = self.cwd.clone();
        job.runtime = self.runtime;
        job.output_mode = self.output_mode;
        job.network = self.network;
        job.limits = Limits {
            memory_mb: self.memory_mb,
            pids: self.pids,
            cpu_ms: self.cpu_ms,
            output_bytes: self.output_bytes,
            disk_mb: self.disk_mb,
            file_size_mb: self.file_size_mb,
            open_files: self.open_files,
        };
        for kv in &self.env {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("--env {kv:?}: expected K=V"))?;
            job.env.insert(k.to_owned(), v.to_owned());
        }
        for spec in &self.files {
            let (path, local) = spec
                .split_once('=')
                .with_context(|| format!("--file {spec:?}: expected PATH=LOCALFILE"))?;
            let bytes = std::fs::read(local)
                .with_context(|| format!("--file {spec:?}: reading {local}"))?;
            job.files
                .insert(path.to_owned(), FileData::from_bytes(bytes));
        }
        job.collect = self.collect.clone();
        if let Some(file) = &self.stdin_file {
            let bytes = if file.as_os_str() == "-" {
                let mut b = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
                    .context("reading stdin")?;
                b
            } else {
                std::fs::read(file).with_context(|| format!("--stdin-file {}", file.display()))?
            };
            job.stdin = Some(FileData::from_bytes(bytes));
        }
        job.validate()?;
        Ok(job)
    }
}

/// An engine with `slots` slots built from `opts`.
pub fn start_engine(slots: usize, opts: &SandboxOpts) -> anyhow::Result<Engine> {
    Engine::start(opts.engine_config(slots)).map_err(|e| opts.start_failed(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any option set, from a flag or the environment, means the daemon's engine will not do.
    #[test]
    fn options_are_unset_only_when_none_is_given() {
        assert!(SandboxOpts::default().is_unset());
        let set = [
            SandboxOpts {
                shared_net: true,
                ..SandboxOpts::default()
            },
            SandboxOpts {
                allow: Some(vec![PathBuf::from("/opt")]),
                ..SandboxOpts::default()
            },
            SandboxOpts {
                network_default: Some(Network::None),
                ..SandboxOpts::default()
            },
            SandboxOpts {
                max_collect_bytes: Some(1),
                ..SandboxOpts::default()
            },
        ];
        for opts in set {
            assert!(!opts.is_unset(), "{opts:?}");
        }
    }

    #[test]
    fn allow_entries_are_existing_directories_below_the_root() {
        assert_eq!(allow_entry("/usr"), Ok(PathBuf::from("/usr")));
        // Outside the paths every sandbox mounts over: a directory, a symlink, a file.
        let place = tempfile::tempdir_in("/var/tmp").unwrap();
        let link = place.path().join("link");
        std::os::unix::fs::symlink("/usr", &link).unwrap();
        assert_eq!(allow_entry(link.to_str().unwrap()), Ok(link.clone()));
        let file = place.path().join("file");
        std::fs::write(&file, "").unwrap();
        let file = file.to_str().unwrap();
        for (entry, why) in [
            ("/", "the host's whole root cannot be exposed"),
            ("//", "the host's whole root cannot be exposed"),
            ("usr", "not an absolute path"),
            ("/usr/../home", "has a `..` in it"),
            (file, "not a directory"),
            ("/forkbox-no-such-directory", "No such file or directory"),
            ("/proc/self", "mounts its own proc on /proc"),
            ("/dev", "mounts its own devices on /dev"),
            ("/dev/shm", "mounts its own devices on /dev"),
            ("/tmp/data", "mounts its own disk on /tmp"),
            ("/work/data", "as the working directory on /work"),
        ] {
            let err = allow_entry(entry).unwrap_err();
            assert!(err.contains(why), "{entry}: {err}");
        }
    }

    #[test]
    fn default_in_a_preload_list_stands_for_the_default_list() {
        use sandbox::DEFAULT_PYTHON_PRELOAD as DEFAULT_PRELOAD;
        let preload = |list: &[&str]| {
            let list: Vec<String> = list.iter().map(|s| s.to_string()).collect();
            python_settings(Some(&list)).unwrap().preload
        };
        let default: Vec<String> = DEFAULT_PRELOAD.iter().map(|s| s.to_string()).collect();
        assert_eq!(python_settings(None).unwrap().preload, default);
        assert_eq!(preload(&["default"]), default);
        // Added to, in order, each module once.
        let mut more = default.clone();
        more.extend(["unittest".to_owned(), "numpy".to_owned()]);
        assert_eq!(
            preload(&["default", " unittest", "json", "numpy", "unittest"]),
            more
        );
        let mut first = vec!["numpy".to_owned()];
        first.extend(default.iter().cloned());
        assert_eq!(preload(&["numpy", "default", ""]), first);
        assert_eq!(preload(&["json", "re"]), ["json", "re"]);
        assert_eq!(python_settings(Some(&["none".to_owned()])), None);
    }
}

/// The TLS settings of a `rediss://` Redis URL, shared by every command that takes `--redis`.
#[derive(Debug, Clone, Default, Args, Deserialize)]
pub struct RedisTlsOpts {
    /// PEM file of the CAs that sign Redis' certificate (rediss:// only) [default: the
    /// system's roots].
    #[arg(long, env = "FORKBOX_REDIS_CA", value_name = "FILE")]
    pub redis_ca: Option<PathBuf>,
    /// PEM file of a client certificate for Redis (mutual TLS; with --redis-key).
    #[arg(
        long,
        env = "FORKBOX_REDIS_CERT",
        value_name = "FILE",
        requires = "redis_key"
    )]
    pub redis_cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key (with --redis-cert).
    #[arg(
        long,
        env = "FORKBOX_REDIS_KEY",
        value_name = "FILE",
        requires = "redis_cert"
    )]
    pub redis_key: Option<PathBuf>,
}

impl RedisTlsOpts {
    /// These settings where given, else `file`'s.
    pub fn over(self, file: RedisTlsOpts) -> RedisTlsOpts {
        RedisTlsOpts {
            redis_ca: self.redis_ca.or(file.redis_ca),
            redis_cert: self.redis_cert.or(file.redis_cert),
            redis_key: self.redis_key.or(file.redis_key),
        }
    }

    pub fn tls(&self) -> forkbox_queue::RedisTls {
        forkbox_queue::RedisTls {
            ca: self.redis_ca.clone(),
            cert: self.redis_cert.clone(),
            key: self.redis_key.clone(),
        }
    }
}
