//! Staged jobs: a compile stage, then the program, in one sandbox, each with its own limits and
//! figures. C and C++ (and Java where installed): a compile that succeeds and a program that
//! sees its binary and its stdin, a compile error, a compile stage killed at its timeout (with
//! its usage counted up to the kill), a program killed at its own timeout after a compile, and
//! the program's peak apart from the compiler's; under a delegated cgroup (the VM tier), each
//! stage held to its own memory limit with its own peak.

mod limits_support;
mod sandbox_support;

use forkbox::sandbox::{Engine, EngineConfig};
use forkbox_queue::schema::{
    CompileStage, FileData, Job, Outcome, StageLimits, StageStatus, Status,
};
use limits_support::{installed, runtimes_required};

const BIN: &str = env!("CARGO_BIN_EXE_forkbox");

const C_SUM: &str = "#include <stdio.h>\nint main(void){long a,b;if(scanf(\"%ld %ld\",&a,&b)!=2)return 3;printf(\"%ld\\n\",a+b);return 0;}\n";
const CPP_SUM: &str =
    "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<std::endl;}\n";

fn engine() -> Engine {
    Engine::start(EngineConfig {
        zygote_exe: BIN.into(),
        slots: 2,
        ..EngineConfig::default()
    })
    .expect("engine")
}

/// Whether `programs` are installed; SKIPPED (or a failure where runtimes are required) if not.
fn have(what: &str, programs: &[&str]) -> bool {
    match programs.iter().find(|p| !installed(p)) {
        None => true,
        Some(p) => {
            assert!(!runtimes_required(), "{what}: {p} is required but missing");
            forkbox_testkit::skipped(format!("{what}: {p} not installed"));
            false
        }
    }
}

fn staged(file: &str, source: &str, compile: &[&str], run: &[&str], stdin: &str) -> Job {
    Job {
        files: [(file.to_owned(), FileData::Text(source.into()))].into(),
        stdin: Some(FileData::Text(stdin.into())),
        timeout_ms: Some(10_000),
        compile: Some(CompileStage {
            timeout_ms: Some(60_000),
            limits: StageLimits {
                memory_mb: Some(1024),
                pids: Some(256),
                ..StageLimits::default()
            },
            ..CompileStage::argv(compile.iter().copied())
        }),
        ..Job::argv(run.iter().copied())
    }
}

