//! Piston v2: `GET /api/v2/runtimes` and `POST /api/v2/execute`, as pure translations.
//!
//! What clients depend on, kept as Piston does it: a bad field is HTTP 400 with
//! `{"message": ...}`, a body that is not JSON 415 (a JSON body is taken whatever its
//! `Content-Type`: npm's `piston-client` sends it as `text/plain`); `version` is exact, `*`, or a semver
//! prefix (`3`, `3.11`); `files[].encoding` is `utf8` (the default), `base64` or `hex`; each
//! stage reports `stdout`, `stderr`, `output`, `code` (null when killed) and `signal`
//! (`"SIGKILL"` at a time limit); output is capped at a number of characters (1,024 by
//! default); and when compiling fails, `run` is the compile stage too.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::gateway::catalogue::{Catalogue, Language};
use crate::gateway::exec::{
    AskedCompile, Bounds, Executed, Execution, Stage, StageLimits, StageStatus,
};

/// Piston's stage timeouts when a request sets none (the compile stage's when the runtime
/// catalogue sets none either).
const COMPILE_TIMEOUT_MS: u64 = 10_000;
const RUN_TIMEOUT_MS: u64 = 3_000;

/// A rejected request: the HTTP status and Piston's `message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub status: u16,
    pub message: String,
}

fn bad(message: impl Into<String>) -> Rejection {
    Rejection {
        status: 400,
        message: message.into(),
    }
}

/// `GET /api/v2/runtimes`.
pub fn runtimes(catalogue: &Catalogue) -> Value {
    Value::Array(
        catalogue
            .languages()
            .iter()
            .map(|l| {
                let mut aliases: Vec<&str> = l.runtime.aliases.iter().map(String::as_str).collect();
                if l.name() != l.piston {
                    aliases.insert(0, l.name());
                }
                let mut entry =
                    json!({"language": l.piston, "version": l.version, "aliases": aliases});
                if matches!(l.name(), "javascript" | "typescript") {
                    entry["runtime"] = json!("node");
                }
                entry
            })
            .collect(),
    )
}

#[derive(Debug, Deserialize)]
struct ExecuteBody {
    language: Option<Value>,
    version: Option<Value>,
    files: Option<Value>,
    #[serde(default)]
    stdin: Option<Value>,
    #[serde(default)]
    args: Option<Value>,
    #[serde(default)]
    compile_timeout: Option<Value>,
    #[serde(default)]
    run_timeout: Option<Value>,
    #[serde(default)]
    compile_memory_limit: Option<Value>,
    #[serde(default)]
    run_memory_limit: Option<Value>,
}

/// Whether runtime version `have` satisfies the requested `want`: `*`, `x` or exact, or a
/// prefix of whole components (`3.11` takes `3.11.7`), with a leading `^`, `~` or `=` read
/// as the same prefix.
pub fn version_matches(want: &str, have: &str) -> bool {
    let want = want.trim().trim_start_matches(['^', '~', '=', 'v']);
    if matches!(want, "*" | "x" | "X" | "") || want == have {
        return true;
    }
    let want: Vec<&str> = want
        .split('.')
        .take_while(|c| !matches!(*c, "*" | "x" | "X"))
        .collect();
    let have: Vec<&str> = have.split('.').collect();
    want.len() <= have.len() && want.iter().zip(&have).all(|(w, h)| w == h)
}

