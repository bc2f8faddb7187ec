//! The warm Python runtime: CPython embedded in the zygote (its shared library, `dlopen`ed),
//! initialised with python3's own configuration and the preload list imported, before any
//! sandbox exists. Every sandbox is a fork of that state; a job with `"runtime": "python"`
//! whose command line is an ordinary `python3 ...` runs in its launcher's copy of the
//! interpreter, after the same isolation steps as a cold job, instead of exec'ing `python3`.
//!
//! The Python side is `python_stub.py`. This module holds the zygote's warm-up, the engine's
//! decision ([`plan`]: which command lines run warm, and why the others do not) and the
//! launcher's hand-over ([`run`]).

use std::collections::BTreeSet;
use std::ffi::CString;
use std::io::{Read, Seek};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use forkbox_queue::schema::FileData;
use serde::{Deserialize, Serialize};

use crate::sandbox::kernel::sys::{self, Libpython};

/// The Python side of the runtime.
const STUB: &str = include_str!("python_stub.py");

/// The interpreter jobs name (`python3 ...`) and the one whose shared library is warmed.
pub const DEFAULT_EXECUTABLE: &str = "/usr/bin/python3";

/// Standard-library modules that evaluation programs (HumanEval, MBPP, LiveCodeBench, reward
/// functions) import, pre-imported by default. A preloaded module costs every warm job of the
/// node a little, since each sandbox copies and tears down a larger inherited heap; one left
/// out costs only the jobs that import it their import time. Modules that are common in such
/// programs or cheap to hold are in; heavy ones they rarely import (`unittest`, `dataclasses`,
/// `statistics`, `fractions`, `decimal`, `datetime`, `hashlib`, `textwrap`, `threading`) are
/// not. `docs/benchmarks.md` measures both sides ("Which modules the default preloads").
pub const DEFAULT_PRELOAD: &[&str] = &[
    "typing",
    "math",
    "cmath",
    "re",
    "collections",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "string",
    "random",
    "copy",
    "operator",
    "json",
    "struct",
    "array",
    "enum",
];

/// How an engine sets the runtime up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonSettings {
    /// The `python3` that jobs name; its shared library is the one embedded.
    pub executable: PathBuf,
    /// Modules imported before the first sandbox.
    pub preload: Vec<String>,
}

impl Default for PythonSettings {
    fn default() -> Self {
        PythonSettings {
            executable: DEFAULT_EXECUTABLE.into(),
            preload: DEFAULT_PRELOAD.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// The host's interpreter, as the engine found it (by running it once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    pub executable: PathBuf,
    /// `executable` with every symlink resolved.
    pub real: PathBuf,
    /// `sys.version`.
    pub version: String,
    /// Its shared library (`LIBDIR/INSTSONAME`).
    pub library: PathBuf,
}

/// Runs `executable` once to learn its version, real path and shared library.
pub fn probe(executable: &Path) -> Result<Interpreter, String> {
    let code = "import os, sys, sysconfig\n\
                print(sys.version)\n\
                print(os.path.realpath(sys.executable))\n\
                v = sysconfig.get_config_var\n\
                print(os.path.join(v('LIBDIR') or '', v('INSTSONAME') or ''))\n";
    let out = std::process::Command::new(executable)
        .args(["-E", "-s", "-c", code])
        .env_clear()
        .env("LANG", "C.UTF-8")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", executable.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            executable.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let (Some(version), Some(real), Some(library)) = (lines.next(), lines.next(), lines.next())
    else {
        return Err(format!(
            "{}: unexpected answer {text:?}",
            executable.display()
        ));
    };
    let library = PathBuf::from(library);
    if !library.is_file() {
        return Err(format!(
            "{} has no shared library at {} (install its libpython package)",
            executable.display(),
            library.display()
        ));
    }
    Ok(Interpreter {
        executable: executable.to_owned(),
        real: real.into(),
        version: version.to_owned(),
        library,
    })
}

/// What the engine asks the zygote to warm.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WarmRequest {
    pub library: PathBuf,
    pub preload: Vec<String>,
    /// The environment the interpreter is initialised in: a job's default environment, so
    /// that what CPython reads from it at start-up (locale, `HOME`) is what a cold job sees.
    pub env: Vec<(String, String)>,
}

/// What the zygote reports once the interpreter is warm.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WarmInfo {
    /// `sys.version` of the embedded interpreter.
    pub version: String,
    /// `sys.executable` as it computed it.
    pub executable: String,
    /// The preload modules imported, and those that failed (with the error).
    pub preloaded: Vec<String>,
    pub failed: Vec<(String, String)>,
    /// Top-level names of every module in `sys.modules` (preloads and their imports).
    pub modules: Vec<String>,
    /// Time the warm-up took in the zygote.
    pub warm_up_ms: f64,
    /// The zygote's resident memory before and after.
    pub rss_before_kb: u64,
    pub rss_after_kb: u64,
}

