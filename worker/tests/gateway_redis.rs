//! `forkbox gateway` against Redis as production runs it: over `rediss://` with a CA file,
//! logged in as the gateway's ACL role of docs/operations.md ("ACL roles", read from that
//! page), in front of a worker logged in as the worker's role. Each API runs a program, the
//! Judge0 submission is read back, and a request whose job finds no free slot in time is
//! cancelled: a command the role lacks fails one of these steps (the ACL log is printed).

mod node_support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use forkbox_queue::redis;
use forkbox_testkit::{RedisServer, RedisServerOptions, TestCerts};
use node_support::*;
use serde_json::{json, Value};

const QUEUE: &str = "gwacl";

/// The page's `user forkbox-worker` and `user forkbox-gateway` lines for [`QUEUE`], each with
/// password `pw-ROLE`.
fn acl_lines() -> Vec<String> {
    let page = std::fs::read_to_string(repo_file("docs/operations.md")).unwrap();
    let lines: Vec<String> = page
        .lines()
        .filter(|l| l.starts_with("user forkbox-worker ") || l.starts_with("user forkbox-gateway "))
        .map(|l| {
            l.replace("{Q}", &format!("{{{QUEUE}}}"))
                .replace(">WORKER_PASSWORD", ">pw-worker")
                .replace(">GATEWAY_PASSWORD", ">pw-gateway")
        })
        .collect();
    assert_eq!(
        lines.len(),
        2,
        "the worker and gateway roles on the page: {lines:?}"
    );
    lines
}

/// A TLS-only server whose users are the two roles and an admin (`default`, password `admin`).
fn server(certs: &TestCerts, acl_dir: &std::path::Path) -> RedisServer {
    let mut acl = acl_lines().join("\n");
    acl.push_str("\nuser default on >admin ~* &* +@all\n");
    let file = acl_dir.join("users.acl");
    std::fs::write(&file, acl).unwrap();
    RedisServer::start_with(RedisServerOptions {
        tls: Some(certs.server_tls(false)),
        extra_args: vec!["--aclfile".into(), file.display().to_string()],
        ..RedisServerOptions::default()
    })
    .expect("a TLS redis-server with the ACL file")
}

/// `url` (`rediss://127.0.0.1:PORT...`) logged in as `role`.
fn as_role(url: &str, role: &str) -> String {
    let rest = url.strip_prefix("rediss://").expect("a rediss:// URL");
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    format!("rediss://forkbox-{role}:pw-{role}@{host}")
}

/// The ACL log, read as the admin, for failure messages.
async fn acl_log(url: &str, ca: &str) -> String {
    let admin = url.replacen("rediss://", "rediss://:admin@", 1);
    let tls = forkbox_queue::RedisTls {
        ca: Some(ca.into()),
        ..Default::default()
    };
    let broker = match forkbox_queue::Broker::connect_with(&admin, &tls).await {
        Ok(b) => b,
        Err(e) => return format!("(no ACL log: {e})"),
    };
    let log: redis::RedisResult<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut broker.connection())
        .await;
    format!("{log:?}")
}

/// `forkbox gateway` on a free loopback port; its address, once it prints it.
struct GatewayProc {
    child: Child,
    addr: SocketAddr,
}