/// `POST /api/v2/execute`: the body (with its `Content-Type`) as an [`Execution`], or why not.
pub fn parse_execute(
    content_type: Option<&str>,
    body: &[u8],
    catalogue: &Catalogue,
    bounds: &Bounds,
) -> Result<Execution, Rejection> {
    let declared_json =
        content_type.is_some_and(|t| t.trim_start().starts_with("application/json"));
    let body: ExecuteBody = match serde_json::from_slice(body) {
        Ok(b) => b,
        Err(e) if declared_json => return Err(bad(format!("the body is not valid JSON: {e}"))),
        // npm's piston-client sends its JSON as text/plain: a body that parses is taken.
        Err(_) => {
            return Err(Rejection {
                status: 415,
                message: "requests must be of type application/json".into(),
            })
        }
    };
    let language = match body.language {
        Some(Value::String(s)) => s,
        _ => return Err(bad("language is required as a string")),
    };
    let version = match body.version {
        Some(Value::String(s)) => s,
        _ => return Err(bad("version is required as a string")),
    };
    let lang: &Language = catalogue
        .find(&language)
        .filter(|l| version_matches(&version, &l.version))
        .ok_or_else(|| bad(format!("{language}-{version} runtime is unknown")))?;
    let files = match body.files {
        Some(Value::Array(files)) if !files.is_empty() => files,
        Some(Value::Array(_)) => return Err(bad("files must contain at least one file")),
        _ => return Err(bad("files is required as an array")),
    };
    let decoded = decode_files(&files)?;
    let stdin = match body.stdin {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => s.into_bytes(),
        Some(_) => return Err(bad("stdin must be a string")),
    };
    let args = string_list(body.args, "args")?;
    let compile_timeout = timeout_ms(
        body.compile_timeout,
        "compile_timeout",
        bounds.max_compile_timeout_ms,
    )?;
    let run_timeout = timeout_ms(body.run_timeout, "run_timeout", bounds.max_run_timeout_ms)?
        .unwrap_or(RUN_TIMEOUT_MS.min(bounds.max_run_timeout_ms));
    let compile_memory = memory_mb(body.compile_memory_limit, "compile_memory_limit", bounds)?;
    let run_memory = memory_mb(body.run_memory_limit, "run_memory_limit", bounds)?;
    let mut decoded = decoded.into_iter();
    let (_, source) = decoded.next().expect("at least one file");
    let source_text = String::from_utf8_lossy(&source);
    let source_name = lang.source_name(&source_text);
    let mut files = BTreeMap::new();
    for (i, (name, bytes)) in decoded.enumerate() {
        let name = name.unwrap_or_else(|| format!("file{}.code", i + 1));
        if name == source_name {
            return Err(bad(format!(
                "files[{}].name repeats the main file's name {name}",
                i + 1
            )));
        }
        files.insert(name, bytes);
    }
    Ok(Execution {
        language: lang.clone(),
        source_name,
        source,
        files,
        stdin,
        args,
        compile: bounds.compile_limits(
            &lang.runtime.compile_limits,
            AskedCompile {
                timeout_ms: compile_timeout,
                memory_mb: compile_memory,
            },
            COMPILE_TIMEOUT_MS,
        ),
        run: StageLimits {
            timeout_ms: run_timeout,
            memory_mb: run_memory,
            ..StageLimits::default()
        },
        collect: Vec::new(),
        output_bytes: None,
        merge_stderr: false,
    })
}

/// A request's file: its name, if given, and its content decoded.
type NamedFile = (Option<String>, Vec<u8>);

/// The request's files, each with its name (if given) and its content decoded.
fn decode_files(files: &[Value]) -> Result<Vec<NamedFile>, Rejection> {
    let mut decoded = Vec::with_capacity(files.len());
    for (i, f) in files.iter().enumerate() {
        let Some(content) = f.get("content").and_then(Value::as_str) else {
            return Err(bad(format!("files[{i}].content is required as a string")));
        };
        let name = match f.get("name") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(bad(format!("files[{i}].name must be a string"))),
        };
        let bytes = match f.get("encoding").map(|e| e.as_str()) {
            None | Some(Some("utf8")) => content.as_bytes().to_vec(),
            Some(Some("base64")) => base64::engine::general_purpose::STANDARD
                .decode(content)
                .map_err(|e| bad(format!("files[{i}].content is not valid base64: {e}")))?,
            Some(Some("hex")) => hex_decode(content)
                .ok_or_else(|| bad(format!("files[{i}].content is not valid hex")))?,
            _ => {
                return Err(bad(format!(
                    "files[{i}].encoding must be one of utf8, base64, hex"
                )))
            }
        };
        if let Some(n) = &name {
            if n.is_empty() || n.starts_with('/') || n.split('/').any(|c| c == "..") {
                return Err(bad(format!(
                    "files[{i}].name must be a relative path inside the working directory"
                )));
            }
        }
        decoded.push((name, bytes));
    }
    Ok(decoded)
}

/// An optional array of strings (`args`), empty when absent.
fn string_list(v: Option<Value>, field: &str) -> Result<Vec<String>, Rejection> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s),
                _ => Err(bad(format!("{field}[{i}] must be a string"))),
            })
            .collect(),
        Some(_) => Err(bad(format!("{field} must be an array"))),
    }
}

