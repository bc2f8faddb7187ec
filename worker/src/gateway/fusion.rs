//! SandboxFusion: `POST /run_code` and `GET /v1/ping`, as pure translations.
//!
//! A run always answers HTTP 200: `status` is `Success` (every stage exited 0), `Failed`
//! (one did not, or hit its limit) or `SandboxError` (the sandbox failed), with `message`,
//! `compile_result` (compiled languages) and `run_result` (absent when compiling failed), each
//! `{status: Finished|Error|TimeLimitExceeded, execution_time, return_code, stdout, stderr}`,
//! plus the `fetch_files` found, base64-encoded. A request that cannot be run at all (a
//! missing or mistyped field, an unknown language) is refused with HTTP 422 and FastAPI's
//! `detail`, naming the field, as SandboxFusion's own validation does.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::gateway::catalogue::Catalogue;
use crate::gateway::exec::{
    AskedCompile, Bounds, Executed, Execution, Stage, StageLimits, StageStatus,
};

/// SandboxFusion's stage timeout when a request sets none (the compile stage's when the
/// runtime catalogue sets none either).
const TIMEOUT_MS: u64 = 10_000;

/// A refused request: HTTP 422 and its body.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub body: Value,
}

fn invalid(field: &str, message: impl Into<String>) -> Rejection {
    Rejection {
        body: json!({"detail": [{"loc": ["body", field], "msg": message.into(), "type": "value_error"}]}),
    }
}

/// A relative path inside the working directory (SandboxFusion's absolute paths are not
/// offered: a sandbox's only writable place is its working directory).
fn relative(field: &str, path: &str) -> Result<String, Rejection> {
    let p = path.strip_prefix("./").unwrap_or(path);
    if p.is_empty() || p.starts_with('/') || p.split('/').any(|c| c == "..") {
        return Err(invalid(
            field,
            format!("{path:?} must be a relative path inside the working directory"),
        ));
    }
    Ok(p.to_owned())
}

/// `POST /run_code`: the body as an [`Execution`], or why not.
pub fn parse_run_code(
    body: &[u8],
    catalogue: &Catalogue,
    bounds: &Bounds,
) -> Result<Execution, Rejection> {
    let body: Value = serde_json::from_slice(body)
        .map_err(|e| invalid("body", format!("not valid JSON: {e}")))?;
    let obj = body
        .as_object()
        .ok_or_else(|| invalid("body", "must be a JSON object"))?;
    let string = |field: &str| -> Result<Option<&str>, Rejection> {
        match obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(invalid(field, "str type expected")),
        }
    };
    let code = string("code")?.ok_or_else(|| invalid("code", "field required"))?;
    let language = string("language")?.ok_or_else(|| invalid("language", "field required"))?;
    let lang = catalogue
        .languages()
        .iter()
        .find(|l| l.fusion.iter().any(|f| f == language))
        .ok_or_else(|| {
            invalid(
                "language",
                format!("language {language:?} is not offered here"),
            )
        })?;
    // A stage's timeout; none when the request sets none.
    let seconds = |field: &str, max_ms: u64| -> Result<Option<u64>, Rejection> {
        let secs = match obj.get(field) {
            None | Some(Value::Null) => return Ok(None),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| invalid(field, "value is not a valid float"))?,
        };
        let ms = (secs * 1000.0).ceil();
        if ms <= 0.0 {
            return Err(invalid(field, "must be greater than 0"));
        }
        if ms > max_ms as f64 {
            return Err(invalid(
                field,
                format!("must be at most {} seconds", max_ms as f64 / 1000.0),
            ));
        }
        Ok(Some(ms as u64))
    };
    let compile_timeout = seconds("compile_timeout", bounds.max_compile_timeout_ms)?;
    let run_timeout = seconds("run_timeout", bounds.max_run_timeout_ms)?
        .unwrap_or(TIMEOUT_MS.min(bounds.max_run_timeout_ms));
    let memory = match obj.get("memory_limit_MB") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64() {
            Some(-1) => None,
            Some(mb) if mb > 0 && mb as u64 <= bounds.max_memory_mb => Some(mb as u64),
            Some(mb) if mb > 0 => {
                return Err(invalid(
                    "memory_limit_MB",
                    format!("must be at most {}", bounds.max_memory_mb),
                ))
            }
            _ => {
                return Err(invalid(
                    "memory_limit_MB",
                    "must be -1 or a positive integer",
                ))
            }
        },
    };
    let stdin = string("stdin")?.unwrap_or_default().as_bytes().to_vec();
    let mut files = BTreeMap::new();
    match obj.get("files") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (path, content) in map {
                let field = format!("files.{path}");
                let name = relative(&field, path)?;
                let bytes = match content {
                    Value::Null => Vec::new(),
                    Value::String(b64) => base64::engine::general_purpose::STANDARD
                        .decode(b64)
                        .map_err(|e| invalid(&field, format!("not valid base64: {e}")))?,
                    _ => return Err(invalid(&field, "str type expected")),
                };
                files.insert(name, bytes);
            }
        }
        Some(_) => return Err(invalid("files", "value is not a valid dict")),
    }
    let collect = match obj.get("fetch_files") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(paths)) => paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let field = format!("fetch_files.{i}");
                p.as_str()
                    .ok_or_else(|| invalid(&field, "str type expected"))
                    .and_then(|p| relative(&field, p))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(invalid("fetch_files", "value is not a valid list")),
    };
    let source_name = lang.source_name(code);
    if files.contains_key(&source_name) {
        return Err(invalid(
            &format!("files.{source_name}"),
            "is the program's own source file",
        ));
    }
    let mut compile = bounds.compile_limits(
        &lang.runtime.compile_limits,
        AskedCompile {
            timeout_ms: compile_timeout,
            memory_mb: None,
        },
        TIMEOUT_MS,
    );
    // `memory_limit_MB` is the program's: a compiler is given at least as much.
    compile.memory_mb = compile.memory_mb.max(memory);
    Ok(Execution {
        language: lang.clone(),
        source_name,
        source: code.as_bytes().to_vec(),
        files,
        stdin,
        args: Vec::new(),
        compile,
        run: StageLimits {
            timeout_ms: run_timeout,
            memory_mb: memory,
            ..StageLimits::default()
        },
        collect,
        output_bytes: None,
        merge_stderr: false,
    })
}

