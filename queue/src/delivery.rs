//! Taking jobs off a queue.
//!
//! A worker reads with XREADGROUP through the group `workers`, never more entries than it has
//! free slots. Every entry becomes a [`Delivery`], parsed or not: a malformed entry is still a
//! delivery (its `job` is the error) so the worker can dead-letter it with the reason. At
//! start-up a worker first takes back its own pending entries ([`Queue::read_own_pending`]),
//! which a previous life of the same consumer name left behind.

use std::collections::HashMap;

use redis::Value;

use crate::error::QueueError;
use crate::keys::{GROUP, JOB_FIELD, VETTED_FIELD};
use crate::queue::Queue;
use crate::reply::{self, RawEntry};
use crate::schema::{Job, JobError, MAX_ID_LEN};

/// One stream entry handed to this worker.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The queue it came from.
    pub queue: String,
    /// The partition of the queue it came from (0 on an unpartitioned queue): complete it on
    /// that partition.
    pub partition: usize,
    /// The stream entry id (`<ms>-<seq>`), used to acknowledge it.
    pub entry_id: String,
    /// The id the result is stored under: the job's `id`; for a malformed job, its `id` field
    /// when that is a valid id; otherwise the entry id (so a raw `XADD` without id can be waited
    /// on with the id XADD returned).
    pub id: String,
    /// The raw `job` field (empty when the entry had none).
    pub payload: Vec<u8>,
    /// The parsed job, or why it is malformed.
    pub job: Result<Job, JobError>,
    /// How many times Redis has handed this entry out, this time included (1 for a first
    /// read). Use it as the result's `attempt`.
    pub deliveries: u64,
    /// Added by the enqueue script (field `vetted`), which found no pending copy and no live
    /// result of the id; a raw `XADD` has no such check behind it.
    pub vetted: bool,
}

impl Delivery {
    pub(crate) fn from_entry(
        keys: &crate::keys::Keys,
        entry: &RawEntry,
        deliveries: u64,
        max_bytes: usize,
    ) -> Delivery {
        let jobs = entry
            .fields
            .iter()
            .flatten()
            .filter(|(k, _)| k == JOB_FIELD.as_bytes())
            .count();
        let (payload, job) = match entry.field(JOB_FIELD) {
            // Which of several would run is a guess; none runs, and the dead letter says why.
            Some(p) if jobs > 1 => (
                p.to_vec(),
                Err(JobError::Schema {
                    path: "job".into(),
                    message: format!(
                        "stream entry has {jobs} `job` fields; an entry holds exactly one job"
                    ),
                }),
            ),
            Some(p) => (
                p.to_vec(),
                parse_payload(p, max_bytes).and_then(|j| check_for_queue(&j, keys).map(|()| j)),
            ),
            None => {
                let names: Vec<String> = entry
                    .fields
                    .iter()
                    .flatten()
                    .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
                    .collect();
                (
                    Vec::new(),
                    Err(JobError::Schema {
                        path: "job".into(),
                        message: format!(
                            "stream entry has no `job` field (fields: {})",
                            if names.is_empty() {
                                "none".to_owned()
                            } else {
                                names.join(", ")
                            }
                        ),
                    }),
                )
            }
        };
        let id = match &job {
            Ok(j) => j.id.clone(),
            Err(JobError::TooLarge { .. }) => None,
            Err(_) => lenient_field(&payload, "id").filter(|id| valid_id(id)),
        }
        .unwrap_or_else(|| entry.id.clone());
        Delivery {
            queue: keys.queue().to_owned(),
            partition: keys.partition_index(),
            entry_id: entry.id.clone(),
            id,
            payload,
            job,
            deliveries: deliveries.max(1),
            vetted: entry.field(VETTED_FIELD) == Some(b"1".as_slice()),
        }
    }

    /// The job's batch; for a malformed job, its `batch` field when that is a string.
    pub fn batch(&self) -> Option<String> {
        match &self.job {
            Ok(j) => j.batch.clone(),
            Err(JobError::TooLarge { .. }) => None,
            Err(_) => lenient_field(&self.payload, "batch"),
        }
    }

    /// When the entry was added: the milliseconds of its stream entry id (an id a client chose
    /// by hand with `XADD key <ms>-<seq>` gives that time).
    pub fn enqueued_at_ms(&self) -> Option<u64> {
        self.entry_id.split_once('-')?.0.parse().ok()
    }

