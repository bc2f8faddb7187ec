//! The redis-cli example of docs/protocol.md, run verbatim against a real redis-server with a
//! stand-in worker (this crate has no sandbox): the commands are accepted, the job parses, and
//! the replies have the documented shape. The node's own test runs the same block with a real
//! worker.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::ok_result;
use forkbox_queue::redis::{self, Value};
use forkbox_queue::schema::DEFAULT_MAX_JOB_BYTES;
use forkbox_queue::{Broker, Job, JobResult, Queue, QueueConfig, RedisServer, Status};

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md");
    std::fs::read_to_string(path).expect("docs/protocol.md")
}

/// Contents of the fenced blocks tagged `tag`.
fn blocks(text: &str, tag: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match &mut current {
            None if line.trim_start() == format!("```{tag}") => current = Some(String::new()),
            Some(_) if line.trim_start() == "```" => out.push(current.take().unwrap()),
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
            None => {}
        }
    }
    out
}

/// The redis-cli command lines of the document, in order.
fn redis_cli_lines() -> Vec<String> {
    blocks(&doc(), "redis-cli")
        .iter()
        .flat_map(|b| b.lines().map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .collect()
}

/// Splits a line the way redis-cli does (sdssplitargs): whitespace-separated, with "..."
/// (backslash escapes) and '...' (only \' escaped) quoting.
fn split_args(line: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let Some(&first) = chars.peek() else {
            return args;
        };
        let mut arg = String::new();
        if first == '"' || first == '\'' {
            chars.next();
            while let Some(c) = chars.next() {
                if c == first {
                    break;
                }
                if c == '\\' {
                    if let Some(n) = chars.next() {
                        if first == '\'' && n != '\'' {
                            arg.push('\\');
                        }
                        arg.push(match (first, n) {
                            ('"', 'n') => '\n',
                            ('"', 't') => '\t',
                            (_, other) => other,
                        });
                    }
                } else {
                    arg.push(c);
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                arg.push(c);
                chars.next();
            }
        }
        args.push(arg);
    }
}

/// A stand-in worker: completes every job with status ok and the output `echo` would give.
fn stand_in_worker(q: Queue) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            for d in q.read("stand-in", 8, 200).await.unwrap() {
                let job = d.job.as_ref().expect("the documented job parses");
                let cmd = job.cmd.as_deref().unwrap_or_default();
                let out = cmd.strip_prefix("echo ").map(|s| format!("{s}\n"));
                q.complete(&d, &ok_result(&d, &out.unwrap_or_default(), "stand-in"))
                    .await
                    .unwrap();
            }
        }
    })
}

async fn setup() -> (RedisServer, Queue, tokio::task::JoinHandle<()>) {
    let server = RedisServer::start().unwrap();
    let q = Broker::connect(&server.url())
        .await
        .unwrap()
        .queue("default", QueueConfig::default())
        .unwrap();
    q.ensure_group().await.unwrap();
    let worker = stand_in_worker(q.clone());
    (server, q, worker)
}

fn check_result_json(text: &str) {
    let r: JobResult = serde_json::from_str(text).expect("result JSON v1");
    assert_eq!(r.id, "hello-1");
    assert_eq!(r.outcome.status, Status::Ok);
    assert_eq!(r.outcome.exit_code, 0);
    assert_eq!(r.outcome.stdout, "hello\n");
}

#[test]
fn the_document_has_the_example() {
    let lines = redis_cli_lines();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].starts_with("XADD forkbox:{default}:jobs * job "));
    // The documented result is valid v1 result JSON with the documented values.
    let json = blocks(&doc(), "json");
    assert_eq!(json.len(), 1);
    check_result_json(json[0].trim());
}

#[tokio::test]
async fn the_redis_cli_example_runs_through_a_client() {
    let (server, _q, worker) = setup().await;
    // A client connection of its own: BLPOP blocks the connection it is sent on.
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut replies = Vec::new();
    for line in redis_cli_lines() {
        let args = split_args(&line);
        if args[0].eq_ignore_ascii_case("XADD") {
            let payload = args.last().unwrap();
            let job = Job::parse(payload.as_bytes(), DEFAULT_MAX_JOB_BYTES).expect("job parses");
            assert_eq!(job.id.as_deref(), Some("hello-1"));
        }
        let mut cmd = redis::cmd(&args[0]);
        for a in &args[1..] {
            cmd.arg(a);
        }
        let v: Value = cmd.query_async(&mut conn).await.expect(&line);
        replies.push(v);
    }
    worker.abort();
    let entry: String = redis::from_redis_value(&replies[0]).unwrap();
    assert!(entry.contains('-'), "an entry id: {entry}");
    let (list, status): (String, String) = redis::from_redis_value(&replies[1]).unwrap();
    assert_eq!(list, "forkbox:{default}:done:hello-1");
    assert_eq!(status, "ok");
    let result: String = redis::from_redis_value(&replies[2]).unwrap();
    check_result_json(&result);
}

#[tokio::test]
async fn the_redis_cli_example_runs_in_redis_cli() {
    let Ok(status) = Command::new("redis-cli").arg("--version").output() else {
        println!("SKIPPED: redis-cli is not installed");
        return;
    };
    assert!(status.status.success());
    let (server, _q, worker) = setup().await;
    let script = redis_cli_lines().join("\n") + "\n";
    let port = server.port().to_string();
    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new("redis-cli")
            .args(["-p", &port])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    });
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("redis-cli finished")
        .unwrap();
    worker.abort();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    // Non-interactive redis-cli prints raw replies: the entry id, the BLPOP pair, the JSON.
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(lines[0].contains('-'), "{stdout}");
    assert_eq!(lines[1], "forkbox:{default}:done:hello-1");
    assert_eq!(lines[2], "ok");
    check_result_json(lines[3]);
}
