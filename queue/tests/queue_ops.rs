//! Queue operations against a real redis-server: enqueue, read, complete, dead letters,
//! cancellation, priorities, stats, batches.

mod common;

use std::time::Duration;

use common::{conn, ok_result, server_and_queue};
use forkbox_queue::redis::{self, AsyncCommands};
use forkbox_queue::{
    Broker, CancelEvent, Completion, DlqSelection, Job, JobError, JobState, QueueConfig, QueueSet,
    Status,
};
use forkbox_testkit::RedisServer;

#[tokio::test]
async fn enqueue_read_complete_stores_exactly_one_result() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    let id = q.enqueue(&Job::shell("echo hi")).await.unwrap();
    assert!(uuid::Uuid::parse_str(&id).is_ok(), "generated id {id}");

    let got = q.read("w1", 10, 100).await.unwrap();
    assert_eq!(got.len(), 1);
    let d = &got[0];
    assert_eq!(d.id, id);
    assert_eq!(d.deliveries, 1);
    assert_eq!(d.queue, "default");
    assert_eq!(d.job.as_ref().unwrap().cmd.as_deref(), Some("echo hi"));
    assert!(d.vetted, "the enqueue script vets what it adds");

    let r = ok_result(d, "hi\n", "w1");
    assert_eq!(q.complete(d, &r).await.unwrap(), Completion::Stored);
    // A second completion (a redelivery that ran again) is a duplicate and changes nothing.
    let mut again = r.clone();
    again.outcome.stdout = "other".into();
    assert_eq!(q.complete(d, &again).await.unwrap(), Completion::Duplicate);

    let stored = q.result(&id).await.unwrap().unwrap();
    assert_eq!(stored, r);
    // A raw XADD of the finished id is acknowledged on read and not handed out again.
    let again_entry = q
        .enqueue_raw(format!(r#"{{"id":"{id}","cmd":"echo hi"}}"#).as_bytes())
        .await
        .unwrap();
    assert!(q.read("w1", 10, 0).await.unwrap().is_empty());
    assert_eq!(q.stats().await.unwrap().pending, 0, "{again_entry} acked");
    let mut c = conn(&q).await;
    let results: usize = c.xlen(q.keys().results()).await.unwrap();
    assert_eq!(results, 1, "one entry in the results stream");
    let len: usize = c.xlen(q.keys().jobs()).await.unwrap();
    assert_eq!(len, 0, "the completed entry is deleted from the job stream");
    let stats = q.stats().await.unwrap();
    assert_eq!(stats.pending, 0);
    let done: Vec<String> = c.lrange(q.keys().done(&id), 0, -1).await.unwrap();
    assert_eq!(done, ["ok"]);
    let ttl: i64 = c.ttl(q.keys().result(&id)).await.unwrap();
    assert!(ttl > 86_000 && ttl <= 86_400, "result ttl {ttl}");
    let ttl: i64 = c.ttl(q.keys().done(&id)).await.unwrap();
    assert!(ttl > 86_000 && ttl <= 86_400, "done ttl {ttl}");
    // The wake stream: one entry with the status, gone within seconds (waiters that come
    // later find the result).
    let wake: redis::streams::StreamRangeReply = c.xrange_all(q.keys().wake(&id)).await.unwrap();
    assert_eq!(wake.ids.len(), 1);
    assert_eq!(
        wake.ids[0].get::<String>("status").as_deref(),
        Some("ok"),
        "{wake:?}"
    );
    let pttl: i64 = c.pttl(q.keys().wake(&id)).await.unwrap();
    assert!(
        pttl > 0 && pttl <= forkbox_queue::keys::WAKE_LINGER_MS as i64,
        "wake pttl {pttl}"
    );
    assert!(q.read("w1", 10, 0).await.unwrap().is_empty());
}

/// Calls of `EXISTS` so far, scripts' inner calls included.
async fn exists_calls(c: &mut forkbox_queue::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_exists:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn only_entries_the_enqueue_script_did_not_vet_are_checked_on_read() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    let mut c = conn(&q).await;
    for _ in 0..3 {
        q.enqueue(&Job::shell("true")).await.unwrap();
    }
    let before = exists_calls(&mut c).await;
    let got = q.read("w", 10, 0).await.unwrap();
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|d| d.vetted));
    assert_eq!(
        exists_calls(&mut c).await,
        before,
        "vetted entries are not checked"
    );
    // A raw XADD has nothing behind it: its id is checked for a result.
    q.enqueue_raw(br#"{"cmd":"true"}"#).await.unwrap();
    let got = q.read("w", 10, 0).await.unwrap();
    assert_eq!(got.len(), 1);
    assert!(!got[0].vetted);
    assert_eq!(
        exists_calls(&mut c).await,
        before + 1,
        "the raw entry is checked"
    );
}

