//! Finishing deliveries: results and dead letters.
//!
//! Both go through `lua/complete.lua`, which declares every key it touches and does, in one
//! atomic step: store the result with its TTL, push the wake-up element on the `done` list and
//! the `wake` stream,
//! append to the results stream (and the job's `reply_to` stream), bump the batch counters,
//! XACK and XDEL the entry (and, for a dead letter, XADD it to the dead stream). Completions
//! are fenced by delivery: the script stores only when its XACK acknowledged the entry, i.e.
//! the entry was still pending, so of all the deliveries of one entry only the first to finish
//! stores, even when it finishes after an earlier result expired. A result that already exists
//! wins as well (an id enqueued again as a new entry while its result lives). Several
//! completions travel in one pipelined round trip, and that round trip can also read the next
//! entries for the slots the completions free ([`Queue::complete_many_and_read`]), so a node
//! working through a backlog spends one round trip per job, not two.

use crate::error::QueueError;
use crate::keys::{GROUP, WAKE_LINGER_MS};
use crate::queue::{now_ms, Queue};
use crate::schema::{JobResult, Outcome, Status};
use crate::scripts::SCRIPTS;
use crate::{reply, Delivery};
use redis::aio::ConnectionLike;
use redis::FromRedisValue;

/// What a completion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// This call stored the result and woke the waiters.
    Stored,
    /// Nothing stored: a result already existed (the entry was only acknowledged), or the
    /// entry was no longer pending (another delivery of it finished first).
    Duplicate,
    /// Nothing stored, and no result exists for the id: the entry was no longer pending and
    /// its result is nowhere. Redis lost the entry (a restart without persistence, a flush, a
    /// failover to a replica that never had it), or the result of the delivery that finished
    /// it first has expired since.
    Lost,
}

struct Finish<'a> {
    delivery: &'a Delivery,
    result_json: String,
    status: Status,
    batch: Option<String>,
    ttl: u64,
    reply_to: Option<String>,
    dead: Option<Vec<(&'static str, Vec<u8>)>>,
}

impl Queue {
    /// Stores `result` for `delivery` and acknowledges it, atomically. `result.id` must be
    /// `delivery.id`. Safe to repeat: a second call returns [`Completion::Duplicate`].
    pub async fn complete(
        &self,
        delivery: &Delivery,
        result: &JobResult,
    ) -> Result<Completion, QueueError> {
        let mut out = self.complete_many(&[(delivery, result)]).await?;
        Ok(out.pop().expect("one in, one out"))
    }

    /// [`Queue::complete`] for several deliveries in one round trip (each one atomic).
    pub async fn complete_many(
        &self,
        done: &[(&Delivery, &JobResult)],
    ) -> Result<Vec<Completion>, QueueError> {
        let finishes = self.finishes(done)?;
        let first = done.first().map(|(d, _)| d.id.clone()).unwrap_or_default();
        self.finish(&finishes)
            .await
            .map_err(|source| QueueError::Complete {
                queue: self.name().to_owned(),
                id: first,
                source,
            })
    }