/// A stage's timeout in milliseconds, at most `max`; none when absent.
fn timeout_ms(v: Option<Value>, field: &str, max: u64) -> Result<Option<u64>, Rejection> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(ms) if ms > 0.0 && ms <= max as f64 => Ok(Some(ms.ceil() as u64)),
            Some(ms) if ms > 0.0 => Err(bad(format!(
                "{field} cannot exceed the configured limit of {max}"
            ))),
            _ => Err(bad(format!("{field} must be a positive number"))),
        },
        Some(_) => Err(bad(format!("{field} must be a number"))),
    }
}

/// A stage's memory limit, given in bytes, as MiB: none when absent or -1.
fn memory_mb(v: Option<Value>, field: &str, bounds: &Bounds) -> Result<Option<u64>, Rejection> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(-1.0) => Ok(None),
            Some(b) if b > 0.0 => {
                let mb = (b / (1024.0 * 1024.0)).ceil() as u64;
                if mb > bounds.max_memory_mb {
                    Err(bad(format!(
                        "{field} cannot exceed the configured limit of {}",
                        bounds.max_memory_mb * 1024 * 1024
                    )))
                } else {
                    Ok(Some(mb.max(1)))
                }
            }
            _ => Err(bad(format!(
                "{field} must be -1 or a positive number of bytes"
            ))),
        },
        Some(_) => Err(bad(format!("{field} must be a number"))),
    }
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 == 1 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The first `max` characters of `s`.
fn cap(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((at, _)) => &s[..at],
        None => s,
    }
}

/// A signal's name (`SIGKILL`), or its number as text when it has none.
pub fn signal_name(signal: i32) -> String {
    nix::sys::signal::Signal::try_from(signal)
        .map(|s| s.as_str().to_owned())
        .unwrap_or_else(|_| signal.to_string())
}

/// One stage as Piston reports it.
fn stage(s: &Stage, max_chars: usize) -> Value {
    let killed = matches!(
        s.status,
        StageStatus::Timeout
            | StageStatus::CpuLimit
            | StageStatus::MemoryLimit
            | StageStatus::OutputLimit
    );
    let signal = if killed {
        Some(libc::SIGKILL)
    } else {
        s.signal
    };
    let (status, message) = match s.status {
        StageStatus::Ok => (Value::Null, Value::Null),
        StageStatus::Failed => (json!("RE"), Value::Null),
        StageStatus::Timeout => (json!("TO"), json!("Timeout")),
        StageStatus::CpuLimit => (json!("TO"), json!("CPU time limit exceeded")),
        StageStatus::MemoryLimit => (json!("SG"), json!("Memory limit exceeded")),
        StageStatus::OutputLimit => (json!("OL"), json!("Output limit exceeded")),
        StageStatus::Signaled => (json!("SG"), Value::Null),
    };
    let stdout = cap(&s.stdout, max_chars);
    let stderr = cap(&s.stderr, max_chars);
    let output = format!("{}{}", s.stdout, s.stderr);
    json!({
        "stdout": stdout,
        "stderr": stderr,
        "output": cap(&output, max_chars),
        "code": if signal.is_some() { Value::Null } else { json!(s.exit_code) },
        "signal": signal.map(signal_name),
        "message": message,
        "status": status,
        "cpu_time": s.cpu_ms,
        "wall_time": s.duration_ms.round() as u64,
        "memory": s.max_rss_kb * 1024,
    })
}

