//! The calls readers: one per queue partition reads `calls:<node>` with plain `XREAD BLOCK`
//! (retried with back-off while Redis is away, the last entry id kept) and hands each call to
//! the node's sessions.
//!
//! Where they start is taken from Redis before [`start`] returns: the id of each calls
//! stream's last entry. Redis gives every entry added later a greater id, so every call added
//! once [`start`] has returned is read, whatever the node's clock says against Redis' (a start
//! taken from the node's clock, at a reader's first poll, missed the calls Redis stamped
//! before it: added before that poll, or by a Redis whose clock is behind the node's). The
//! node starts them before it reads any job or renews its heartbeat, so no session of its own
//! can have a call before. Trimming (`MAXLEN ~`) drops the oldest entries only, never the last
//! one.
//!
//! Calls added before (up to that entry) were sent to a previous life of the node's name: it
//! died, every session it held is lost, and it may not have answered them. Their callers see
//! the node's heartbeat again once it is back, so they would wait out each call's timeout. One
//! task per partition answers them at the start instead ([`answer_earlier`]): each session
//! they name whose record still says live on this node is ended as lost, and each of its calls
//! without a terminal event gets `session lost` (`lua/session_lost.lua`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use forkbox_queue::session::{ErrorReason, Event};
use forkbox_queue::{now_ms, Queue, QueueError, QueueSet};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::node::health::{Backoff, RedisHealth};
use crate::node::stop::StopLevel;

/// What a reader does with each call it reads: `(partition, call JSON)`.
pub(crate) type Route = Arc<dyn Fn(&Queue, &[u8]) + Send + Sync>;

/// How many calls one read takes at most.
const READ_COUNT: usize = 64;

/// How long one read blocks.
const READ_BLOCK: Duration = Duration::from_millis(1000);

/// Starts one calls reader of node `node` per partition of `queues`, each from the end of its
/// calls stream as Redis has it when this returns; they read until `stop` turns true. Waits
/// (backing off) while Redis is away; `None` when the node is asked to stop first.
pub(crate) async fn start(
    queues: &QueueSet,
    node: &str,
    health: &Arc<RedisHealth>,
    node_stop: &mut watch::Receiver<StopLevel>,
    stop: &watch::Sender<bool>,
    route: Route,
) -> Option<Vec<JoinHandle<()>>> {
    let mut starts = Vec::new();
    for queue in queues.queues() {
        let after = start_id(queue, node, health, node_stop).await?;
        starts.push((queue.clone(), after));
    }
    let mut tasks = Vec::new();
    for (queue, after) in starts {
        let earlier = answer_earlier(
            queue.clone(),
            node.to_owned(),
            after.clone(),
            health.clone(),
            stop.subscribe(),
        );
        tasks.push(tokio::spawn(earlier));
        let reader = Reader {
            queue,
            node: node.to_owned(),
            health: health.clone(),
            stop: stop.subscribe(),
            route: route.clone(),
        };
        tasks.push(tokio::spawn(reader.run(after)));
    }
    Some(tasks)
}