/// The runtime as an engine knows it.
#[derive(Debug, Clone, PartialEq)]
pub enum PythonRuntime {
    /// Not configured on this engine.
    Disabled,
    /// Configured but unusable here (the reason); jobs run cold.
    Unavailable(String),
    Ready {
        interpreter: Interpreter,
        info: Box<WarmInfo>,
    },
}

impl PythonRuntime {
    /// Combines the engine's probe with the zygote's report.
    pub fn from_parts(
        interpreter: Result<Interpreter, String>,
        warmed: Option<Result<WarmInfo, String>>,
    ) -> PythonRuntime {
        match (interpreter, warmed) {
            (Err(e), _) => PythonRuntime::Unavailable(e),
            (Ok(_), None) => PythonRuntime::Unavailable("the zygote did not warm it".into()),
            (Ok(_), Some(Err(e))) => PythonRuntime::Unavailable(e),
            (Ok(interpreter), Some(Ok(info))) if info.version != interpreter.version => {
                PythonRuntime::Unavailable(format!(
                    "the shared library is Python {}, {} is Python {}",
                    first_word(&info.version),
                    interpreter.executable.display(),
                    first_word(&interpreter.version)
                ))
            }
            (Ok(interpreter), Some(Ok(info))) => PythonRuntime::Ready {
                interpreter,
                info: Box::new(info),
            },
        }
    }
}

fn first_word(s: &str) -> &str {
    s.split_whitespace().next().unwrap_or(s)
}

/// The interpreter of this process (set in the zygote, inherited by every sandbox).
static LOADED: OnceLock<Libpython> = OnceLock::new();

/// Zygote side: loads and initialises the interpreter and imports the preload list. Runs in
/// the zygote before any sandbox exists; nothing of any job is in this process, ever.
pub fn warm_up(request: &WarmRequest) -> Result<WarmInfo, String> {
    let started = crate::sandbox::kernel::clock::mono_ns();
    let rss_before_kb = rss_kb();
    // CPython reads its locale and paths from the environment at initialisation. The zygote
    // was started with an empty one and is single-threaded.
    for (k, v) in &request.env {
        std::env::set_var(k, v);
    }
    let library = CString::new(request.library.as_os_str().as_encoded_bytes())
        .map_err(|_| "library path contains NUL".to_owned())?;
    let py = Libpython::load(&library)?;
    py.initialize()?;
    let mut report = tempfile::tempfile().map_err(|e| format!("warm-up report file: {e}"))?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&report);
    let preload = serde_json::to_vec(&request.preload).map_err(|e| e.to_string())?;
    // The session supervisor, compiled once here rather than in every session's sandbox.
    let precompiled =
        serde_json::to_vec(&[super::session::SUPERVISOR_SOURCE]).map_err(|e| e.to_string())?;
    let bootstrap = format!(
        "import sys\n\
         _m = type(sys)('_forkbox_warm')\n\
         exec(compile(bytes.fromhex('{}').decode(), '<forkbox-warm>', 'exec'), _m.__dict__)\n\
         sys.modules['_forkbox_warm'] = _m\n\
         del _m\n\
         sys.modules['_forkbox_warm'].warm_up('{}', {fd}, '{}')\n",
        hex(STUB.as_bytes()),
        hex(&preload),
        hex(&precompiled)
    );
    let bootstrap = CString::new(bootstrap).map_err(|e| e.to_string())?;
    if py.run(&bootstrap) != 0 {
        return Err("the warm-up code failed (its traceback is on the zygote's stderr)".into());
    }
    let mut text = String::new();
    report
        .rewind()
        .and_then(|_| report.read_to_string(&mut text))
        .map_err(|e| format!("warm-up report: {e}"))?;
    let mut info: WarmInfo =
        serde_json::from_str(&text).map_err(|e| format!("warm-up report {text:?}: {e}"))?;
    if sys::thread_count() != Some(1) {
        return Err(
            "the interpreter started a thread; the zygote must stay single-threaded".into(),
        );
    }
    info.warm_up_ms = (crate::sandbox::kernel::clock::mono_ns() - started) as f64 / 1e6;
    info.rss_before_kb = rss_before_kb;
    info.rss_after_kb = rss_kb();
    let _ = LOADED.set(py);
    Ok(info)
}

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// Whether this process holds a warm interpreter.
pub fn is_loaded() -> bool {
    LOADED.get().is_some()
}