#[tokio::test]
async fn raw_xadd_without_id_is_known_by_its_entry_id() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    let entry = q.enqueue_raw(br#"{"cmd":"true"}"#).await.unwrap();
    let d = q.read("w", 1, 100).await.unwrap().remove(0);
    assert_eq!(d.entry_id, entry);
    assert_eq!(d.id, entry);
    q.complete(&d, &ok_result(&d, "", "w")).await.unwrap();
    assert_eq!(
        q.result(&entry).await.unwrap().unwrap().outcome.status,
        Status::Ok
    );
}

#[tokio::test]
async fn complete_many_is_one_call_for_several_jobs_and_feeds_reply_to() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    for i in 0..5 {
        let job = Job {
            id: Some(format!("j{i}")),
            reply_to: Some("forkbox:{default}:replies:agent".into()),
            ..Job::shell("true")
        };
        q.enqueue(&job).await.unwrap();
    }
    let ds = q.read("w", 5, 100).await.unwrap();
    assert_eq!(ds.len(), 5);
    let rs: Vec<_> = ds.iter().map(|d| ok_result(d, "", "w")).collect();
    let pairs: Vec<_> = ds.iter().zip(&rs).collect();
    let out = q.complete_many(&pairs).await.unwrap();
    assert_eq!(out, vec![Completion::Stored; 5]);
    let mut c = conn(&q).await;
    let replies: usize = c.xlen("forkbox:{default}:replies:agent").await.unwrap();
    assert_eq!(replies, 5);
    assert_eq!(
        q.has_results(&["j0", "j4", "nope"]).await.unwrap(),
        [true, true, false]
    );
}

#[tokio::test]
async fn enqueueing_the_same_id_twice_adds_it_once() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    let job = Job {
        id: Some("same".into()),
        ..Job::shell("true")
    };
    let first = q.enqueue_idempotent(&job).await.unwrap();
    assert!(first.new);
    let second = q.enqueue_idempotent(&job).await.unwrap();
    assert!(!second.new);
    assert_eq!(second.entry_id, first.entry_id, "points at the first copy");
    let ds = q.read("w", 10, 100).await.unwrap();
    assert_eq!(ds.len(), 1, "pending: still one entry");
    q.complete(&ds[0], &ok_result(&ds[0], "", "w"))
        .await
        .unwrap();
    // The result is alive: a third enqueue is refused too.
    assert!(!q.enqueue_idempotent(&job).await.unwrap().new);
    assert!(q.read("w", 10, 0).await.unwrap().is_empty());
    // Invalid jobs never reach Redis.
    let bad = Job {
        id: Some("has space".into()),
        ..Job::shell("true")
    };
    assert!(q.enqueue(&bad).await.is_err());
}

#[tokio::test]
async fn wait_result_wakes_several_waiters_and_times_out_cleanly() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    assert!(q
        .wait_result("missing", Duration::from_millis(50))
        .await
        .unwrap()
        .is_none());
    let id = q.enqueue(&Job::shell("true")).await.unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let q = q.clone();
            let id = id.clone();
            tokio::spawn(async move { q.wait_result(&id, Duration::from_secs(30)).await })
        })
        .collect();
    let d = q.read("w", 1, 1000).await.unwrap().remove(0);
    q.complete(&d, &ok_result(&d, "x", "w")).await.unwrap();
    for w in waiters {
        let r = w.await.unwrap().unwrap().expect("woken with the result");
        assert_eq!(r.outcome.stdout, "x");
    }
    // A wake-up entry without a result (one deleted since) does not make a waiter spin: it
    // waits past that entry.
    let mut c = conn(&q).await;
    let _: () = c.del(q.keys().result(&id)).await.unwrap();
    let trips = q.broker().round_trips().get();
    assert!(q
        .wait_result(&id, Duration::from_millis(1500))
        .await
        .unwrap()
        .is_none());
    let used = q.broker().round_trips().get() - trips;
    assert!(used < 10, "{used} round trips for one wait");
    // The wake-up element is still there for a later BLPOP.
    let n: usize = c.llen(q.keys().done(&id)).await.unwrap();
    assert_eq!(n, 1);
}