    /// [`Queue::complete_many`], and on the same round trip up to `count` new entries for
    /// `consumer`: `XREADGROUP GROUP workers <consumer> COUNT <count> STREAMS
    /// forkbox:{Q}:jobs >`, after the completions and without blocking (an empty queue returns
    /// nothing at once). The entries come back whatever became of the completions: Redis has
    /// delivered them to `consumer`, who must run them (a refused completion is reported as by
    /// [`Queue::complete_many`]). They are checked like [`Queue::read`]'s. `count == 0` reads
    /// nothing: [`Queue::complete_many`] alone. On a Redis Cluster, whose pipelines report one
    /// error for the whole batch (which would hide the entries read), the completion script
    /// itself reads after a completion that went through, for a single completion only; a
    /// batch of several reads nothing there.
    pub async fn complete_many_and_read(
        &self,
        done: &[(&Delivery, &JobResult)],
        consumer: &str,
        count: usize,
    ) -> (
        Result<Vec<Completion>, QueueError>,
        Result<Vec<Delivery>, QueueError>,
    ) {
        if count == 0 || done.is_empty() || (self.broker.is_cluster() && done.len() > 1) {
            return (self.complete_many(done).await, Ok(Vec::new()));
        }
        if self.broker.is_cluster() {
            return self.complete_one_and_read(done[0], consumer, count).await;
        }
        let finishes = match self.finishes(done) {
            Ok(f) => f,
            Err(e) => return (Err(e), Ok(Vec::new())),
        };
        let first = done[0].0.id.clone();
        let complete_err = |source| QueueError::Complete {
            queue: self.name().to_owned(),
            id: first.clone(),
            source,
        };
        if let Err(e) = self.broker.ensure_loaded(&[&SCRIPTS.complete]).await {
            return (Err(complete_err(e)), Ok(Vec::new()));
        }
        let mut pipe = self.finish_pipe(&finishes, None);
        pipe.add_command(crate::delivery::read_group(consumer, count, 0))
            .arg(self.keys.jobs())
            .arg(">");
        // One reply per command, errors included: a refused completion must not hide the
        // entries the read took.
        let mut replies = match self
            .conn()
            .req_packed_commands(&pipe, 0, finishes.len() + 1)
            .await
        {
            Ok(r) if r.len() == finishes.len() + 1 => r,
            Ok(r) => {
                let e = redis::RedisError::from((
                    redis::ErrorKind::ResponseError,
                    "unexpected pipeline reply",
                    format!("{} replies to {} commands", r.len(), finishes.len() + 1),
                ));
                return (Err(complete_err(e)), Ok(Vec::new()));
            }
            // Nothing is known of what ran: as after a read whose reply was lost, entries it
            // took stay pending and come back through the reclaimer.
            Err(e) => return (Err(complete_err(e)), Ok(Vec::new())),
        };
        let fresh = match replies.pop().expect("checked above").extract_error() {
            Ok(v) => Ok(self.fresh_deliveries(&v)),
            // The group is gone (a flushed Redis): the reader's next read creates it.
            Err(e) if e.code() == Some("NOGROUP") => Ok(Vec::new()),
            Err(e) => Err(self.read_err(e)),
        };
        let mut stored = Vec::with_capacity(replies.len());
        let mut refused = None;
        let mut unloaded = false;
        for r in replies {
            match r.extract_error().and_then(|v| i64::from_redis_value(&v)) {
                Ok(s) => stored.push(completion(s)),
                Err(e) if e.kind() == redis::ErrorKind::NoScriptError => unloaded = true,
                Err(e) => {
                    refused.get_or_insert(e);
                }
            }
        }
        let completed = if unloaded {
            // Redis lost its scripts (a restart, a failover): nothing was completed; load
            // them and complete again, without reading twice.
            self.finish(&finishes).await.map_err(complete_err)
        } else if let Some(e) = refused {
            Err(complete_err(e))
        } else {
            Ok(stored)
        };
        // Checked once the completions are done: an entry read before a completion that had
        // to be sent again may be a copy of that very job.
        let read = match fresh {
            Ok(fresh) => Ok(self.skip_completed(fresh).await),
            Err(e) => Err(e),
        };
        (completed, read)
    }

    /// The entries of an `XREADGROUP ... >` reply, delivered for the first time.
    fn fresh_deliveries(&self, v: &redis::Value) -> Vec<Delivery> {
        reply::xread(v)
            .into_iter()
            .flat_map(|(_, entries)| entries)
            .map(|e| Delivery::from_entry(&self.keys, &e, 1, self.config.max_job_bytes))
            .collect()
    }