/// What the program is, as python3 would take it from its command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Main {
    /// `python3 PATH ...` (also a directory or zip archive with `__main__.py`).
    File { path: String },
    /// `python3 -c CODE ...`
    Command { code: String },
    /// `python3 -m MODULE ...`
    Module { module: String },
    /// `python3` or `python3 -`: the program is read from stdin.
    Stdin,
}

/// How a warm job runs: what the launcher hands the interpreter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmPlan {
    #[serde(flatten)]
    pub main: Main,
    /// `sys.argv` as python3 sets it (for `-m`, runpy replaces the first item).
    pub argv: Vec<String>,
    /// The whole command line (`sys.orig_argv`).
    pub orig_argv: Vec<String>,
    /// `-u` or `PYTHONUNBUFFERED`.
    pub unbuffered: bool,
    /// `-B` or `PYTHONDONTWRITEBYTECODE`.
    pub dont_write_bytecode: bool,
    /// `-I`, `-P` or `PYTHONSAFEPATH`: no script directory in `sys.path`.
    pub safe_path: bool,
    /// `PYTHONWARNINGS` then every `-W`, in order.
    pub warnoptions: Vec<String>,
    /// `PYTHONPATH` entries, put in front of the interpreter's own `sys.path`.
    pub pythonpath: Vec<String>,
}

/// The options of a python3 command line that matter to the warm path.
#[derive(Debug, Default, PartialEq, Eq)]
struct Options {
    unbuffered: bool,
    dont_write_bytecode: bool,
    ignore_environment: bool,
    safe_path: bool,
    warnoptions: Vec<String>,
}