/// A waiter for a job it has just enqueued, woken by the completion, reads the result in the
/// round trip that waited; one that comes after the completion finds it in its first.
#[tokio::test]
async fn a_new_jobs_wait_is_one_round_trip() {
    let (srv, q) = server_and_queue(QueueConfig::default()).await;
    let id = q.enqueue(&Job::shell("true")).await.unwrap();
    // The waiter has a broker of its own, so its round trips are its alone.
    let waiter = Broker::connect(&srv.url())
        .await
        .unwrap()
        .queue(q.name(), QueueConfig::default())
        .unwrap();
    let w = {
        let (waiter, id) = (waiter.clone(), id.clone());
        tokio::spawn(async move { waiter.wait_new_result(&id, Duration::from_secs(30)).await })
    };
    // The waiter blocks before the completion (it is in Redis' blocked clients).
    let mut c = conn(&q).await;
    for _ in 0..500 {
        let info: String = redis::cmd("INFO")
            .arg("clients")
            .query_async(&mut c)
            .await
            .unwrap();
        if info.contains("blocked_clients:1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let d = q.read("w", 1, 1000).await.unwrap().remove(0);
    q.complete(&d, &ok_result(&d, "x", "w")).await.unwrap();
    let r = w.await.unwrap().unwrap().expect("woken with the result");
    assert_eq!(r.outcome.stdout, "x");
    assert_eq!(waiter.broker().round_trips().get(), 1);
    let r = waiter
        .wait_new_result(&id, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the result at once");
    assert_eq!(r.outcome.stdout, "x");
    assert_eq!(waiter.broker().round_trips().get(), 2);
}

#[tokio::test]
async fn malformed_entries_are_deliveries_that_dead_letter_with_their_reason() {
    let config = QueueConfig {
        max_job_bytes: 200,
        ..QueueConfig::default()
    };
    let (_srv, q) = server_and_queue(config).await;
    let big = format!(r#"{{"cmd":"{}"}}"#, "x".repeat(300));
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"not json".to_vec(), "not valid JSON"),
        (br#"{"id":"m1","env":{}}"#.to_vec(), "cmd: a job needs"),
        (
            br#"{"id":"m2","cmd":"x","timeout_ms":"soon"}"#.to_vec(),
            "timeout_ms: invalid type",
        ),
        (
            br#"{"id":"m3","cmd":"x","bogus":1}"#.to_vec(),
            "unknown field `bogus`",
        ),
        (big.into_bytes(), "over the limit of 200 bytes"),
        (vec![b'{', 0xff, 0xfe, b'}'], "not UTF-8"),
    ];
    for (payload, _) in &cases {
        q.enqueue_raw(payload).await.unwrap();
    }
    let mut c = conn(&q).await;
    let _: String = redis::cmd("XADD")
        .arg(q.keys().jobs())
        .arg("*")
        .arg("payload")
        .arg("{}")
        .query_async(&mut c)
        .await
        .unwrap();

    let ds = q.read("w", 100, 100).await.unwrap();
    assert_eq!(ds.len(), cases.len() + 1);
    let mut reasons = Vec::new();
    for d in &ds {
        let e = d.job.as_ref().expect_err("malformed");
        reasons.push(e.to_string());
        q.dead_letter(d, &e.to_string(), "w").await.unwrap();
    }
    for (i, (_, want)) in cases.iter().enumerate() {
        assert!(reasons[i].contains(want), "{}: {want:?}", reasons[i]);
    }
    assert!(reasons[cases.len()].contains("no `job` field (fields: payload)"));
    assert!(matches!(ds[4].job, Err(JobError::TooLarge { .. })));

    let dead = q.dlq_list(100).await.unwrap();
    assert_eq!(dead.len(), ds.len());
    for (l, d) in dead.iter().zip(&ds) {
        assert_eq!(l.job, d.payload, "payload kept byte for byte");
        assert_eq!(l.entry_id, d.entry_id);
        assert_eq!(l.queue, "default");
        assert_eq!(l.worker, "w");
        assert_eq!(l.deliveries, 1);
        assert!(l.at_ms > 0);
    }
    assert_eq!(dead[0].reason, reasons[0]);
    // The id inside a malformed job still gets a result, so its waiter wakes up.
    let r = q.result("m3").await.unwrap().unwrap();
    assert_eq!(r.outcome.status, Status::Invalid);
    assert!(r.outcome.error.unwrap().contains("bogus"));
    // Without a usable id the entry id stands in.
    let r = q.result(&ds[0].entry_id).await.unwrap().unwrap();
    assert_eq!(r.outcome.status, Status::Invalid);
    let stats = q.stats().await.unwrap();
    assert_eq!((stats.length, stats.pending, stats.dead), (0, 0, 7));
}

#[tokio::test]
async fn dlq_requeue_runs_the_job_again_and_purge_empties_it() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    for i in 0..3 {
        q.enqueue(&Job {
            id: Some(format!("d{i}")),
            ..Job::shell("true")
        })
        .await
        .unwrap();
    }
    let ds = q.read("w", 3, 100).await.unwrap();
    for d in &ds {
        q.dead_letter(d, "sandbox set-up failed", "w")
            .await
            .unwrap();
    }
    assert_eq!(
        q.result("d0").await.unwrap().unwrap().outcome.status,
        Status::Error
    );
    let dead = q.dlq_list(10).await.unwrap();
    assert_eq!(dead.len(), 3);
    assert!(dead.iter().all(|l| l.result_stored));

    let n = q
        .dlq_requeue(DlqSelection::Ids(vec![dead[0].dead_id.clone()]))
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert!(
        q.result("d0").await.unwrap().is_none(),
        "stale result cleared"
    );
    let again = q.read("w", 10, 100).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, "d0");
    assert_eq!(again[0].payload, ds[0].payload);
    q.complete(&again[0], &ok_result(&again[0], "", "w"))
        .await
        .unwrap();
    assert_eq!(
        q.result("d0").await.unwrap().unwrap().outcome.status,
        Status::Ok
    );

    assert_eq!(q.dlq_purge().await.unwrap(), 2);
    assert!(q.dlq_list(10).await.unwrap().is_empty());
    assert_eq!(q.dlq_requeue(DlqSelection::All).await.unwrap(), 0);
}

#[tokio::test]
async fn batch_counters_follow_results_by_status() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    let jobs: Vec<Job> = (0..4).map(|_| Job::shell("true")).collect();
    let added = q.enqueue_batch(&jobs, "b1").await.unwrap();
    assert_eq!(added.len(), 4);
    // Resubmitting the same ids does not inflate the total.
    let same: Vec<Job> = added
        .iter()
        .map(|e| Job {
            id: Some(e.id.clone()),
            ..Job::shell("true")
        })
        .collect();
    assert!(q
        .enqueue_batch(&same, "b1")
        .await
        .unwrap()
        .iter()
        .all(|e| !e.new));
    let s = q.batch_status("b1").await.unwrap();
    assert_eq!((s.total, s.done), (4, 0));
    assert!(!s.is_complete());

    let ds = q.read("w", 10, 100).await.unwrap();
    assert_eq!(ds.len(), 4);
    for (i, d) in ds.iter().enumerate() {
        assert_eq!(d.job.as_ref().unwrap().batch.as_deref(), Some("b1"));
        if i == 3 {
            q.dead_letter(d, "gave up", "w").await.unwrap();
            continue;
        }
        let mut r = ok_result(d, "", "w");
        if i == 2 {
            r.outcome.status = Status::Failed;
            r.outcome.exit_code = 1;
        }
        q.complete(d, &r).await.unwrap();
    }
    let s = q.batch_status("b1").await.unwrap();
    assert_eq!((s.total, s.done), (4, 4));
    assert!(s.is_complete());
    assert_eq!(s.by_status["ok"], 2);
    assert_eq!(s.by_status["failed"], 1);
    assert_eq!(s.by_status["error"], 1);
}