    /// One completion whose script reads the next entries after it (a Redis Cluster): one
    /// reply, `{stored, entries}` or `{stored, false, error}`; a refused completion read
    /// nothing.
    async fn complete_one_and_read(
        &self,
        done: (&Delivery, &JobResult),
        consumer: &str,
        count: usize,
    ) -> (
        Result<Vec<Completion>, QueueError>,
        Result<Vec<Delivery>, QueueError>,
    ) {
        let finishes = match self.finishes(&[done]) {
            Ok(f) => f,
            Err(e) => return (Err(e), Ok(Vec::new())),
        };
        let complete_err = |source| QueueError::Complete {
            queue: self.name().to_owned(),
            id: done.0.id.clone(),
            source,
        };
        if let Err(e) = self.broker.ensure_loaded(&[&SCRIPTS.complete]).await {
            return (Err(complete_err(e)), Ok(Vec::new()));
        }
        let pipe = self.finish_pipe(&finishes, Some((consumer, count)));
        let reply = match self.conn().req_packed_commands(&pipe, 0, 1).await {
            Ok(mut r) if r.len() == 1 => r.pop().expect("one reply").extract_error(),
            Ok(r) => Err(redis::RedisError::from((
                redis::ErrorKind::ResponseError,
                "unexpected pipeline reply",
                format!("{} replies to 1 command", r.len()),
            ))),
            Err(e) => Err(e),
        };
        let parts = match reply {
            Ok(redis::Value::Array(parts)) if !parts.is_empty() => parts,
            Ok(other) => {
                let e = redis::RedisError::from((
                    redis::ErrorKind::ResponseError,
                    "unexpected completion reply",
                    format!("{other:?}"),
                ));
                return (Err(complete_err(e)), Ok(Vec::new()));
            }
            // Redis lost its scripts (a restart, a failover): nothing ran; complete again
            // without reading.
            Err(e) if e.kind() == redis::ErrorKind::NoScriptError => {
                return (
                    self.finish(&finishes).await.map_err(complete_err),
                    Ok(Vec::new()),
                )
            }
            // Refused, or nothing known of what ran: entries it may have taken stay pending
            // and come back through the reclaimer, as after a read whose reply was lost.
            Err(e) => return (Err(complete_err(e)), Ok(Vec::new())),
        };
        let completed = i64::from_redis_value(&parts[0])
            .map(|s| vec![completion(s)])
            .map_err(complete_err);
        let fresh = match parts.get(2) {
            Some(error) => {
                let text = String::from_redis_value(error).unwrap_or_default();
                if text.starts_with("NOGROUP") {
                    // The group is gone (a flushed Redis): the reader's next read creates it.
                    Ok(Vec::new())
                } else {
                    Err(self.read_err(redis::RedisError::from((
                        redis::ErrorKind::ResponseError,
                        "reading with a completion",
                        text,
                    ))))
                }
            }
            None => Ok(parts
                .get(1)
                .map(|v| self.fresh_deliveries(v))
                .unwrap_or_default()),
        };
        let read = match fresh {
            Ok(fresh) => Ok(self.skip_completed(fresh).await),
            Err(e) => Err(e),
        };
        (completed, read)
    }

