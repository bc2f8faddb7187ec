//! Redis as production runs it, end to end with real `forkbox` processes: a worker and the
//! command line over `rediss://` with a CA file, with mutual TLS, refused with a wrong CA; and
//! passwords and ACL users in the URL, a refused password reported as such.

mod node_support;

use std::process::{Command, Output, Stdio};

use forkbox_testkit::{tls_server, RedisServer, RedisServerOptions, TestCerts};
use node_support::*;

fn forkbox(args: &[String]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running forkbox")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `forkbox ARGS` with the Redis options before any `--`.
async fn cli(args: &[&str], redis: &[String]) -> Output {
    let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let at = v.iter().position(|s| s == "--").unwrap_or(v.len());
    v.splice(at..at, redis.iter().cloned());
    tokio::task::spawn_blocking(move || forkbox(&v))
        .await
        .unwrap()
}

fn path(p: std::path::PathBuf) -> String {
    p.to_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn worker_and_submit_over_rediss_with_a_ca_file() {
    let Some(certs) = TestCerts::or_skip() else {
        return;
    };
    let server = tls_server(&certs, false);
    let url = server.url();
    assert!(url.starts_with("rediss://"));
    let ca = path(certs.ca());
    let mut w = WorkerProc::start(
        &url,
        "tls-ca",
        &["--redis-ca", &ca, "--queues", "tls", "--slots", "1"],
    );
    w.wait_ready();
    let redis = vec![
        "--redis".into(),
        url.clone(),
        "--redis-ca".into(),
        ca.clone(),
    ];
    let out = cli(
        &["submit", "-q", "tls", "--wait", "--", "echo", "over tls"],
        &redis,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "over tls\n");
    // The CA also comes from the environment, as a deployment's env file gives it.
    let out = {
        let url = url.clone();
        let ca = ca.clone();
        tokio::task::spawn_blocking(move || {
            Command::new(BIN)
                .args(["stats", "-q", "tls", "--json", "--redis", &url])
                .env("FORKBOX_REDIS_CA", &ca)
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    };
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("tls-ca"),
        "{}",
        text(&out.stdout)
    );

    // A wrong CA is refused, and the message says it is the TLS handshake, not Redis down.
    let other = path(certs.other_ca());
    let out = cli(
        &["submit", "-q", "tls", "--", "true"],
        &["--redis".into(), url.clone(), "--redis-ca".into(), other],
    )
    .await;
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains("TLS handshake") && err.contains("--redis-ca"),
        "{err}"
    );
    assert!(!err.contains("cannot reach Redis"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls_worker_and_client() {
    let Some(certs) = TestCerts::or_skip() else {
        return;
    };
    let server = tls_server(&certs, true);
    let url = server.url();
    let (ca, cert, key) = (
        path(certs.ca()),
        path(certs.client_cert()),
        path(certs.client_key()),
    );
    let mut w = WorkerProc::start(
        &url,
        "tls-mutual",
        &[
            "--redis-ca",
            &ca,
            "--redis-cert",
            &cert,
            "--redis-key",
            &key,
            "--queues",
            "mtls",
            "--slots",
            "1",
        ],
    );
    w.wait_ready();
    let mutual = vec![
        "--redis".into(),
        url.clone(),
        "--redis-ca".into(),
        ca.clone(),
        "--redis-cert".into(),
        cert,
        "--redis-key".into(),
        key,
    ];
    let out = cli(
        &["submit", "-q", "mtls", "--wait", "--", "echo", "mutual"],
        &mutual,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "mutual\n");
    // Without a client certificate the server refuses the client.
    let out = cli(
        &["submit", "-q", "mtls", "--", "true"],
        &["--redis".into(), url, "--redis-ca".into(), ca],
    )
    .await;
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_with_a_wrong_ca_says_the_tls_handshake_failed() {
    let Some(certs) = TestCerts::or_skip() else {
        return;
    };
    let server = tls_server(&certs, false);
    let other = path(certs.other_ca());
    let w = WorkerProc::start(&server.url(), "tls-wrong-ca", &["--redis-ca", &other]);
    let log = poll(std::time::Duration::from_secs(30), "the TLS error", || {
        let log = w.log();
        async move {
            log.contains("TLS handshake with Redis failed")
                .then_some(log)
        }
    })
    .await;
    assert!(!log.contains("Redis unreachable"), "{log}");
}

/// A server whose only user is `app` with password `p@ss:w/rd` (every character a URL must
/// %-encode), the default user off.
fn password_server() -> RedisServer {
    RedisServer::start_with(RedisServerOptions {
        extra_args: [
            "--user",
            "default",
            "off",
            "--user",
            "app",
            "on",
            ">p@ss:w/rd",
            "~*",
            "&*",
            "+@all",
        ]
        .map(String::from)
        .to_vec(),
        ..RedisServerOptions::default()
    })
    .expect("redis-server with an ACL user")
}

#[tokio::test(flavor = "multi_thread")]
async fn acl_user_and_password_in_the_url() {
    let server = password_server();
    let port = server.port();
    let good = format!("redis://app:p%40ss%3Aw%2Frd@127.0.0.1:{port}/");
    let mut w = WorkerProc::start(&good, "acl-user", &["--queues", "pw", "--slots", "1"]);
    w.wait_ready();
    let out = cli(
        &["submit", "-q", "pw", "--wait", "--", "echo", "authed"],
        &["--redis".into(), good.clone()],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "authed\n");
    assert!(!w.log().contains("p%40ss"), "the log shows the password");

    for (url, what) in [
        (format!("redis://app:wrong@127.0.0.1:{port}/"), "WRONGPASS"),
        (format!("redis://127.0.0.1:{port}/"), "NOAUTH"),
    ] {
        let out = cli(&["stats", "-q", "pw"], &["--redis".into(), url]).await;
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{what}: {err}");
        assert!(err.contains("authentication failed"), "{what}: {err}");
        assert!(!err.contains("cannot reach"), "{what}: {err}");
        assert!(
            !err.contains("wrong@"),
            "{what}: the password is shown: {err}"
        );
    }
    // An unencoded password that breaks the URL: the error says to %-encode it.
    let out = cli(
        &["stats", "-q", "pw"],
        &[
            "--redis".into(),
            format!("redis://app:p@ss:w/rd@127.0.0.1:{port}/"),
        ],
    )
    .await;
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("%-encoded"), "{err}");
    assert!(!err.contains("w/rd"), "the password is shown: {err}");

    // A worker given a wrong password says so in its log.
    let bad = WorkerProc::start(
        &format!("redis://app:wrong@127.0.0.1:{port}/"),
        "acl-wrong",
        &["--queues", "pw"],
    );
    let log = poll(std::time::Duration::from_secs(30), "the auth error", || {
        let log = bad.log();
        async move { log.contains("Redis authentication failed").then_some(log) }
    })
    .await;
    assert!(!log.contains("Redis unreachable"), "{log}");
    assert!(
        !log.contains(":wrong@"),
        "the log shows the password: {log}"
    );
}

/// A server whose users are the ACL roles of docs/operations.md for queue `roles`, each with
/// password `pw-ROLE`.
fn roles_server() -> RedisServer {
    roles_server_without(&[])
}

/// [`roles_server`], with the rules `dropped` (e.g. `+xread`) left out of every role.
fn roles_server_without(dropped: &[&str]) -> RedisServer {
    let page = std::fs::read_to_string(repo_file("docs/operations.md")).unwrap();
    let acl: Vec<String> = page
        .lines()
        .filter(|l| l.starts_with("user forkbox-"))
        .map(|l| {
            let mut line = l.replace("{Q}", "{roles}");
            for role in ["WORKER", "SUBMITTER", "GATEWAY", "MONITOR"] {
                line = line.replace(
                    &format!(">{role}_PASSWORD"),
                    &format!(">pw-{}", role.to_lowercase()),
                );
            }
            let kept: Vec<&str> = line
                .split(' ')
                .filter(|rule| !dropped.contains(rule))
                .collect();
            kept.join(" ")
        })
        .collect();
    assert_eq!(acl.len(), 4, "{acl:?}");
    // Redis reads the file at start only.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("users.acl");
    std::fs::write(&file, acl.join("\n") + "\nuser default off\n").unwrap();
    RedisServer::start_with(RedisServerOptions {
        extra_args: vec!["--aclfile".into(), file.display().to_string()],
        ..RedisServerOptions::default()
    })
    .expect("redis-server with the ACL roles")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_acl_roles_run_a_worker_a_submitter_and_a_monitor() {
    let server = roles_server();
    let url = |role: &str| {
        format!(
            "redis://forkbox-{role}:pw-{role}@127.0.0.1:{}/",
            server.port()
        )
    };

    // A node with the submitter's rights stops at start, naming what it lacks.
    let mut under = WorkerProc::start(&url("submitter"), "roles-under", &["--queues", "roles"]);
    let status = under.wait_exit(std::time::Duration::from_secs(60));
    assert!(!status.success());
    let log = under.log();
    assert!(
        log.contains("ACL refuses this node's user") && log.contains(" on forkbox:{roles}:"),
        "{log}"
    );

    let mut w = WorkerProc::start(
        &url("worker"),
        "roles-worker",
        &["--queues", "roles", "--slots", "1"],
    );
    w.wait_ready();
    let out = cli(
        &["submit", "-q", "roles", "--wait", "--", "echo", "by role"],
        &["--redis".into(), url("submitter")],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "by role\n");
    let out = cli(
        &["stats", "-q", "roles", "--json"],
        &["--redis".into(), url("monitor")],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("roles-worker"),
        "{}",
        text(&out.stdout)
    );
    // The monitor cannot submit; the error names the refusal.
    let out = cli(
        &["submit", "-q", "roles", "--", "true"],
        &["--redis".into(), url("monitor")],
    )
    .await;
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("NOPERM"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn check_says_whether_redis_keeps_its_data() {
    let volatile = start_redis();
    let out = cli(&["check"], &["--redis".into(), volatile.url()]).await;
    let stdout = text(&out.stdout);
    assert!(stdout.contains("warn  redis persistence: off"), "{stdout}");
    assert!(
        stdout.contains("ok    redis maxmemory-policy: noeviction"),
        "{stdout}"
    );
    let durable = RedisServer::start_persistent().unwrap();
    let mut c = conn(&durable.url()).await;
    let _: () = forkbox_queue::redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut c)
        .await
        .unwrap();
    let out = cli(&["check"], &["--redis".into(), durable.url()]).await;
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("ok    redis persistence: append-only file on"),
        "{stdout}"
    );
    assert!(
        stdout.contains("warn  redis maxmemory-policy: allkeys-lru evicts"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redis_that_lost_its_data_is_named_and_the_node_serves_on() {
    let mut server = start_redis();
    let url = server.url();
    // Claims refreshed every second: the loss is reported within a second or two.
    let mut w = WorkerProc::start(
        &url,
        "lossy",
        &[
            "--queues",
            "lossy",
            "--slots",
            "1",
            "--visibility-timeout-ms",
            "3000",
        ],
    );
    w.wait_ready();
    let metrics = w.metrics_addr();
    let lossy = [("queue", "lossy")];
    // A job in flight while Redis loses everything (still running when the loss is seen, a
    // second or two later): its result cannot be stored.
    let q = queue(&url, "lossy").await;
    q.enqueue(&forkbox_queue::Job::shell("sleep 10"))
        .await
        .unwrap();
    slots_busy(
        metrics,
        1.0,
        std::time::Duration::from_secs(30),
        "the job running",
    )
    .await;
    // No persistence: the restarted server is empty, the consumer group included.
    server.restart().unwrap();
    let log = poll(
        std::time::Duration::from_secs(60),
        "the data-loss warning",
        || {
            let log = w.log();
            async move { log.contains("Redis lost data").then_some(log) }
        },
    )
    .await;
    let warning = log
        .lines()
        .find(|l| l.contains("Redis lost data"))
        .unwrap()
        .to_owned();
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("forkbox:{lossy}:jobs"), "{warning}");
    assert!(warning.contains("is recreated"), "{warning}");
    assert!(
        warning.contains("1 in-flight result(s) of this node cannot be stored"),
        "{warning}"
    );
    let m = metrics;
    tokio::task::spawn_blocking(move || {
        metric_reaches(m, "forkbox_redis_data_lost_total", &lossy, 1.0);
        // The job ends, and its completion finds the entry gone: counted, not stored.
        metric_reaches(m, "forkbox_results_lost_total", &lossy, 1.0);
    })
    .await
    .unwrap();
    let out = cli(
        &[
            "submit",
            "-q",
            "lossy",
            "--wait",
            "--timeout",
            "60",
            "--",
            "echo",
            "still here",
        ],
        &["--redis".into(), url],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "still here\n");
    // One warning for one loss.
    let log = w.log();
    assert_eq!(log.matches("Redis lost data").count(), 1, "{log}");
    let page = http_get(metrics, "/metrics").1;
    assert_eq!(
        metric(&page, "forkbox_redis_data_lost_total", &lossy),
        Some(1.0)
    );
}

/// A restart that keeps the data (append-only file) is seen through Redis' run id and said
/// to have lost nothing: no data-loss warning, and the job running across it stores its result.
#[tokio::test(flavor = "multi_thread")]
async fn a_redis_restart_that_kept_its_data_is_no_loss() {
    let mut server = RedisServer::start_with(RedisServerOptions {
        appendonly: true,
        ..RedisServerOptions::default()
    })
    .expect("redis-server");
    let url = server.url();
    let mut w = WorkerProc::start(
        &url,
        "kept",
        &[
            "--queues",
            "kept",
            "--slots",
            "1",
            "--visibility-timeout-ms",
            "3000",
        ],
    );
    w.wait_ready();
    let metrics = w.metrics_addr();
    let q = queue(&url, "kept").await;
    let id = q
        .enqueue(&forkbox_queue::Job::shell("sleep 6; echo kept"))
        .await
        .unwrap();
    slots_busy(
        metrics,
        1.0,
        std::time::Duration::from_secs(30),
        "the job running",
    )
    .await;
    server.restart().unwrap();
    poll(
        std::time::Duration::from_secs(60),
        "the restart seen",
        || {
            let log = w.log();
            async move {
                log.contains("Redis restarted (its run id changed)")
                    .then_some(())
            }
        },
    )
    .await;
    let r = queue(&url, "kept")
        .await
        .wait_result(&id, std::time::Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the result of the job that ran across the restart");
    assert_eq!(r.outcome.stdout, "kept\n");
    let log = w.log();
    assert!(!log.contains("Redis lost data"), "{log}");
    let page = http_get(metrics, "/metrics").1;
    assert_eq!(
        metric(&page, "forkbox_redis_data_lost_total", &[("queue", "kept")]),
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_whose_user_cannot_serve_sessions_stops_at_start_naming_the_command() {
    // The worker role without XREAD: jobs would run, but no session call would ever be read.
    let server = roles_server_without(&["+xread"]);
    let url = format!(
        "redis://forkbox-worker:pw-worker@127.0.0.1:{}/",
        server.port()
    );
    let mut w = WorkerProc::start(&url, "roles-no-xread", &["--queues", "roles"]);
    let status = w.wait_exit(std::time::Duration::from_secs(60));
    assert!(!status.success());
    let log = w.log();
    assert!(
        log.contains("ACL refuses this node's user XREAD on forkbox:{roles}:calls:roles-no-xread"),
        "{log}"
    );

    // Without ZREM, a session could open but its end would never leave the live set.
    let server = roles_server_without(&["+zrem"]);
    let url = format!(
        "redis://forkbox-worker:pw-worker@127.0.0.1:{}/",
        server.port()
    );
    let mut w = WorkerProc::start(&url, "roles-no-zrem", &["--queues", "roles"]);
    let status = w.wait_exit(std::time::Duration::from_secs(60));
    assert!(!status.success());
    let log = w.log();
    assert!(
        log.contains("ACL refuses this node's user ZREM on forkbox:{roles}:sessions"),
        "{log}"
    );
}