/// Answers the calls on `queue`'s calls stream up to entry `until` (the reader's start) that
/// a previous life of node `node` left unanswered: `session lost`, as a caller whose check
/// finds the node's heartbeat gone is told. Retried while Redis is away (the script answers
/// a call once), until the node stops reading.
async fn answer_earlier(
    queue: Queue,
    node: String,
    until: String,
    health: Arc<RedisHealth>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::default();
    loop {
        let answered = tokio::select! {
            r = answer_earlier_once(&queue, &node, &until) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        match answered {
            Ok((0, _)) => return,
            Ok((calls, sessions)) => {
                tracing::info!(
                    queue = queue.name(),
                    "{calls} call(s) to {sessions} session(s) of this node's previous life \
                     answered: session lost"
                );
                return;
            }
            Err(e) => {
                health.failed("answering the calls of a previous life's sessions", &e);
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        }
    }
}

/// One pass of [`answer_earlier`]: `(calls answered, sessions they were sent to)`.
async fn answer_earlier_once(
    queue: &Queue,
    node: &str,
    until: &str,
) -> Result<(u64, usize), QueueError> {
    let calls = queue.calls_before(node, until, now_ms()).await?;
    // Every session named here is a previous life's: this life opens its sessions after its
    // readers' start, so their calls come after `until`.
    let mut sessions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for call in calls {
        sessions.entry(call.session).or_default().push(call.id);
    }
    let event = Event::error(
        ErrorReason::SessionLost,
        format!("session lost: node {node} stopped answering"),
    );
    let mut answered = 0;
    for (sid, cids) in &sessions {
        answered += queue.answer_lost_calls(sid, node, cids, &event).await?;
    }
    Ok((answered, sessions.len()))
}

/// The id `queue`'s reader starts after, from Redis; retried while Redis is away.
async fn start_id(
    queue: &Queue,
    node: &str,
    health: &RedisHealth,
    node_stop: &mut watch::Receiver<StopLevel>,
) -> Option<String> {
    let mut backoff = Backoff::default();
    loop {
        match queue.calls_start_id(node).await {
            Ok(id) => {
                health.ok();
                return Some(id);
            }
            Err(e) => {
                health.failed("reading where the session calls start", &e);
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                    _ = node_stop.wait_for(|l| *l >= StopLevel::Drain) => return None,
                }
            }
        }
    }
}

/// One partition's calls reader.
struct Reader {
    queue: Queue,
    node: String,
    health: Arc<RedisHealth>,
    stop: watch::Receiver<bool>,
    route: Route,
}

impl Reader {
    /// Reads the calls added after entry `after` until the node stops reading.
    async fn run(mut self, mut after: String) {
        let mut backoff = Backoff::default();
        loop {
            let read = self
                .queue
                .read_calls(&self.node, &after, READ_COUNT, READ_BLOCK);
            let got = tokio::select! {
                r = read => r,
                _ = self.stop.wait_for(|s| *s) => return,
            };
            match got {
                Ok(calls) => {
                    backoff.reset();
                    for (entry, payload) in calls {
                        after = entry;
                        (self.route)(&self.queue, &payload);
                    }
                }
                Err(e) => {
                    self.health.failed("reading session calls", &e);
                    tokio::select! {
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                        _ = self.stop.wait_for(|s| *s) => return,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkbox_queue::{Broker, QueueConfig};
    use forkbox_testkit::RedisServer;
    use tokio::sync::mpsc;

    const NODE: &str = "node-calls";

    /// A call added once the readers have started is read: here it is added by a client
    /// while no task of this (single-threaded) runtime can run, so a reader that took its
    /// start at its first poll would take it after the call, and miss it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_added_once_the_readers_started_is_read() {
        let server = RedisServer::start().expect("a private redis-server");
        let broker = Broker::connect(&server.url()).await.expect("connects");
        let queue = broker.queue("q", QueueConfig::default()).expect("a queue");
        let key = queue.keys().calls(NODE);
        let set = QueueSet::new(vec![queue]).expect("a queue set");
        // A call of a previous life of the node's name, before the start: not read.
        let client = forkbox_queue::redis::Client::open(server.url()).expect("a client");
        let mut c = client.get_connection().expect("a connection");
        let xadd = |c: &mut forkbox_queue::redis::Connection, payload: &str| -> String {
            forkbox_queue::redis::cmd("XADD")
                .arg(&key)
                .arg("*")
                .arg("call")
                .arg(payload)
                .query(c)
                .expect("XADD")
        };
        xadd(&mut c, "before");

        let (tx, mut rx) = mpsc::unbounded_channel();
        let route: Route = Arc::new(move |_: &Queue, payload: &[u8]| {
            let _ = tx.send(payload.to_vec());
        });
        let health = Arc::new(RedisHealth::default());
        let (_node_stop_tx, mut node_stop) = watch::channel(StopLevel::Running);
        let (stop, _) = watch::channel(false);
        let readers = start(&set, NODE, &health, &mut node_stop, &stop, route)
            .await
            .expect("started");
        // Blocking: the runtime's one thread runs nothing else until the call is in Redis.
        xadd(&mut c, "after");
        let got = tokio::time::timeout(Duration::from_secs(20), rx.recv()).await;
        assert_eq!(
            got.ok().flatten().as_deref(),
            Some(&b"after"[..]),
            "the call added after the start is read, and the one before is not"
        );
        let _ = stop.send(true);
        for r in readers {
            r.await.expect("the reader ends");
        }
    }
}