/// Parses `python3`'s arguments (after the program name) like CPython's getopt, taking only
/// the options the warm path honours; anything else is the reason to run cold.
fn parse_command_line(argv: &[String]) -> Result<(Main, Vec<String>, Options), String> {
    let mut o = Options::default();
    let mut i = 1;
    while i < argv.len() {
        let arg = &argv[i];
        if arg == "-" {
            return Ok((Main::Stdin, argv[i..].to_vec(), o));
        }
        if !arg.starts_with('-') {
            let main = Main::File { path: arg.clone() };
            return Ok((main, argv[i..].to_vec(), o));
        }
        if arg.starts_with("--") {
            return Err(format!("the warm interpreter does not take {arg}"));
        }
        let flags: Vec<char> = arg[1..].chars().collect();
        let mut j = 0;
        while j < flags.len() {
            let ch = flags[j];
            match ch {
                'c' | 'm' | 'W' => {
                    let attached: String = flags[j + 1..].iter().collect();
                    let value = if !attached.is_empty() {
                        attached
                    } else {
                        i += 1;
                        argv.get(i)
                            .cloned()
                            .ok_or_else(|| format!("-{ch} needs an argument"))?
                    };
                    match ch {
                        'c' => {
                            let mut sys_argv = vec!["-c".to_owned()];
                            sys_argv.extend(argv[i + 1..].iter().cloned());
                            return Ok((Main::Command { code: value }, sys_argv, o));
                        }
                        'm' => {
                            let mut sys_argv = vec!["-m".to_owned()];
                            sys_argv.extend(argv[i + 1..].iter().cloned());
                            return Ok((Main::Module { module: value }, sys_argv, o));
                        }
                        _ => {
                            o.warnoptions.push(value);
                            break;
                        }
                    }
                }
                'u' => o.unbuffered = true,
                'B' => o.dont_write_bytecode = true,
                'E' => o.ignore_environment = true,
                'P' => o.safe_path = true,
                'I' => {
                    o.ignore_environment = true;
                    o.safe_path = true;
                }
                // No user site directory exists in a sandbox; quiet only affects the banner.
                's' | 'q' => {}
                other => {
                    return Err(format!(
                        "the warm interpreter does not support the option -{other}"
                    ))
                }
            }
            j += 1;
        }
        i += 1;
    }
    Ok((Main::Stdin, vec![String::new()], o))
}

/// Environment variables the warm interpreter honours at run time (the others that CPython
/// reads at start-up make a job run cold).
const HONOURED_ENV: &[&str] = &[
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONPATH",
    "PYTHONWARNINGS",
    "PYTHONSAFEPATH",
];
/// Variables that set the interpreter's locale, fixed at its initialisation.
const LOCALE_ENV: &[&str] = &["LANG", "LC_ALL", "LC_CTYPE"];

/// What the engine needs to decide whether a job runs warm.
pub struct Context<'a> {
    /// The job's environment (defaults included).
    pub env: &'a [(String, String)],
    /// The environment the interpreter was initialised in.
    pub warm_env: &'a [(String, String)],
    pub files: &'a std::collections::BTreeMap<String, FileData>,
    /// The working directory inside the sandbox (absolute).
    pub cwd: &'a str,
    pub work_dir: &'a str,
    /// Host directories every sandbox sees unchanged and read-only.
    pub allowlist: &'a [PathBuf],
    pub interpreter: &'a Interpreter,
    pub modules: &'a [String],
}

