use super::*;

fn text(s: &str) -> FileData {
    FileData::Text(s.into())
}

#[test]
fn the_builtin_catalogue_covers_the_languages() {
    let c = Catalogue::builtin();
    for name in [
        "python3",
        "javascript",
        "typescript",
        "c",
        "c++",
        "java",
        "go",
        "rust",
        "ruby",
        "perl",
        "bash",
        "erlang",
        "lua",
    ] {
        assert!(c.find(name).is_some(), "{name} missing");
    }
    assert_eq!(c.find("Node").unwrap().name, "javascript");
    assert_eq!(c.find("cpp").unwrap().name, "c++");
    assert_eq!(c.find("py").unwrap().warm, Some(Runtime::Python));
    assert!(c.find("cobol").is_none());
}

#[test]
fn versions_are_found_in_what_probes_print() {
    for (printed, want) in [
        ("Python 3.11.2\n", Some("3.11.2")),
        ("v20.20.2\n", Some("20.20.2")),
        ("go version go1.19.8 linux/amd64\n", Some("1.19.8")),
        (
            "GNU bash, version 5.2.15(1)-release (x86_64-pc-linux-gnu)",
            Some("5.2.15"),
        ),
        (
            "Lua 5.4.4  Copyright (C) 1994-2022 Lua.org, PUC-Rio",
            Some("5.4.4"),
        ),
        (
            "ruby 3.1.2p20 (2022-04-12 revision 4491bb740a)",
            Some("3.1.2"),
        ),
        ("javac 17.0.9", Some("17.0.9")),
        ("v5.36.0", Some("5.36.0")),
        ("25", Some("25")),
        ("no version here", None),
    ] {
        assert_eq!(parse_version(printed).as_deref(), want, "{printed}");
    }
}

#[test]
fn version_requests_match_by_prefix() {
    for (version, wanted, want) in [
        ("3.11.2", "*", true),
        ("3.11.2", "", true),
        ("3.11.2", "3", true),
        ("3.11.2", "3.11", true),
        ("3.11.2", "3.11.2", true),
        ("3.11.2", "3.1", false),
        ("3.11.2", "3.11.2.1", false),
        ("3.11.2", "3.x", true),
        ("3.11.2", "2", false),
    ] {
        assert_eq!(version_matches(version, wanted), want, "{version} {wanted}");
    }
    assert_eq!(
        compare_versions("1.10.0", "1.9.9"),
        std::cmp::Ordering::Greater
    );
}

#[test]
fn select_takes_the_highest_matching_version_and_names_what_is_missing() {
    let c = Catalogue::builtin();
    let have = |l: &str, v: &str| Available {
        language: l.into(),
        version: v.into(),
    };
    let available = [
        have("python3", "3.9.1"),
        have("python3", "3.11.2"),
        have("c", "12.2.0"),
    ];
    let (lang, got) = select(&c, &available, "python", "*").unwrap();
    assert_eq!(
        (lang.name.as_str(), got.version.as_str()),
        ("python3", "3.11.2")
    );
    assert_eq!(
        select(&c, &available, "py3", "3.9").unwrap().1.version,
        "3.9.1"
    );
    assert_eq!(
        select(&c, &available, "python3", "4")
            .unwrap_err()
            .to_string(),
        "version: python3 4 is not available (available: 3.11.2, 3.9.1)"
    );
    assert_eq!(
        select(&c, &available, "ruby", "*").unwrap_err().to_string(),
        "version: ruby * is not available (available: none)"
    );
    assert_eq!(
        select(&c, &available, "cobol", "*").unwrap_err(),
        LookupError::UnknownLanguage("cobol".into())
    );
}

