//! Waits for results shared by every request a process has in flight.
//!
//! [`Queue::wait_result`] holds one blocking connection per waiter, and a client that
//! enqueues and then waits sends two requests per job. [`SharedWaits`] is for a process that
//! waits for many jobs at once (the HTTP gateway): one coordinating task per partition keeps
//! the ids in flight and reads their `wake:<id>` streams in few blocking calls, each a
//! *lane*: one pipeline on a dedicated connection,
//!
//! ```text
//! EVALSHA enqueue ...      (the jobs that joined since the last call, if any)
//! XREAD COUNT 1 BLOCK t STREAMS wake:<id1> wake:<id2> ... <after1> <after2> ...
//! GET result:<id1>
//! GET result:<id2> ...
//! ```
//!
//! Redis runs the `GET`s as the `XREAD` answers (a result is stored with its wake-up entry,
//! in one script), so a lane that returns brings every result that came meanwhile. When a
//! lane returns, the ids still waiting and the ones that joined since go out together in the
//! next one. A job that joins while fewer than [`LANES`] lanes are out starts a lane at once,
//! with its enqueue in it: enqueue and wait in one round trip. With [`LANES`] out, it joins
//! the next lane to return, or after [`JOIN_DELAY`] a lane of its own (so a short job is not
//! held behind long ones): its enqueue waits that long at most. A joining job never
//! interrupts a blocked read (`CLIENT UNBLOCK` is not in the gateway's ACL role).
//!
//! Nothing is missed: each lane sends every id's `XREAD` from the last entry seen (`0-0` at
//! first) and its `GET`, so a result stored before the lane started is read at once (its
//! wake-up entry lingers [`WAKE_LINGER_MS`](crate::keys::WAKE_LINGER_MS)), and one whose entry
//! expired by then is read when the lane's block ends (at most [`WAIT_SLICE`]).
//!
//! Failures: a lane's call that fails on a connection error is sent once more on a fresh
//! connection (as every blocking call, [`Broker::query_blocking_pipe`](crate::Broker)); a
//! Redis that lost its scripts (NOSCRIPT after a restart) gets them loaded and the lane sent
//! again (the failed call's read still blocks first, up to its block time, since Redis runs
//! the read after the failed enqueue: once per lane after Redis lost its scripts); any other
//! failure fails the lane's jobs that joined with their enqueue (an error of
//! the enqueue) and sends the others again, or, when the lane carried no enqueue, fails them
//! all (an error of the wait).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::error::QueueError;
use crate::keys::partition_of;
use crate::partitioned::Partitioned;
use crate::queue::{is_connection_error, Queue};
use crate::results::WAIT_SLICE;
use crate::schema::{Job, JobResult};
use crate::scripts::SCRIPTS;

/// Lanes a partition keeps out before a joining job waits for one to return.
pub const LANES: usize = 4;

/// Longest a joining job waits for a lane to return before it gets one of its own.
pub const JOIN_DELAY: Duration = Duration::from_millis(5);

/// Most ids one lane reads.
const LANE_IDS: usize = 256;

/// Times a job is sent again after its lane found Redis without the enqueue script.
const NOSCRIPT_TRIES: u8 = 3;

/// Shared waits over every partition of a queue (see the module docs). Cheap to share behind
/// an `Arc`; the coordinating tasks start on first use, on the caller's runtime, and end when
/// this is dropped and their lanes are back.
pub struct SharedWaits {
    parts: Vec<Part>,
}

impl std::fmt::Debug for SharedWaits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWaits")
            .field("queue", &self.parts[0].queue.name())
            .field("partitions", &self.parts.len())
            .finish()
    }
}

struct Part {
    queue: Arc<Queue>,
    joins: OnceLock<mpsc::UnboundedSender<Entry>>,
}

/// What a waiting job gets back: the result's bytes, `None` when its time ran out.
type Answer = Result<Option<Vec<u8>>, QueueError>;

/// One job waited for.
struct Entry {
    id: String,
    wake: String,
    result: String,
    /// Entries of `wake` after this one wake the job.
    after: String,
    /// The enqueue script's call, until a lane has run it.
    enqueue: Option<Cmd>,
    deadline: Instant,
    noscript: u8,
    answer: oneshot::Sender<Answer>,
}

impl SharedWaits {
    /// Shared waits on `queue`'s partitions.
    pub fn new(queue: &Partitioned) -> SharedWaits {
        SharedWaits {
            parts: queue
                .partitions()
                .iter()
                .map(|q| Part {
                    queue: Arc::new(q.clone()),
                    joins: OnceLock::new(),
                })
                .collect(),
        }
    }

    fn part(&self, id: &str) -> &Part {
        &self.parts[partition_of(id, self.parts.len())]
    }