/// The engine's decision: the plan to run `argv` warm, or why it runs cold. `exists` and
/// `canonical` look at the host's files (parameters, so tests need no interpreter).
pub fn plan(
    argv: &[String],
    cx: &Context<'_>,
    canonical: &dyn Fn(&Path) -> Option<PathBuf>,
) -> Result<WarmPlan, String> {
    let program = argv.first().ok_or("no program")?;
    check_interpreter(program, cx, canonical)?;
    let (main, sys_argv, mut o) = parse_command_line(argv)?;
    let get = |k: &str| {
        cx.env
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    for var in LOCALE_ENV {
        let warm = cx
            .warm_env
            .iter()
            .find(|(k, _)| k == var)
            .map(|(_, v)| v.as_str());
        if get(var) != warm {
            return Err(format!(
                "{var} differs from the warm interpreter's locale ({})",
                warm.unwrap_or("unset")
            ));
        }
    }
    let mut pythonpath = Vec::new();
    if !o.ignore_environment {
        for (k, _) in cx.env {
            if k.starts_with("PYTHON") && !HONOURED_ENV.contains(&k.as_str()) {
                return Err(format!(
                    "{k} is read at interpreter start-up, which a warm job skips"
                ));
            }
        }
        let set = |k: &str| get(k).is_some_and(|v| !v.is_empty());
        o.unbuffered |= set("PYTHONUNBUFFERED");
        o.dont_write_bytecode |= set("PYTHONDONTWRITEBYTECODE");
        o.safe_path |= set("PYTHONSAFEPATH");
        if let Some(w) = get("PYTHONWARNINGS") {
            let env_opts = w.split(',').filter(|s| !s.is_empty()).map(str::to_owned);
            o.warnoptions.splice(0..0, env_opts);
        }
        if let Some(p) = get("PYTHONPATH") {
            // Empty entries stand for the working directory, as in python3.
            pythonpath = p.split(':').map(str::to_owned).collect();
        }
    }
    if let Main::File { path } = &main {
        if path.ends_with(".pyc") {
            return Err("a compiled (.pyc) script runs cold".into());
        }
    }
    check_shadowing(&main, o.safe_path, &pythonpath, cx)?;
    Ok(WarmPlan {
        main,
        argv: sys_argv,
        orig_argv: argv.to_vec(),
        unbuffered: o.unbuffered,
        dont_write_bytecode: o.dont_write_bytecode,
        safe_path: o.safe_path,
        warnoptions: o.warnoptions,
        pythonpath,
    })
}

/// The program must be the interpreter that was warmed, reached through directories no job
/// can write to (a `python3` of its own, or another interpreter, runs cold).
fn check_interpreter(
    program: &str,
    cx: &Context<'_>,
    canonical: &dyn Fn(&Path) -> Option<PathBuf>,
) -> Result<(), String> {
    let read_only = |p: &Path| {
        p.is_absolute()
            && !p.components().any(|c| c == Component::ParentDir)
            && cx.allowlist.iter().any(|dir| p.starts_with(dir))
    };
    let matches = |candidate: &Path| -> Result<(), String> {
        match canonical(candidate) {
            Some(real) if real == cx.interpreter.real => Ok(()),
            Some(real) => Err(format!(
                "{program} is {}, not the warm interpreter {}",
                real.display(),
                cx.interpreter.real.display()
            )),
            None => Err(format!("{} does not exist", candidate.display())),
        }
    };
    if program.contains('/') {
        let p = Path::new(program);
        if !read_only(p) {
            return Err(format!(
                "{program} is not a path in the read-only host directories"
            ));
        }
        return matches(p);
    }
    let path_var = cx
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    for dir in path_var.split(':') {
        let dir = Path::new(dir);
        if !read_only(dir) {
            return Err(format!(
                "PATH entry {:?} comes before any read-only host directory holding {program}",
                dir.display().to_string()
            ));
        }
        let candidate = dir.join(program);
        if canonical(&candidate).is_some() {
            return matches(&candidate);
        }
    }
    Err(format!("{program} is not found in PATH"))
}

/// A job file that would be imported instead of a module the interpreter already holds (it
/// sits in the script's directory or on `PYTHONPATH`) makes the job run cold: a warm import
/// would find the preloaded module.
fn check_shadowing(
    main: &Main,
    safe_path: bool,
    pythonpath: &[String],
    cx: &Context<'_>,
) -> Result<(), String> {
    let cwd = Path::new(cx.cwd);
    let mut dirs: Vec<PathBuf> = pythonpath.iter().map(|p| cwd.join(p)).collect();
    if !safe_path {
        dirs.push(match main {
            Main::File { path } => {
                let full = cwd.join(path);
                full.parent().map(Path::to_owned).unwrap_or(full)
            }
            _ => cwd.to_owned(),
        });
    }
    let names: BTreeSet<&str> = cx
        .modules
        .iter()
        .map(String::as_str)
        .chain(["sitecustomize", "usercustomize"])
        .collect();
    let work = Path::new(cx.work_dir);
    for dir in dirs {
        let Ok(rel) = normalize(&dir).strip_prefix(work).map(Path::to_owned) else {
            continue;
        };
        for file in cx.files.keys() {
            let Ok(rest) = normalize(Path::new(file))
                .strip_prefix(&rel)
                .map(Path::to_owned)
            else {
                continue;
            };
            let Some(first) = rest.components().next() else {
                continue;
            };
            let first = first.as_os_str().to_string_lossy();
            let name = first.split('.').next().unwrap_or(&first);
            if names.contains(name) {
                return Err(format!(
                    "files.{file} would shadow the module {name}, which the warm interpreter \
                     has already imported"
                ));
            }
        }
    }
    Ok(())
}

/// Lexically removes `.` components (job paths never hold `..`).
fn normalize(p: &Path) -> PathBuf {
    p.components().filter(|c| *c != Component::CurDir).collect()
}

/// What the stub reads: the plan and the job's environment.
#[derive(Serialize)]
struct StubInput<'a> {
    #[serde(flatten)]
    plan: &'a WarmPlan,
    env: &'a [(String, String)],
}