#[tokio::test]
async fn cancel_reaches_the_set_and_a_watcher() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    q.cancel("early").await.unwrap();
    let mut w = q.watch_cancellations();
    match w.next().await.unwrap() {
        CancelEvent::Resynced(ids) => assert_eq!(ids, ["early"]),
        other => panic!("expected a resync first, got {other:?}"),
    }
    let heard = q.cancel("late").await.unwrap();
    assert_eq!(heard, 1, "the watcher is subscribed");
    assert_eq!(
        w.next().await.unwrap(),
        CancelEvent::Cancelled("late".into())
    );
    assert!(q.is_cancelled("late").await.unwrap());
    assert!(!q.is_cancelled("other").await.unwrap());
    let since = q.cancelled_since(0).await.unwrap();
    assert_eq!(since.len(), 2);
    let later = q.cancelled_since(since[1].1 + 1).await.unwrap();
    assert!(later.is_empty());
}

#[tokio::test]
async fn a_job_is_found_queued_running_finished_or_unknown() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    let state = |id: &'static str| {
        let q = q.clone();
        async move { q.job_state(id).await.unwrap() }
    };
    assert_eq!(state("never-submitted").await, JobState::Unknown);
    q.enqueue(&Job {
        id: Some("a".into()),
        ..Job::shell("true")
    })
    .await
    .unwrap();
    assert_eq!(state("a").await, JobState::Queued);
    // Added with a raw XADD and no id: found by its entry id.
    let raw = q.enqueue_raw(br#"{"cmd":"true"}"#).await.unwrap();
    assert_eq!(q.job_state(&raw).await.unwrap(), JobState::Queued);
    let got = q.read("w1", 1, 100).await.unwrap();
    assert_eq!(got[0].id, "a");
    assert_eq!(
        state("a").await,
        JobState::Running {
            worker: "w1".into()
        }
    );
    q.complete(&got[0], &ok_result(&got[0], "", "w1"))
        .await
        .unwrap();
    assert_eq!(
        state("a").await,
        JobState::Finished {
            status: "ok".into()
        }
    );
    // Nothing above wrote a cancel.
    assert!(q.cancelled_since(0).await.unwrap().is_empty());
}

