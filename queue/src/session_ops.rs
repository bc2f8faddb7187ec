//! Session operations on a [`Queue`]: the client's (create, call, wait, info, list) and the
//! node's (open, events, calls read, end). The protocol is in [`crate::session`].
//!
//! A session's keys live on the partition of its id (the create job's), as its result does.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use redis::Value;

use crate::complete::Completion;
use crate::delivery::Delivery;
use crate::enqueue::Enqueued;
use crate::error::QueueError;
use crate::keys::{GROUP, WAKE_LINGER_MS};
use crate::queue::{now_ms, Queue};
use crate::schema::{invalid, Job, JobError, JobResult, Status, MAX_TIMEOUT_MS};
use crate::scripts::{CheckedCall, SCRIPTS};
use crate::session::{
    caller_may_wait, entry_ms, Call, EarlierCall, EndReason, Event, SessionInfo, SessionOpened,
    BACKSTOP_GRACE_MS, CALLS_MAXLEN, CALL_EVENTS_LINGER_MS, CALL_FIELD, EVENT_FIELD, WAIT_SLICE_MS,
};

/// Why a session operation did not give what was asked.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error("invalid call: {0}")]
    Invalid(#[source] JobError),
    #[error("session {sid}: unknown session")]
    Unknown { sid: String },
    #[error("session {sid}: {message}")]
    Ended { sid: String, message: String },
    #[error("session {sid}: session lost: node {node} stopped answering")]
    Lost { sid: String, node: String },
    #[error("session {sid} was not opened ({status}): {error}")]
    NotOpened {
        sid: String,
        status: Status,
        error: String,
    },
    #[error("session {sid}: no answer within {waited_ms} ms")]
    Timeout { sid: String, waited_ms: u64 },
    #[error("session {sid}: {message}")]
    Refused { sid: String, message: String },
}

impl Queue {
    fn session_err(&self, source: redis::RedisError) -> QueueError {
        QueueError::Session {
            queue: self.name().to_owned(),
            source,
        }
    }

    /// Enqueues a session's create job (a job with a `session` object) and returns its id,
    /// the session's id.
    pub async fn create_session(&self, job: &Job) -> Result<Enqueued, QueueError> {
        if job.session.is_none() {
            return Err(QueueError::InvalidJob(invalid(
                "session",
                "a session's create job needs a `session` object",
            )));
        }
        self.enqueue_idempotent(job).await
    }

    /// Creates a session and waits up to `timeout` for its node to open it.
    pub async fn open_session(
        &self,
        job: &Job,
        timeout: Duration,
    ) -> Result<SessionOpened, SessionError> {
        let sid = self.create_session(job).await?.id;
        self.wait_opened(&sid, timeout).await
    }

    /// Waits up to `timeout` for the result of session `sid`'s create job.
    pub async fn wait_opened(
        &self,
        sid: &str,
        timeout: Duration,
    ) -> Result<SessionOpened, SessionError> {
        let Some(result) = self.wait_result(sid, timeout).await? else {
            return Err(SessionError::Timeout {
                sid: sid.to_owned(),
                waited_ms: timeout.as_millis() as u64,
            });
        };
        match result.session {
            Some(s) if result.outcome.status == Status::Ok => Ok(s),
            _ => Err(SessionError::NotOpened {
                sid: sid.to_owned(),
                status: result.outcome.status,
                error: result.outcome.error.unwrap_or_default(),
            }),
        }
    }

