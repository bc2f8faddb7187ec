//! The ACL roles of docs/operations.md ("ACL roles"), read from that page, against a real
//! redis-server whose users are exactly those lines: what a worker, a submitter and a monitor
//! can do, and what Redis refuses them with `NOPERM`. (The gateway role's work is run end to
//! end by `worker/tests/gateway_redis.rs`; here, what it is refused.)

use std::time::Duration;

use forkbox_queue::redis::{self, aio::MultiplexedConnection};
use forkbox_queue::{Broker, Job, JobResult, Outcome, QueueConfig, Status};
use forkbox_testkit::{RedisServer, RedisServerOptions};

const QUEUE: &str = "acl";

/// The `user forkbox-*` lines of the page, for queue [`QUEUE`], each with password `pw-ROLE`.
fn acl_lines() -> Vec<String> {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .unwrap();
    let lines: Vec<String> = page
        .lines()
        .filter(|l| l.starts_with("user forkbox-"))
        .map(|l| {
            l.replace("{Q}", &format!("{{{QUEUE}}}"))
                .replace(">WORKER_PASSWORD", ">pw-worker")
                .replace(">SUBMITTER_PASSWORD", ">pw-submitter")
                .replace(">MONITOR_PASSWORD", ">pw-monitor")
                .replace(">GATEWAY_PASSWORD", ">pw-gateway")
        })
        .collect();
    assert_eq!(lines.len(), 4, "four roles on the page: {lines:?}");
    lines
}

/// A server with the four users and an admin (`default` with password `admin`).
fn server() -> RedisServer {
    // Redis reads the file at start only.
    let dir = tempfile::tempdir().unwrap();
    let mut acl = acl_lines().join("\n");
    acl.push_str("\nuser default on >admin ~* &* +@all\n");
    let file = dir.path().join("users.acl");
    std::fs::write(&file, acl).unwrap();
    RedisServer::start_with(RedisServerOptions {
        extra_args: vec!["--aclfile".into(), file.display().to_string()],
        ..RedisServerOptions::default()
    })
    .expect("redis-server with the ACL file")
}

fn url(server: &RedisServer, role: &str) -> String {
    format!(
        "redis://forkbox-{role}:pw-{role}@127.0.0.1:{}/",
        server.port()
    )
}