#[test]
fn expand_makes_a_staged_job() {
    let c = Catalogue::builtin();
    let cpp = c.find("cpp").unwrap();
    let job = cpp
        .expand(
            &[SourceFile {
                name: None,
                content: text("int main(){}"),
            }],
            &["1".into(), "2".into()],
        )
        .unwrap();
    assert_eq!(job.argv.as_deref().unwrap(), ["./main", "1", "2"]);
    assert_eq!(
        job.compile.as_ref().unwrap().command(),
        ["g++", "-O2", "-std=gnu++17", "-o", "main", "main.cpp"]
    );
    assert_eq!(job.files.keys().collect::<Vec<_>>(), ["main.cpp"]);
    job.validate().unwrap();

    let py = c.find("python").unwrap();
    let job = py
        .expand(
            &[
                SourceFile {
                    name: Some("solve.py".into()),
                    content: text("import util"),
                },
                SourceFile {
                    name: Some("util.py".into()),
                    content: text(""),
                },
            ],
            &[],
        )
        .unwrap();
    assert_eq!(job.argv.as_deref().unwrap(), ["python3", "solve.py"]);
    assert!(job.compile.is_none());
    assert_eq!(job.runtime, Some(Runtime::Python));
    job.validate().unwrap();

    let unnamed = [
        SourceFile {
            name: None,
            content: text("x"),
        },
        SourceFile {
            name: None,
            content: text("y"),
        },
    ];
    assert_eq!(
        py.expand(&unnamed, &[]).unwrap_err(),
        ExpandError::Unnamed(1)
    );
    assert_eq!(py.expand(&[], &[]).unwrap_err(), ExpandError::NoFiles);
    let escape = [SourceFile {
        name: Some("../x.py".into()),
        content: text(""),
    }];
    assert!(matches!(
        py.expand(&escape, &[]).unwrap_err(),
        ExpandError::BadName { index: 0, .. }
    ));
}

#[test]
fn java_takes_its_file_name_from_the_public_class() {
    let java = Catalogue::builtin().find("java").unwrap().clone();
    for (source, want) in [
        (
            "public class Solution { public static void main(String[] a) {} }",
            "Solution.java",
        ),
        ("class Helper {}\npublic final class Main2 {}", "Main2.java"),
        ("import java.util.*; class Only { }", "Only.java"),
        ("// nothing", "Main.java"),
    ] {
        assert_eq!(java.source_name(source), want, "{source}");
    }
    let job = java
        .expand(
            &[SourceFile {
                name: None,
                content: text("public class Solution {}"),
            }],
            &[],
        )
        .unwrap();
    assert_eq!(job.argv.as_deref().unwrap(), ["java", "Solution"]);
    assert_eq!(
        job.compile.unwrap().command(),
        ["javac", "-encoding", "UTF-8", "Solution.java"]
    );
}

#[test]
fn an_operator_file_replaces_and_adds_entries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runtimes.toml");
    std::fs::write(
        &path,
        r#"
[[language]]
name = "c"
aliases = ["gcc"]
source_file = "prog.c"
compile = ["clang", "-o", "prog", "{source}"]
run = ["./prog"]
version = ["clang", "--version"]

[[language]]
name = "zig"
source_file = "main.zig"
run = ["zig", "run", "{source}"]
version = ["zig", "version"]
"#,
    )
    .unwrap();
    let c = Catalogue::load(Some(&path)).unwrap();
    let lang = c.find("c").unwrap();
    assert_eq!(lang.source_file, "prog.c");
    assert_eq!(lang.compile.as_ref().unwrap()[0], "clang");
    assert!(c.find("c11").is_none(), "the entry is replaced whole");
    assert_eq!(c.find("zig").unwrap().run[0], "zig");
    assert_eq!(
        c.languages().len(),
        Catalogue::builtin().languages().len() + 1
    );

    for (bad, want) in [
        ("[[language]]\nname = \"x\"\n", "missing field"),
        (
            "[[language]]\nname=\"x\"\nsource_file=\"a\"\nrun=[]\nversion=[\"x\"]\n",
            "run: needs a program",
        ),
        (
            "[[language]]\nname=\"x\"\nsource_file=\"/a\"\nrun=[\"x\"]\nversion=[\"x\"]\n",
            "source_file:",
        ),
        (
            "[[language]]\nname=\"x\"\naliases=[\"py\"]\nsource_file=\"a\"\nrun=[\"x\"]\nversion=[\"x\"]\n",
            "\"py\" also names language \"python3\"",
        ),
        (
            "[[language]]\nname=\"x\"\nsource_file=\"a\"\nrun=[\"x\"]\nversion=[\"x\"]\nbogus=1\n",
            "unknown field `bogus`",
        ),
    ] {
        std::fs::write(&path, bad).unwrap();
        let e = Catalogue::load(Some(&path)).unwrap_err().to_string();
        assert!(e.contains(want), "{bad}: {e}");
        assert!(e.contains("runtimes.toml"), "names the file: {e}");
    }
    // Compile limits: checked against the ranges a job takes, each error naming the
    // language and the field.
    let entry = "[[language]]\nname=\"x\"\nsource_file=\"a\"\ncompile=[\"cc\"]\nrun=[\"x\"]\nversion=[\"x\"]\n";
    for (limits, want) in [
        (
            "compile_limits={memory_mb=\"2G\"}",
            "language \"x\": compile_limits.memory_mb: invalid type: string \"2G\", expected u64",
        ),
        (
            "compile_limits={memroy_mb=1}",
            "language \"x\": compile_limits.memroy_mb: unknown field `memroy_mb`",
        ),
        (
            "compile_limits={timeout_ms=0}",
            "language \"x\": compile_limits.timeout_ms: 0 is not within 1..=",
        ),
        (
            "compile_limits={pids=1}",
            "language \"x\": compile_limits.pids: 1 is not within 2..=",
        ),
        (
            "compile_limits={memory_mb=-5}",
            "language \"x\": compile_limits.memory_mb: invalid value",
        ),
    ] {
        std::fs::write(&path, format!("{entry}{limits}\n")).unwrap();
        let e = Catalogue::load(Some(&path)).unwrap_err().to_string();
        assert!(e.contains(want), "{limits}: {e}");
    }
    std::fs::write(
        &path,
        "[[language]]\nname=\"x\"\nsource_file=\"a\"\nrun=[\"x\"]\nversion=[\"x\"]\ncompile_limits={memory_mb=64}\n",
    )
    .unwrap();
    let e = Catalogue::load(Some(&path)).unwrap_err().to_string();
    assert!(
        e.contains("language \"x\": compile_limits: the language has no compile stage"),
        "{e}"
    );
    // A field of the wrong type elsewhere names its entry too.
    std::fs::write(
        &path,
        "[[language]]\nname=\"x\"\nsource_file=\"a\"\nrun=\"x\"\nversion=[\"x\"]\n",
    )
    .unwrap();
    let e = Catalogue::load(Some(&path)).unwrap_err().to_string();
    assert!(e.contains("language \"x\": run: invalid type"), "{e}");

    let e = Catalogue::load(Some(&dir.path().join("absent.toml")))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("reading the runtime catalogue"), "{e}");
}