/// A cancel made ahead of its job cancels a job enqueued later with that id, published before
/// the entry exists, and only while it lives; a plain lookup writes nothing.
#[tokio::test]
async fn a_cancel_made_ahead_applies_to_a_job_enqueued_while_it_lives() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    let mut w = q.watch_cancellations();
    assert_eq!(w.next().await.unwrap(), CancelEvent::Resynced(vec![]));
    q.cancel_ahead("later-1", 3600).await.unwrap();
    assert!(
        !q.is_cancelled("later-1").await.unwrap(),
        "not yet a cancel"
    );
    let job = |id: &str| Job {
        id: Some(id.into()),
        ..Job::shell("true")
    };
    q.enqueue(&job("later-1")).await.unwrap();
    assert_eq!(
        w.next().await.unwrap(),
        CancelEvent::Cancelled("later-1".into())
    );
    assert!(q.is_cancelled("later-1").await.unwrap());
    // Used up: the marker is gone.
    let mut c = conn(&q).await;
    let left: usize = c.zcard(q.keys().cancel_ahead()).await.unwrap();
    assert_eq!(left, 0);
    // A lapsed one cancels nothing.
    q.cancel_ahead("later-2", 0).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    q.enqueue(&job("later-2")).await.unwrap();
    assert!(!q.is_cancelled("later-2").await.unwrap());
    assert_eq!(q.job_state("later-2").await.unwrap(), JobState::Queued);
}

