//! Every common language runtime starts and runs at the default limits, on whichever kind of
//! host runs the suite: with cgroup v2 delegated (memory.max, no memory rlimit) or with the
//! rlimit fallback (RLIMIT_DATA, which does not count the address space V8, the JVM, Go and
//! BEAM reserve up front). Each program computes something and its output bytes are checked.
//! A runtime missing from the host is reported as SKIPPED, or fails the test where the suite
//! requires every runtime (`FORKBOX_REQUIRE_RUNTIMES=1`, set by the Makefile, which installs
//! them).

mod limits_support;
mod sandbox_support;

use limits_support::{installed, run_shell, runtimes_required, Ran};
use sandbox_support::{emulated_guest, identities, Identity};

/// One row of the matrix: the programs it needs, the shell script, the exact stdout.
struct Runtime {
    name: &'static str,
    needs: &'static [&'static str],
    script: &'static str,
    stdout: &'static str,
}

const MATRIX: &[Runtime] = &[
    Runtime {
        name: "bash",
        needs: &["bash"],
        script: "bash -c 's=0; for i in $(seq 1 100); do s=$((s+i)); done; echo bash $s'",
        stdout: "bash 5050\n",
    },
    Runtime {
        name: "python3",
        needs: &["python3"],
        script: "python3 -c 'import json; print(\"python\", json.dumps(sum(range(101))))'",
        stdout: "python 5050\n",
    },
    Runtime {
        name: "perl",
        needs: &["perl"],
        script: "perl -e 'my $s = 0; $s += $_ for 1..100; print \"perl $s\\n\"'",
        stdout: "perl 5050\n",
    },
    Runtime {
        name: "ruby",
        needs: &["ruby"],
        script: "ruby -e 'puts \"ruby #{(1..100).sum}\"'",
        stdout: "ruby 5050\n",
    },
    Runtime {
        name: "node",
        needs: &["node"],
        script: "node -e 'let s = 0; for (let i = 1; i <= 100; i++) s += i; \
                 console.log(\"node\", s)'",
        stdout: "node 5050\n",
    },
    Runtime {
        name: "gcc",
        needs: &["gcc"],
        script: "cat > sum.c <<'EOF'\n\
                 #include <stdio.h>\n\
                 int main(void) { int s = 0; for (int i = 1; i <= 100; i++) s += i;\n\
                 printf(\"c %d\\n\", s); return 0; }\n\
                 EOF\n\
                 gcc -O1 -o sum sum.c && ./sum",
        stdout: "c 5050\n",
    },
    Runtime {
        name: "g++",
        needs: &["g++"],
        script: "cat > sum.cc <<'EOF'\n\
                 #include <iostream>\n\
                 #include <numeric>\n\
                 #include <vector>\n\
                 int main() { std::vector<int> v(100); std::iota(v.begin(), v.end(), 1);\n\
                 std::cout << \"c++ \" << std::accumulate(v.begin(), v.end(), 0) << '\\n'; }\n\
                 EOF\n\
                 g++ -O1 -o sum sum.cc && ./sum",
        stdout: "c++ 5050\n",
    },
    Runtime {
        name: "java",
        needs: &["javac", "java"],
        script: "cat > Sum.java <<'EOF'\n\
                 public class Sum { public static void main(String[] a) {\n\
                 int s = 0; for (int i = 1; i <= 100; i++) s += i;\n\
                 System.out.println(\"java \" + s); } }\n\
                 EOF\n\
                 javac Sum.java && java Sum || { rc=$?; cat hs_err_pid*.log >&2; exit $rc; }",
        stdout: "java 5050\n",
    },
    Runtime {
        name: "go",
        needs: &["go"],
        // GOCACHE defaults to $HOME/.cache/go-build: the job's own disk.
        script: "cat > sum.go <<'EOF'\n\
                 package main\n\
                 import \"fmt\"\n\
                 func main() { s := 0; for i := 1; i <= 100; i++ { s += i }; fmt.Println(\"go\", s) }\n\
                 EOF\n\
                 go run sum.go",
        stdout: "go 5050\n",
    },
    Runtime {
        name: "erlang",
        needs: &["erl"],
        script: "erl -noshell -eval 'io:format(\"erlang ~p~n\", [lists:sum(lists:seq(1, 100))]), \
                 halt().'",
        stdout: "erlang 5050\n",
    },
];

/// The rows this host can run; a missing runtime is SKIPPED, or a failure when required.
fn available() -> Vec<&'static Runtime> {
    let mut rows = Vec::new();
    let mut missing = Vec::new();
    for rt in MATRIX {
        match rt.needs.iter().find(|p| !installed(p)) {
            None => rows.push(rt),
            Some(p) => missing.push(format!("{} ({p} not installed)", rt.name)),
        }
    }
    if !missing.is_empty() {
        assert!(
            !runtimes_required(),
            "runtimes required but missing: {}; `make deps` installs them",
            missing.join(", ")
        );
        forkbox_testkit::skipped(format!("runtime rows {}", missing.join(", ")));
    }
    rows
}

fn check(rt: &Runtime, ran: &Ran) {
    assert_eq!(
        (ran.status(), ran.stdout()),
        ("ok", rt.stdout),
        "{} at the default limits: {}",
        rt.name,
        ran.dump()
    );
}

/// A deadline beyond what any row needs in the VM tier's emulated guest, where `javac` alone
/// takes longer than the default 10 s. Everywhere else the rows run at the default deadline
/// too: no option at all.
const SLOW_GUEST_TIMEOUT: &str = "300000";