/// Launcher side, once, before its sandbox is announced ready: the interpreter's after-fork
/// bookkeeping (CPython's own, and the `os.register_at_fork` hooks of the preloaded modules,
/// such as `threading`'s when it is preloaded) and the stub's reseeding. Each Python object
/// they touch copies its page of the inherited heap (CPython 3.11 writes reference counts on
/// every use), a few hundred pages in all; done here, that is spent while the sandbox waits,
/// not between a job's request and its program. The launcher is already hardened and no job
/// exists yet; it takes exactly one job, so what is seeded here is still that job's alone.
pub fn prepare() -> Result<(), String> {
    let Some(py) = LOADED.get() else {
        return Ok(());
    };
    py.after_fork_child();
    if py.run(c"__import__('_forkbox_warm').prepare()\n") != 0 {
        return Err(
            "the warm interpreter's preparation in the sandbox raised an exception".to_owned(),
        );
    }
    Ok(())
}

/// Launcher side: runs the job's program in this process's warm interpreter, which
/// [`prepare`] readied. Called in place of `execve`, after every isolation step, with stdio
/// installed and the exec time reported. Never returns: the interpreter's exit path ends the
/// process.
pub fn run(plan: &WarmPlan, env: &[(String, String)]) -> ! {
    let Some(py) = LOADED.get() else {
        sys::exit_now(125)
    };
    let input = match serde_json::to_vec(&StubInput { plan, env }) {
        Ok(b) => b,
        Err(_) => sys::exit_now(125),
    };
    let Ok(code) = CString::new(format!(
        "__import__('_forkbox_warm').run('{}')\n",
        hex(&input)
    )) else {
        sys::exit_now(125)
    };
    drop(input);
    // What exec would close: every descriptor but stdio (the job's channel, its report and
    // exec-notify pipes). The exec-notify pipe's EOF tells the zygote the program started.
    if sys::close_from(3).is_err() {
        sys::exit_now(125);
    }
    py.run(&code);
    // The stub always ends the process itself; reaching here means it failed before the
    // program ran.
    sys::exit_now(125)
}