async fn raw(server: &RedisServer, role: &str) -> MultiplexedConnection {
    redis::Client::open(url(server, role))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// What Redis' ACL log holds, for failure messages.
async fn acl_log(server: &RedisServer) -> String {
    let mut admin = redis::Client::open(format!("redis://:admin@127.0.0.1:{}/", server.port()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let v: redis::Value = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut admin)
        .await
        .unwrap();
    format!("{v:?}")
}

async fn refused(conn: &mut MultiplexedConnection, cmd: &mut redis::Cmd) -> String {
    let r: redis::RedisResult<redis::Value> = cmd.query_async(conn).await;
    let e = r.expect_err("Redis allowed it");
    assert_eq!(e.code(), Some("NOPERM"), "{e}");
    e.to_string()
}

fn job(id: &str) -> Job {
    serde_json::from_value(serde_json::json!({"id": id, "cmd": "true"})).unwrap()
}

#[tokio::test]
async fn each_role_can_do_its_work_and_nothing_else() {
    let server = server();
    let k = forkbox_queue::Keys::new(QUEUE).unwrap();

    // A worker: group, read, complete, heartbeat, reclaim, cancellations.
    let w = Broker::connect(&url(&server, "worker")).await.unwrap();
    let wq = w.queue(QUEUE, QueueConfig::default()).unwrap();
    let worker_ops = async {
        wq.ensure_group().await?;
        wq.heartbeat("w1", Duration::from_secs(10)).await?;
        Ok::<_, forkbox_queue::QueueError>(())
    };
    if let Err(e) = worker_ops.await {
        panic!("worker: {e}; ACL log: {}", acl_log(&server).await);
    }

    // A submitter: the enqueue script, a raw XADD, where a job is, cancel, batch status.
    let s = Broker::connect(&url(&server, "submitter")).await.unwrap();
    let sq = s.queue(QUEUE, QueueConfig::default()).unwrap();
    let submitter_ops = async {
        sq.enqueue(&job("acl-1")).await?;
        sq.enqueue_raw(br#"{"id":"acl-raw","cmd":"true"}"#).await?;
        sq.enqueue_batch(&[job("acl-b1")], "b").await?;
        sq.job_state("acl-1").await?;
        sq.cancel("acl-raw").await?;
        sq.batch_status("b").await?;
        sq.result("acl-1").await?;
        Ok::<_, forkbox_queue::QueueError>(())
    };
    if let Err(e) = submitter_ops.await {
        panic!("submitter: {e}; ACL log: {}", acl_log(&server).await);
    }

    // The worker reads and completes; the submitter's wait, blocked before the completion,
    // sees the result.
    let waiter = {
        let sq = sq.clone();
        tokio::spawn(async move { sq.wait_result("acl-1", Duration::from_secs(20)).await })
    };
    let got = wq.read("w1", 10, 100).await.unwrap();
    assert_eq!(got.len(), 3, "{got:?}");
    let d = got.iter().find(|d| d.id == "acl-1").unwrap();
    let mut outcome = Outcome::not_run(Status::Ok, "");
    outcome.exit_code = 0;
    outcome.error = None;
    let result = JobResult::new(d.id.clone(), outcome, 1, "w1".into());
    if let Err(e) = wq.complete(d, &result).await {
        panic!("worker complete: {e}; ACL log: {}", acl_log(&server).await);
    }
    let waited = match waiter.await.unwrap() {
        Ok(r) => r,
        Err(e) => panic!("submitter wait: {e}; ACL log: {}", acl_log(&server).await),
    };
    assert_eq!(waited.map(|r| r.id), Some("acl-1".to_owned()));
    // A wait that starts after the completion finds the result at once.
    let again = sq
        .wait_result("acl-1", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(again.map(|r| r.id), Some("acl-1".to_owned()));
    wq.reclaim("w2", 0, 10).await.unwrap();
    wq.stats().await.unwrap();

    // What the submitter cannot do: forge a result, touch the results or dead streams,
    // acknowledge or delete entries, read deliveries, or reach another queue.
    let mut sc = raw(&server, "submitter").await;
    refused(
        &mut sc,
        redis::cmd("SET").arg(k.result("acl-raw")).arg("{}"),
    )
    .await;
    refused(
        &mut sc,
        redis::cmd("XADD")
            .arg(k.results())
            .arg("*")
            .arg("result")
            .arg("{}"),
    )
    .await;
    refused(
        &mut sc,
        redis::cmd("XADD").arg(k.dead()).arg("*").arg("x").arg("y"),
    )
    .await;
    // Nor any key a waiter blocks on: a wait only reads (a blocking XREAD of `wake:<id>`).
    refused(&mut sc, redis::cmd("RPUSH").arg(k.done("acl-raw")).arg("1")).await;
    refused(&mut sc, redis::cmd("RPUSH").arg(k.done("acl-1")).arg("ok")).await;
    refused(
        &mut sc,
        redis::cmd("BLMOVE")
            .arg(k.done("acl-1"))
            .arg(k.done("acl-1"))
            .arg("RIGHT")
            .arg("LEFT")
            .arg("0.01"),
    )
    .await;
    refused(
        &mut sc,
        redis::cmd("XADD")
            .arg(k.wake("acl-raw"))
            .arg("*")
            .arg("status")
            .arg("ok"),
    )
    .await;
    refused(
        &mut sc,
        redis::cmd("XACK").arg(k.jobs()).arg("workers").arg("0-1"),
    )
    .await;
    refused(&mut sc, redis::cmd("XDEL").arg(k.jobs()).arg("0-1")).await;
    refused(&mut sc, redis::cmd("DEL").arg(k.jobs())).await;
    refused(
        &mut sc,
        redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("workers")
            .arg("x")
            .arg("STREAMS")
            .arg(k.jobs())
            .arg(">"),
    )
    .await;
    refused(
        &mut sc,
        redis::cmd("XADD")
            .arg("forkbox:{other}:jobs")
            .arg("*")
            .arg("job")
            .arg("{}"),
    )
    .await;
    refused(&mut sc, redis::cmd("GET").arg("forkbox:{other}:result:x")).await;
    refused(&mut sc, &mut redis::cmd("FLUSHALL")).await;
    // Through the enqueue script too: it may write only the submitter's keys.
    let other = Broker::connect(&url(&server, "submitter")).await.unwrap();
    let oq = other.queue("other", QueueConfig::default()).unwrap();
    let e = oq.enqueue(&job("x")).await.unwrap_err();
    assert!(
        e.to_string().contains("NOPERM") || format!("{e:?}").contains("NOPERM"),
        "{e}"
    );

    // The worker has no rights outside its queue, nor admin commands.
    let mut wc = raw(&server, "worker").await;
    refused(&mut wc, redis::cmd("GET").arg("forkbox:{other}:result:x")).await;
    refused(&mut wc, &mut redis::cmd("FLUSHALL")).await;
    refused(&mut wc, redis::cmd("KEYS").arg("*")).await;

    // The gateway keeps its own keys, and is refused what the submitter is, and batches.
    let mut gc = raw(&server, "gateway").await;
    let gateway_key = format!("{}gateway:judge0:x", k.prefix());
    let kept: redis::RedisResult<()> = redis::cmd("SET")
        .arg(&gateway_key)
        .arg("{}")
        .arg("EX")
        .arg(10)
        .query_async(&mut gc)
        .await;
    kept.unwrap();
    refused(
        &mut gc,
        redis::cmd("SET").arg(k.result("acl-raw")).arg("{}"),
    )
    .await;
    refused(&mut gc, redis::cmd("RPUSH").arg(k.done("acl-1")).arg("ok")).await;
    refused(
        &mut gc,
        redis::cmd("XACK").arg(k.jobs()).arg("workers").arg("0-1"),
    )
    .await;
    refused(&mut gc, redis::cmd("DEL").arg(&gateway_key)).await;
    refused(
        &mut gc,
        redis::cmd("HINCRBY").arg(k.batch("b")).arg("total").arg(1),
    )
    .await;
    refused(
        &mut gc,
        redis::cmd("SET").arg("forkbox:{other}:gateway:x").arg("{}"),
    )
    .await;
    refused(&mut gc, &mut redis::cmd("FLUSHALL")).await;

    // A monitor reads everything and writes nothing.
    let m = Broker::connect(&url(&server, "monitor")).await.unwrap();
    let mq = m.queue(QUEUE, QueueConfig::default()).unwrap();
    let stats = match mq.stats().await {
        Ok(s) => s,
        Err(e) => panic!("monitor stats: {e}; ACL log: {}", acl_log(&server).await),
    };
    assert_eq!(stats.length, 2, "two of the three jobs still on the stream");
    assert!(mq.result("acl-1").await.unwrap().is_some());
    assert!(mq.batch_status("b").await.is_ok());
    let mut mc = raw(&server, "monitor").await;
    refused(
        &mut mc,
        redis::cmd("XADD")
            .arg(k.jobs())
            .arg("*")
            .arg("job")
            .arg("{}"),
    )
    .await;
    refused(&mut mc, redis::cmd("SET").arg(k.result("x")).arg("{}")).await;
    refused(
        &mut mc,
        redis::cmd("ZADD").arg(k.cancelled()).arg("1").arg("x"),
    )
    .await;
    assert!(mq.enqueue(&job("m")).await.is_err());
}

/// The enqueue script no longer reads the result key: the completion leaves the idempotency
/// marker for as long as the result, also for an entry a raw `XADD` added, so resubmitting a
/// finished id is still refused.
#[tokio::test]
async fn a_finished_raw_entry_is_not_enqueued_again() {
    let server = RedisServer::start().expect("redis-server");
    let q = Broker::connect(&server.url())
        .await
        .unwrap()
        .queue("marker", QueueConfig::default())
        .unwrap();
    q.ensure_group().await.unwrap();
    q.enqueue_raw(br#"{"id":"raw-1","cmd":"true"}"#)
        .await
        .unwrap();
    let d = q.read("w", 1, 100).await.unwrap().remove(0);
    let mut outcome = Outcome::not_run(Status::Ok, "");
    outcome.exit_code = 0;
    outcome.error = None;
    let result = JobResult::new(d.id.clone(), outcome, 1, "w".into());
    assert!(matches!(
        q.complete(&d, &result).await.unwrap(),
        forkbox_queue::Completion::Stored
    ));
    let again = q.enqueue_idempotent(&job("raw-1")).await.unwrap();
    assert!(!again.new, "a finished id was enqueued again: {again:?}");
    assert!(q.read("w", 1, 100).await.unwrap().is_empty());
}
