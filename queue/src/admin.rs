//! Operating a queue: heartbeats, stats, consumer clean-up, dead letters, batch counters.

use crate::scripts::CheckedCall;
use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;

use crate::error::QueueError;
use crate::keys::GROUP;
use crate::queue::{now_ms, Queue};
use crate::reply;
use crate::scripts::SCRIPTS;

/// A snapshot of a queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Entries in the job stream: waiting plus in flight (finished entries are deleted).
    pub length: u64,
    /// Entries delivered and not yet acknowledged.
    pub pending: u64,
    /// Entries not yet delivered to any worker (XINFO GROUPS `lag`); `None` when Redis cannot
    /// tell (after deletions in the stream's middle, or before 7.0).
    pub lag: Option<u64>,
    pub consumers: Vec<ConsumerStats>,
    /// Entries in the dead-letter stream.
    pub dead: u64,
}

/// One consumer of the group `workers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerStats {
    pub name: String,
    pub pending: u64,
    /// Time since the consumer last read or claimed.
    pub idle_ms: u64,
}

/// One entry of the dead-letter stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its id in the dead stream (used by [`DlqSelection::Ids`]).
    pub dead_id: String,
    /// The raw payload, byte for byte.
    pub job: Vec<u8>,
    pub reason: String,
    /// The id its result was stored under.
    pub id: String,
    /// Its entry id in the job stream.
    pub entry_id: String,
    pub queue: String,
    pub deliveries: u64,
    pub worker: String,
    pub at_ms: u64,
    /// Whether dead-lettering stored the job's result (false when one already existed).
    pub result_stored: bool,
}

/// Which dead letters to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DlqSelection {
    All,
    Ids(Vec<String>),
}

/// The counters of a batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchStatus {
    /// Jobs enqueued into the batch with [`Queue::enqueue_batch`] (or a counted enqueue).
    pub total: u64,
    /// Jobs with a stored result.
    pub done: u64,
    /// Results by status (`ok`, `failed`, ...); only statuses seen are present.
    pub by_status: BTreeMap<String, u64>,
}

impl BatchStatus {
    /// True once every counted job has a result.
    pub fn is_complete(&self) -> bool {
        self.total > 0 && self.done >= self.total
    }
}

impl Queue {
    /// The first command a worker node runs on this queue's keys that Redis' ACL refuses to
    /// this connection's user, as `COMMAND on KEY`; `None` when it may run them all. Checked
    /// with `redis.acl_check_cmd` inside a script, so nothing is run; a user that may not even
    /// run the script gets the `NOPERM` error, which names `evalsha`.
    pub async fn missing_worker_right(&self, consumer: &str) -> Result<Option<String>, QueueError> {
        let k = &self.keys;
        let probe = "forkbox-rights-probe";
        let mut pipe = redis::pipe();
        pipe.invoke_script(
            SCRIPTS
                .rights
                .arg(GROUP)
                .arg(consumer)
                .arg(k.jobs())
                .arg(k.result(probe))
                .arg(k.done(probe))
                .arg(k.results())
                .arg(k.dead())
                .arg(k.idem(probe))
                .arg(k.batch(probe))
                .arg(k.worker(consumer))
                .arg(k.cancelled())
                .arg(k.wake(probe))
                .arg(k.calls(consumer))
                .arg(k.call(probe))
                .arg(k.session(probe))
                .arg(k.sessions()),
        );
        let (missing,): (String,) = self
            .broker
            .query_scripted(&pipe, &[&SCRIPTS.rights])
            .await
            .map_err(|source| QueueError::Rights {
                queue: self.name().to_owned(),
                source,
            })?;
        Ok((!missing.is_empty()).then_some(missing))
    }

    fn stats_err(&self, source: redis::RedisError) -> QueueError {
        QueueError::Stats {
            queue: self.name().to_owned(),
            source,
        }
    }