    /// Moves `delivery` to the dead-letter stream `forkbox:{Q}:dead` with `reason`, and stores
    /// a result for its id (see [`Delivery::id`]) so that waiters wake up and batches finish:
    /// status `invalid` when the job did not parse, `error` otherwise (attempts exhausted, or
    /// any fault the worker gives up on). `exit_code` is 125 and `error` holds the reason. An
    /// existing result is kept. Returns whether this call stored the result.
    pub async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: &str,
        worker: &str,
    ) -> Result<Completion, QueueError> {
        let mut out = self.dead_letter_many(&[(delivery, reason)], worker).await?;
        Ok(out.pop().expect("one in, one out"))
    }

    /// [`Queue::dead_letter`] for several deliveries in one round trip.
    pub async fn dead_letter_many(
        &self,
        letters: &[(&Delivery, &str)],
        worker: &str,
    ) -> Result<Vec<Completion>, QueueError> {
        let letters: Vec<(&Delivery, Status, &str)> = letters
            .iter()
            .map(|(d, reason)| (*d, Delivery::dead_status(d), *reason))
            .collect();
        self.dead_letter_as(&letters, worker).await
    }

    /// Dead-letters deliveries with the status their result gets: `invalid` for a job at
    /// fault (malformed, refused by the node, files or a working directory that cannot be
    /// set up), `error` for a fault outside the job (the sandbox, exhausted attempts).
    pub async fn dead_letter_as(
        &self,
        letters: &[(&Delivery, Status, &str)],
        worker: &str,
    ) -> Result<Vec<Completion>, QueueError> {
        let at = now_ms().to_string();
        let mut finishes = Vec::with_capacity(letters.len());
        for &(delivery, status, reason) in letters {
            let batch = delivery.batch();
            let result = JobResult {
                batch: batch.clone(),
                enqueued_at_ms: delivery.enqueued_at_ms(),
                finished_at_ms: at.parse().ok(),
                ..JobResult::new(
                    delivery.id.clone(),
                    Outcome::not_run(status, reason),
                    u32::try_from(delivery.deliveries).unwrap_or(u32::MAX),
                    worker.to_owned(),
                )
            };
            let job = delivery.job.as_ref().ok();
            finishes.push(Finish {
                delivery,
                result_json: serde_json::to_string(&result).expect("a result always serializes"),
                status,
                batch,
                ttl: self.ttl_for(job.and_then(|j| j.result_ttl_s)),
                reply_to: None,
                dead: Some(self.dead_fields(delivery, reason, worker, &at)),
            });
        }
        let entry_id = letters
            .first()
            .map(|(d, _, _)| d.entry_id.clone())
            .unwrap_or_default();
        self.finish(&finishes)
            .await
            .map_err(|source| QueueError::DeadLetter {
                queue: self.name().to_owned(),
                entry_id,
                source,
            })
    }

    /// [`Queue::dead_letter_as`] one delivery at a time, for letters Redis refused as a
    /// batch. A letter whose dead letter Redis refuses on its own too (a key of its id, such as
    /// `done:<id>`, holds a value of the wrong type) is still retired: it goes to the dead
    /// stream with `result_stored` `0` and leaves the job stream, so it never comes back and
    /// never holds up the others ([`Queue::retire_unstored`]); its entry is `Ok(None)`. An
    /// error is returned only for a letter to retry (Redis unreachable, out of memory, ...).
    pub async fn dead_letter_each(
        &self,
        letters: &[(&Delivery, Status, &str)],
        worker: &str,
    ) -> Vec<Result<Option<Completion>, QueueError>> {
        let mut out = Vec::with_capacity(letters.len());
        for &(delivery, status, reason) in letters {
            let one = match self
                .dead_letter_as(&[(delivery, status, reason)], worker)
                .await
            {
                Ok(mut c) => Ok(c.pop()),
                Err(e) if e.is_refused() => {
                    let why = format!("{reason}; Redis refused to store its result: {e}");
                    tracing::error!(queue = self.name(), "job {}: {why}", delivery.id);
                    self.retire_unstored(delivery, &why, worker)
                        .await
                        .map(|()| None)
                }
                Err(e) => Err(e),
            };
            out.push(one);
        }
        out
    }

    /// Moves `delivery` to the dead stream with `reason` and `result_stored` `0`, and
    /// acknowledges and deletes its entry, without touching any key of its id: the last
    /// resort for an entry whose result Redis refuses to store.
    pub async fn retire_unstored(
        &self,
        delivery: &Delivery,
        reason: &str,
        worker: &str,
    ) -> Result<(), QueueError> {
        let at = now_ms().to_string();
        let k = &self.keys;
        let mut xadd = redis::cmd("XADD");
        xadd.arg(k.dead())
            .arg("MAXLEN")
            .arg("~")
            .arg(self.config.dead_maxlen)
            .arg("*");
        for (name, value) in self.dead_fields(delivery, reason, worker, &at) {
            xadd.arg(name).arg(value);
        }
        xadd.arg("result_stored").arg("0");
        redis::pipe()
            .atomic()
            .add_command(xadd)
            .ignore()
            .cmd("XACK")
            .arg(k.jobs())
            .arg(GROUP)
            .arg(&delivery.entry_id)
            .ignore()
            .cmd("XDEL")
            .arg(k.jobs())
            .arg(&delivery.entry_id)
            .ignore()
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(|source| QueueError::DeadLetter {
                queue: self.name().to_owned(),
                entry_id: delivery.entry_id.clone(),
                source,
            })
    }

    fn dead_fields(
        &self,
        delivery: &Delivery,
        reason: &str,
        worker: &str,
        at: &str,
    ) -> Vec<(&'static str, Vec<u8>)> {
        vec![
            ("job", delivery.payload.clone()),
            ("reason", reason.as_bytes().to_vec()),
            ("id", delivery.id.clone().into_bytes()),
            ("entry_id", delivery.entry_id.clone().into_bytes()),
            ("queue", self.name().as_bytes().to_vec()),
            ("deliveries", delivery.deliveries.to_string().into_bytes()),
            ("worker", worker.as_bytes().to_vec()),
            ("at_ms", at.as_bytes().to_vec()),
        ]
    }

    /// What to store for each completion; refuses a result whose id is not its delivery's.
    fn finishes<'a>(
        &self,
        done: &[(&'a Delivery, &JobResult)],
    ) -> Result<Vec<Finish<'a>>, QueueError> {
        let mut finishes = Vec::with_capacity(done.len());
        for (delivery, result) in done {
            if result.id != delivery.id {
                return Err(QueueError::IdMismatch {
                    delivery: delivery.id.clone(),
                    result: result.id.clone(),
                });
            }
            let job = delivery.job.as_ref().ok();
            finishes.push(Finish {
                delivery,
                result_json: result.to_json_within(self.config.max_result_bytes),
                status: result.outcome.status,
                batch: result.batch.clone().or_else(|| delivery.batch()),
                ttl: self.ttl_for(job.and_then(|j| j.result_ttl_s)),
                // The delivery checked it already; a result never goes outside the queue's
                // replies namespace whoever built the job.
                reply_to: job.and_then(|j| j.reply_to.clone()).filter(|r| {
                    crate::keys::parse_reply_to(r).is_ok_and(|(t, _)| t == self.keys.tag())
                }),
                dead: None,
            });
        }
        Ok(finishes)
    }

    /// One `complete.lua` call per completion; with `read` (consumer, count), the last call
    /// also reads up to `count` new entries for that consumer after its completion.
    fn finish_pipe(&self, finishes: &[Finish<'_>], read: Option<(&str, usize)>) -> redis::Pipeline {
        let k = &self.keys;
        let mut pipe = redis::pipe();
        for (i, f) in finishes.iter().enumerate() {
            let (count, consumer) = match read {
                Some((consumer, count)) if i + 1 == finishes.len() => (count, consumer),
                _ => (0, ""),
            };
            let id = &f.delivery.id;
            let batch_key = k.batch(f.batch.as_deref().unwrap_or(""));
            let reply_key = f.reply_to.clone().unwrap_or_else(|| k.results());
            let mut inv = SCRIPTS.complete.prepare_invoke();
            inv.key(k.result(id))
                .key(k.done(id))
                .key(k.results())
                .key(batch_key)
                .key(k.jobs())
                .key(reply_key)
                .key(k.idem(id))
                .key(k.dead())
                .key(k.wake(id))
                .arg(&f.result_json)
                .arg(f.ttl)
                .arg(self.config.results_maxlen)
                .arg(f.status.as_str())
                .arg(GROUP)
                .arg(&f.delivery.entry_id)
                .arg(if f.batch.is_some() { "1" } else { "0" })
                .arg(if f.reply_to.is_some() { "1" } else { "0" })
                .arg(self.config.dead_maxlen)
                .arg(count)
                .arg(consumer)
                .arg((f.ttl.saturating_mul(1000)).min(WAKE_LINGER_MS));
            if let Some(fields) = &f.dead {
                for (name, value) in fields {
                    inv.arg(*name).arg(value.as_slice());
                }
            }
            pipe.invoke_script(&inv);
        }
        pipe
    }

    async fn finish(&self, finishes: &[Finish<'_>]) -> redis::RedisResult<Vec<Completion>> {
        if finishes.is_empty() {
            return Ok(Vec::new());
        }
        let pipe = self.finish_pipe(finishes, None);
        let stored: Vec<i64> = self
            .broker
            .query_scripted(&pipe, &[&SCRIPTS.complete])
            .await?;
        Ok(stored.into_iter().map(completion).collect())
    }
}

/// `complete.lua`'s reply: 1 when it stored the result, 2 when nothing was stored and no
/// result exists.
fn completion(stored: i64) -> Completion {
    match stored {
        1 => Completion::Stored,
        2 => Completion::Lost,
        _ => Completion::Duplicate,
    }
}
