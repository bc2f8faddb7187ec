//! The session protocol against a real redis-server, with a stand-in node (this crate has no
//! sandbox): open, call, events, end, a lost node, an unknown session.

mod common;

use std::time::Duration;

use common::{ok_result, server_and_queue};
use forkbox_queue::session::{Call, CallOp, EndReason, ErrorReason, Event, SessionSpec};
use forkbox_queue::{Completion, Job, QueueConfig, SessionError, SessionOpened};

const NODE: &str = "node-a";

fn create_job() -> Job {
    Job {
        session: Some(SessionSpec {
            ttl_s: Some(60),
            idle_s: Some(30),
        }),
        ..Job::default()
    }
}

/// Enqueues a create job and opens it as a node would; returns the session id.
async fn open(queue: &forkbox_queue::Queue) -> String {
    let sid = queue.create_session(&create_job()).await.unwrap().id;
    let d = queue.read(NODE, 1, 1000).await.unwrap().pop().unwrap();
    assert_eq!(d.id, sid);
    assert!(d.job.as_ref().unwrap().session.is_some());
    let mut result = ok_result(&d, "", NODE);
    result.session = Some(SessionOpened {
        id: sid.clone(),
        node: NODE.into(),
        expires_ms: forkbox_queue::now_ms() + 60_000,
        idle_s: 30,
        runtime: None,
    });
    let fields = [
        ("node", NODE.to_owned()),
        ("state", "live".to_owned()),
        ("idle_s", "30".to_owned()),
    ];
    let stored = queue
        .open_session_record(&d, &result, forkbox_queue::now_ms() + 60_000, &fields)
        .await
        .unwrap();
    assert_eq!(stored, Completion::Stored);
    // A second open of the same delivery changes nothing.
    let again = queue
        .open_session_record(&d, &result, 1, &fields)
        .await
        .unwrap();
    assert_ne!(again, Completion::Stored);
    sid
}