/// Lower-case hex, the only encoding spliced into Python source (no quoting to get wrong).
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn command_lines_parse_like_python3() {
        let (main, argv, o) =
            parse_command_line(&args(&["python3", "main.py", "a", "-u"])).unwrap();
        assert_eq!(
            main,
            Main::File {
                path: "main.py".into()
            }
        );
        assert_eq!(argv, args(&["main.py", "a", "-u"]));
        assert_eq!(o, Options::default());

        let (main, argv, o) =
            parse_command_line(&args(&["python3", "-uB", "-c", "print(1)", "x"])).unwrap();
        assert_eq!(
            main,
            Main::Command {
                code: "print(1)".into()
            }
        );
        assert_eq!(argv, args(&["-c", "x"]));
        assert!(o.unbuffered && o.dont_write_bytecode);

        let (main, argv, _) = parse_command_line(&args(&["python3", "-cpass"])).unwrap();
        assert_eq!(
            main,
            Main::Command {
                code: "pass".into()
            }
        );
        assert_eq!(argv, args(&["-c"]));

        let (main, argv, o) = parse_command_line(&args(&[
            "python3", "-I", "-Werror", "-W", "ignore", "-m", "m", "q",
        ]))
        .unwrap();
        assert_eq!(main, Main::Module { module: "m".into() });
        assert_eq!(argv, args(&["-m", "q"]));
        assert!(o.safe_path && o.ignore_environment);
        assert_eq!(o.warnoptions, args(&["error", "ignore"]));

        let (main, argv, _) = parse_command_line(&args(&["python3"])).unwrap();
        assert_eq!((main, argv), (Main::Stdin, args(&[""])));
        let (main, argv, _) = parse_command_line(&args(&["python3", "-", "a"])).unwrap();
        assert_eq!((main, argv), (Main::Stdin, args(&["-", "a"])));
    }

    #[test]
    fn unsupported_options_are_named() {
        for (argv, word) in [
            (&["python3", "-O", "m.py"][..], "-O"),
            (&["python3", "-X", "dev", "m.py"][..], "-X"),
            (&["python3", "-S", "m.py"][..], "-S"),
            (&["python3", "--version"][..], "--version"),
            (&["python3", "-c"][..], "-c needs"),
        ] {
            let err = parse_command_line(&args(argv)).unwrap_err();
            assert!(err.contains(word), "{argv:?}: {err}");
        }
    }

    fn interpreter() -> Interpreter {
        Interpreter {
            executable: "/usr/bin/python3".into(),
            real: "/usr/bin/python3.11".into(),
            version: "3.11.2".into(),
            library: "/usr/lib/libpython3.11.so.1.0".into(),
        }
    }

    /// A host with python3 (→ python3.11) in /usr/bin and another interpreter in /opt.
    fn canonical(p: &Path) -> Option<PathBuf> {
        match p.to_str()? {
            "/usr/bin/python3" | "/usr/bin/python3.11" | "/bin/python3" => {
                Some("/usr/bin/python3.11".into())
            }
            "/usr/bin/python2" => Some("/usr/bin/python2.7".into()),
            "/opt/py/bin/python3" => Some("/opt/py/bin/python3.12".into()),
            _ => None,
        }
    }

    fn decide(argv: &[&str], env: &[(&str, &str)], files: &[&str]) -> Result<WarmPlan, String> {
        let mut full: Vec<(String, String)> = vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("HOME".into(), "/work".into()),
        ];
        for (k, v) in env {
            full.retain(|(key, _)| key != k);
            full.push((k.to_string(), v.to_string()));
        }
        let warm_env = vec![("LANG".to_owned(), "C.UTF-8".to_owned())];
        let files = files
            .iter()
            .map(|f| (f.to_string(), FileData::Text(String::new())))
            .collect();
        let allow = vec![PathBuf::from("/usr"), PathBuf::from("/bin")];
        let modules = args(&["json", "random", "collections"]);
        let interp = interpreter();
        let cx = Context {
            env: &full,
            warm_env: &warm_env,
            files: &files,
            cwd: "/work",
            work_dir: "/work",
            allowlist: &allow,
            interpreter: &interp,
            modules: &modules,
        };
        plan(&args(argv), &cx, &canonical)
    }

    #[test]
    fn the_warm_interpreter_runs_ordinary_command_lines() {
        let p = decide(&["python3", "main.py", "x"], &[], &["main.py"]).unwrap();
        assert_eq!(
            p.main,
            Main::File {
                path: "main.py".into()
            }
        );
        assert_eq!(p.orig_argv, args(&["python3", "main.py", "x"]));
        assert!(decide(&["/usr/bin/python3", "-c", "1"], &[], &[]).is_ok());
        assert!(decide(&["python3.11", "-m", "m"], &[], &[]).is_ok());
        let p = decide(
            &["python3", "-W", "error", "main.py"],
            &[
                ("PYTHONUNBUFFERED", "1"),
                ("PYTHONPATH", "lib:/opt/x"),
                ("PYTHONWARNINGS", "default"),
            ],
            &["main.py"],
        )
        .unwrap();
        assert!(p.unbuffered);
        assert_eq!(p.pythonpath, args(&["lib", "/opt/x"]));
        assert_eq!(p.warnoptions, args(&["default", "error"]));
        // -E ignores the variables CPython would have read, as python3 does.
        let p = decide(&["python3", "-E", "m.py"], &[("PYTHONHASHSEED", "0")], &[]).unwrap();
        assert!(!p.unbuffered);
    }

    #[test]
    fn command_lines_the_warm_path_cannot_honour_run_cold_with_the_reason() {
        for (argv, env, files, word) in [
            (&["python2", "m.py"][..], &[][..], &[][..], "not the warm"),
            (&["python9", "m.py"][..], &[][..], &[][..], "not found"),
            (
                &["/usr/bin/python2", "m.py"][..],
                &[][..],
                &[][..],
                "not the warm",
            ),
            (
                &["/opt/py/bin/python3", "m.py"][..],
                &[][..],
                &[][..],
                "read-only",
            ),
            (&["./python3", "m.py"][..], &[][..], &[][..], "read-only"),
            (
                &["python3", "m.py"][..],
                &[("PATH", "/work/bin:/usr/bin")][..],
                &[][..],
                "PATH entry",
            ),
            (
                &["python3", "m.py"][..],
                &[("PATH", "/opt/py/bin:/usr/bin")][..],
                &[][..],
                "PATH entry",
            ),
            (&["python3", "-O", "m.py"][..], &[][..], &[][..], "-O"),
            (
                &["python3", "m.py"][..],
                &[("PYTHONHASHSEED", "0")][..],
                &[][..],
                "PYTHONHASHSEED",
            ),
            (
                &["python3", "m.py"][..],
                &[("LANG", "C")][..],
                &[][..],
                "LANG",
            ),
            (
                &["python3", "m.py"][..],
                &[("LC_ALL", "C")][..],
                &[][..],
                "LC_ALL",
            ),
            (&["python3", "m.pyc"][..], &[][..], &[][..], ".pyc"),
            (&["python3", "m.py"][..], &[][..], &["json.py"][..], "json"),
            (
                &["python3", "d/m.py"][..],
                &[][..],
                &["d/random/__init__.py"][..],
                "random",
            ),
            (
                &["python3", "-c", "1"][..],
                &[][..],
                &["collections.py"][..],
                "collections",
            ),
            (
                &["python3", "m.py"][..],
                &[("PYTHONPATH", "lib")][..],
                &["lib/sitecustomize.py"][..],
                "sitecustomize",
            ),
        ] {
            let err = decide(argv, env, files).unwrap_err();
            assert!(err.contains(word), "{argv:?} {env:?} {files:?}: {err}");
        }
        // Shadowing counts only where imports look: a json.py elsewhere is fine, and -I drops
        // the script's directory.
        assert!(decide(&["python3", "m.py"], &[], &["other/json.py"]).is_ok());
        assert!(decide(&["python3", "-I", "m.py"], &[], &["json.py"]).is_ok());
    }

    #[test]
    fn the_runtime_is_usable_only_when_library_and_executable_agree() {
        let info = WarmInfo {
            version: "3.11.2 (main)".into(),
            ..WarmInfo::default()
        };
        let mut i = interpreter();
        i.version = "3.11.2 (main)".into();
        assert!(matches!(
            PythonRuntime::from_parts(Ok(i.clone()), Some(Ok(info.clone()))),
            PythonRuntime::Ready { .. }
        ));
        i.version = "3.11.4 (main)".into();
        let PythonRuntime::Unavailable(e) = PythonRuntime::from_parts(Ok(i), Some(Ok(info))) else {
            panic!("a version mismatch must make the runtime unusable")
        };
        assert!(e.contains("3.11.2") && e.contains("3.11.4"), "{e}");
        assert!(matches!(
            PythonRuntime::from_parts(Err("no python3".into()), None),
            PythonRuntime::Unavailable(_)
        ));
    }

    #[test]
    fn hex_is_lower_case_pairs() {
        assert_eq!(hex(b"\x00\xffa'"), "00ff6127");
    }
}