    /// The status a dead letter of this delivery gets when nothing more is known: `invalid`
    /// when the job did not parse, `error` otherwise.
    pub fn dead_status(&self) -> crate::schema::Status {
        if self.job.is_ok() {
            crate::schema::Status::Error
        } else {
            crate::schema::Status::Invalid
        }
    }

    /// The job's `max_attempts`, else `default`.
    pub fn max_attempts(&self, default: u32) -> u32 {
        self.job
            .as_ref()
            .ok()
            .and_then(|j| j.max_attempts)
            .unwrap_or(default)
    }
}

/// The size check, a UTF-8 check with its own message, then the strict parse.
pub fn parse_payload(payload: &[u8], max_bytes: usize) -> Result<Job, JobError> {
    if payload.len() > max_bytes {
        return Err(JobError::TooLarge {
            size: payload.len(),
            limit: max_bytes,
        });
    }
    if let Err(e) = std::str::from_utf8(payload) {
        return Err(JobError::NotJson(format!(
            "payload is not UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        )));
    }
    Job::parse(payload, max_bytes)
}

/// The rules that depend on the queue partition a job is on: its `reply_to` must be one of
/// that partition's replies streams (`forkbox:{T}:replies:<name>`, `T` the partition's tag),
/// in the partition's Cluster slot.
pub(crate) fn check_for_queue(job: &Job, keys: &crate::keys::Keys) -> Result<(), JobError> {
    if let Some(reply_to) = &job.reply_to {
        let (tag, _) =
            crate::keys::parse_reply_to(reply_to).map_err(|reason| JobError::Invalid {
                field: "reply_to".into(),
                reason,
            })?;
        if tag != keys.tag() {
            let (queue, own) = (keys.queue(), keys.tag());
            let which = if keys.partition_index() == 0 && own == queue {
                format!("a job of queue {queue}")
            } else {
                format!(
                    "a job of partition {} of queue {queue}",
                    keys.partition_index()
                )
            };
            return Err(JobError::Invalid {
                field: "reply_to".into(),
                reason: format!(
                    "names a stream of {tag}; {which} may reply only to \
                     forkbox:{{{own}}}:replies:<name>"
                ),
            });
        }
    }
    Ok(())
}

fn lenient_field(payload: &[u8], name: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    v.get(name)?.as_str().map(str::to_owned)
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && id.bytes().all(|b| b.is_ascii_graphic())
}

impl Queue {
    /// Recreates the consumer group after a command found it gone. The group is made before
    /// the first read and never deleted: Redis lost it (a restart without persistence, a
    /// `FLUSHALL`, a failover to an empty replica), and with it every queued job and stored
    /// result of the stream, and every entry delivered before. Counted in
    /// [`Queue::groups_recreated`], so that whoever holds deliveries (a worker node) can say
    /// what it lost; logged here at `info` only.
    pub(crate) async fn recreate_lost_group(&self) -> Result<(), QueueError> {
        tracing::info!(
            "the consumer group {GROUP} of {} is gone (Redis lost its data); recreating it",
            self.keys.jobs()
        );
        self.ensure_group().await?;
        self.groups_recreated
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// How many times this queue handle (or a clone of it) found its consumer group gone and
    /// made it again: each time, Redis had lost the stream's data.
    pub fn groups_recreated(&self) -> u64 {
        self.groups_recreated
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn read_err(&self, source: redis::RedisError) -> QueueError {
        QueueError::Read {
            queue: self.name().to_owned(),
            source,
        }
    }

    /// Reads up to `count` new entries for `consumer`: `XREADGROUP GROUP workers <consumer>
    /// COUNT <count> BLOCK <block_ms> STREAMS forkbox:{Q}:jobs >`. `block_ms == 0` does not
    /// block (unlike Redis' `BLOCK 0`, which would wait forever). A blocking read uses a
    /// connection of its own, so other calls on this queue are not held up. Creates the group
    /// when it is missing (a fresh or flushed Redis). Every delivery here has `deliveries == 1`.
    /// With [`QueueConfig::skip_completed_on_read`](crate::QueueConfig::skip_completed_on_read) (the default), entries whose id already has
    /// a result are acknowledged and left out.
    ///
    /// Dropping the future mid-read closes its connection; an entry Redis handed out in that
    /// instant stays pending for `consumer` and comes back through [`Queue::read_own_pending`]
    /// or the reclaimer. To end a blocking read early without that, use a wakeable read
    /// (what [`crate::QueueSet::read`] does on a cluster).
    pub async fn read(
        &self,
        consumer: &str,
        count: usize,
        block_ms: u64,
    ) -> Result<Vec<Delivery>, QueueError> {
        self.read_until(consumer, count, block_ms, None).await
    }

    /// [`Queue::read`], whose blocking step ends early (as if its block time had run out)
    /// once `wake` turns true, still returning whatever Redis handed out.
    pub(crate) async fn read_until(
        &self,
        consumer: &str,
        count: usize,
        block_ms: u64,
        mut wake: Option<&mut tokio::sync::watch::Receiver<bool>>,
    ) -> Result<Vec<Delivery>, QueueError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut cmd = read_group(consumer, count, block_ms);
        cmd.arg(self.keys.jobs()).arg(">");
        let block = (block_ms > 0).then(|| std::time::Duration::from_millis(block_ms));
        let reply = match self.run_read_until(&cmd, block, wake.as_deref_mut()).await {
            Err(e) if e.code() == Some("NOGROUP") => {
                self.recreate_lost_group().await?;
                self.run_read_until(&cmd, block, wake).await
            }
            r => r,
        }
        .map_err(|e| self.read_err(e))?;
        let fresh = reply::xread(&reply)
            .into_iter()
            .flat_map(|(_, entries)| entries)
            .map(|e| Delivery::from_entry(&self.keys, &e, 1, self.config.max_job_bytes))
            .collect();
        Ok(self.skip_completed(fresh).await)
    }

    /// [`Queue::discard_completed`] when the queue is configured to check fresh reads and a
    /// read returned an entry the enqueue script did not vet (a raw `XADD`): entries it added
    /// were checked as they were added, so a read of only those costs no second round trip.
    /// The entries are already delivered: when the check fails they are all returned (a job
    /// run twice stores its first result only; a delivery dropped here would be run by no
    /// one until a reclaim).
    pub(crate) async fn skip_completed(&self, fresh: Vec<Delivery>) -> Vec<Delivery> {
        if !(self.config.skip_completed_on_read && fresh.iter().any(|d| !d.vetted)) {
            return fresh;
        }
        let ids: Vec<&str> = fresh.iter().map(|d| d.id.as_str()).collect();
        let done = match self.has_results(&ids).await {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(
                    queue = self.name(),
                    "could not check {} fresh entr(ies) for existing results, running them \
                     unchecked: {e}",
                    fresh.len()
                );
                return fresh;
            }
        };
        let (dups, keep): (Vec<_>, Vec<_>) =
            fresh.into_iter().zip(done).partition(|(_, done)| *done);
        if !dups.is_empty() {
            let entry_ids: Vec<String> = dups.iter().map(|(d, _)| d.entry_id.clone()).collect();
            // Not acknowledged: they stay pending, and the reclaimer drops them as duplicates.
            if let Err(e) = self.ack_and_delete(&entry_ids).await {
                tracing::warn!(
                    queue = self.name(),
                    "could not drop {} entr(ies) whose job already has a result: {e}",
                    entry_ids.len()
                );
            }
        }
        keep.into_iter().map(|(d, _)| d).collect()
    }

    /// Runs a read; `block`: the most it may block (a blocking command), `None` for one that
    /// does not block.
    pub(crate) async fn run_read(
        &self,
        cmd: &redis::Cmd,
        block: Option<std::time::Duration>,
    ) -> redis::RedisResult<Value> {
        self.run_read_until(cmd, block, None).await
    }

    /// [`Queue::run_read`], a blocking one ended early once `wake` turns true.
    async fn run_read_until(
        &self,
        cmd: &redis::Cmd,
        block: Option<std::time::Duration>,
        wake: Option<&mut tokio::sync::watch::Receiver<bool>>,
    ) -> redis::RedisResult<Value> {
        match (block, wake) {
            (Some(block), Some(wake)) => {
                self.broker
                    .query_blocking_wakeable(cmd, block, &self.keys.jobs(), wake)
                    .await
            }
            (Some(block), None) => self.broker.query_blocking(cmd, block).await,
            (None, _) => cmd.query_async(&mut self.conn()).await,
        }
    }

    /// Takes back up to `count` of `consumer`'s own pending entries (XREADGROUP id `0`): what a
    /// previous run under the same name was handed and never acknowledged. Call it once at
    /// start-up with the free slots; entries beyond that stay pending and reach the reclaimer.
    /// Entries deleted from the stream are acknowledged and dropped; entries whose id already
    /// has a result are acknowledged and dropped (see [`Queue::discard_completed`]).
    pub async fn read_own_pending(
        &self,
        consumer: &str,
        count: usize,
    ) -> Result<Vec<Delivery>, QueueError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let jobs = self.keys.jobs();
        // Both commands walk the consumer's pending list from the start, so they see the same
        // entries; one round trip gives the payloads and the delivery counts.
        let mut pipe = redis::pipe();
        pipe.add_command(read_group(consumer, count, 0))
            .arg(&jobs)
            .arg("0")
            .cmd("XPENDING")
            .arg(&jobs)
            .arg(GROUP)
            .arg("-")
            .arg("+")
            .arg(count)
            .arg(consumer);
        let r: redis::RedisResult<(Value, Value)> = pipe.query_async(&mut self.conn()).await;
        let (read, pending) = match r {
            Err(e) if e.code() == Some("NOGROUP") => {
                self.recreate_lost_group().await?;
                return Ok(Vec::new());
            }
            r => r.map_err(|e| self.read_err(e))?,
        };
        let counts: HashMap<String, u64> = reply::pending_rows(&pending)
            .into_iter()
            .map(|(id, _, _, n)| (id, n))
            .collect();
        let mut gone = Vec::new();
        let mut out = Vec::new();
        for entry in reply::xread(&read).into_iter().flat_map(|(_, e)| e) {
            if entry.fields.is_none() {
                gone.push(entry.id);
                continue;
            }
            let n = counts.get(&entry.id).copied().unwrap_or(1);
            out.push(Delivery::from_entry(
                &self.keys,
                &entry,
                n,
                self.config.max_job_bytes,
            ));
        }
        if !gone.is_empty() {
            self.ack_and_delete(&gone)
                .await
                .map_err(|e| self.read_err(e))?;
        }
        Ok(self.discard_completed(out).await?.0)
    }

    /// For each id, whether a result exists. One round trip.
    pub async fn has_results(&self, ids: &[&str]) -> Result<Vec<bool>, QueueError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.exists(self.keys.result(id));
        }
        pipe.query_async(&mut self.conn())
            .await
            .map_err(|source| QueueError::Results {
                queue: self.name().to_owned(),
                source,
            })
    }

    /// Acknowledges and deletes the deliveries whose id already has a result (duplicates of a
    /// finished job: never run them again) and returns the others, with the number dropped.
    /// [`Queue::read_own_pending`] and [`Queue::reclaim`] always do this, [`Queue::read`] when
    /// [`QueueConfig::skip_completed_on_read`](crate::QueueConfig::skip_completed_on_read) is set.
    pub async fn discard_completed(
        &self,
        deliveries: Vec<Delivery>,
    ) -> Result<(Vec<Delivery>, usize), QueueError> {
        let ids: Vec<&str> = deliveries.iter().map(|d| d.id.as_str()).collect();
        let done = self.has_results(&ids).await?;
        let (dups, keep): (Vec<_>, Vec<_>) = deliveries
            .into_iter()
            .zip(done)
            .partition(|(_, done)| *done);
        if !dups.is_empty() {
            let entry_ids: Vec<String> = dups.iter().map(|(d, _)| d.entry_id.clone()).collect();
            self.ack_and_delete(&entry_ids)
                .await
                .map_err(|e| self.read_err(e))?;
        }
        Ok((keep.into_iter().map(|(d, _)| d).collect(), dups.len()))
    }

    /// XACK + XDEL in one MULTI/EXEC.
    pub(crate) async fn ack_and_delete(&self, entry_ids: &[String]) -> redis::RedisResult<()> {
        if entry_ids.is_empty() {
            return Ok(());
        }
        let jobs = self.keys.jobs();
        redis::pipe()
            .atomic()
            .cmd("XACK")
            .arg(&jobs)
            .arg(GROUP)
            .arg(entry_ids)
            .ignore()
            .cmd("XDEL")
            .arg(&jobs)
            .arg(entry_ids)
            .ignore()
            .query_async(&mut self.conn())
            .await
    }
}

/// `XREADGROUP GROUP <group> <consumer> COUNT <count> [BLOCK <block_ms>] STREAMS`, for the
/// caller to add its stream keys and ids to (`block_ms` 0: do not block).
pub(crate) fn read_group(consumer: &str, count: usize, block_ms: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(count);
    if block_ms > 0 {
        cmd.arg("BLOCK").arg(block_ms);
    }
    cmd.arg("STREAMS");
    cmd
}
