//! The warm Python runtime end to end: real namespaces, real seccomp, the real embedded
//! interpreter. A warm job must behave like `python3` run cold (same stdout, stderr and exit
//! code on the parity corpus), get fresh randomness, hold no more than a cold job can reach
//! (the escape checks, as host root and as `nobody`), fall back to cold where it cannot honour
//! the command line (and say so), and report through the queue like any job.

mod node_support;
mod sandbox_support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use forkbox::sandbox::{Engine, EngineConfig, PythonRuntime, PythonSettings};
use forkbox_queue::schema::{FileData, Job, Limits, Outcome, Runtime};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_forkbox");

fn engine(slots: usize) -> Engine {
    engine_with(slots, PythonSettings::default())
}

fn engine_with(slots: usize, python: PythonSettings) -> Engine {
    let engine = Engine::start(EngineConfig {
        zygote_exe: BIN.into(),
        slots,
        python: Some(python),
        ..EngineConfig::default()
    })
    .expect("engine");
    if let PythonRuntime::Unavailable(why) = &engine.mechanisms().python {
        panic!("the warm runtime is unavailable on this host: {why}");
    }
    engine
}

fn py(args: &[&str]) -> Job {
    let mut argv = vec!["python3".to_owned()];
    argv.extend(args.iter().map(|s| s.to_string()));
    Job::argv(argv)
}

fn with_files(mut job: Job, files: &[(&str, &str)]) -> Job {
    for (k, v) in files {
        job.files
            .insert(k.to_string(), FileData::Text(v.to_string()));
    }
    job
}

fn warm(job: &Job) -> Job {
    Job {
        runtime: Some(Runtime::Python),
        ..job.clone()
    }
}

/// Runs `job` warm and cold and asserts the same status, exit code, stdout and stderr.
async fn assert_parity(engine: &Engine, name: &str, job: &Job) -> (Outcome, Outcome) {
    let warm_job = warm(job);
    let (w, c) = tokio::join!(engine.run(&warm_job), engine.run(job));
    let ran = w
        .runtime
        .as_ref()
        .expect("a runtime job reports its runtime");
    assert!(ran.warm, "{name}: ran cold: {:?}", ran.note);
    assert_eq!(c.runtime, None, "{name}");
    let show = |o: &Outcome| {
        format!(
            "status={} exit={} error={:?}\n--stdout--\n{}\n--stderr--\n{}",
            o.status, o.exit_code, o.error, o.stdout, o.stderr
        )
    };
    assert!(
        w.status == c.status
            && w.exit_code == c.exit_code
            && w.stdout == c.stdout
            && without_addresses(&w.stderr) == without_addresses(&c.stderr)
            && w.stdout_truncated == c.stdout_truncated,
        "{name}: warm and cold differ\n=== warm: {}\n=== cold: {}",
        show(&w),
        show(&c)
    );
    (w, c)
}

/// `text` with every `0x<hex>` replaced by `0x…`: object addresses differ between any two runs.
fn without_addresses(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("0x") {
        out.push_str(&rest[..i]);
        out.push_str("0x…");
        rest = rest[i + 2..].trim_start_matches(|c: char| c.is_ascii_hexdigit());
    }
    out.push_str(rest);
    out
}