    /// Enqueues `job` (as [`Queue::enqueue_idempotent`] does; a job without id gets a uuid v7)
    /// and waits up to `timeout` for its result; `None` when none came in time. An error of the
    /// enqueue is [`QueueError::InvalidJob`] (nothing sent) or [`QueueError::Enqueue`]; any
    /// other error is the wait's, the job enqueued.
    pub async fn enqueue_and_wait(
        &self,
        job: &Job,
        timeout: Duration,
    ) -> Result<Option<JobResult>, QueueError> {
        let mut job = job.clone();
        let id = job
            .id
            .get_or_insert_with(|| uuid::Uuid::now_v7().to_string())
            .clone();
        let part = self.part(&id);
        let mut pipe = redis::pipe();
        part.queue
            .add_enqueue(&mut pipe, &job, None, crate::queue::now_ms())?;
        let call = pipe.cmd_iter().next().cloned();
        self.join(part, id, call, timeout).await
    }

    /// Waits up to `timeout` for the result of `id`, a job just enqueued (as
    /// [`Queue::wait_new_result`]); `None` when none came in time.
    pub async fn wait_new(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<Option<JobResult>, QueueError> {
        self.join(self.part(id), id.to_owned(), None, timeout).await
    }

    async fn join(
        &self,
        part: &Part,
        id: String,
        enqueue: Option<Cmd>,
        timeout: Duration,
    ) -> Result<Option<JobResult>, QueueError> {
        let queue = &part.queue;
        let (answer, answered) = oneshot::channel();
        let entry = Entry {
            wake: queue.keys.wake(&id),
            result: queue.keys.result(&id),
            id,
            after: "0-0".to_owned(),
            enqueue,
            deadline: Instant::now() + timeout,
            noscript: 0,
            answer,
        };
        let id = entry.id.clone();
        let joins = part.joins.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(coordinate(queue.clone(), rx));
            tx
        });
        let stopped = || QueueError::Results {
            queue: queue.name().to_owned(),
            source: RedisError::from((
                ErrorKind::ClientError,
                "the shared wait stopped",
                format!("job {id}"),
            )),
        };
        joins.send(entry).map_err(|_| stopped())?;
        let Some(raw) = answered.await.map_err(|_| stopped())?? else {
            return Ok(None);
        };
        JobResult::from_slice(&raw)
            .map(Some)
            .map_err(|source| QueueError::CorruptResult {
                queue: queue.name().to_owned(),
                id,
                source,
            })
    }
}

/// One partition's coordinator: starts lanes and settles them as they return.
async fn coordinate(queue: Arc<Queue>, mut joins: mpsc::UnboundedReceiver<Entry>) {
    let mut waiting: Vec<Entry> = Vec::new();
    let mut lanes: JoinSet<Lane> = JoinSet::new();
    // When the oldest job waiting for a lane began to wait.
    let mut since: Option<Instant> = None;
    let mut open = true;
    loop {
        waiting.retain(|e| !e.answer.is_closed());
        if waiting.is_empty() {
            since = None;
        } else if lanes.len() < LANES || since.is_some_and(|t| t.elapsed() >= JOIN_DELAY) {
            while !waiting.is_empty() {
                let n = waiting.len().min(LANE_IDS);
                let batch: Vec<Entry> = waiting.drain(..n).collect();
                lanes.spawn(lane(queue.clone(), batch));
            }
            since = None;
        } else if since.is_none() {
            since = Some(Instant::now());
        }
        if !open && waiting.is_empty() && lanes.is_empty() {
            return;
        }
        let join_by = tokio::time::Instant::from_std(
            since.map_or_else(|| Instant::now() + WAIT_SLICE, |t| t + JOIN_DELAY),
        );
        tokio::select! {
            got = joins.recv(), if open => match got {
                Some(e) => {
                    waiting.push(e);
                    while let Ok(e) = joins.try_recv() {
                        waiting.push(e);
                    }
                }
                None => open = false,
            },
            Some(done) = lanes.join_next(), if !lanes.is_empty() => match done {
                Ok(lane) => settle(&queue, lane, &mut waiting).await,
                // Its jobs' answers are dropped with it: their callers see the wait stopped.
                Err(e) => tracing::error!("a shared wait's lane on queue {} failed: {e}", queue.name()),
            },
            () = tokio::time::sleep_until(join_by), if since.is_some() => {}
        }
    }
}

/// A lane back from Redis: its jobs, how many enqueues it carried, and the replies.
struct Lane {
    entries: Vec<Entry>,
    enqueues: usize,
    reply: RedisResult<Value>,
}