/// One stage as SandboxFusion reports it: a program killed by signal N returns -N, as
/// Python's subprocess reports it; a timed-out one has no return code.
fn result(s: &Stage) -> Value {
    let (status, code) = match s.status {
        StageStatus::Timeout | StageStatus::CpuLimit => ("TimeLimitExceeded", Value::Null),
        StageStatus::MemoryLimit | StageStatus::OutputLimit => ("Finished", json!(-libc::SIGKILL)),
        StageStatus::Signaled => ("Finished", json!(-s.signal.unwrap_or(s.exit_code - 128))),
        StageStatus::Ok | StageStatus::Failed => ("Finished", json!(s.exit_code)),
    };
    json!({
        "status": status,
        "execution_time": s.duration_ms / 1000.0,
        "cpu_time": s.cpu_ms as f64 / 1000.0,
        "return_code": code,
        "stdout": s.stdout,
        "stderr": s.stderr,
    })
}

/// `POST /run_code`'s answer to an execution that ended.
pub fn respond(executed: &Executed) -> Value {
    match executed {
        Executed::Internal { error } => json!({
            "status": "SandboxError", "message": error,
            "compile_result": null, "run_result": null, "executor_pod_name": null, "files": {},
        }),
        Executed::CompileFailed { compile } => json!({
            "status": "Failed", "message": "",
            "compile_result": result(compile), "run_result": null,
            "executor_pod_name": null, "files": {},
        }),
        Executed::Ran {
            compile,
            run,
            files,
        } => {
            let ok = run.status == StageStatus::Ok;
            let fetched: serde_json::Map<String, Value> = files
                .iter()
                .filter_map(|(path, data)| {
                    let bytes = data.to_bytes().ok()?;
                    Some((
                        path.clone(),
                        json!(base64::engine::general_purpose::STANDARD.encode(bytes)),
                    ))
                })
                .collect();
            json!({
                "status": if ok { "Success" } else { "Failed" },
                "message": "",
                "compile_result": compile.as_ref().map(result),
                "run_result": result(run),
                "executor_pod_name": null,
                "files": fetched,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkbox_queue::schema::FileData;

    fn parse(body: Value) -> Result<Execution, Rejection> {
        parse_run_code(
            body.to_string().as_bytes(),
            &crate::gateway::catalogue::all_at("1.0.0"),
            &Bounds::default(),
        )
    }

    #[test]
    fn the_documented_request_is_accepted() {
        let e = parse(json!({
            "code": "print(open('a.txt').read())", "language": "python",
            "compile_timeout": 10, "run_timeout": 2.5, "memory_limit_MB": 256,
            "stdin": "x", "files": {"a.txt": "aGk=", "empty": null}, "fetch_files": ["out.txt"]
        }))
        .unwrap();
        assert_eq!(e.language.name(), "python3");
        assert_eq!(e.run.timeout_ms, 2_500);
        assert_eq!(e.run.memory_mb, Some(256));
        assert_eq!(e.files["a.txt"], b"hi");
        assert_eq!(e.files["empty"], b"");
        assert_eq!(e.collect, ["out.txt"]);
        assert_eq!(
            parse(json!({"code": "", "language": "cpp"}))
                .unwrap()
                .language
                .name(),
            "c++"
        );
        assert_eq!(
            parse(json!({"code": "", "language": "nodejs"}))
                .unwrap()
                .language
                .name(),
            "javascript"
        );
    }

    #[test]
    fn compile_limits_are_the_requests_else_the_languages() {
        let java = crate::runtimes::Catalogue::builtin()
            .find("java")
            .unwrap()
            .compile_limits;
        let e = parse(json!({"code": "class A {}", "language": "java"})).unwrap();
        assert_eq!(Some(e.compile.timeout_ms), java.timeout_ms);
        assert_eq!(
            (e.compile.memory_mb, e.compile.pids),
            (java.memory_mb, java.pids)
        );
        assert_eq!(e.run.timeout_ms, 10_000);
        let job = e
            .to_job("j", crate::gateway::exec::Staging::Native)
            .unwrap();
        let stage = job.compile.unwrap();
        assert_eq!(stage.timeout_ms, java.timeout_ms);
        assert_eq!(stage.limits.pids, java.pids);
        // The request's compile_timeout replaces the language's; its memory_limit_MB is the
        // program's, and a compiler is given at least as much.
        let e = parse(json!({"code": "class A {}", "language": "java",
            "compile_timeout": 3, "memory_limit_MB": 3000}))
        .unwrap();
        assert_eq!(
            (e.compile.timeout_ms, e.compile.memory_mb),
            (3_000, Some(3000))
        );
    }

    #[test]
    fn each_bad_field_is_named() {
        for (body, field) in [
            (json!({"language": "python"}), "code"),
            (json!({"code": "x"}), "language"),
            (json!({"code": "x", "language": "cobol"}), "language"),
            (
                json!({"code": "x", "language": "python", "run_timeout": "soon"}),
                "run_timeout",
            ),
            (
                json!({"code": "x", "language": "python", "run_timeout": 100000}),
                "run_timeout",
            ),
            (
                json!({"code": "x", "language": "python", "memory_limit_MB": 0}),
                "memory_limit_MB",
            ),
            (
                json!({"code": "x", "language": "python", "files": {"/etc/x": ""}}),
                "files./etc/x",
            ),
            (
                json!({"code": "x", "language": "python", "files": {"a": "%%"}}),
                "files.a",
            ),
            (
                json!({"code": "x", "language": "python", "fetch_files": ["../x"]}),
                "fetch_files.0",
            ),
        ] {
            let r = parse(body.clone()).unwrap_err();
            assert_eq!(r.body["detail"][0]["loc"][1], field, "{body}");
        }
    }

    fn stage(status: StageStatus, exit_code: i32, signal: Option<i32>) -> Stage {
        Stage {
            status,
            exit_code,
            signal,
            stdout: "o".into(),
            stderr: "e".into(),
            duration_ms: 250.0,
            cpu_ms: 200,
            max_rss_kb: 1,
        }
    }

    #[test]
    fn results_say_success_failed_or_sandbox_error() {
        let mut files = BTreeMap::new();
        files.insert("out.txt".to_owned(), FileData::Text("hi".into()));
        let ok = respond(&Executed::Ran {
            compile: Some(stage(StageStatus::Ok, 0, None)),
            run: stage(StageStatus::Ok, 0, None),
            files,
        });
        assert_eq!(ok["status"], "Success");
        assert_eq!(ok["compile_result"]["return_code"], 0);
        assert_eq!(ok["run_result"]["execution_time"], 0.25);
        assert_eq!(ok["files"]["out.txt"], "aGk=");
        let tle = respond(&Executed::Ran {
            compile: None,
            run: stage(StageStatus::Timeout, 124, None),
            files: BTreeMap::new(),
        });
        assert_eq!(
            (tle["status"].as_str(), tle["run_result"]["status"].as_str()),
            (Some("Failed"), Some("TimeLimitExceeded"))
        );
        assert_eq!(tle["run_result"]["return_code"], Value::Null);
        assert_eq!(tle["compile_result"], Value::Null);
        let segv = respond(&Executed::Ran {
            compile: None,
            run: stage(StageStatus::Signaled, 139, Some(11)),
            files: BTreeMap::new(),
        });
        assert_eq!(segv["run_result"]["return_code"], -11);
        let ce = respond(&Executed::CompileFailed {
            compile: stage(StageStatus::Failed, 1, None),
        });
        assert_eq!(
            (ce["status"].as_str(), &ce["run_result"]),
            (Some("Failed"), &Value::Null)
        );
        assert_eq!(ce["compile_result"]["return_code"], 1);
        let err = respond(&Executed::Internal {
            error: "no sandbox".into(),
        });
        assert_eq!(
            (err["status"].as_str(), err["message"].as_str()),
            (Some("SandboxError"), Some("no sandbox"))
        );
    }
}