#[test]
fn compiled_languages_carry_compile_limits_the_operator_can_change() {
    let builtin = Catalogue::builtin();
    for lang in builtin.languages() {
        if lang.compile.is_none() {
            assert!(lang.compile_limits.is_empty(), "{}", lang.name);
            continue;
        }
        let l = lang.compile_limits;
        assert!(
            l.timeout_ms.is_some() && l.memory_mb.is_some(),
            "{}: {l:?}",
            lang.name
        );
    }
    // Compilers that need more than a script: seconds for C++, memory for the JVM and rustc.
    let limits = |c: &Catalogue, name: &str| c.find(name).unwrap().compile_limits;
    assert!(
        limits(&builtin, "c++").timeout_ms.unwrap() > limits(&builtin, "c").timeout_ms.unwrap()
    );
    for name in ["java", "rust", "go"] {
        assert!(limits(&builtin, name).memory_mb.unwrap() >= 2048, "{name}");
    }
    // expand puts them on the compile stage.
    let job = builtin
        .find("java")
        .unwrap()
        .expand(
            &[SourceFile {
                name: None,
                content: text("public class Main {}"),
            }],
            &[],
        )
        .unwrap();
    let stage = job.compile.as_ref().unwrap();
    assert_eq!(stage.timeout_ms, limits(&builtin, "java").timeout_ms);
    assert_eq!(stage.limits.memory_mb, limits(&builtin, "java").memory_mb);
    assert_eq!(stage.limits.pids, limits(&builtin, "java").pids);
    job_is_valid(&job);

    // The operator's entry replaces the language's, its limits with it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runtimes.toml");
    std::fs::write(
        &path,
        r#"
[[language]]
name = "c++"
source_file = "main.cpp"
compile = ["g++", "-O2", "-o", "main", "{source}"]
run = ["./main"]
version = ["g++", "-dumpfullversion"]
compile_limits = { timeout_ms = 45000, memory_mb = 3072, output_bytes = 65536 }
"#,
    )
    .unwrap();
    let c = Catalogue::load(Some(&path)).unwrap();
    assert_eq!(
        limits(&c, "c++"),
        CompileLimits {
            timeout_ms: Some(45_000),
            memory_mb: Some(3072),
            pids: None,
            output_bytes: Some(65536),
        }
    );
    assert_eq!(
        limits(&c, "c++").to_string(),
        "timeout=45s,memory=3072MB,output=65536B"
    );
    assert_eq!(limits(&c, "python3").to_string(), "-");
}

fn job_is_valid(job: &Job) {
    let mut job = job.clone();
    job.id = Some("j".into());
    job.validate().unwrap();
}