#[tokio::test]
async fn a_call_travels_to_the_node_and_its_events_back() {
    let (_server, queue) = server_and_queue(QueueConfig::default()).await;
    queue
        .heartbeat(NODE, Duration::from_secs(30))
        .await
        .unwrap();
    let start = queue.calls_start_id(NODE).await.unwrap();
    assert_eq!(start, "0-0", "no calls yet");
    let sid = open(&queue).await;
    let opened = queue
        .wait_opened(&sid, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(opened.node, NODE);
    let info = queue.session_info(&sid).await.unwrap().unwrap();
    assert_eq!((info.state.as_str(), info.node.as_str()), ("live", NODE));
    assert_eq!(queue.live_sessions().await.unwrap().len(), 1);

    let call = Call::run_code(&sid, "print(1)");
    assert_eq!(queue.send_call(&call).await.unwrap(), NODE);
    let calls = queue
        .read_calls(NODE, &start, 10, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(calls.len(), 1);
    let got = Call::parse(&calls[0].1, 60_000).unwrap();
    assert_eq!(got, call);
    // A second call with the same id, once it has events, is refused.
    let out = Event::Stdout { data: "1\n".into() };
    let done: Event = serde_json::from_str(r#"{"kind": "result", "ok": true}"#).unwrap();
    queue
        .push_events(&call.id, std::slice::from_ref(&out))
        .await
        .unwrap();
    queue
        .push_events(&call.id, std::slice::from_ref(&done))
        .await
        .unwrap();
    assert!(matches!(
        queue.send_call(&call).await,
        Err(SessionError::Refused { .. })
    ));
    let mut seen = Vec::new();
    let end = queue
        .wait_call(&sid, NODE, &call.id, Duration::from_secs(5), &mut |e| {
            seen.push(e.clone())
        })
        .await
        .unwrap();
    assert_eq!(end, done);
    assert_eq!(seen, vec![out, done]);

    // The node ends it: a queued call gets its terminal event, later calls the reason.
    let queued = Call::new(&sid, CallOp::Info);
    let ended = Event::error(ErrorReason::SessionEnded, "session ended: killed");
    assert!(queue
        .end_session_record(
            &sid,
            NODE,
            EndReason::Killed,
            std::slice::from_ref(&queued.id),
            &ended
        )
        .await
        .unwrap());
    let end = queue
        .wait_call(&sid, NODE, &queued.id, Duration::from_secs(5), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(end, ended);
    match queue.send_call(&Call::run_code(&sid, "1")).await {
        Err(SessionError::Ended { message, .. }) => assert_eq!(message, "session ended: killed"),
        other => panic!("{other:?}"),
    }
    assert!(queue.live_sessions().await.unwrap().is_empty());
}

/// A node reads its calls from the end its calls stream had at its start, as Redis numbers
/// the entries: a call added after is read, one added before is not, and a trimmed stream
/// still has its last entry to start from.
#[tokio::test]
async fn a_node_reads_the_calls_added_after_its_start() {
    let (_server, queue) = server_and_queue(QueueConfig::default()).await;
    queue
        .heartbeat(NODE, Duration::from_secs(30))
        .await
        .unwrap();
    let sid = open(&queue).await;
    let before = Call::run_code(&sid, "1");
    queue.send_call(&before).await.unwrap();
    let start = queue.calls_start_id(NODE).await.unwrap();
    assert_ne!(start, "0-0");
    let after = Call::run_code(&sid, "2");
    queue.send_call(&after).await.unwrap();
    let read = |from: String| {
        let queue = queue.clone();
        async move {
            let calls = queue
                .read_calls(NODE, &from, 10, Duration::from_secs(1))
                .await
                .unwrap();
            calls
                .iter()
                .map(|(_, p)| Call::parse(p, 60_000).unwrap())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(read(start).await, vec![after.clone()]);
    // Trimmed to its last entry: the start is that entry, and what comes next is read.
    let calls_key = queue.keys().calls(NODE);
    let _: i64 = forkbox_queue::redis::cmd("XTRIM")
        .arg(&calls_key)
        .arg("MAXLEN")
        .arg(1)
        .query_async(&mut queue.broker().connection())
        .await
        .unwrap();
    let start = queue.calls_start_id(NODE).await.unwrap();
    let next = Call::run_code(&sid, "3");
    queue.send_call(&next).await.unwrap();
    assert_eq!(read(start).await, vec![next]);
}

#[tokio::test]
async fn a_dead_node_is_reported_lost_to_a_waiter_and_to_a_new_call() {
    let (_server, queue) = server_and_queue(QueueConfig::default()).await;
    queue
        .heartbeat(NODE, Duration::from_millis(1500))
        .await
        .unwrap();
    let sid = open(&queue).await;
    let call = Call::run_code(&sid, "import time; time.sleep(60)");
    queue.send_call(&call).await.unwrap();
    // No node answers, and the heartbeat lapses: the waiter learns it, not its timeout.
    let waited = queue
        .wait_call(&sid, NODE, &call.id, Duration::from_secs(30), &mut |_| {})
        .await;
    assert!(
        matches!(waited, Err(SessionError::Lost { .. })),
        "{waited:?}"
    );
    let info = queue.session_info(&sid).await.unwrap().unwrap();
    assert_eq!(
        (info.state.as_str(), info.reason.as_deref()),
        ("ended", Some("lost"))
    );
    // Once marked, a new call reports the end's reason.
    let again = queue.send_call(&Call::run_code(&sid, "1")).await;
    match again {
        Err(SessionError::Ended { message, .. }) => assert_eq!(message, "session ended: lost"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn calls_to_unknown_sessions_and_bad_calls_are_refused() {
    let (_server, queue) = server_and_queue(QueueConfig::default()).await;
    let r = queue.send_call(&Call::run_code("nope", "1")).await;
    assert!(matches!(r, Err(SessionError::Unknown { .. })), "{r:?}");
    let bad = Call::files("nope", CallOp::FilesRead, "../etc/passwd");
    let r = queue.send_call(&bad).await;
    assert!(matches!(r, Err(SessionError::Invalid(_))), "{r:?}");
    // A create job needs its session object; a plain job is not one.
    assert!(queue.create_session(&Job::shell("true")).await.is_err());
}
