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
//! can have a call before. Calls added before (a previous life's of the node's name) are not
//! read. Trimming (`MAXLEN ~`) drops the oldest entries only, never the last one.

use std::sync::Arc;
use std::time::Duration;

use forkbox_queue::{Queue, QueueSet};
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
    let tasks = starts
        .into_iter()
        .map(|(queue, after)| {
            let reader = Reader {
                queue,
                node: node.to_owned(),
                health: health.clone(),
                stop: stop.subscribe(),
                route: route.clone(),
            };
            tokio::spawn(reader.run(after))
        })
        .collect();
    Some(tasks)
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
