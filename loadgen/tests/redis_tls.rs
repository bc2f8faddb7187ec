//! `forkbox-loadgen` against a Redis that speaks TLS only (the CA given once, handed to the
//! workers it spawns), and against one whose password it was given wrong.

use std::path::PathBuf;
use std::process::{Command, Output};

use forkbox_loadgen::report::Report;
use forkbox_testkit::TestCerts;
use forkbox_testkit::{skipped, tls_server, RedisServer, RedisServerOptions};

fn forkbox_worker() -> Option<PathBuf> {
    let bin = forkbox_loadgen::cluster::forkbox_bin();
    if bin.is_none() {
        let reason = "no forkbox binary (build it: cargo build -p forkbox, or set FORKBOX_BIN)";
        if std::env::var_os("FORKBOX_LOADGEN_REQUIRE_WORKER").is_some() {
            panic!("{reason}");
        }
        skipped(reason);
    }
    bin
}

fn loadgen(args: &[&str], bin: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_forkbox-loadgen"))
        .args(args)
        .arg("--quiet")
        .env("FORKBOX_BIN", bin)
        .output()
        .expect("running forkbox-loadgen")
}

#[test]
fn a_run_over_rediss_with_a_ca_file() {
    let Some(bin) = forkbox_worker() else { return };
    let Some(certs) = TestCerts::or_skip() else {
        return;
    };
    let server = tls_server(&certs, false);
    let report = tempfile::tempdir().unwrap();
    let ca = certs.ca();
    let out = loadgen(
        &[
            "--redis",
            &server.url(),
            "--redis-ca",
            ca.to_str().unwrap(),
            "--queue",
            "lg-tls",
            "--jobs",
            "20",
            "--concurrency",
            "4",
            "--spawn-workers",
            "1",
            "--slots",
            "2",
            "--report",
            report.path().to_str().unwrap(),
        ],
        &bin,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {stderr}", out.status);
    let text = std::fs::read_to_string(report.path().join("report.json")).unwrap();
    let r: Report = serde_json::from_str(&text).unwrap();
    assert_eq!((r.enqueued, r.completed, r.lost), (20, 20, 0), "{stderr}");
}

#[test]
fn a_wrong_password_is_an_authentication_failure() {
    let Some(bin) = forkbox_worker() else { return };
    let server = RedisServer::start_with(RedisServerOptions {
        extra_args: ["--requirepass", "right"].map(String::from).to_vec(),
        ..RedisServerOptions::default()
    })
    .expect("redis-server with a password");
    for url in [
        format!("redis://:wrong@127.0.0.1:{}/", server.port()),
        format!("redis://127.0.0.1:{}/", server.port()),
    ] {
        let out = loadgen(&["--redis", &url, "--jobs", "1"], &bin);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains("authentication failed"), "{url}: {stderr}");
        assert!(!stderr.contains("cannot reach"), "{url}: {stderr}");
    }
}