/// The response to an execution that ended: HTTP 200 and Piston's body, or a 500 with its
/// `message` when the sandbox failed.
pub fn respond(exec: &Execution, executed: &Executed, max_chars: usize) -> (u16, Value) {
    let head = |body: &mut Value| {
        body["language"] = json!(exec.language.piston);
        body["version"] = json!(exec.language.version);
    };
    match executed {
        Executed::Ran { compile, run, .. } => {
            let mut body = json!({"run": stage(run, max_chars)});
            if let Some(c) = compile {
                body["compile"] = stage(c, max_chars);
            }
            head(&mut body);
            (200, body)
        }
        Executed::CompileFailed { compile } => {
            let c = stage(compile, max_chars);
            let mut body = json!({"compile": c.clone(), "run": c});
            head(&mut body);
            (200, body)
        }
        Executed::Internal { error } => (500, json!({"message": error})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::catalogue::all_at;

    fn catalogue() -> Catalogue {
        Catalogue::new(
            all_at("1.0.0")
                .languages()
                .iter()
                .cloned()
                .map(|mut l| {
                    l.version = match l.name() {
                        "python3" => "3.11.7".into(),
                        "c++" => "12.2.0".into(),
                        _ => "1.0.0".into(),
                    };
                    l
                })
                .collect(),
        )
    }

    fn parse(body: Value) -> Result<Execution, Rejection> {
        parse_execute(
            Some("application/json"),
            body.to_string().as_bytes(),
            &catalogue(),
            &Bounds::default(),
        )
    }

    #[test]
    fn the_documented_example_request_is_accepted() {
        // Piston's README example, as piston-client sends it (default args 1 2 3).
        let e = parse(json!({
            "language": "c++", "version": "*",
            "files": [{"name": "my_cool_code.cpp", "content": "int main(){}"}],
            "stdin": "", "args": ["1", "2", "3"],
            "compile_timeout": 10000, "run_timeout": 3000,
            "compile_memory_limit": -1, "run_memory_limit": -1
        }))
        .unwrap();
        assert_eq!(e.language.name(), "c++");
        assert_eq!(e.source_name, "main.cpp");
        assert_eq!(e.args, ["1", "2", "3"]);
        assert_eq!((e.compile.timeout_ms, e.run.timeout_ms), (10_000, 3_000));
        assert_eq!(e.run.memory_mb, None);
        let e = parse(json!({"language": "python", "version": "3.11",
            "files": [{"content": "cHJpbnQoMSk=", "encoding": "base64"}, {"name": "data.txt", "content": "6869", "encoding": "hex"}],
            "run_memory_limit": 100000000}))
        .unwrap();
        assert_eq!(e.source, b"print(1)");
        assert_eq!(e.files["data.txt"], b"hi");
        assert_eq!(e.run.memory_mb, Some(96));
    }

    #[test]
    fn compile_limits_are_the_requests_else_the_languages() {
        let builtin = crate::runtimes::Catalogue::builtin();
        let cxx = builtin.find("c++").unwrap().compile_limits;
        let rust = builtin.find("rust").unwrap().compile_limits;
        let body = |language: &str| json!({"language": language, "version": "*", "files": [{"content": "int main(){}"}]});
        let e = parse(body("c++")).unwrap();
        assert_eq!(Some(e.compile.timeout_ms), cxx.timeout_ms);
        assert_eq!(e.compile.memory_mb, cxx.memory_mb);
        assert_eq!(e.run.timeout_ms, 3_000);
        let e = parse(body("rust")).unwrap();
        assert_eq!(
            (
                Some(e.compile.timeout_ms),
                e.compile.memory_mb,
                e.compile.pids
            ),
            (rust.timeout_ms, rust.memory_mb, rust.pids)
        );
        // The request's own replace them, and -1 leaves the language's.
        let mut own = body("c++");
        own["compile_timeout"] = json!(4000);
        own["compile_memory_limit"] = json!(300 * 1024 * 1024);
        let e = parse(own.clone()).unwrap();
        assert_eq!(
            (e.compile.timeout_ms, e.compile.memory_mb),
            (4_000, Some(300))
        );
        own["compile_memory_limit"] = json!(-1);
        assert_eq!(parse(own).unwrap().compile.memory_mb, cxx.memory_mb);
    }

    #[test]
    fn bad_requests_are_named_as_piston_names_them() {
        let cases = [
            (
                json!({"version": "*", "files": [{"content": ""}]}),
                400,
                "language is required as a string",
            ),
            (
                json!({"language": "python", "files": [{"content": ""}]}),
                400,
                "version is required as a string",
            ),
            (
                json!({"language": "python", "version": "3.99", "files": [{"content": ""}]}),
                400,
                "python-3.99 runtime is unknown",
            ),
            (
                json!({"language": "cobol", "version": "*", "files": [{"content": ""}]}),
                400,
                "cobol-* runtime is unknown",
            ),
            (
                json!({"language": "python", "version": "*"}),
                400,
                "files is required as an array",
            ),
            (
                json!({"language": "python", "version": "*", "files": [{}]}),
                400,
                "files[0].content is required as a string",
            ),
            (
                json!({"language": "python", "version": "*", "files": [{"content": "", "encoding": "rot13"}]}),
                400,
                "files[0].encoding must be one of utf8, base64, hex",
            ),
            (
                json!({"language": "python", "version": "*", "files": [{"content": ""}], "run_timeout": 999999}),
                400,
                "run_timeout cannot exceed the configured limit of 60000",
            ),
            (
                json!({"language": "python", "version": "*", "files": [{"content": ""}], "args": [1]}),
                400,
                "args[0] must be a string",
            ),
            (
                json!({"language": "python", "version": "*", "files": [{"content": ""}, {"name": "../x", "content": ""}]}),
                400,
                "files[1].name must be a relative path inside the working directory",
            ),
        ];
        for (body, status, message) in cases {
            let r = parse(body.clone()).unwrap_err();
            assert_eq!((r.status, r.message.as_str()), (status, message), "{body}");
        }
        let r = parse_execute(
            Some("text/plain"),
            b"language=python",
            &catalogue(),
            &Bounds::default(),
        )
        .unwrap_err();
        assert_eq!(r.status, 415);
        let r = parse_execute(None, b"<xml/>", &catalogue(), &Bounds::default()).unwrap_err();
        assert_eq!(r.status, 415);
        // JSON sent as text (piston-client) is read.
        let body =
            json!({"language": "python", "version": "*", "files": [{"content": ""}]}).to_string();
        parse_execute(
            Some("text/plain;charset=UTF-8"),
            body.as_bytes(),
            &catalogue(),
            &Bounds::default(),
        )
        .unwrap();
        let r = parse_execute(
            Some("application/json"),
            b"{",
            &catalogue(),
            &Bounds::default(),
        )
        .unwrap_err();
        assert_eq!(r.status, 400);
    }

    #[test]
    fn versions_match_exactly_by_star_or_by_prefix() {
        for (want, have, ok) in [
            ("*", "3.11.7", true),
            ("3.11.7", "3.11.7", true),
            ("3.11", "3.11.7", true),
            ("3", "3.11.7", true),
            ("3.1", "3.11.7", false),
            ("^3.11", "3.11.7", true),
            ("3.x", "3.11.7", true),
            ("2", "3.11.7", false),
            ("3.11.7.1", "3.11.7", false),
        ] {
            assert_eq!(version_matches(want, have), ok, "{want} {have}");
        }
    }

    fn stage_of(status: StageStatus, exit_code: i32, signal: Option<i32>) -> Stage {
        Stage {
            status,
            exit_code,
            signal,
            stdout: "out".into(),
            stderr: "err".into(),
            duration_ms: 12.4,
            cpu_ms: 10,
            max_rss_kb: 3,
        }
    }

    #[test]
    fn stages_report_code_and_signal_as_piston_does() {
        let e =
            parse(json!({"language": "c++", "version": "*", "files": [{"content": ""}]})).unwrap();
        let ran = Executed::Ran {
            compile: Some(stage_of(StageStatus::Ok, 0, None)),
            run: stage_of(StageStatus::Timeout, 124, None),
            files: BTreeMap::new(),
        };
        let (status, body) = respond(&e, &ran, 1024);
        assert_eq!(status, 200);
        assert_eq!(body["language"], "c++");
        assert_eq!(body["version"], "12.2.0");
        assert_eq!(body["compile"]["code"], 0);
        assert_eq!(body["run"]["code"], Value::Null);
        assert_eq!(body["run"]["signal"], "SIGKILL");
        assert_eq!(body["run"]["output"], "outerr");
        assert_eq!(body["run"]["memory"], 3072);
        // A failed compile is both stages.
        let failed = Executed::CompileFailed {
            compile: stage_of(StageStatus::Failed, 1, None),
        };
        let (_, body) = respond(&e, &failed, 1024);
        assert_eq!(body["compile"]["code"], 1);
        assert_eq!(body["run"], body["compile"]);
        // A program killed by its own SIGSEGV.
        let segv = Executed::Ran {
            compile: None,
            run: stage_of(StageStatus::Signaled, 139, Some(11)),
            files: BTreeMap::new(),
        };
        let (_, body) = respond(&e, &segv, 1024);
        assert_eq!(body["run"]["signal"], "SIGSEGV");
        assert_eq!(body["run"]["code"], Value::Null);
    }

    #[test]
    fn output_is_capped_in_characters() {
        let e = parse(json!({"language": "python", "version": "*", "files": [{"content": ""}]}))
            .unwrap();
        let mut run = stage_of(StageStatus::Ok, 0, None);
        run.stdout = "é".repeat(2000);
        let ran = Executed::Ran {
            compile: None,
            run,
            files: BTreeMap::new(),
        };
        let (_, body) = respond(&e, &ran, 1024);
        assert_eq!(
            body["run"]["stdout"].as_str().unwrap().chars().count(),
            1024
        );
        assert_eq!(
            body["run"]["output"].as_str().unwrap().chars().count(),
            1024
        );
        assert!(body.get("compile").is_none());
    }
}
