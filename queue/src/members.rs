//! Which input line each job of a batch came from.
//!
//! `forkbox batch submit` records, per batch, the line number of every job it enqueued in the
//! hash `forkbox:{Q}:batch-lines:<batch>` (field: the line number, value: the job's id), with
//! the batch's TTL, so `forkbox batch results` can list every result joined back to its line
//! without the submitter keeping the ids. Writing the same line again is a no-op, so a
//! resubmitted file leaves one entry per line.

use std::collections::BTreeMap;

use crate::error::QueueError;
use crate::queue::Queue;
use crate::schema::JobResult;

/// Results fetched per MGET in [`Queue::results_of`]: bounds the memory of one reply.
const RESULTS_CHUNK: usize = 500;

impl Queue {
    /// Records `(line, id)` pairs as members of `batch`, living `ttl_s` seconds.
    pub async fn record_batch_lines(
        &self,
        batch: &str,
        lines: &[(u64, String)],
        ttl_s: u64,
    ) -> Result<(), QueueError> {
        let key = self.keys.batch_lines(batch);
        for chunk in lines.chunks(RESULTS_CHUNK) {
            let mut pipe = redis::pipe();
            let mut hset = redis::cmd("HSET");
            hset.arg(&key);
            for (line, id) in chunk {
                hset.arg(line).arg(id);
            }
            pipe.add_command(hset).ignore();
            pipe.expire(&key, ttl_s.max(1) as i64).ignore();
            pipe.query_async::<()>(&mut self.conn())
                .await
                .map_err(|source| QueueError::Enqueue {
                    queue: self.name().to_owned(),
                    source,
                })?;
        }
        Ok(())
    }

    /// The members `batch submit` recorded for `batch`, by line number.
    pub async fn batch_lines(&self, batch: &str) -> Result<BTreeMap<u64, String>, QueueError> {
        let raw: BTreeMap<String, String> = redis::cmd("HGETALL")
            .arg(self.keys.batch_lines(batch))
            .query_async(&mut self.conn())
            .await
            .map_err(|source| QueueError::Results {
                queue: self.name().to_owned(),
                source,
            })?;
        Ok(raw
            .into_iter()
            .filter_map(|(line, id)| Some((line.parse().ok()?, id)))
            .collect())
    }

    /// The stored results of `ids`, in order (`None`: not finished, unknown, or expired).
    pub async fn results_of(&self, ids: &[String]) -> Result<Vec<Option<JobResult>>, QueueError> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(RESULTS_CHUNK) {
            let keys: Vec<String> = chunk.iter().map(|id| self.keys.result(id)).collect();
            let raw: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
                .arg(&keys)
                .query_async(&mut self.conn())
                .await
                .map_err(|source| QueueError::Results {
                    queue: self.name().to_owned(),
                    source,
                })?;
            for (id, r) in chunk.iter().zip(raw) {
                out.push(
                    r.map(|r| {
                        serde_json::from_slice(&r).map_err(|source| QueueError::CorruptResult {
                            queue: self.name().to_owned(),
                            id: id.clone(),
                            source,
                        })
                    })
                    .transpose()?,
                );
            }
        }
        Ok(out)
    }
}
