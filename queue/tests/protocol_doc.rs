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

/// The command lines of the document's blocks tagged `tag`, in order (blank lines and
/// comments left out).
fn command_lines(tag: &str) -> Vec<String> {
    blocks(&doc(), tag)
        .iter()
        .flat_map(|b| b.lines().map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .collect()
}

/// The redis-cli command lines of the document, in order.
fn redis_cli_lines() -> Vec<String> {
    command_lines("redis-cli")
}

/// Whether redis-cli runs here; the caller's test is skipped (and counted) when it does not.
fn have_redis_cli() -> bool {
    let Ok(status) = Command::new("redis-cli").arg("--version").output() else {
        forkbox_queue::skip::skipped("redis-cli is not installed");
        return false;
    };
    assert!(status.status.success());
    true
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

/// Runs `redis-cli ARGS` with `script` on its standard input; its output once it exits.
async fn redis_cli(args: &[&str], script: String) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new("redis-cli")
            .args(&args)
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
    tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("redis-cli finished")
        .unwrap()
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
    assert_eq!(json.len(), 2);
    check_result_json(json[1].trim());
    // The staged job's example is a valid job with both stages.
    let staged = forkbox_queue::Job::parse(json[0].trim().as_bytes(), 1 << 20)
        .expect("the staged example is a valid job");
    assert_eq!(staged.compile.unwrap().command()[0], "g++");
    assert_eq!(staged.argv.unwrap(), ["./main"]);
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
    if !have_redis_cli() {
        return;
    }
    let (server, _q, worker) = setup().await;
    let script = redis_cli_lines().join("\n") + "\n";
    let port = server.port().to_string();
    let out = redis_cli(&["-p", &port], script).await;
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

/// The redis-cli lines of the document's Redis Cluster example.
fn redis_cli_cluster_lines() -> Vec<String> {
    command_lines("redis-cli-cluster")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_example_runs_in_redis_cli_c() {
    if !have_redis_cli() {
        return;
    }
    let cluster = forkbox_queue::RedisCluster::start_default().expect("start a 3+3 cluster");
    let endpoint = forkbox_queue::Endpoint::parse(&cluster.seeds(), true).unwrap();
    let q = Broker::connect_to(&endpoint)
        .await
        .unwrap()
        .queue("default", QueueConfig::default())
        .unwrap();
    q.ensure_group().await.unwrap();
    let worker = stand_in_worker(q.clone());
    // A watcher as a worker runs one: it must hear the raw SPUBLISH.
    let mut watcher = q.watch_cancellations();
    let first = tokio::time::timeout(Duration::from_secs(30), watcher.next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(first, forkbox_queue::CancelEvent::Resynced(_)));
    let heard = tokio::spawn(async move { watcher.next().await });

    // Through a primary that does not serve the queue's slot: redis-cli -c follows MOVED.
    let slot = redis::cluster_routing::get_slot(q.keys().jobs().as_bytes());
    let owner = cluster.primary_of(slot).unwrap();
    let via = cluster
        .view()
        .into_iter()
        .find(|n| n.primary && !n.serves(slot))
        .map(|n| n.port)
        .unwrap();
    assert_ne!(cluster.nodes()[owner].port(), via);
    let script = redis_cli_cluster_lines().join("\n") + "\n";
    let out = redis_cli(&["-c", "-p", &via.to_string()], script).await;
    worker.abort();
    let stdout = String::from_utf8(out.stdout).unwrap();
    // redis-cli -c notes each redirection it followed on a line of its own.
    let (redirects, lines): (Vec<&str>, Vec<&str>) = stdout
        .lines()
        .partition(|l| l.starts_with("-> Redirected to slot"));
    assert!(
        redirects.iter().any(|l| l.contains(&format!("[{slot}]"))),
        "the MOVED reply was followed: {stdout}"
    );
    assert_eq!(lines.len(), 7, "{stdout}");
    assert!(lines[0].contains('-'), "{stdout}");
    assert_eq!(lines[1], "forkbox:{default}:done:hello-c1");
    assert_eq!(lines[2], "ok");
    let r: JobResult = serde_json::from_str(lines[3]).expect("result JSON v1");
    assert_eq!(
        (r.id.as_str(), r.outcome.stdout.as_str()),
        ("hello-c1", "hello\n")
    );
    assert_eq!(lines[4], "1", "ZADD");
    assert_eq!(lines[5], "1", "SPUBLISH reached the one subscribed watcher");
    assert_eq!(lines[6], slot.to_string(), "CLUSTER KEYSLOT");
    let ev = tokio::time::timeout(Duration::from_secs(30), heard)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        ev,
        forkbox_queue::CancelEvent::Cancelled("never-ran-1".into())
    );
    // The documented slot is the real one.
    assert!(doc().contains(&format!("the slot, `{slot}`")));
}

/// The redis-cli lines of the document's partitioned-queue example.
fn redis_cli_partitioned_lines() -> Vec<String> {
    command_lines("redis-cli-partitioned")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_partitioned_example_runs_in_redis_cli_c() {
    if !have_redis_cli() {
        return;
    }
    // The documented tags, slots and partition of the example id are what the crate computes.
    let tags: Vec<String> = (0..3)
        .map(|p| forkbox_queue::keys::partition_tag("default", p, 3))
        .collect();
    assert_eq!(tags, ["default", "default:1:3", "default:2:0"]);
    let text = doc();
    for t in &tags {
        let slot = forkbox_queue::keys::tag_slot(t);
        assert!(text.contains(&format!("`{t}` (slot {slot})")), "{t} {slot}");
    }
    assert_eq!(forkbox_queue::keys::partition_of("hello-p1", 3), 1);

    let cluster = forkbox_queue::RedisCluster::start_default().expect("start a 3+3 cluster");
    let endpoint = forkbox_queue::Endpoint::parse(&cluster.seeds(), true).unwrap();
    let q = Broker::connect_to(&endpoint)
        .await
        .unwrap()
        .open_partitioned("default", 3, QueueConfig::default())
        .await
        .unwrap();
    // A stand-in for a worker reading every partition.
    let workers: Vec<_> = q
        .partitions()
        .iter()
        .map(|p| stand_in_worker(p.clone()))
        .collect();
    // The three partitions are served by three different primaries.
    let owners: std::collections::BTreeSet<usize> = q
        .partitions()
        .iter()
        .map(|p| {
            let slot = redis::cluster_routing::get_slot(p.keys().jobs().as_bytes());
            cluster.primary_of(slot).unwrap()
        })
        .collect();
    assert_eq!(owners.len(), 3, "one primary per partition");

    let slot = forkbox_queue::keys::tag_slot("default:1:3");
    let via = cluster
        .view()
        .into_iter()
        .find(|n| n.primary && !n.serves(slot))
        .map(|n| n.port)
        .unwrap();
    let script = redis_cli_partitioned_lines().join("\n") + "\n";
    let out = redis_cli(&["-c", "-p", &via.to_string()], script).await;
    for w in workers {
        w.abort();
    }
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.starts_with("-> Redirected to slot"))
        .collect();
    assert_eq!(lines.len(), 6, "{stdout}");
    assert!(lines[0].contains('-'), "{stdout}");
    assert_eq!(lines[1], "forkbox:{default:1:3}:done:hello-p1");
    assert_eq!(lines[2], "ok");
    let r: JobResult = serde_json::from_str(lines[3]).expect("result JSON v1");
    assert_eq!(
        (r.id.as_str(), r.outcome.stdout.as_str()),
        ("hello-p1", "hello\n")
    );
    assert_eq!(lines[4], "3", "the meta key");
    assert_eq!(lines[5], slot.to_string(), "CLUSTER KEYSLOT");
    assert!(text.contains(&format!("the slot, `{slot}`")));
    // The result is where a client holding the id looks.
    assert_eq!(
        q.result("hello-p1").await.unwrap().map(|r| r.id),
        Some("hello-p1".to_owned())
    );
}

/// The README shows a `jobs.jsonl` line of each kind (`cmd`, `argv` with `runtime`, `files`),
/// each a valid job.
#[test]
fn the_readme_shows_a_jobs_jsonl_line_of_each_kind() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    let readme = std::fs::read_to_string(path).expect("README.md");
    let jobs: Vec<Job> = blocks(&readme, "jsonl")
        .iter()
        .flat_map(|b| b.lines().map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let job: Job = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l}: {e}"));
            job.validate().unwrap_or_else(|e| panic!("{l}: {e}"));
            job
        })
        .collect();
    assert!(jobs.iter().any(|j| j.cmd.is_some() && j.files.is_empty()));
    assert!(jobs.iter().any(|j| j.argv.is_some() && j.runtime.is_some()));
    assert!(jobs
        .iter()
        .any(|j| !j.files.is_empty() && !j.collect.is_empty()));
}