    /// Session `sid`'s record, if it exists (a live one, or an ended one whose record has not
    /// expired).
    pub async fn session_info(&self, sid: &str) -> Result<Option<SessionInfo>, QueueError> {
        let h: BTreeMap<String, String> = redis::cmd("HGETALL")
            .arg(self.keys.session(sid))
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.session_err(e))?;
        Ok(SessionInfo::from_hash(sid, &h))
    }

    /// The live sessions of this queue (partition), soonest to expire first.
    pub async fn live_sessions(&self) -> Result<Vec<SessionInfo>, QueueError> {
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.keys.sessions())
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.session_err(e))?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HGETALL").arg(self.keys.session(id));
        }
        let hashes: Vec<BTreeMap<String, String>> = pipe
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.session_err(e))?;
        Ok(ids
            .iter()
            .zip(&hashes)
            .filter_map(|(id, h)| SessionInfo::from_hash(id, h))
            .collect())
    }

    /// Sends `call` to its session's node (`lua/session_call.lua`) and returns the node's
    /// name. Refused when the session is unknown, ended or lost (its node's heartbeat is gone:
    /// the call marks it ended, reason `lost`).
    pub async fn send_call(&self, call: &Call) -> Result<String, SessionError> {
        call.validate(MAX_TIMEOUT_MS)
            .map_err(SessionError::Invalid)?;
        let payload = serde_json::to_string(call).expect("a call always serializes");
        if payload.len() > crate::session::MAX_CALL_BYTES {
            return Err(SessionError::Invalid(JobError::TooLarge {
                size: payload.len(),
                limit: crate::session::MAX_CALL_BYTES,
            }));
        }
        let node = self.session_node(&call.session).await?;
        self.session_script(&call.session, &node, &call.id, &payload)
            .await?;
        Ok(node)
    }

    async fn session_node(&self, sid: &str) -> Result<String, SessionError> {
        let node: Option<String> = redis::cmd("HGET")
            .arg(self.keys.session(sid))
            .arg("node")
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.session_err(e))?;
        node.ok_or_else(|| SessionError::Unknown {
            sid: sid.to_owned(),
        })
    }

    /// Runs `lua/session_call.lua`: sends `payload` (or, when empty, checks the session).
    async fn session_script(
        &self,
        sid: &str,
        node: &str,
        cid: &str,
        payload: &str,
    ) -> Result<(), SessionError> {
        let mut pipe = redis::pipe();
        pipe.invoke_script(
            SCRIPTS
                .session_call
                .key(self.keys.session(sid))
                .key(self.keys.calls(node))
                .key(self.keys.worker(node))
                .key(self.keys.call(cid))
                .key(self.keys.sessions())
                .arg(payload)
                .arg(node)
                .arg(CALLS_MAXLEN)
                .arg(now_ms())
                .arg(sid)
                .arg(self.config.result_ttl_s)
                .checked(),
        );
        let (reply,): (Vec<String>,) = self
            .broker
            .query_scripted(&pipe, &[&SCRIPTS.session_call])
            .await
            .map_err(|e| self.session_err(e))?;
        let code = reply.first().map(String::as_str).unwrap_or_default();
        let message = reply.get(1).cloned().unwrap_or_default();
        let sid = sid.to_owned();
        match code {
            "ok" => Ok(()),
            "unknown" => Err(SessionError::Unknown { sid }),
            "ended" => Err(SessionError::Ended { sid, message }),
            "lost" => Err(SessionError::Lost {
                sid,
                node: node.to_owned(),
            }),
            _ => Err(SessionError::Refused { sid, message }),
        }
    }

    /// Waits for call `cid` of session `sid` on `node` to end, handing each event to
    /// `on_event` as it comes, and returns the terminal one. Reads the call's events from the
    /// start in blocks of at most a second; after each block without a terminal event it
    /// checks the node's heartbeat, so a dead node is reported ([`SessionError::Lost`], and
    /// the session marked ended) within the heartbeat's TTL, never waited on.
    pub async fn wait_call(
        &self,
        sid: &str,
        node: &str,
        cid: &str,
        timeout: Duration,
        on_event: &mut (dyn FnMut(&Event) + Send),
    ) -> Result<Event, SessionError> {
        let deadline = Instant::now() + timeout;
        let key = self.keys.call(cid);
        let mut after = "0-0".to_owned();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(SessionError::Timeout {
                    sid: sid.to_owned(),
                    waited_ms: timeout.as_millis() as u64,
                });
            }
            let block = left.min(Duration::from_millis(WAIT_SLICE_MS));
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT")
                .arg(256)
                .arg("BLOCK")
                .arg(block.as_millis().max(1) as u64)
                .arg("STREAMS")
                .arg(&key)
                .arg(&after);
            let got = self
                .run_read(&cmd, Some(block))
                .await
                .map_err(|e| self.session_err(e))?;
            for (_, entries) in crate::reply::xread(&got) {
                for entry in entries {
                    after = entry.id.clone();
                    let Some(raw) = entry.field(EVENT_FIELD) else {
                        continue;
                    };
                    let event: Event =
                        serde_json::from_slice(raw).map_err(|e| SessionError::Refused {
                            sid: sid.to_owned(),
                            message: format!("call {cid}: an event is not valid JSON: {e}"),
                        })?;
                    on_event(&event);
                    if event.is_terminal() {
                        return Ok(event);
                    }
                }
            }
            if matches!(got, Value::Nil) {
                self.session_script(sid, node, cid, "").await?;
            }
        }
    }

    /// Sends `call` and waits for its end ([`Queue::send_call`], [`Queue::wait_call`]),
    /// up to the call's timeout plus the node's backstop and `slack`.
    pub async fn call_session(
        &self,
        call: &Call,
        slack: Duration,
        on_event: &mut (dyn FnMut(&Event) + Send),
    ) -> Result<Event, SessionError> {
        let node = self.send_call(call).await?;
        let wait = Duration::from_millis(call.timeout_ms(MAX_TIMEOUT_MS) + BACKSTOP_GRACE_MS);
        self.wait_call(&call.session, &node, &call.id, wait + slack, on_event)
            .await
    }
}