    fn dlq_err(&self, source: redis::RedisError) -> QueueError {
        QueueError::Dlq {
            queue: self.name().to_owned(),
            source,
        }
    }

    /// Marks `worker` alive for `ttl` (`forkbox:{Q}:worker:<worker>`, value: time in ms). A
    /// worker's consumer name is its worker name; [`Queue::remove_dead_consumers`] relies on it.
    pub async fn heartbeat(&self, worker: &str, ttl: Duration) -> Result<(), QueueError> {
        redis::cmd("SET")
            .arg(self.keys.worker(worker))
            .arg(now_ms())
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut self.conn())
            .await
            .map_err(|source| QueueError::Heartbeat {
                queue: self.name().to_owned(),
                worker: worker.to_owned(),
                source,
            })
    }

    /// Publishes what `worker` can run (`forkbox:{Q}:runtimes:<worker>`, a JSON array of
    /// `{"language", "version"}`) for `ttl`: renewed with the heartbeat, gone with it.
    pub async fn publish_runtimes(
        &self,
        worker: &str,
        runtimes_json: &str,
        ttl: Duration,
    ) -> Result<(), QueueError> {
        redis::cmd("SET")
            .arg(self.keys.runtimes(worker))
            .arg(runtimes_json)
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut self.conn())
            .await
            .map_err(|source| QueueError::Heartbeat {
                queue: self.name().to_owned(),
                worker: worker.to_owned(),
                source,
            })
    }

    /// What each live worker of this queue published with its heartbeat: (worker, the JSON
    /// it set), from one SCAN over `forkbox:{Q}:runtimes:*` (on the queue's shard in a
    /// cluster).
    pub async fn published_runtimes(&self) -> Result<Vec<(String, String)>, QueueError> {
        let prefix = self.keys.runtimes("");
        let pattern = format!("{}*", glob_escape(&prefix));
        let mut conn = self.conn();
        let (mut cursor, mut keys) = (0u64, Vec::new());
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let (next, batch): (u64, Vec<String>) = conn
                .query_in_slot_of(&self.keys.jobs(), &scan)
                .await
                .map_err(|e| self.stats_err(e))?;
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let mut out = Vec::new();
        for key in keys {
            // One GET each: the keys share the queue's slot, and one that expired since the
            // scan is simply left out.
            let value: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.stats_err(e))?;
            if let (Some(worker), Some(value)) = (key.strip_prefix(&prefix), value) {
                out.push((worker.to_owned(), value));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Removes `worker`'s heartbeat: a worker that stopped cleanly is not shown alive until
    /// the key would have expired.
    pub async fn remove_heartbeat(&self, worker: &str) -> Result<(), QueueError> {
        redis::cmd("DEL")
            .arg(self.keys.worker(worker))
            .arg(self.keys.runtimes(worker))
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(|source| QueueError::Heartbeat {
                queue: self.name().to_owned(),
                worker: worker.to_owned(),
                source,
            })
    }

    /// Whether `worker`'s heartbeat is live.
    pub async fn is_alive(&self, worker: &str) -> Result<bool, QueueError> {
        redis::cmd("EXISTS")
            .arg(self.keys.worker(worker))
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.stats_err(e))
    }

    /// How many workers have a live heartbeat on this queue (their keys expire when they stop).
    pub async fn live_workers(&self) -> Result<usize, QueueError> {
        live_workers(&mut self.conn(), &self.keys)
            .await
            .map_err(|e| self.stats_err(e))
    }

    /// Stream length, pending, lag, consumers and dead letters.
    pub async fn stats(&self) -> Result<Stats, QueueError> {
        let jobs = self.keys.jobs();
        let (length, dead, exists): (u64, u64, bool) = redis::pipe()
            .xlen(&jobs)
            .xlen(self.keys.dead())
            .exists(&jobs)
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.stats_err(e))?;
        let mut stats = Stats {
            length,
            dead,
            lag: Some(length),
            ..Stats::default()
        };
        if !exists {
            return Ok(stats);
        }
        let groups: Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&jobs)
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.stats_err(e))?;
        let group = reply::items(&groups)
            .unwrap_or_default()
            .into_iter()
            .map(reply::pairs)
            .find(|g| {
                g.iter()
                    .any(|(k, v)| k == "name" && reply::string(v).as_deref() == Some(GROUP))
            });
        let Some(group) = group else {
            return Ok(stats);
        };
        let field = |name: &str| {
            group
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| reply::int(v))
        };
        stats.pending = field("pending").unwrap_or(0).max(0) as u64;
        stats.lag = field("lag").map(|l| l.max(0) as u64);
        let consumers: Value = redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(&jobs)
            .arg(GROUP)
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.stats_err(e))?;
        for c in reply::items(&consumers).unwrap_or_default() {
            let p = reply::pairs(c);
            let get = |name: &str| p.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
            let Some(name) = get("name").and_then(reply::string) else {
                continue;
            };
            stats.consumers.push(ConsumerStats {
                name,
                pending: get("pending").and_then(reply::int).unwrap_or(0).max(0) as u64,
                idle_ms: get("idle").and_then(reply::int).unwrap_or(0).max(0) as u64,
            });
        }
        Ok(stats)
    }

    /// Deletes the group's consumers that hold no pending entry and have no live heartbeat
    /// (each check and delete is one atomic script, so a consumer that just received an entry
    /// is kept). A dead worker's entries are therefore removed only after the reclaimer took
    /// them. Returns the removed names.
    pub async fn remove_dead_consumers(&self) -> Result<Vec<String>, QueueError> {
        let names: Vec<String> = self
            .stats()
            .await?
            .consumers
            .into_iter()
            .filter(|c| c.pending == 0)
            .map(|c| c.name)
            .collect();
        let mut removed = Vec::new();
        for name in names {
            let gone: i64 = SCRIPTS
                .remove_consumer
                .key(self.keys.jobs())
                .key(self.keys.worker(&name))
                .arg(GROUP)
                .arg(&name)
                .checked()
                .invoke_async(&mut self.conn())
                .await
                .map_err(|source| QueueError::RemoveConsumers {
                    queue: self.name().to_owned(),
                    source,
                })?;
            if gone == 1 {
                removed.push(name);
            }
        }
        Ok(removed)
    }

    /// The oldest `count` dead letters.
    pub async fn dlq_list(&self, count: usize) -> Result<Vec<DeadLetter>, QueueError> {
        let v: Value = redis::cmd("XRANGE")
            .arg(self.keys.dead())
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.dlq_err(e))?;
        Ok(reply::entries(&v).iter().map(dead_letter).collect())
    }

    /// Puts dead letters back on the job stream (the raw payload, as a new entry) and removes
    /// them from the dead stream. A result that dead-lettering stored is deleted first, with its
    /// batch counts, so the job runs again instead of being taken for a duplicate. A job without
    /// an `id` of its own gets a new one: its new entry id. Returns the number requeued.
    pub async fn dlq_requeue(&self, which: DlqSelection) -> Result<usize, QueueError> {
        let letters = match which {
            DlqSelection::All => self.dlq_list(usize::MAX >> 1).await?,
            DlqSelection::Ids(ids) => {
                let mut pipe = redis::pipe();
                for id in &ids {
                    pipe.cmd("XRANGE").arg(self.keys.dead()).arg(id).arg(id);
                }
                let found: Vec<Value> = pipe
                    .query_async(&mut self.conn())
                    .await
                    .map_err(|e| self.dlq_err(e))?;
                found
                    .iter()
                    .flat_map(reply::entries)
                    .map(|e| dead_letter(&e))
                    .collect()
            }
        };
        if letters.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        for l in &letters {
            let batch = serde_json::from_slice::<serde_json::Value>(&l.job)
                .ok()
                .and_then(|v| v.get("batch")?.as_str().map(str::to_owned));
            pipe.invoke_script(
                SCRIPTS
                    .dlq_requeue
                    .key(self.keys.dead())
                    .key(self.keys.jobs())
                    .key(self.keys.result(&l.id))
                    .key(self.keys.done(&l.id))
                    .key(self.keys.batch(batch.as_deref().unwrap_or("")))
                    .key(self.keys.idem(&l.id))
                    .arg(&l.dead_id)
                    .arg(l.job.as_slice())
                    .arg(if l.result_stored { "1" } else { "0" })
                    .arg(if batch.is_some() { "1" } else { "0" }),
            );
        }
        let added: Vec<Option<String>> = self
            .broker
            .query_scripted(&pipe, &[&SCRIPTS.dlq_requeue])
            .await
            .map_err(|e| self.dlq_err(e))?;
        Ok(added.iter().flatten().count())
    }

    /// Deletes every dead letter. Returns how many there were.
    pub async fn dlq_purge(&self) -> Result<u64, QueueError> {
        let (n, _): (u64, i64) = redis::pipe()
            .atomic()
            .xlen(self.keys.dead())
            .del(self.keys.dead())
            .query_async(&mut self.conn())
            .await
            .map_err(|e| self.dlq_err(e))?;
        Ok(n)
    }

    /// The counters of `batch`.
    pub async fn batch_status(&self, batch: &str) -> Result<BatchStatus, QueueError> {
        let all: BTreeMap<String, i64> = redis::cmd("HGETALL")
            .arg(self.keys.batch(batch))
            .query_async(&mut self.conn())
            .await
            .map_err(|source| QueueError::Batch {
                queue: self.name().to_owned(),
                batch: batch.to_owned(),
                source,
            })?;
        let mut status = BatchStatus::default();
        for (k, v) in all {
            let v = v.max(0) as u64;
            match k.as_str() {
                "total" => status.total = v,
                "done" => status.done = v,
                _ if v > 0 => {
                    status.by_status.insert(k, v);
                }
                _ => {}
            }
        }
        Ok(status)
    }
}