#[tokio::test]
async fn a_queue_set_reads_higher_priorities_first() {
    let server = RedisServer::start().unwrap();
    let broker = Broker::connect(&server.url()).await.unwrap();
    let high = broker.queue("high", QueueConfig::default()).unwrap();
    let low = broker.queue("default", QueueConfig::default()).unwrap();
    let set = QueueSet::new(vec![high.clone(), low.clone()]).unwrap();
    set.ensure_groups().await.unwrap();
    for i in 0..3 {
        low.enqueue(&Job::shell(format!("low {i}"))).await.unwrap();
    }
    for i in 0..2 {
        high.enqueue(&Job::shell(format!("high {i}")))
            .await
            .unwrap();
    }
    let got = set.read("w", 3, 100).await.unwrap();
    let from: Vec<&str> = got.iter().map(|d| d.queue.as_str()).collect();
    assert_eq!(from, ["high", "high", "default"]);
    let got = set.read("w", 10, 100).await.unwrap();
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|d| d.queue == "default"));
    assert!(set.get("high", 0).is_some());

    // Blocking phase: everything is empty, a low-priority job arrives while blocked.
    let reader = {
        let set = set.clone();
        tokio::spawn(async move { set.read("w", 4, 10_000).await })
    };
    let low2 = low.clone();
    common::eventually(Duration::from_secs(10), "reader blocked", || {
        let q = low2.clone();
        async move {
            let s = q.stats().await.ok()?;
            s.consumers.iter().any(|c| c.name == "w").then_some(())
        }
    })
    .await;
    low.enqueue(&Job::shell("late")).await.unwrap();
    let got = reader.await.unwrap().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].queue, "default");

    let other = Broker::connect(&server.url()).await.unwrap();
    let foreign = other.queue("x", QueueConfig::default()).unwrap();
    assert!(QueueSet::new(vec![high, foreign]).is_err());
}

#[tokio::test]
async fn stats_heartbeats_and_dead_consumer_removal() {
    let (_srv, q) = server_and_queue(QueueConfig::default()).await;
    let empty = q.stats().await.unwrap();
    assert_eq!((empty.length, empty.pending, empty.lag), (0, 0, Some(0)));
    for _ in 0..5 {
        q.enqueue(&Job::shell("true")).await.unwrap();
    }
    let s = q.stats().await.unwrap();
    assert_eq!((s.length, s.pending, s.lag), (5, 0, Some(5)));
    let held = q.read("busy", 2, 100).await.unwrap();
    let idle = q.read("idle", 1, 100).await.unwrap();
    q.complete(&idle[0], &ok_result(&idle[0], "", "idle"))
        .await
        .unwrap();
    let s = q.stats().await.unwrap();
    assert_eq!(s.length, 4);
    assert_eq!(s.pending, 2);
    assert_eq!(s.dead, 0);
    let busy = s.consumers.iter().find(|c| c.name == "busy").unwrap();
    assert_eq!(busy.pending, 2);
    let idle_c = s.consumers.iter().find(|c| c.name == "idle").unwrap();
    assert_eq!(idle_c.pending, 0);

    // "idle" has nothing pending but a live heartbeat: kept. "busy" holds entries: kept.
    q.heartbeat("idle", Duration::from_secs(60)).await.unwrap();
    assert!(q.is_alive("idle").await.unwrap());
    assert!(q.remove_dead_consumers().await.unwrap().is_empty());
    let mut c = conn(&q).await;
    let _: () = c.del(q.keys().worker("idle")).await.unwrap();
    assert_eq!(q.remove_dead_consumers().await.unwrap(), ["idle"]);
    let names: Vec<String> = q
        .stats()
        .await
        .unwrap()
        .consumers
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["busy"]);
    drop(held);
}

#[tokio::test]
async fn the_broker_counts_every_request_it_sends() {
    let srv = RedisServer::start().unwrap();
    let trips = forkbox_queue::RoundTrips::default();
    let broker = Broker::connect_counted(
        &forkbox_queue::Endpoint::Single(srv.url()),
        &Default::default(),
        trips.clone(),
    )
    .await
    .unwrap();
    let q = broker.queue("trips", QueueConfig::default()).unwrap();
    q.ensure_group().await.unwrap();
    let start = trips.get();
    assert_eq!(
        broker.round_trips().get(),
        start,
        "one counter, the caller's"
    );
    // A command, a pipeline and a script call are one request each, whatever they hold.
    let mut c = broker.connection();
    let _: () = c.set("trips:a", 1).await.unwrap();
    let _: () = redis::pipe()
        .set("trips:b", 2)
        .ignore()
        .set("trips:c", 3)
        .ignore()
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(trips.get() - start, 2);
    // A blocking read on its dedicated connection counts too.
    let before = trips.get();
    assert!(q.read("w1", 1, 50).await.unwrap().is_empty());
    assert_eq!(trips.get() - before, 1);
}