impl GatewayProc {
    fn start(args: &[&str]) -> GatewayProc {
        let mut child = Command::new(BIN)
            .args(["gateway", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning forkbox gateway");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        let addr = first
            .strip_prefix("forkbox gateway: http://")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("the gateway's first line names no address: {first:?}"));
        std::thread::spawn(move || lines.for_each(drop));
        GatewayProc { child, addr }
    }
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// [`http_json`] from a blocking thread.
async fn call(
    addr: SocketAddr,
    method: &'static str,
    path: String,
    body: Option<Value>,
) -> (u16, Value) {
    tokio::task::spawn_blocking(move || http_json(addr, method, &path, body.as_ref()))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_serves_every_api_as_its_acl_role_over_tls() {
    let Some(certs) = TestCerts::or_skip() else {
        return;
    };
    let acl_dir = tempfile::tempdir().unwrap();
    let server = server(&certs, acl_dir.path());
    let url = server.url();
    let ca = certs.ca().to_str().unwrap().to_owned();
    let mut w = WorkerProc::start(
        &as_role(&url, "worker"),
        "gwacl-w",
        &["--redis-ca", &ca, "--queues", QUEUE, "--slots", "1"],
    );
    w.wait_ready();
    let gateway_url = as_role(&url, "gateway");
    let gw = GatewayProc::start(&[
        "--redis",
        &gateway_url,
        "--redis-ca",
        &ca,
        "--queue",
        QUEUE,
        "--queue-wait",
        "1",
    ]);
    let addr = gw.addr;
    let log = || acl_log(&url, &ca);

    // What the worker published, read with SCAN and GET.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, v) = call(addr, "GET", "/api/v2/runtimes".into(), None).await;
        if code == 200
            && v.as_array()
                .is_some_and(|a| a.iter().any(|l| l["language"] == "python"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no python offered: {code} {v}; {}",
            log().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, v) = call(addr, "GET", "/healthz".into(), None).await;
    assert_eq!(code, 200, "{v}; {}", log().await);

    // Piston.
    let piston =
        json!({"language": "python", "version": "*", "files": [{"content": "print(6*7)"}]});
    let (code, v) = call(addr, "POST", "/api/v2/execute".into(), Some(piston)).await;
    assert_eq!(
        (code, &v["run"]["stdout"]),
        (200, &json!("42\n")),
        "{v}; {}",
        log().await
    );

    // SandboxFusion.
    let fusion = json!({"code": "print(7*6)", "language": "python"});
    let (code, v) = call(addr, "POST", "/run_code".into(), Some(fusion)).await;
    assert_eq!(
        (code, &v["status"], &v["run_result"]["stdout"]),
        (200, &json!("Success"), &json!("42\n")),
        "{v}; {}",
        log().await
    );

    // Judge0: kept for a later read (SET ... EX), read back (GET) while queued or done.
    let sub = json!({"source_code": "print(input())", "language_id": 71, "stdin": "judged"});
    let (code, v) = call(addr, "POST", "/submissions".into(), Some(sub.clone())).await;
    assert_eq!(code, 201, "{v}; {}", log().await);
    let token = v["token"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, v) = call(addr, "GET", format!("/submissions/{token}"), None).await;
        assert_eq!(code, 200, "{v}; {}", log().await);
        if v["status"]["id"] == 3 {
            assert_eq!(v["stdout"], "judged\n", "{v}");
            break;
        }
        assert!(
            v["status"]["id"] == 1 || v["status"]["id"] == 2,
            "{v}; {}",
            log().await
        );
        assert!(Instant::now() < deadline, "{v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, v) = call(
        addr,
        "POST",
        "/submissions?wait=true".into(),
        Some(sub.clone()),
    )
    .await;
    assert_eq!(
        (code, &v["stdout"]),
        (201, &json!("judged\n")),
        "{v}; {}",
        log().await
    );
    let batch = json!({"submissions": [sub.clone(), sub]});
    let (code, v) = call(addr, "POST", "/submissions/batch".into(), Some(batch)).await;
    assert_eq!(code, 201, "{v}; {}", log().await);
    let tokens: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["token"].as_str())
        .collect();
    assert_eq!(tokens.len(), 2, "{v}");
    let path = format!("/submissions/batch?tokens={}", tokens.join(","));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, v) = call(addr, "GET", path.clone(), None).await;
        assert_eq!(code, 200, "{v}; {}", log().await);
        let subs = v["submissions"].as_array().expect("a list of submissions");
        assert_eq!(subs.len(), 2, "{v}");
        if subs.iter().all(|s| s["status"]["id"] == 3) {
            assert!(subs.iter().all(|s| s["stdout"] == "judged\n"), "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "{v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The one slot busy for 6 s: a request waiting 1 s + its 1 s limit gets no result in
    // time, and its job is cancelled (MULTI, ZADD, ZREMRANGEBYSCORE, PUBLISH, EXEC).
    let busy =
        json!({"code": "import time; time.sleep(6)", "language": "python", "run_timeout": 20});
    let blocker = tokio::spawn(call(addr, "POST", "/run_code".into(), Some(busy)));
    let admin = redis_admin(&url, &ca).await;
    let running = format!("forkbox:{{{QUEUE}}}:jobs");
    poll(Duration::from_secs(30), "the blocker running", || {
        let admin = admin.clone();
        let running = running.clone();
        async move {
            let pending: redis::Value = redis::cmd("XPENDING")
                .arg(&running)
                .arg("workers")
                .query_async(&mut admin.connection())
                .await
                .ok()?;
            matches!(&pending, redis::Value::Array(v) if v.first() != Some(&redis::Value::Int(0)))
                .then_some(())
        }
    })
    .await;
    let late = json!({"source_code": "print(1)", "language_id": 71, "wall_time_limit": 1, "cpu_time_limit": 1});
    let (code, v) = call(addr, "POST", "/submissions?wait=true".into(), Some(late)).await;
    assert_eq!(
        (code, &v["status"]["id"]),
        (201, &json!(13)),
        "{v}; {}",
        log().await
    );
    let late_token = v["token"].as_str().unwrap().to_owned();
    let cancelled: Option<f64> = redis::cmd("ZSCORE")
        .arg(format!("forkbox:{{{QUEUE}}}:cancelled"))
        .arg(&late_token)
        .query_async(&mut admin.connection())
        .await
        .unwrap();
    assert!(
        cancelled.is_some(),
        "{late_token} was not cancelled; {}",
        log().await
    );
    let (code, v) = blocker.await.unwrap();
    assert_eq!((code, &v["status"]), (200, &json!("Success")), "{v}");
    // Nothing the gateway did was refused.
    let refusals = log().await;
    assert!(!refusals.contains("forkbox-gateway"), "{refusals}");
    drop(gw);
    drop(w);
}

/// A broker logged in as the admin over TLS.
async fn redis_admin(url: &str, ca: &str) -> forkbox_queue::Broker {
    let admin = url.replacen("rediss://", "rediss://:admin@", 1);
    let tls = forkbox_queue::RedisTls {
        ca: Some(ca.into()),
        ..Default::default()
    };
    forkbox_queue::Broker::connect_with(&admin, &tls)
        .await
        .expect("the admin over TLS")
}