/// The options of a matrix row: none but the emulated guest's deadline.
fn default_limits() -> Vec<&'static str> {
    if emulated_guest() {
        vec!["--timeout-ms", SLOW_GUEST_TIMEOUT]
    } else {
        Vec::new()
    }
}

/// The JVM's own crash report: a fault in the JVM itself (its JIT-compiled code), printed
/// with an `hs_err` file, as against a limit refusing it (a reservation or an out-of-memory
/// error, which never print this).
const JVM_CRASH: &str = "A fatal error has been detected by the Java Runtime Environment";

/// How many times a job a runtime crashed in is run again in the emulated guest.
const EMULATOR_CRASH_RERUNS: usize = 2;

/// Whether a job ended in a runtime's own crash: the JVM's crash report, or a fault signal
/// (SIGSEGV, SIGBUS, SIGILL) in the program or, through the shell, in its exit code. No
/// limit ends a job that way.
fn crashed(ran: &Ran) -> bool {
    let faults = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL];
    let signal = ran.json["signal"].as_i64();
    let code = ran.json["exit_code"].as_i64();
    (ran.status() != "ok" && ran.dump().contains(JVM_CRASH))
        || faults
            .iter()
            .any(|&f| signal == Some(i64::from(f)) || code == Some(128 + i64::from(f)))
}

/// Runs `script` as `who`; in the emulated guest, a run a runtime crashed in runs again, at
/// most [`EMULATOR_CRASH_RERUNS`] times, each said as `RETRIED`: a third crash, or any other
/// ending, is what the caller checks. (The emulator's JVM crashes came in about one run of
/// the java row in three, faults in JIT-compiled code the host never shows.)
fn run_past_emulator_crashes(who: Identity, opts: &[&str], what: &str, script: &str) -> Ran {
    let mut ran = run_shell(who, opts, script);
    for _ in 0..EMULATOR_CRASH_RERUNS {
        if !(emulated_guest() && crashed(&ran)) {
            break;
        }
        println!(
            "RETRIED: {who:?} {what}: the runtime crashed in the emulated guest: {}",
            ran.dump()
        );
        ran = run_shell(who, opts, script);
    }
    ran
}

/// One job per runtime at the default limits (in the emulated guest, all but the deadline).
fn matrix_as(who: Identity) {
    for rt in available() {
        let started = std::time::Instant::now();
        let ran = run_past_emulator_crashes(who, &default_limits(), rt.name, rt.script);
        check(rt, &ran);
        println!(
            "{who:?} {}: ok, cpu {} ms, peak {} kB, {:.1} s",
            rt.name,
            ran.u64("cpu_ms"),
            ran.u64("max_rss_kb"),
            started.elapsed().as_secs_f64()
        );
    }
}

#[test]
fn every_runtime_runs_at_the_default_limits_as_root() {
    if identities().contains(&Identity::Root) {
        matrix_as(Identity::Root);
    }
}

#[test]
fn every_runtime_runs_at_the_default_limits_unprivileged() {
    matrix_as(Identity::Unprivileged);
}

/// A memory hog ends as `memory_limit` in python and in node: on a cgroup host by the OOM
/// killer, on the fallback by RLIMIT_DATA with the runtime's own out-of-memory message.
#[test]
fn memory_hogs_end_as_memory_limit() {
    let hogs: &[(&str, &str)] = &[
        (
            "python3",
            "python3 -c 'a = []\nwhile True: a.append(bytearray(1 << 20))'",
        ),
        (
            "node",
            "node -e 'const a = []; for (;;) a.push(Buffer.alloc(1 << 20).fill(1))'",
        ),
        (
            "node",
            "node -e 'const a = []; for (let i = 0; ; i++) a.push(\"x\".repeat(1000) + i)'",
        ),
    ];
    for who in identities() {
        for (program, script) in hogs {
            if !installed(program) {
                assert!(!runtimes_required(), "{program} required but missing");
                forkbox_testkit::skipped(format!("{program} memory hog ({program} not installed)"));
                continue;
            }
            let ran = run_past_emulator_crashes(
                who,
                &["--memory-mb", "128", "--timeout-ms", SLOW_GUEST_TIMEOUT],
                program,
                script,
            );
            assert_eq!(ran.status(), "memory_limit", "{script}: {}", ran.dump());
            // The peak is the job's (cgroup) or its largest process's: never past the limit
            // by more than the accounting's slack.
            assert!(
                ran.u64("max_rss_kb") <= 136 * 1024,
                "{script}: {}",
                ran.dump()
            );
            // And it was stopped by what it held, not by a bound of what it might hold (such
            // as the worst case of a socket no dump lists): Python's hog holds its heap in
            // bytearrays, which count in full.
            if *program == "python3" {
                assert!(
                    ran.u64("max_rss_kb") >= 96 * 1024,
                    "{script}: stopped early: {}",
                    ran.dump()
                );
            }
        }
    }
}

/// What the fallback cannot tell: a program that prints an out-of-memory message without using
/// memory is its own `failed`, never `memory_limit`.
#[test]
fn an_out_of_memory_message_alone_is_not_a_memory_limit() {
    for who in identities() {
        let ran = run_shell(
            who,
            &["--memory-mb", "128"],
            "echo 'MemoryError: out of memory' >&2; exit 1",
        );
        assert_eq!(
            (ran.status(), ran.u64("exit_code")),
            ("failed", 1),
            "{}",
            ran.dump()
        );
    }
}