fn ok_and_compiled(o: &Outcome) -> &forkbox_queue::StageOutcome {
    let stage = o
        .compile
        .as_ref()
        .unwrap_or_else(|| panic!("no compile: {o:?}"));
    assert_eq!(stage.status, StageStatus::Ok, "{o:?}");
    assert_eq!(stage.exit_code, 0);
    assert!(stage.cpu_ms > 0 && stage.max_rss_kb > 0, "{stage:?}");
    stage
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_and_cpp_compile_then_run_with_stdin() {
    let e = engine();
    if have("C", &["gcc"]) {
        let job = staged(
            "main.c",
            C_SUM,
            &["gcc", "-O2", "-o", "main", "main.c"],
            &["./main"],
            "2 40\n",
        );
        let o = e.run(&job).await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, "42\n");
        let stage = ok_and_compiled(&o);
        eprintln!(
            "C: compile {:.1} ms, {} ms CPU, {} KiB; run {:.1} ms, {} ms CPU, {} KiB",
            stage.duration_ms,
            stage.cpu_ms,
            stage.max_rss_kb,
            o.duration_ms,
            o.cpu_ms,
            o.max_rss_kb
        );
        // The program's peak is its own, not the compiler's.
        assert!(
            o.max_rss_kb < stage.max_rss_kb,
            "run {} vs compile {}",
            o.max_rss_kb,
            stage.max_rss_kb
        );
    }
    if have("C++", &["g++"]) {
        let job = staged(
            "main.cpp",
            CPP_SUM,
            &["g++", "-O2", "-o", "main", "main.cpp"],
            &["./main"],
            "20 22",
        );
        let o = e.run(&job).await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, "42\n");
        ok_and_compiled(&o);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_error_is_reported_and_nothing_runs() {
    if !have("compile error", &["gcc"]) {
        return;
    }
    let e = engine();
    let job = staged(
        "main.c",
        "int main(void) { return undeclared; }\n",
        &["gcc", "-o", "main", "main.c"],
        &["/bin/sh", "-c", "echo ran"],
        "",
    );
    let o = e.run(&job).await;
    assert_eq!(o.status, Status::CompileError, "{o:?}");
    assert!(o.stdout.is_empty() && o.stderr.is_empty(), "{o:?}");
    assert_eq!(o.cpu_ms, 0);
    let stage = o.compile.as_ref().unwrap();
    assert_eq!(stage.status, StageStatus::Failed);
    assert_ne!(stage.exit_code, 0);
    assert_eq!(o.exit_code, stage.exit_code);
    assert!(stage.stderr.contains("undeclared"), "{stage:?}");
    assert!(o.error.is_none(), "{o:?}");
    // A stage that is not found is a failed stage too (127, as a shell says).
    let missing = Job {
        compile: Some(CompileStage::argv(["no-such-compiler-xyz", "main.c"])),
        ..job
    };
    let o = e.run(&missing).await;
    assert_eq!(o.status, Status::CompileError, "{o:?}");
    let stage = o.compile.unwrap();
    assert_eq!(stage.exit_code, 127);
    assert!(stage.stderr.contains("command not found"), "{stage:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_stage_is_killed_at_its_timeout_with_its_usage_counted() {
    let e = engine();
    // A busy stage (and a child of it) past its own timeout; the program's timeout is longer.
    let job = Job {
        timeout_ms: Some(30_000),
        compile: Some(CompileStage {
            timeout_ms: Some(700),
            ..CompileStage::shell("(while :; do :; done) & while :; do :; done")
        }),
        ..Job::shell("echo ran")
    };
    let o = e.run(&job).await;
    assert_eq!(o.status, Status::CompileError, "{o:?}");
    assert_eq!(o.exit_code, 124);
    let stage = o.compile.as_ref().unwrap();
    assert_eq!(stage.status, StageStatus::Timeout, "{o:?}");
    assert!(stage.timed_out);
    assert!(stage.cpu_ms > 100, "usage up to the kill: {stage:?}");
    assert!(stage.max_rss_kb > 0, "{stage:?}");
    assert!(o.stdout.is_empty());
    // Its output cap kills it too.
    let chatty = Job {
        compile: Some(CompileStage {
            limits: StageLimits {
                output_bytes: Some(1000),
                ..StageLimits::default()
            },
            ..CompileStage::shell("yes compiling")
        }),
        ..Job::shell("echo ran")
    };
    let o = e.run(&chatty).await;
    assert_eq!(o.status, Status::CompileError, "{o:?}");
    let stage = o.compile.unwrap();
    assert_eq!(stage.status, StageStatus::OutputLimit);
    assert!(
        stage.stdout_truncated && stage.stdout.len() == 1000,
        "{}",
        stage.stdout.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_program_has_its_own_timeout_after_a_compile() {
    let e = engine();
    let job = Job {
        timeout_ms: Some(500),
        compile: Some(CompileStage {
            timeout_ms: Some(20_000),
            ..CompileStage::shell(
                "printf '#!/bin/sh\\nsleep 30\\n' > prog && chmod +x prog && echo built",
            )
        }),
        ..Job::argv(["./prog"])
    };
    let o = e.run(&job).await;
    assert_eq!(o.status, Status::Timeout, "{o:?}");
    assert_eq!(o.exit_code, 124);
    let stage = o
        .compile
        .as_ref()
        .expect("the compile stage survives the program's kill");
    assert_eq!(stage.status, StageStatus::Ok);
    assert_eq!(stage.stdout, "built\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_compiles_then_runs() {
    if !have("Java", &["javac", "java"]) {
        return;
    }
    let e = engine();
    let source = "import java.util.Scanner;\npublic class Solution { public static void main(String[] a) { Scanner s = new Scanner(System.in); System.out.println(s.nextLong() + s.nextLong()); } }\n";
    let mut job = staged(
        "Solution.java",
        source,
        &["javac", "Solution.java"],
        &["java", "Solution"],
        "40 2\n",
    );
    job.timeout_ms = Some(30_000);
    let o = e.run(&job).await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.stdout, "42\n");
    ok_and_compiled(&o);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_that_stops_or_kills_its_launcher_still_ends() {
    let e = engine();
    // Stopped, the launcher cannot end the stage: the watchdog ends the sandbox instead.
    let stopped = Job {
        compile: Some(CompileStage {
            timeout_ms: Some(300),
            ..CompileStage::shell("kill -STOP $PPID; sleep 60")
        }),
        ..Job::shell("echo ran")
    };
    let o = e.run(&stopped).await;
    assert_eq!(o.status, Status::CompileError, "{o:?}");
    assert_eq!(
        o.compile.as_ref().unwrap().status,
        StageStatus::Timeout,
        "{o:?}"
    );
    assert!(o.stdout.is_empty());
    // Killed, the launcher takes the job with it: a stage killed by its own doing, not a
    // sandbox fault to retry.
    let killed = Job {
        compile: Some(CompileStage::shell("kill -KILL $PPID; sleep 60")),
        ..Job::shell("echo ran")
    };
    let o = e.run(&killed).await;
    assert_eq!(o.status, Status::CompileError, "{o:?}");
    assert_eq!(
        o.compile.as_ref().unwrap().status,
        StageStatus::Signaled,
        "{o:?}"
    );
    assert!(o.stdout.is_empty());
}

/// A program per language of the built-in catalogue: prints the sum of two numbers on stdin.
const SUMS: &[(&str, &str)] = &[
    ("python3", "a, b = map(int, input().split())\nprint(a + b)\n"),
    (
        "javascript",
        "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\nconsole.log(a + b);\n",
    ),
    (
        "typescript",
        "declare var require: any;\nconst nums: number[] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\nconsole.log(nums[0] + nums[1]);\n",
    ),
    ("c", C_SUM),
    ("c++", CPP_SUM),
    (
        "java",
        "import java.util.Scanner;\npublic class Sum { public static void main(String[] a) { Scanner s = new Scanner(System.in); System.out.println(s.nextLong() + s.nextLong()); } }\n",
    ),
    (
        "go",
        "package main\nimport \"fmt\"\nfunc main() { var a, b int; fmt.Scan(&a, &b); fmt.Println(a + b) }\n",
    ),
    (
        "rust",
        "use std::io::Read;\nfn main() { let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap(); let n: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect(); println!(\"{}\", n[0] + n[1]); }\n",
    ),
    ("ruby", "a, b = gets.split.map(&:to_i)\nputs a + b\n"),
    ("perl", "my ($a, $b) = split ' ', <STDIN>;\nprint $a + $b, \"\\n\";\n"),
    ("bash", "read a b\necho $((a + b))\n"),
    (
        "erlang",
        "#!/usr/bin/env escript\nmain(_) -> {ok, [A, B]} = io:fread(\"\", \"~d ~d\"), io:format(\"~p~n\", [A + B]).\n",
    ),
    ("lua", "local a, b = io.read(\"n\", \"n\")\nprint(a + b)\n"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_language_the_node_offers_compiles_and_runs_from_the_catalogue() {
    use forkbox::runtimes::{probe, Catalogue, SourceFile};
    let e = engine();
    let catalogue = Catalogue::builtin();
    let offered = probe::probe(&e, &catalogue, probe::PROBE_TIMEOUT).await;
    for lang in catalogue.languages() {
        if !offered.iter().any(|a| a.language == lang.name) {
            forkbox_testkit::skipped(format!("catalogue run of {}: not on this node", lang.name));
            continue;
        }
        let (_, source) = SUMS
            .iter()
            .find(|(name, _)| *name == lang.name)
            .unwrap_or_else(|| panic!("no program for {}", lang.name));
        let mut job = lang
            .expand(
                &[SourceFile {
                    name: None,
                    content: FileData::Text((*source).into()),
                }],
                &[],
            )
            .unwrap();
        job.stdin = Some(FileData::Text("40 2\n".into()));
        job.timeout_ms = Some(30_000);
        // The compile stage's memory and processes are the catalogue's, which must suffice;
        // its time is this machine's (a shared one may be slow).
        if let Some(stage) = job.compile.as_mut() {
            assert!(stage.limits.memory_mb.is_some(), "{}", lang.name);
            stage.timeout_ms = Some(120_000);
        }
        let o = e.run(&job).await;
        assert_eq!(o.status, Status::Ok, "{}: {o:?}", lang.name);
        assert_eq!(o.stdout, "42\n", "{}: {o:?}", lang.name);
        assert_eq!(o.compile.is_some(), lang.compile.is_some(), "{}", lang.name);
    }
}

/// A python3 program that holds `mb` MiB for a moment, then writes `done`.
fn hold(mb: u64) -> String {
    format!(
        "import time\nb = bytearray({mb} << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n\
         time.sleep(0.2)\nopen('done', 'w').write('x')\nprint('held')"
    )
}

fn staged_python(compile_mb: u64, compile_hold: u64, run_mb: u64, run_hold: u64) -> Job {
    Job {
        timeout_ms: Some(300_000),
        limits: forkbox_queue::Limits {
            memory_mb: Some(run_mb),
            ..forkbox_queue::Limits::default()
        },
        compile: Some(CompileStage {
            timeout_ms: Some(300_000),
            limits: StageLimits {
                memory_mb: Some(compile_mb),
                ..StageLimits::default()
            },
            ..CompileStage::argv(["python3", "-c", &hold(compile_hold)])
        }),
        ..Job::argv(["python3", "-c", &hold(run_hold)])
    }
}

/// Under a delegated cgroup (the VM tier runs this as root), the sandbox's cgroup holds the
/// larger stage's memory while the compiler runs and the run stage's once the program starts:
/// each stage is held to its own limit and reports its own peak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_cgroup_each_stage_has_its_own_memory_limit_and_peak() {
    if !have("staged memory under a cgroup", &["python3"]) {
        return;
    }
    let e = engine();
    // A compiler that takes 200 MiB under its 400, then a program of 20 MiB under its 64.
    let o = e.run(&staged_python(400, 200, 64, 20)).await;
    if o.memory_bound_by != Some(forkbox_queue::schema::MemoryBound::Cgroup) {
        forkbox_testkit::skipped(
            "staged memory under a cgroup: no delegated cgroup here; `make test-vm` runs it",
        );
        return;
    }
    assert_eq!(
        (o.status, o.stdout.as_str()),
        (Status::Ok, "held\n"),
        "{o:?}"
    );
    let stage = ok_and_compiled(&o);
    assert!(stage.max_rss_kb >= 200 * 1024, "compile: {stage:?}");
    assert!(
        (20 * 1024..64 * 1024).contains(&o.max_rss_kb),
        "the program's peak is its own, under its limit: {} KiB (compile {} KiB)",
        o.max_rss_kb,
        stage.max_rss_kb
    );
    // A program past its own limit is stopped there, though the compiler's was larger.
    let o = e.run(&staged_python(400, 10, 64, 150)).await;
    assert_eq!(o.status, Status::MemoryLimit, "{o:?}");
    assert_eq!(ok_and_compiled(&o).status, StageStatus::Ok);
    assert_eq!(o.stdout, "", "{o:?}");
    assert!(o.max_rss_kb <= 64 * 1024, "{o:?}");
    // And the compiler at its own, below the program's: the stage's limit, not the sandbox's.
    let o = e.run(&staged_python(64, 150, 400, 10)).await;
    assert_eq!(o.status, Status::CompileError, "{o:?}");
    assert_eq!(
        o.compile.as_ref().map(|c| c.status),
        Some(StageStatus::MemoryLimit),
        "{o:?}"
    );
}
