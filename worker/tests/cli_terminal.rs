//! Every client command that prints what Redis holds, run on a pseudo-terminal (util-linux
//! `script`) against values a hostile job or Redis user planted: no escape sequence, BEL or C1
//! control reaches the terminal; each value is shown in its visible form (`^[`, `^G`, `M-^[`).

mod node_support;

use std::process::{Command, Stdio};
use std::time::Duration;

use forkbox_queue::{redis, JobResult, Keys, Outcome, Status};
use node_support::*;

/// An OSC 52 clipboard write, a screen clear, an 8-bit CSI and a right-to-left override.
const HOSTILE: &str = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\u{9b}31m\u{202e}";
/// What [`HOSTILE`] looks like once made visible.
const SHOWN: &str = "^[]52;c;cHduZWQ=^G^[[2JM-^[31m<U+202E>";
/// Its tail in JSON, which writes the C0 controls as `\u001b` itself.
const SHOWN_IN_JSON: &str = "\\u001b[2JM-^[31m<U+202E>";

/// Runs `forkbox ARGS` with its standard streams on a pseudo-terminal; returns what the
/// terminal received.
fn on_terminal(args: &[&str]) -> String {
    let quoted: Vec<String> = std::iter::once(BIN)
        .chain(args.iter().copied())
        .map(|a| {
            assert!(!a.contains('\''), "{a}");
            format!("'{a}'")
        })
        .collect();
    let out = Command::new("script")
        .args(["-qec", &quoted.join(" "), "/dev/null"])
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .output()
        .expect("running script");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What a terminal would obey: ESC (but the progress bar's own cursor moves and line clears),
/// BEL, C1 controls, and the bidirectional overrides.
fn obeyed(screen: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = screen;
    while let Some(at) = rest.find(|c: char| {
        c == '\x1b'
            || c == '\x07'
            || ('\u{80}'..='\u{9f}').contains(&c)
            || ('\u{202a}'..='\u{202e}').contains(&c)
            || ('\u{2066}'..='\u{2069}').contains(&c)
    }) {
        let tail = &rest[at..];
        let bar_move = tail.strip_prefix("\x1b[").and_then(|t| {
            let digits = t.find(|c: char| !c.is_ascii_digit() && c != '?')?;
            matches!(
                t.as_bytes()[digits],
                b'A' | b'B' | b'G' | b'K' | b'l' | b'h'
            )
            .then_some(2 + digits + 1)
        });
        let skip = match bar_move {
            Some(n) => n,
            None => {
                found.push(tail.chars().take(12).collect());
                tail.chars().next().unwrap().len_utf8()
            }
        };
        rest = &tail[skip..];
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn no_command_lets_redis_data_drive_the_terminal() {
    if !have("/usr/bin/script") {
        forkbox_testkit::skipped("no script (util-linux) to run commands on a terminal");
        return;
    }
    let server = start_redis();
    let url = server.url();
    let name = format!("esc-{}", std::process::id());
    let keys = Keys::new(&name).unwrap();
    let q = queue(&url, &name).await;
    let mut c = conn(&url).await;

    // A worker dead-letters a job whose unknown field is the hostile text.
    let mut w = WorkerProc::start(&url, "esc-worker", &["--queues", &name, "--slots", "1"]);
    w.wait_ready();
    let bad = serde_json::json!({"id": "bad-field", "cmd": "true", HOSTILE: 1});
    q.enqueue_raw(bad.to_string().as_bytes()).await.unwrap();
    poll(Duration::from_secs(30), "a dead letter", || {
        let q = q.clone();
        async move { (!q.dlq_list(10).await.unwrap().is_empty()).then_some(()) }
    })
    .await;
    // A consumer named with it, in the group every node reads.
    let _: () = redis::cmd("XGROUP")
        .arg("CREATECONSUMER")
        .arg(keys.jobs())
        .arg("workers")
        .arg(format!("node{HOSTILE}"))
        .query_async(&mut c)
        .await
        .unwrap();
    // A result whose every text is it, and one that is not JSON at all.
    let mut outcome = Outcome::not_run(Status::Error, format!("set-up: {HOSTILE}"));
    outcome.stdout = format!("out {HOSTILE}\n");
    outcome.stderr = format!("err {HOSTILE}\n");
    let result = JobResult::new(format!("id{HOSTILE}"), outcome, 1, format!("w{HOSTILE}"));
    let stored = serde_json::to_string(&result).unwrap();
    let _: () = redis::pipe()
        .set(keys.result("planted"), &stored)
        // A queue whose recorded layout is the hostile text, which an error quotes.
        .hset(
            Keys::new(&format!("{name}-meta")).unwrap().meta(),
            "partitions",
            HOSTILE,
        )
        .set(keys.result(&format!("id{HOSTILE}")), &stored)
        // A batch whose line names that id and whose counters have a hostile status.
        .hset(keys.batch_lines("b1"), 1, format!("id{HOSTILE}"))
        .hset(keys.batch("b1"), "total", 1)
        .hset(keys.batch("b1"), "done", 1)
        .hset(keys.batch("b1"), format!("st{HOSTILE}"), 1)
        .query_async(&mut c)
        .await
        .unwrap();

    let client = |rest: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
        v.extend([
            "--redis".into(),
            url.clone(),
            "--queue".into(),
            name.clone(),
        ]);
        v
    };
    let stats = vec![
        "stats".to_owned(),
        "--redis".into(),
        url.clone(),
        "--queues".into(),
        name.clone(),
    ];
    let mut stats_json = stats.clone();
    stats_json.push("--json".into());
    let mut submit = client(&["submit", "--wait", "--id", "prints"]);
    submit.extend(["--".into(), "printf".into(), "%s".into(), HOSTILE.into()]);
    let commands: Vec<Vec<String>> = vec![
        client(&["dlq", "list"]),
        client(&["dlq", "list", "--json"]),
        stats,
        stats_json,
        client(&["result", "planted"]),
        client(&["result", "planted", "--json"]),
        vec![
            "stats".to_owned(),
            "--redis".into(),
            url.clone(),
            "--queues".into(),
            format!("{name}-meta"),
        ],
        client(&["batch", "results", "b1"]),
        client(&["batch", "results", "b1", "--jsonl"]),
        client(&["batch", "wait", "b1"]),
        client(&["batch", "wait", "b1", "--json"]),
        submit,
    ];
    for args in commands {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let json = a.iter().any(|a| a.starts_with("--json"));
        let screen = tokio::task::spawn_blocking({
            let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
            move || on_terminal(&a.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .await
        .unwrap();
        let shown = a.join(" ");
        assert!(
            obeyed(&screen).is_empty(),
            "forkbox {shown} sent {:?} to the terminal:\n{screen:?}",
            obeyed(&screen)
        );
        assert!(
            screen.contains(SHOWN) || json && screen.contains(SHOWN_IN_JSON),
            "forkbox {shown} did not show the value:\n{screen:?}"
        );
    }
    drop(w);
}
