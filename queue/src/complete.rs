//! Finishing deliveries: results and dead letters.
//!
//! Both go through `lua/complete.lua`, which declares every key it touches and does, in one
//! atomic step: store the result with its TTL, push the wake-up element on the `done` list,
//! append to the results stream (and the job's `reply_to` stream), bump the batch counters,
//! XACK and XDEL the entry (and, for a dead letter, XADD it to the dead stream). A result that
//! already exists wins, so a job delivered twice yields exactly one stored result; the second
//! completion only acknowledges. Several completions travel in one pipelined round trip.

use crate::error::QueueError;
use crate::keys::GROUP;
use crate::queue::{now_ms, Queue, SCRIPTS};
use crate::schema::{JobResult, Outcome, Status};
use crate::Delivery;

/// What a completion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// This call stored the result and woke the waiters.
    Stored,
    /// A result already existed; the entry was only acknowledged.
    Duplicate,
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
                result_json: serde_json::to_string(result).expect("a result always serializes"),
                status: result.outcome.status,
                batch: result.batch.clone().or_else(|| delivery.batch()),
                ttl: self.ttl_for(job.and_then(|j| j.result_ttl_s)),
                reply_to: job
                    .and_then(|j| j.reply_to.clone())
                    .filter(|r| !self.keys.is_reserved(r)),
                dead: None,
            });
        }
        let first = done.first().map(|(d, _)| d.id.clone()).unwrap_or_default();
        self.finish(&finishes)
            .await
            .map_err(|source| QueueError::Complete {
                queue: self.name().to_owned(),
                id: first,
                source,
            })
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
        let at = now_ms().to_string();
        let mut finishes = Vec::with_capacity(letters.len());
        for (delivery, reason) in letters {
            let status = if delivery.job.is_ok() {
                Status::Error
            } else {
                Status::Invalid
            };
            let batch = delivery.batch();
            let result = JobResult {
                id: delivery.id.clone(),
                outcome: Outcome::not_run(status, *reason),
                attempt: u32::try_from(delivery.deliveries).unwrap_or(u32::MAX),
                worker: worker.to_owned(),
                batch: batch.clone(),
            };
            let job = delivery.job.as_ref().ok();
            finishes.push(Finish {
                delivery,
                result_json: serde_json::to_string(&result).expect("a result always serializes"),
                status,
                batch,
                ttl: self.ttl_for(job.and_then(|j| j.result_ttl_s)),
                reply_to: None,
                dead: Some(vec![
                    ("job", delivery.payload.clone()),
                    ("reason", reason.as_bytes().to_vec()),
                    ("id", delivery.id.clone().into_bytes()),
                    ("entry_id", delivery.entry_id.clone().into_bytes()),
                    ("queue", self.name().as_bytes().to_vec()),
                    ("deliveries", delivery.deliveries.to_string().into_bytes()),
                    ("worker", worker.as_bytes().to_vec()),
                    ("at_ms", at.clone().into_bytes()),
                ]),
            });
        }
        let entry_id = letters
            .first()
            .map(|(d, _)| d.entry_id.clone())
            .unwrap_or_default();
        self.finish(&finishes)
            .await
            .map_err(|source| QueueError::DeadLetter {
                queue: self.name().to_owned(),
                entry_id,
                source,
            })
    }

    async fn finish(&self, finishes: &[Finish<'_>]) -> redis::RedisResult<Vec<Completion>> {
        if finishes.is_empty() {
            return Ok(Vec::new());
        }
        let k = &self.keys;
        let mut pipe = redis::pipe();
        for f in finishes {
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
                .arg(&f.result_json)
                .arg(f.ttl)
                .arg(self.config.results_maxlen)
                .arg(f.status.as_str())
                .arg(GROUP)
                .arg(&f.delivery.entry_id)
                .arg(if f.batch.is_some() { "1" } else { "0" })
                .arg(if f.reply_to.is_some() { "1" } else { "0" })
                .arg(self.config.dead_maxlen);
            if let Some(fields) = &f.dead {
                for (name, value) in fields {
                    inv.arg(*name).arg(value.as_slice());
                }
            }
            pipe.invoke_script(&inv);
        }
        let stored: Vec<i64> = self
            .broker
            .query_scripted(&pipe, &[&SCRIPTS.complete])
            .await?;
        Ok(stored
            .into_iter()
            .map(|s| {
                if s == 1 {
                    Completion::Stored
                } else {
                    Completion::Duplicate
                }
            })
            .collect())
    }
}