fn dead_letter(e: &reply::RawEntry) -> DeadLetter {
    let text = |name: &str| {
        e.field(name)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    DeadLetter {
        dead_id: e.id.clone(),
        job: e.field("job").map(<[u8]>::to_vec).unwrap_or_default(),
        reason: text("reason"),
        id: text("id"),
        entry_id: text("entry_id"),
        queue: text("queue"),
        deliveries: text("deliveries").parse().unwrap_or(0),
        worker: text("worker"),
        at_ms: text("at_ms").parse().unwrap_or(0),
        result_stored: text("result_stored") == "1",
    }
}

/// How many workers have a live heartbeat on the queue of `keys` (one SCAN over
/// `forkbox:{Q}:worker:*`, on the queue's shard in a cluster). A client that is about to wait on a queue uses it to warn
/// that nothing serves the queue rather than wait in silence.
pub async fn live_workers(
    conn: &mut crate::queue::Connection,
    keys: &crate::keys::Keys,
) -> redis::RedisResult<usize> {
    let pattern = format!("{}*", glob_escape(&keys.worker("")));
    let (mut cursor, mut found) = (0u64, 0);
    loop {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000);
        // In a cluster, on the queue's shard: its heartbeats are there.
        let (next, batch): (u64, Vec<String>) = conn.query_in_slot_of(&keys.jobs(), &scan).await?;
        found += batch.len();
        if next == 0 {
            return Ok(found);
        }
        cursor = next;
    }
}

/// `s` matched literally by a Redis glob pattern.
pub fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn glob_patterns_match_queue_names_literally() {
        assert_eq!(
            super::glob_escape("forkbox:{a*b?[c]\\}:"),
            "forkbox:{a\\*b\\?\\[c\\]\\\\}:"
        );
        assert_eq!(super::glob_escape("plain"), "plain");
    }
}