/// The node's side.
impl Queue {
    /// Stores the result of a session's create job (status `ok`, with its `session`) and
    /// records the session as live with `fields` (`lua/session_open.lua`), atomically and
    /// fenced by delivery as a completion is. Anything but [`Completion::Stored`] means the
    /// session is not live: the node closes what it opened.
    pub async fn open_session_record(
        &self,
        delivery: &Delivery,
        result: &JobResult,
        expires_ms: u64,
        fields: &[(&str, String)],
    ) -> Result<Completion, QueueError> {
        let json = serde_json::to_string(result).expect("a result always serializes");
        let ttl = self.ttl_for(delivery.job.as_ref().ok().and_then(|j| j.result_ttl_s));
        let sid = &delivery.id;
        let mut invocation = SCRIPTS.session_open.key(self.keys.result(sid));
        invocation
            .key(self.keys.done(sid))
            .key(self.keys.results())
            .key(self.keys.jobs())
            .key(self.keys.idem(sid))
            .key(self.keys.wake(sid))
            .key(self.keys.session(sid))
            .key(self.keys.sessions())
            .arg(json)
            .arg(ttl)
            .arg(self.config.results_maxlen)
            .arg(GROUP)
            .arg(&delivery.entry_id)
            .arg(WAKE_LINGER_MS.min(ttl * 1000))
            .arg(sid)
            .arg(expires_ms);
        for (name, value) in fields {
            invocation.arg(*name).arg(value);
        }
        invocation.arg("result_ttl_s").arg(ttl);
        let mut pipe = redis::pipe();
        pipe.invoke_script(invocation.checked());
        let (stored,): (i64,) = self
            .broker
            .query_scripted(&pipe, &[&SCRIPTS.session_open])
            .await
            .map_err(|source| QueueError::Complete {
                queue: self.name().to_owned(),
                id: sid.clone(),
                source,
            })?;
        Ok(match stored {
            1 => Completion::Stored,
            2 => Completion::Lost,
            _ => Completion::Duplicate,
        })
    }

    /// Records the branches `children` of session `parent` of node `node` as live sessions
    /// with `fields`, each naming its parent, and lists them in the parent's hash
    /// (`lua/session_fork.lua`), atomically. `false` when the parent is no longer this node's
    /// live session: the node ends the branches it made.
    pub async fn fork_session_record(
        &self,
        parent: &str,
        node: &str,
        children: &[String],
        expires_ms: u64,
        fields: &[(&str, String)],
    ) -> Result<bool, QueueError> {
        let mut invocation = SCRIPTS.session_fork.key(self.keys.session(parent));
        invocation.key(self.keys.sessions());
        for sid in children {
            invocation.key(self.keys.session(sid));
        }
        invocation
            .arg(parent)
            .arg(node)
            .arg(expires_ms)
            .arg(children.len());
        for sid in children {
            invocation.arg(sid);
        }
        for (name, value) in fields {
            invocation.arg(*name).arg(value);
        }
        let mut pipe = redis::pipe();
        pipe.invoke_script(invocation.checked());
        let (recorded,): (i64,) = self
            .broker
            .query_scripted(&pipe, &[&SCRIPTS.session_fork])
            .await
            .map_err(|e| self.session_err(e))?;
        Ok(recorded == 1)
    }