/// Sends one lane: the enqueues it carries, the blocking read of every job's wake-up
/// stream, and every job's `GET`.
async fn lane(queue: Arc<Queue>, entries: Vec<Entry>) -> Lane {
    let now = Instant::now();
    let left = entries
        .iter()
        .map(|e| e.deadline.saturating_duration_since(now))
        .min()
        .unwrap_or_default();
    // BLOCK takes milliseconds; 0 would mean forever, so never send less than 1.
    let block = left.min(WAIT_SLICE).as_millis().max(1) as u64;
    let mut pipe = redis::pipe();
    let mut enqueues = 0;
    for call in entries.iter().filter_map(|e| e.enqueue.as_ref()) {
        pipe.add_command(call.clone());
        enqueues += 1;
    }
    pipe.cmd("XREAD")
        .arg("COUNT")
        .arg(1)
        .arg("BLOCK")
        .arg(block)
        .arg("STREAMS");
    for e in &entries {
        pipe.arg(&e.wake);
    }
    for e in &entries {
        pipe.arg(&e.after);
    }
    for e in &entries {
        pipe.cmd("GET").arg(&e.result);
    }
    let reply = queue
        .broker
        .query_blocking_pipe(&pipe, Duration::from_millis(block))
        .await;
    Lane {
        entries,
        enqueues,
        reply,
    }
}

/// Answers the jobs whose result a lane brought (or whose time ran out), and puts the others
/// back to wait.
async fn settle(queue: &Queue, lane: Lane, waiting: &mut Vec<Entry>) {
    let Lane {
        entries,
        enqueues,
        reply,
    } = lane;
    let replies = match reply {
        Ok(Value::Array(v)) if v.len() == enqueues + 1 + entries.len() => v,
        Ok(other) => {
            let e = RedisError::from((
                ErrorKind::TypeError,
                "a shared wait's replies",
                format!(
                    "{} replies expected, got {other:?}",
                    enqueues + 1 + entries.len()
                ),
            ));
            return failed(queue, entries, 0, e, waiting).await;
        }
        Err(e) => return failed(queue, entries, enqueues, e, waiting).await,
    };
    // An enqueue that failed would have failed the whole pipeline.
    let mut replies = replies.into_iter().skip(enqueues);
    let woke = replies.next().unwrap_or(Value::Nil);
    let seen = crate::reply::xread(&woke);
    let now = Instant::now();
    for (mut e, raw) in entries.into_iter().zip(replies) {
        e.enqueue = None;
        match redis::from_owned_redis_value::<Option<Vec<u8>>>(raw) {
            Ok(Some(bytes)) => {
                let _ = e.answer.send(Ok(Some(bytes)));
                continue;
            }
            Ok(None) => {}
            Err(source) => {
                let _ = e.answer.send(Err(QueueError::Results {
                    queue: queue.name().to_owned(),
                    source,
                }));
                continue;
            }
        }
        // Woken without a result (one deleted since): later entries only wake it again.
        if let Some(last) = seen
            .iter()
            .find(|(stream, _)| *stream == e.wake)
            .and_then(|(_, entries)| entries.last())
        {
            e.after = last.id.clone();
        }
        if now >= e.deadline {
            let _ = e.answer.send(Ok(None));
        } else if !e.answer.is_closed() {
            waiting.push(e);
        }
    }
}

/// A lane that failed with `error`; see the module docs.
async fn failed(
    queue: &Queue,
    entries: Vec<Entry>,
    enqueues: usize,
    error: RedisError,
    waiting: &mut Vec<Entry>,
) {
    let mut error = error;
    if enqueues > 0 && error.kind() == ErrorKind::NoScriptError {
        // Redis lost its scripts (a restart, a failover): nothing of the lane ran after its
        // first enqueue failed, and an enqueue sent again is not added twice.
        match SCRIPTS
            .enqueue
            .prepare_invoke()
            .load_async(&mut queue.broker.connection())
            .await
        {
            Ok(_) => {
                for mut e in entries {
                    e.noscript += 1;
                    if e.noscript > NOSCRIPT_TRIES {
                        let source = copy(&error);
                        let _ = e.answer.send(Err(QueueError::Enqueue {
                            queue: queue.name().to_owned(),
                            source,
                        }));
                    } else {
                        waiting.push(e);
                    }
                }
                return;
            }
            Err(e) => error = e,
        }
    }
    // With enqueues in the lane, the failure may be theirs: the jobs already enqueued wait on.
    let retry = enqueues > 0 && !is_connection_error(&error);
    for e in entries {
        let answer = if e.enqueue.is_some() {
            Err(QueueError::Enqueue {
                queue: queue.name().to_owned(),
                source: copy(&error),
            })
        } else if retry {
            waiting.push(e);
            continue;
        } else {
            Err(QueueError::Results {
                queue: queue.name().to_owned(),
                source: copy(&error),
            })
        };
        tracing::debug!("shared wait for {}: {error}", e.id);
        let _ = e.answer.send(answer);
    }
}

/// `e` again, for each job it fails (a Redis error is not `Clone`).
fn copy(e: &RedisError) -> RedisError {
    if e.is_io_error() {
        let kind = if e.is_timeout() {
            std::io::ErrorKind::TimedOut
        } else if e.is_connection_refusal() {
            std::io::ErrorKind::ConnectionRefused
        } else {
            std::io::ErrorKind::Other
        };
        return RedisError::from(std::io::Error::new(kind, e.to_string()));
    }
    RedisError::from((e.kind(), "shared wait", e.to_string()))
}