/// The behaviours of `python3` a program can observe, each run warm and cold.
fn corpus() -> Vec<(&'static str, Job)> {
    let introspect = "import sys, os, subprocess\n\
        print(sys.argv, __name__, __file__, sys.path[0], sys.executable)\n\
        print(sys.orig_argv, __cached__, type(__loader__).__name__, __spec__)\n\
        print(sorted(globals()))\n\
        print(os.getcwd(), sorted(os.environ))\n\
        print(sys.stdout.line_buffering, sys.stderr.line_buffering, sys.stdout.encoding)\n\
        r = subprocess.run([sys.executable, '-c', 'import sys; print(sys.argv)', 'q'],\n\
                           capture_output=True, text=True)\n\
        print('child:', r.returncode, r.stdout.strip())\n";
    let mut cases = vec![
        (
            "script with arguments",
            with_files(
                py(&["main.py", "a", "-u", "b c"]),
                &[("main.py", introspect)],
            ),
        ),
        (
            "script in a subdirectory, by a path with a dot",
            with_files(py(&["./sub/main.py"]), &[("sub/main.py", introspect)]),
        ),
        (
            "script by absolute path, interpreter by absolute path",
            with_files(
                Job::argv(["/usr/bin/python3", "/work/main.py", "x"]),
                &[("main.py", introspect)],
            ),
        ),
        ("-c with arguments", py(&["-c", introspect, "x", "y"])),
        (
            "-m module with a sibling import",
            with_files(
                py(&["-m", "pkg.tool", "arg"]),
                &[
                    ("pkg/__init__.py", ""),
                    ("pkg/helper.py", "VALUE = 41\n"),
                    (
                        "pkg/tool.py",
                        "import sys\nfrom pkg.helper import VALUE\n\
                         print(VALUE + 1, sys.argv, __name__, sys.path[0])\n",
                    ),
                ],
            ),
        ),
        (
            "a directory with __main__.py",
            with_files(
                py(&["app", "z"]),
                &[(
                    "app/__main__.py",
                    "import sys\nprint(sys.argv, sys.path[0], __name__)\n",
                )],
            ),
        ),
        (
            "sys.exit(n)",
            py(&["-c", "import sys; print('bye'); sys.exit(3)"]),
        ),
        (
            "sys.exit(message)",
            py(&["-c", "import sys; sys.exit('fatal: no input')"]),
        ),
        (
            "uncaught exception with a chained cause",
            with_files(
                py(&["main.py"]),
                &[(
                    "main.py",
                    "def inner(x):\n    return 1 / x\n\
                     def outer():\n    try:\n        inner(0)\n    except ZeroDivisionError as e:\n\
                     \x20       raise ValueError('bad value') from e\n\
                     print('before')\nouter()\n",
                )],
            ),
        ),
        (
            "uncaught exception in -c",
            py(&["-c", "import json\njson.loads('{')"]),
        ),
        (
            "syntax error",
            with_files(py(&["main.py"]), &[("main.py", "print('x'\n")]),
        ),
        ("missing script", py(&["nope.py"])),
        ("missing module", py(&["-m", "no_such_module_here"])),
        (
            "os._exit drops buffered output",
            py(&[
                "-c",
                "import os, sys\nprint('lost')\nsys.stderr.write('kept\\n')\nos._exit(7)",
            ]),
        ),
        (
            "buffered output without a newline is flushed at exit",
            py(&[
                "-c",
                "import sys\nsys.stdout.write('partial')\nsys.stderr.write('err-partial')",
            ]),
        ),
        (
            "atexit handlers run after the main program, in reverse order",
            py(&[
                "-c",
                "import atexit\natexit.register(print, 'first registered')\n\
                 atexit.register(print, 'second registered')\nprint('main')",
            ]),
        ),
        (
            "finalizers of the program's objects run at exit",
            py(&[
                "-c",
                "class Noisy:\n    def __del__(self):\n        print('finalized', self.name)\n\
                 a = Noisy(); a.name = 'global'\nprint('end of main')",
            ]),
        ),
        (
            "an atexit handler that raises",
            py(&["-c", "import atexit\ndef bad():\n    raise RuntimeError('in atexit')\natexit.register(bad)\nprint('main')"]),
        ),
        ("sys.exit(256) wraps", py(&["-c", "import sys; sys.exit(256)"])),
        ("sys.exit(-1)", py(&["-c", "import sys; sys.exit(-1)"])),
        ("sys.exit(None)", py(&["-c", "raise SystemExit"])),
        (
            "stdout closed before exit: 120",
            py(&["-c", "import os\nprint('unflushed')\nos.close(1)"]),
        ),
        (
            "threads are joined at exit",
            py(&[
                "-c",
                "import threading, time\n\
                 def late():\n    time.sleep(0.2)\n    print('thread done', flush=True)\n\
                 threading.Thread(target=late).start()\nprint('main done')",
            ]),
        ),
        (
            "multiprocessing pool",
            with_files(
                py(&["main.py"]),
                &[(
                    "main.py",
                    "import multiprocessing as mp\n\
                     def sq(x):\n    return x * x\n\
                     if __name__ == '__main__':\n\
                     \x20   with mp.Pool(2) as pool:\n        print(pool.map(sq, range(10)))\n\
                     \x20   ctx = mp.get_context('spawn')\n\
                     \x20   with ctx.Pool(1) as pool:\n        print(pool.map(sq, [7]))\n",
                )],
            ),
        ),
        (
            "-u interleaves stdout and stderr unbuffered",
            py(&[
                "-u",
                "-c",
                "import sys\nprint('o1'); sys.stderr.write('e1\\n'); print('o2')",
            ]),
        ),
        (
            "-W error turns a warning into an exception",
            py(&[
                "-W",
                "error",
                "-c",
                "import warnings\nwarnings.warn('careful')",
            ]),
        ),
        (
            "-I drops the script directory from sys.path",
            with_files(
                py(&["-I", "main.py"]),
                &[("main.py", "import sys\nprint(sys.path[0])\n")],
            ),
        ),
        (
            "PYTHONPATH and PYTHONUNBUFFERED",
            Job {
                env: [
                    ("PYTHONPATH".to_owned(), "./lib:x/../lib::".to_owned()),
                    ("PYTHONUNBUFFERED".to_owned(), "1".to_owned()),
                ]
                .into(),
                ..with_files(
                    py(&[
                        "-c",
                        "import sys, mylib\nprint(mylib.X, sys.path[:4], sys.stdout.write_through)",
                    ]),
                    &[("lib/mylib.py", "X = 'from lib'\n")],
                )
            },
        ),
        (
            "non-ASCII text",
            py(&[
                "-c",
                "print('héllo ✓ 你好'); import sys; print(sys.getfilesystemencoding())",
            ]),
        ),
        (
            "TZ is honoured",
            Job {
                env: [("TZ".to_owned(), "Asia/Kolkata".to_owned())].into(),
                ..py(&["-c", "import time\nprint(time.tzname, time.timezone)"])
            },
        ),
        (
            "the sandbox's time zone without TZ",
            py(&[
                "-c",
                "import time\nprint(time.tzname, time.timezone, time.daylight, \
                 time.localtime(0).tm_hour)",
            ]),
        ),
        (
            "the environment in os.environ, the C environ and a child",
            Job {
                env: [
                    ("V".to_owned(), "ünï = cödé".to_owned()),
                    ("EMPTY".to_owned(), String::new()),
                ]
                .into(),
                ..py(&[
                    "-c",
                    "import os, subprocess\n\
                     print(sorted(os.environ.items()), os.getenv('V'), os.environb[b'V'])\n\
                     os.environ['ADDED'] = '1'; del os.environ['EMPTY']\n\
                     print(subprocess.run(['sh', '-c', 'env | sort'], capture_output=True, \
                     text=True).stdout)",
                ])
            },
        ),
        (
            "signals as python3 sets them",
            py(&[
                "-c",
                "import signal\nprint(signal.getsignal(signal.SIGINT), \
                 signal.getsignal(signal.SIGPIPE), signal.getsignal(signal.SIGXFSZ))",
            ]),
        ),
        (
            "timeout",
            Job {
                // Long enough for a cold interpreter to start on a loaded host.
                timeout_ms: Some(4000),
                ..py(&["-c", "print('start', flush=True)\nwhile True: pass"])
            },
        ),
        (
            "output limit",
            Job {
                limits: Limits {
                    output_bytes: Some(1000),
                    ..Limits::default()
                },
                ..py(&[
                    "-c",
                    "import sys\nfor i in range(100000): sys.stdout.write('line %d\\n' % i)",
                ])
            },
        ),
        (
            "memory limit",
            Job {
                limits: Limits {
                    memory_mb: Some(256),
                    ..Limits::default()
                },
                ..py(&["-c", "b = bytearray(1 << 30)\nprint('allocated', len(b))"])
            },
        ),
    ];
    let mut stdin_job = py(&[
        "-c",
        "name = input('who? ')\nprint('hello', name)\nimport sys\nprint(repr(sys.stdin.read()))",
    ]);
    stdin_job.stdin = Some(FileData::Text("alice\nrest of\ninput".into()));
    cases.push(("stdin and input()", stdin_job));
    let mut program_on_stdin = py(&["-", "arg"]);
    program_on_stdin.stdin = Some(FileData::Text(
        "import sys\nprint(sys.argv, __name__, repr(sys.path[0]))\n".into(),
    ));
    cases.push(("the program read from stdin", program_on_stdin));
    cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_jobs_behave_like_python3_on_the_parity_corpus() {
    let engine = tokio::task::spawn_blocking(|| engine(2)).await.unwrap();
    for (name, job) in corpus() {
        let (w, _) = assert_parity(&engine, name, &job).await;
        // The corpus itself must exercise what it claims.
        match name {
            "timeout" => assert_eq!((w.status.as_str(), w.exit_code), ("timeout", 124)),
            "output limit" => assert_eq!(w.status.as_str(), "output_limit"),
            "memory limit" => assert!(
                w.status.as_str() == "memory_limit" || w.stderr.contains("MemoryError"),
                "{}",
                w.stderr
            ),
            "sys.exit(n)" => assert_eq!(w.exit_code, 3),
            "uncaught exception with a chained cause" => {
                assert_eq!(w.exit_code, 1);
                assert!(w
                    .stderr
                    .contains("The above exception was the direct cause"));
                assert!(!w.stderr.contains("forkbox-warm"), "{}", w.stderr);
            }
            "os._exit drops buffered output" => {
                assert_eq!((w.exit_code, w.stdout.as_str()), (7, ""))
            }
            "buffered output without a newline is flushed at exit" => {
                assert_eq!(w.stdout, "partial")
            }
            "multiprocessing pool" => assert!(w.stdout.contains("[49]"), "{}", w.stderr),
            "script with arguments" => {
                assert!(w.stdout.contains("child: 0 ['-c', 'q']"), "{}", w.stdout)
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn humaneval_programs_give_the_same_results_warm_and_cold() {
    let Some(path) = std::env::var_os("FORKBOX_HUMANEVAL")
        .map(std::path::PathBuf::from)
        .filter(|p| p.exists())
    else {
        forkbox_testkit::skipped(
            "FORKBOX_HUMANEVAL is not set or absent (the Makefile exports it)",
        );
        return;
    };
    let problems = forkbox_loadgen::humaneval::load(&path).unwrap();
    assert_eq!(problems.len(), 164);
    let engine = tokio::task::spawn_blocking(|| engine(2)).await.unwrap();
    for p in &problems {
        let (w, _) = assert_parity(&engine, &p.task_id, &p.job()).await;
        assert_eq!(w.exit_code, 0, "{}: {}", p.task_id, w.stderr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numpy_preloaded_is_reseeded_for_each_warm_job() {
    let settings = PythonSettings::default();
    let importable = Command::new(&settings.executable)
        .args(["-c", "import numpy"])
        .status()
        .is_ok_and(|s| s.success());
    if !importable {
        assert!(
            std::env::var_os("FORKBOX_REQUIRE_RUNTIMES").is_none(),
            "numpy is not importable by {} (make deps installs python3-numpy)",
            settings.executable.display()
        );
        forkbox_testkit::skipped(format!(
            "numpy is not importable by {}",
            settings.executable.display()
        ));
        return;
    }
    let engine = tokio::task::spawn_blocking(move || {
        let mut settings = settings;
        settings.preload.push("numpy".into());
        engine_with(2, settings)
    })
    .await
    .unwrap();
    // The legacy global generator is seeded when numpy is imported: in the zygote, here.
    let job = warm(&py(&[
        "-c",
        "import sys, numpy\nprint('numpy' in sys.modules)\n\
         print(numpy.random.random(), numpy.random.randint(1 << 30))",
    ]));
    let (a, b) = tokio::join!(engine.run(&job), engine.run(&job));
    for o in [&a, &b] {
        assert_eq!(o.status.as_str(), "ok", "{}", o.stderr);
        assert!(o.runtime.as_ref().unwrap().warm);
        assert!(o.stdout.starts_with("True\n"), "{}", o.stdout);
    }
    assert_ne!(
        a.stdout, b.stdout,
        "numpy's generator repeated across two warm jobs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_warm_jobs_get_fresh_randomness() {
    let engine = tokio::task::spawn_blocking(|| engine(2)).await.unwrap();
    let program = "import random, uuid, tempfile, os, secrets, multiprocessing\n\
        print(random.random()); print(random.getrandbits(64)); print(uuid.uuid4())\n\
        print(tempfile.NamedTemporaryFile().name); print(tempfile.mkdtemp())\n\
        print(os.urandom(8).hex()); print(secrets.token_hex(8))\n\
        print(multiprocessing.current_process().authkey.hex())\n";
    let job = warm(&py(&["-c", program]));
    let (a, b) = tokio::join!(engine.run(&job), engine.run(&job));
    for o in [&a, &b] {
        assert_eq!(o.status.as_str(), "ok", "{}", o.stderr);
        assert!(o.runtime.as_ref().unwrap().warm);
    }
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.stdout.lines().collect(), b.stdout.lines().collect());
    assert_eq!(la.len(), 8, "{}", a.stdout);
    for (x, y) in la.iter().zip(&lb) {
        assert_ne!(x, y, "a value repeated across two warm jobs");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_lines_the_warm_path_cannot_honour_run_cold_and_say_why() {
    let engine = tokio::task::spawn_blocking(|| engine(1)).await.unwrap();
    let cases: Vec<(Job, &str, &str)> = vec![
        (
            py(&[
                "-O",
                "-c",
                "assert False, 'kept'\nprint('asserts stripped')",
            ]),
            "-O",
            "asserts stripped\n",
        ),
        (
            Job {
                env: [("PYTHONHASHSEED".to_owned(), "0".to_owned())].into(),
                ..py(&["-c", "print(hash('forkbox'))"])
            },
            "PYTHONHASHSEED",
            // With a fixed seed the hash is fixed: proof that the job ran a fresh interpreter.
            "",
        ),
        (
            with_files(
                py(&["main.py"]),
                &[
                    ("main.py", "import json\nprint(json.MARK)"),
                    ("json.py", "MARK = 'the job own json'"),
                ],
            ),
            "json",
            "the job own json\n",
        ),
        (Job::shell("python3 -c 'print(5)'"), "cmd", "5\n"),
        (
            Job::argv(["/bin/echo", "not python"]),
            "not the warm interpreter",
            "not python\n",
        ),
    ];
    for (job, why, stdout) in cases {
        let o = engine.run(&warm(&job)).await;
        let ran = o.runtime.clone().expect("runtime reported");
        assert!(!ran.warm, "{:?} ran warm", job.command());
        let note = ran.note.unwrap_or_default();
        assert!(note.contains(why), "{:?}: note {note:?}", job.command());
        assert_eq!(o.status.as_str(), "ok", "{:?}: {}", job.command(), o.stderr);
        if !stdout.is_empty() {
            assert_eq!(o.stdout, stdout, "{:?}", job.command());
        }
    }
    let seeded = Job {
        env: [("PYTHONHASHSEED".to_owned(), "0".to_owned())].into(),
        ..py(&["-c", "print(hash('forkbox'))"])
    };
    let warm_seeded = warm(&seeded);
    let (a, b) = tokio::join!(engine.run(&warm_seeded), engine.run(&seeded));
    assert_eq!(
        a.stdout, b.stdout,
        "PYTHONHASHSEED=0 must be honoured (cold)"
    );
}

/// The escape checks of the sandbox suite, made from inside a warm interpreter: the process
/// running the job's code holds nothing a cold job's does not.
const ESCAPE_CHECKS: &str = r#"
import ctypes, json, os, resource, socket, sys
out = {}
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
out["caps"] = [status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")]
out["no_new_privs"] = status["NoNewPrivs"].strip()
out["seccomp"] = status["Seccomp"].strip()
open_fds = []
for fd in range(3, 1024):
    try:
        os.fstat(fd)
        open_fds.append(fd)
    except OSError:
        pass
out["extra_fds"] = open_fds
out["session_leader"] = os.getsid(0) == os.getpid()
out["pid"] = os.getpid()
out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out["pid1"] = open("/proc/1/cmdline").read().replace("\0", " ").strip()
out["passwd_owner"] = os.stat("/etc/passwd").st_uid
try:
    open("/etc/shadow").read()
    out["shadow"] = "read"
except OSError as e:
    out["shadow"] = e.errno
out["hostname"] = socket.gethostname()
out["interfaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
try:
    s = socket.socket(); s.settimeout(2)
    out["redis"] = s.connect_ex(("127.0.0.1", 6379))
except OSError as e:
    out["redis"] = e.errno
try:
    open("/etc/hosts", "a").write("x\n")
    out["etc_hosts"] = "written"
except OSError as e:
    out["etc_hosts"] = e.errno
out["visible"] = [d for d in ("/root", "/home", "/run", "/var", "/srv", "/sys") if os.path.exists(d)]
out["environ"] = sorted(os.environ)
out["proc_environ"] = open("/proc/self/environ", "rb").read().decode(errors="replace")
out["rlimit_data"] = resource.getrlimit(resource.RLIMIT_DATA)[0]
out["rlimit_as"] = resource.getrlimit(resource.RLIMIT_AS)[0]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
denied = {}
for name, nr in json.loads(sys.argv[1]):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), 0, 0, 0, 0, 0, 0)
    denied[name] = (r, ctypes.get_errno())
out["denied"] = denied
print(json.dumps(out))
"#;

#[test]
fn the_escape_checks_pass_inside_a_warm_job_as_root_and_as_nobody() {
    let denied = forkbox::sandbox::denied_numbers().unwrap();
    let denied_json = serde_json::to_string(&denied).unwrap();
    let hosts_before = std::fs::read("/etc/hosts").unwrap();
    for who in sandbox_support::identities() {
        let out = sandbox_support::forkbox(who)
            .args([
                "run",
                "--json",
                "--runtime",
                "python",
                "--memory-mb",
                "300",
                "--",
            ])
            .args(["python3", "-c", ESCAPE_CHECKS, &denied_json])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let who = format!("{who:?}");
        let result: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{who}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        assert_eq!(result["runtime"]["warm"], true, "{who}: {result}");
        assert_eq!(result["status"], "ok", "{who}: {}", result["stderr"]);
        let r: Value = serde_json::from_str(result["stdout"].as_str().unwrap().trim()).unwrap();
        for cap in r["caps"].as_array().unwrap() {
            assert_eq!(cap, "0000000000000000", "{who}: {r}");
        }
        assert_eq!(r["no_new_privs"], "1", "{who}");
        assert_eq!(r["seccomp"], "2", "{who}");
        assert_eq!(
            r["extra_fds"],
            serde_json::json!([]),
            "{who}: inherited descriptors"
        );
        assert_eq!(r["session_leader"], true, "{who}");
        let pids: Vec<i64> = r["pids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_i64().unwrap())
            .collect();
        assert!(
            pids.contains(&1) && pids.len() < 10 && pids.iter().all(|p| *p < 100),
            "{who}: {pids:?}"
        );
        assert_eq!(r["pid1"], "forkbox __zygote", "{who}");
        // Host root is not mapped: its files show as the overflow owner, and a file only its
        // owner may read stays closed to the sandbox's root.
        assert_eq!(
            r["passwd_owner"], 65534,
            "{who}: host root mapped into a warm job"
        );
        assert_eq!(r["shadow"], libc::EACCES, "{who}: /etc/shadow readable");
        assert_eq!(r["hostname"], "forkbox");
        assert_eq!(r["interfaces"], serde_json::json!(["lo"]), "{who}");
        assert_eq!(
            r["redis"],
            sandbox_support::host_tcp_errno(sandbox_support::network_default()),
            "{who}: host network reachable"
        );
        assert!(r["etc_hosts"].is_i64(), "{who}: /etc/hosts writable");
        assert_eq!(r["visible"], serde_json::json!([]), "{who}");
        assert_eq!(
            r["environ"],
            serde_json::json!(["HOME", "LANG", "PATH", "TMPDIR"]),
            "{who}: the job's environment only"
        );
        // The process image came from the zygote's exec, with an empty environment: nothing
        // of the node's (its Redis URL, credentials) is in it.
        assert_eq!(r["proc_environ"], "", "{who}");
        // Memory is never an address-space limit; without cgroups it is RLIMIT_DATA, as for a
        // cold job.
        assert_eq!(r["rlimit_as"], -1, "{who}");
        let delegated = matches!(
            forkbox::sandbox::probe_cgroup(
                std::path::Path::new("/proc/self/mountinfo"),
                std::path::Path::new("/proc/self/cgroup"),
            )
            .delegation,
            forkbox::sandbox::Delegation::Delegated(_)
        );
        let data = if delegated { -1 } else { 300 * 1024 * 1024 };
        assert_eq!(r["rlimit_data"], data, "{who}");
        for (name, v) in r["denied"].as_object().unwrap() {
            assert_eq!(v[0], -1, "{who}: {name} returned {v}");
            assert_eq!(v[1], libc::EPERM, "{who}: {name} errno {v}");
        }
    }
    assert_eq!(std::fs::read("/etc/hosts").unwrap(), hosts_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_job_through_the_queue_has_its_status_in_redis() {
    let server = node_support::start_redis();
    let url = &server.url();
    let queue_name = format!("warm-python-{}", std::process::id());
    let worker = node_support::WorkerProc::start(
        url,
        &format!("warm-{}", std::process::id()),
        &["--slots", "1", "--queues", &queue_name],
    );
    let q = node_support::queue(url, &queue_name).await;
    let job = Job {
        runtime: Some(Runtime::Python),
        ..with_files(
            py(&["main.py", "7"]),
            &[("main.py", "import sys\nprint(int(sys.argv[1]) * 6)\n")],
        )
    };
    let id = q.enqueue(&job).await.unwrap();
    let result = q
        .wait_result(&id, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no result; worker log:\n{}", worker.log()));
    assert_eq!(result.outcome.status.as_str(), "ok", "{:?}", result.outcome);
    assert_eq!(result.outcome.stdout, "42\n");
    // The stored JSON itself, as any Redis client reads it.
    let mut conn = node_support::conn(url).await;
    let keys = forkbox_queue::Keys::new(&queue_name).unwrap();
    let raw: String = forkbox_queue::redis::cmd("GET")
        .arg(keys.result(&id))
        .query_async(&mut conn)
        .await
        .unwrap();
    let stored: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(stored["status"], "ok");
    assert_eq!(
        stored["runtime"],
        serde_json::json!({"name": "python", "warm": true})
    );
    let fields: BTreeMap<String, Value> = serde_json::from_str(&raw).unwrap();
    assert!(fields.contains_key("exit_code"));
}

#[test]
fn check_reports_the_python_runtime() {
    let out = Command::new(BIN).arg("check").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ok    python runtime: /usr/bin/python3 (Python 3."),
        "{text}"
    );
    assert!(
        text.contains("info  python preload: typing,math,"),
        "{text}"
    );
    assert!(
        text.contains("ok    python runtime: a warm job ran"),
        "{text}"
    );
    let off = Command::new(BIN)
        .args(["check", "--python-preload", "none"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&off.stdout);
    assert!(text.contains("info  python runtime: off"), "{text}");
}

/// A preload module the node cannot import is said when the node starts, not only by `check`.
#[test]
fn a_preload_module_that_cannot_be_imported_is_said_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("fb.sock");
    let log = dir.path().join("daemon.log");
    let mut daemon = Command::new(BIN)
        .args(["daemon", "--slots", "1", "--socket"])
        .arg(&socket)
        .args(["--python-preload", "json,forkbox_no_such_module"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    for _ in 0..600 {
        if socket.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("warm python runtime: 1 of 2 preload module(s) imported"),
        "{text}"
    );
    assert!(
        text.contains("python preload: forkbox_no_such_module not imported: ModuleNotFoundError"),
        "{text}"
    );
}

/// Whether `pid`'s address space maps the CPython library.
fn maps_libpython(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/maps: {e}"))
        .lines()
        .any(|l| l.contains("libpython"))
}

/// The live children of `pid` with their maps (a reaped or exiting one has none to read).
fn live_children(pid: u32) -> Vec<(u32, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter_map(|child: u32| {
            let maps = std::fs::read_to_string(format!("/proc/{child}/maps")).ok()?;
            (!maps.is_empty()).then_some((child, maps))
        })
        .collect()
}

/// Sandboxes for jobs without the runtime are forked from a zygote that never loaded the
/// interpreter: a `/bin/true` job does not pay for copying and tearing down its mappings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_runtime_sandboxes_are_forked_from_the_interpreter() {
    let engine = engine(1);
    // Both kinds of job run, so both pools are built and in use.
    let plain = engine.run(&Job::argv(["/bin/true"])).await;
    assert_eq!(plain.status.as_str(), "ok", "{:?}", plain.error);
    let w = engine.run(&warm(&py(&["-c", "print(6*7)"]))).await;
    assert_eq!((w.status.as_str(), w.stdout.as_str()), ("ok", "42\n"));
    assert!(
        w.runtime.as_ref().is_some_and(|r| r.warm),
        "{:?}",
        w.runtime
    );

    let zygote = engine.zygote_pid().expect("zygote pid");
    let runtime = engine
        .runtime_zygote_pid()
        .expect("a zygote of its own for the runtime");
    assert_ne!(zygote, runtime);
    assert!(!maps_libpython(zygote), "the plain zygote maps libpython");
    assert!(
        maps_libpython(runtime),
        "the runtime's zygote lacks libpython"
    );
    // Every ready sandbox waits as a fork of its zygote: the plain ones without it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (plain_inits, runtime_inits) = loop {
        let (p, r) = (live_children(zygote), live_children(runtime));
        if !p.is_empty() && !r.is_empty() {
            break (p, r);
        }
        assert!(std::time::Instant::now() < deadline, "no ready sandboxes");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for (init, maps) in plain_inits {
        assert!(
            !maps.contains("libpython"),
            "plain sandbox {init} maps libpython"
        );
    }
    for (init, maps) in runtime_inits {
        assert!(
            maps.contains("libpython"),
            "runtime sandbox {init} lacks libpython"
        );
    }
}

/// The zygotes a process has started: its children (forked by any of its threads) running
/// `forkbox __zygote`.
fn zygotes_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut found: Vec<u32> = tasks
        .filter_map(|t| {
            let path = t.ok()?.path().join("children");
            std::fs::read_to_string(path).ok()
        })
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .filter(|child| {
            std::fs::read(format!("/proc/{child}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|arg| arg == b"__zygote"))
        })
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}

/// `forkbox run --runtime python` runs its one job in the runtime's zygote, warm or cold, so it
/// starts that zygote alone: no plain zygote, with its pool of sandboxes, for a job that
/// never uses it.
#[test]
fn run_with_the_runtime_starts_only_the_runtimes_zygote() {
    let run = Command::new(BIN)
        .args(["run", "--runtime", "python", "--"])
        .args(["python3", "-c", "import time; time.sleep(3); print('done')"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let zygotes = loop {
        let zygotes = zygotes_of(run.id());
        // Once a zygote has a sandbox, every zygote this run starts has been started.
        if zygotes.iter().any(|&z| !live_children(z).is_empty()) {
            break zygotes;
        }
        assert!(std::time::Instant::now() < deadline, "no sandbox appeared");
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
    assert_eq!(zygotes.len(), 1, "zygotes started: {zygotes:?}");
}

/// Host pids of the waiting launchers below this process: pid 2 of their own pid namespace,
/// with the seccomp filter on (a sandbox's init is pid 1 and has none).
fn waiting_launchers() -> Vec<i32> {
    let me = std::process::id() as i32;
    let parent_of = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().collect::<Vec<_>>())
                .unwrap_or_default()
        };
        if field("NSpid:").last() != Some(&"2") || field("Seccomp:") != ["2"] {
            continue;
        }
        let (mut p, mut hops) = (pid, 0);
        while let Some(up) = parent_of(p).filter(|&up| up > 1 && hops < 8) {
            if up == me {
                found.push(pid);
                break;
            }
            (p, hops) = (up, hops + 1);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_to_a_waiting_launcher_never_reaches_the_next_job() {
    let engine = tokio::task::spawn_blocking(|| engine(1)).await.unwrap();
    let job = warm(&py(&["-c", "print(6*7)"]));
    let first = engine.run(&job).await;
    assert_eq!(
        (first.status.as_str(), first.stdout.as_str()),
        ("ok", "42\n")
    );
    // Until a job arrives, a signal kills a launcher as it would kill a cold one: the zygote
    // builds another. It must not be caught and kept pending for the job the launcher takes.
    let mut signalled = Vec::new();
    for _ in 0..50 {
        signalled = waiting_launchers();
        if signalled.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!signalled.is_empty(), "no waiting launcher found");
    for &pid in &signalled {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGINT,
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..3 {
        let o = engine.run(&job).await;
        assert_eq!(
            (o.status.as_str(), o.exit_code, o.stdout.as_str()),
            ("ok", 0, "42\n"),
            "after SIGINT to launchers {signalled:?}: {}",
            o.stderr
        );
    }
}