    /// Records session `sid` of node `node` as ended for `reason` (`lua/session_end.lua`) and
    /// gives each call of `calls` (in flight or queued) the terminal event `event`. Returns
    /// whether this call ended it.
    pub async fn end_session_record(
        &self,
        sid: &str,
        node: &str,
        reason: EndReason,
        calls: &[String],
        event: &Event,
    ) -> Result<bool, QueueError> {
        let ttl: Option<u64> = redis::cmd("HGET")
            .arg(self.keys.session(sid))
            .arg("result_ttl_s")
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.session_err(e))?;
        let mut invocation = SCRIPTS.session_end.key(self.keys.session(sid));
        invocation.key(self.keys.sessions());
        for cid in calls {
            invocation.key(self.keys.call(cid));
        }
        invocation
            .arg(sid)
            .arg(node)
            .arg(reason.as_str())
            .arg(now_ms())
            .arg(ttl.unwrap_or(self.config.result_ttl_s))
            .arg(event.to_json())
            .arg(CALL_EVENTS_LINGER_MS);
        let mut pipe = redis::pipe();
        pipe.invoke_script(invocation.checked());
        let (ended,): (i64,) = self
            .broker
            .query_scripted(&pipe, &[&SCRIPTS.session_end])
            .await
            .map_err(|e| self.session_err(e))?;
        Ok(ended == 1)
    }

    /// Appends `events` to call `cid`'s event stream, in one round trip; a terminal one sets
    /// the stream's expiry ([`CALL_EVENTS_LINGER_MS`]).
    pub async fn push_events(&self, cid: &str, events: &[Event]) -> Result<(), QueueError> {
        if events.is_empty() {
            return Ok(());
        }
        let key = self.keys.call(cid);
        let mut pipe = redis::pipe();
        for event in events {
            pipe.cmd("XADD")
                .arg(&key)
                .arg("*")
                .arg(EVENT_FIELD)
                .arg(event.to_json())
                .ignore();
        }
        if events.iter().any(Event::is_terminal) {
            pipe.cmd("PEXPIRE")
                .arg(&key)
                .arg(CALL_EVENTS_LINGER_MS)
                .ignore();
        }
        pipe.query_async::<()>(&mut self.conn())
            .await
            .map_err(|e| self.session_err(e))
    }

    /// Where node `node` starts reading its calls: the id of the last entry of its calls
    /// stream as Redis has it now (`0-0` when the stream is empty or absent). Redis gives
    /// every entry added later a greater id, so a reader that starts here reads every call
    /// added from now on, whatever the node's clock says against Redis' own. Calls added
    /// before (a previous life's of the node's name) are not read.
    pub async fn calls_start_id(&self, node: &str) -> Result<String, QueueError> {
        let got: Value = redis::cmd("XREVRANGE")
            .arg(self.keys.calls(node))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.session_err(e))?;
        Ok(crate::reply::entries(&got)
            .into_iter()
            .next()
            .map_or_else(|| "0-0".to_owned(), |e| e.id))
    }

    /// The calls on node `node`'s calls stream up to entry `until` (its start: see
    /// [`Queue::calls_start_id`]) whose callers may still be waiting at `now_ms`
    /// ([`caller_may_wait`]), newest first. Read in pages, back to the first entry too old for
    /// any call's limit.
    pub async fn calls_before(
        &self,
        node: &str,
        until: &str,
        now_ms: u64,
    ) -> Result<Vec<EarlierCall>, QueueError> {
        const PAGE: usize = 64;
        let mut found = Vec::new();
        if until == "0-0" {
            return Ok(found);
        }
        let mut end = until.to_owned();
        loop {
            let got: Value = redis::cmd("XREVRANGE")
                .arg(self.keys.calls(node))
                .arg(&end)
                .arg("-")
                .arg("COUNT")
                .arg(PAGE)
                .query_async(&mut self.conn())
                .await
                .map_err(|e| self.session_err(e))?;
            let entries = crate::reply::entries(&got);
            let full = entries.len() == PAGE;
            for entry in entries {
                let added = entry_ms(&entry.id);
                if !caller_may_wait(added, MAX_TIMEOUT_MS, now_ms) {
                    return Ok(found);
                }
                let call = entry.field(CALL_FIELD).and_then(EarlierCall::parse);
                if let Some(call) = call.filter(|c| caller_may_wait(added, c.timeout_ms, now_ms)) {
                    found.push(call);
                }
                end = format!("({}", entry.id);
            }
            if !full {
                return Ok(found);
            }
        }
    }

    /// Ends session `sid`, a previous life's of node `node`, as lost, and gives each of its
    /// calls `calls` that has no terminal event the terminal `event` (`lua/session_lost.lua`;
    /// nothing when the record is another node's or ended otherwise). Returns how many calls
    /// it answered.
    pub async fn answer_lost_calls(
        &self,
        sid: &str,
        node: &str,
        calls: &[String],
        event: &Event,
    ) -> Result<u64, QueueError> {
        let mut invocation = SCRIPTS.session_lost.key(self.keys.session(sid));
        invocation.key(self.keys.sessions());
        for cid in calls {
            invocation.key(self.keys.call(cid));
        }
        invocation
            .arg(sid)
            .arg(node)
            .arg(now_ms())
            .arg(self.config.result_ttl_s)
            .arg(event.to_json())
            .arg(CALL_EVENTS_LINGER_MS);
        let mut pipe = redis::pipe();
        pipe.invoke_script(invocation.checked());
        let (answered,): (u64,) = self
            .broker
            .query_scripted(&pipe, &[&SCRIPTS.session_lost])
            .await
            .map_err(|e| self.session_err(e))?;
        Ok(answered)
    }

    /// Reads up to `count` calls to node `node` added after entry `after`, blocking up to
    /// `block` for the first: `(entry id, call JSON)` each (a call entry without a `call`
    /// field comes with an empty payload, which fails to parse).
    pub async fn read_calls(
        &self,
        node: &str,
        after: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<(String, Vec<u8>)>, QueueError> {
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT")
            .arg(count.max(1))
            .arg("BLOCK")
            .arg(block.as_millis().max(1) as u64)
            .arg("STREAMS")
            .arg(self.keys.calls(node))
            .arg(after);
        let got = self
            .run_read(&cmd, Some(block))
            .await
            .map_err(|e| self.session_err(e))?;
        Ok(crate::reply::xread(&got)
            .into_iter()
            .flat_map(|(_, entries)| entries)
            .map(|e| {
                let payload = e.field(CALL_FIELD).map(<[u8]>::to_vec).unwrap_or_default();
                (e.id, payload)
            })
            .collect())
    }

    /// Sets fields of session `sid`'s record, and its score in the live set when
    /// `expires_ms` is given (a new lifetime).
    pub async fn update_session_record(
        &self,
        sid: &str,
        fields: &[(&str, String)],
        expires_ms: Option<u64>,
    ) -> Result<(), QueueError> {
        let mut pipe = redis::pipe();
        if !fields.is_empty() {
            let cmd = pipe.cmd("HSET").arg(self.keys.session(sid));
            for (name, value) in fields {
                cmd.arg(*name).arg(value);
            }
            cmd.ignore();
        }
        if let Some(expires) = expires_ms {
            pipe.cmd("HSET")
                .arg(self.keys.session(sid))
                .arg("expires_ms")
                .arg(expires)
                .ignore();
            pipe.cmd("ZADD")
                .arg(self.keys.sessions())
                .arg("XX")
                .arg(expires)
                .arg(sid)
                .ignore();
        }
        pipe.query_async::<()>(&mut self.conn())
            .await
            .map_err(|e| self.session_err(e))
    }
}
