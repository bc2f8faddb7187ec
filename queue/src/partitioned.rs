//! One logical queue split into partitions.
//!
//! A [`Partitioned`] queue is `N` [`Queue`]s, one per partition, each with its own hash tag
//! ([`crate::keys::partition_tag`]) and so, in a Redis Cluster, its own slot and ideally its
//! own primary. Everything about one job happens on the partition its id maps to
//! ([`crate::keys::partition_of`]): enqueue (so an idempotent re-enqueue meets the first
//! copy), completion, the result, the `done` list, cancellation. What spans jobs is per
//! partition and summed by whoever reads it: batch counters, stats, dead letters. With
//! `N = 1` it is exactly the v1 queue.
//!
//! `N` is part of the queue's layout in Redis, not a client's choice: it is kept in the meta
//! hash `forkbox:{Q}:meta` (field `partitions`), written by the first user
//! ([`Partitioned::check_layout`], HSETNX) and checked by every later one, so a client or
//! worker started with another `N` stops with an error naming both values instead of putting
//! jobs where no worker reads or looking for results where none are stored.

use std::collections::BTreeMap;

use crate::admin::{BatchStatus, ConsumerStats, DeadLetter, DlqSelection, Stats};
use crate::enqueue::Enqueued;
use crate::error::QueueError;
use crate::keys::{partition_of, PARTITIONS_FIELD};
use crate::queue::{Broker, Queue, QueueConfig};
use crate::schema::{Job, JobResult};

/// A logical queue over its partitions (one or more).
#[derive(Debug, Clone)]
pub struct Partitioned {
    parts: Vec<Queue>,
}

impl Broker {
    /// A handle on queue `name` split into `partitions` (1: the v1 layout). Touches no key;
    /// [`Partitioned::check_layout`] (or [`Broker::open_partitioned`]) checks `partitions`
    /// against the queue's meta key.
    pub fn partitioned(
        &self,
        name: &str,
        partitions: usize,
        config: QueueConfig,
    ) -> Result<Partitioned, QueueError> {
        let config = std::sync::Arc::new(config);
        let parts = (0..partitions.max(1))
            .map(|p| {
                Ok(Queue {
                    broker: self.clone(),
                    keys: crate::keys::Keys::partition(name, p, partitions)?,
                    config: config.clone(),
                    groups_recreated: Default::default(),
                })
            })
            .collect::<Result<Vec<_>, QueueError>>()?;
        Ok(Partitioned { parts })
    }

    /// [`Broker::partitioned`], then [`Partitioned::check_layout`].
    pub async fn open_partitioned(
        &self,
        name: &str,
        partitions: usize,
        config: QueueConfig,
    ) -> Result<Partitioned, QueueError> {
        let q = self.partitioned(name, partitions, config)?;
        q.check_layout().await?;
        Ok(q)
    }
}

impl Partitioned {
    /// The queue's name.
    pub fn name(&self) -> &str {
        self.parts[0].name()
    }

    /// The partitions, partition 0 first.
    pub fn partitions(&self) -> &[Queue] {
        &self.parts
    }

    pub fn config(&self) -> &QueueConfig {
        self.parts[0].config()
    }

    /// Partition 0: where the queue's meta key, batch line maps and worker heartbeats used by
    /// clients live.
    pub fn first(&self) -> &Queue {
        &self.parts[0]
    }

    /// The partition job `id` lives on.
    pub fn for_id(&self, id: &str) -> &Queue {
        &self.parts[partition_of(id, self.parts.len())]
    }

    /// Records this handle's partition count in `forkbox:{Q}:meta` when the queue has none
    /// yet, and fails with [`QueueError::PartitionsMismatch`] when the queue has another one.
    /// For whoever adds jobs or reads them (enqueuers, workers).
    pub async fn check_layout(&self) -> Result<(), QueueError> {
        self.layout(true).await
    }

    /// Fails with [`QueueError::PartitionsMismatch`] when the queue's meta key names another
    /// partition count; writes nothing (a queue no one used yet has no layout to check). For
    /// read-only users (stats, result lookups), which must not fix a queue's layout.
    pub async fn verify_layout(&self) -> Result<(), QueueError> {
        self.layout(false).await
    }

    async fn layout(&self, record: bool) -> Result<(), QueueError> {
        let first = self.first();
        let meta = first.keys.meta();
        let n = self.parts.len();
        let mut pipe = redis::pipe();
        if record {
            pipe.cmd("HSETNX")
                .arg(&meta)
                .arg(PARTITIONS_FIELD)
                .arg(n)
                .ignore();
        }
        pipe.cmd("HGET").arg(&meta).arg(PARTITIONS_FIELD);
        let (live,): (Option<String>,) =
            pipe.query_async(&mut first.conn())
                .await
                .map_err(|source| QueueError::Layout {
                    queue: self.name().to_owned(),
                    source,
                })?;
        match live {
            None if !record => Ok(()),
            Some(live) if live.trim() == n.to_string() => Ok(()),
            live => Err(QueueError::PartitionsMismatch {
                queue: self.name().to_owned(),
                configured: n,
                live: live.unwrap_or_else(|| "no".to_owned()),
            }),
        }
    }

    /// Enqueues `job` on its id's partition (a job without id gets a uuid v7 first); see
    /// [`Queue::enqueue_idempotent`].
    pub async fn enqueue_idempotent(&self, job: &Job) -> Result<Enqueued, QueueError> {
        let mut job = job.clone();
        let id = job
            .id
            .get_or_insert_with(|| uuid::Uuid::now_v7().to_string())
            .clone();
        self.for_id(&id).enqueue_idempotent(&job).await
    }

    /// Enqueues `job` and returns its id.
    pub async fn enqueue(&self, job: &Job) -> Result<String, QueueError> {
        Ok(self.enqueue_idempotent(job).await?.id)
    }

    /// Enqueues `jobs` as members of `batch`, each on its id's partition; the batch's `total`
    /// is counted on each partition for its jobs. Results come back in input order.
    pub async fn enqueue_batch(
        &self,
        jobs: &[Job],
        batch: &str,
    ) -> Result<Vec<Enqueued>, QueueError> {
        let mut by_part: Vec<(Vec<usize>, Vec<Job>)> = vec![Default::default(); self.parts.len()];
        for (i, job) in jobs.iter().enumerate() {
            let mut job = job.clone();
            let id = job
                .id
                .get_or_insert_with(|| uuid::Uuid::now_v7().to_string())
                .clone();
            let slot = &mut by_part[partition_of(&id, self.parts.len())];
            slot.0.push(i);
            slot.1.push(job);
        }
        let mut out: Vec<Option<Enqueued>> = vec![None; jobs.len()];
        for (q, (at, part_jobs)) in self.parts.iter().zip(by_part) {
            if part_jobs.is_empty() {
                continue;
            }
            for (i, e) in at
                .into_iter()
                .zip(q.enqueue_batch(&part_jobs, batch).await?)
            {
                out[i] = Some(e);
            }
        }
        Ok(out
            .into_iter()
            .map(|e| e.expect("every job went to one partition"))
            .collect())
    }

    /// Adds a raw payload to partition 0's stream (`XADD forkbox:{Q}:jobs * job <payload>`).
    pub async fn enqueue_raw(&self, payload: &[u8]) -> Result<String, QueueError> {
        self.first().enqueue_raw(payload).await
    }

    /// The result of `id`, from its partition.
    pub async fn result(&self, id: &str) -> Result<Option<JobResult>, QueueError> {
        self.for_id(id).result(id).await
    }

    /// Waits up to `timeout` for the result of `id` on its partition.
    pub async fn wait_result(
        &self,
        id: &str,
        timeout: std::time::Duration,
    ) -> Result<Option<JobResult>, QueueError> {
        self.for_id(id).wait_result(id, timeout).await
    }

    /// Waits up to `timeout` for the result of `id`, a job just enqueued (see
    /// [`Queue::wait_new_result`]).
    pub async fn wait_new_result(
        &self,
        id: &str,
        timeout: std::time::Duration,
    ) -> Result<Option<JobResult>, QueueError> {
        self.for_id(id).wait_new_result(id, timeout).await
    }

    /// The stored results of `ids`, in order, each read from its partition.
    pub async fn results_of(&self, ids: &[String]) -> Result<Vec<Option<JobResult>>, QueueError> {
        let mut by_part: Vec<(Vec<usize>, Vec<String>)> =
            vec![Default::default(); self.parts.len()];
        for (i, id) in ids.iter().enumerate() {
            let slot = &mut by_part[partition_of(id, self.parts.len())];
            slot.0.push(i);
            slot.1.push(id.clone());
        }
        let mut out: Vec<Option<JobResult>> = vec![None; ids.len()];
        for (q, (at, part_ids)) in self.parts.iter().zip(by_part) {
            if part_ids.is_empty() {
                continue;
            }
            for (i, r) in at.into_iter().zip(q.results_of(&part_ids).await?) {
                out[i] = r;
            }
        }
        Ok(out)
    }

    /// Cancels `id` on its partition; returns how many workers heard it live.
    pub async fn cancel(&self, id: &str) -> Result<u64, QueueError> {
        self.for_id(id).cancel(id).await
    }

    /// Where job `id` is (see [`Queue::job_state`]).
    pub async fn job_state(&self, id: &str) -> Result<crate::JobState, QueueError> {
        self.for_id(id).job_state(id).await
    }

    /// Cancels `id` ahead of its job on its partition (see [`Queue::cancel_ahead`]).
    pub async fn cancel_ahead(&self, id: &str, lifetime_s: u64) -> Result<(), QueueError> {
        self.for_id(id).cancel_ahead(id, lifetime_s).await
    }

    /// Whether `id` is cancelled.
    pub async fn is_cancelled(&self, id: &str) -> Result<bool, QueueError> {
        self.for_id(id).is_cancelled(id).await
    }

    /// The batch's counters, summed over the partitions.
    pub async fn batch_status(&self, batch: &str) -> Result<BatchStatus, QueueError> {
        let mut sum = BatchStatus::default();
        for q in &self.parts {
            let s = q.batch_status(batch).await?;
            sum.total += s.total;
            sum.done += s.done;
            for (status, n) in s.by_status {
                *sum.by_status.entry(status).or_default() += n;
            }
        }
        Ok(sum)
    }

    /// Records a batch's `(line, id)` pairs (on partition 0: the map names ids, not entries).
    pub async fn record_batch_lines(
        &self,
        batch: &str,
        lines: &[(u64, String)],
        ttl_s: u64,
    ) -> Result<(), QueueError> {
        self.first().record_batch_lines(batch, lines, ttl_s).await
    }

    /// The members `batch submit` recorded for `batch`, by line number.
    pub async fn batch_lines(&self, batch: &str) -> Result<BTreeMap<u64, String>, QueueError> {
        self.first().batch_lines(batch).await
    }

    /// Stream lengths, pending, lag and dead letters summed over the partitions; a consumer's
    /// pending entries summed, its idle time the shortest.
    pub async fn stats(&self) -> Result<Stats, QueueError> {
        let mut sum = Stats {
            lag: Some(0),
            ..Stats::default()
        };
        let mut consumers: BTreeMap<String, ConsumerStats> = BTreeMap::new();
        for q in &self.parts {
            let s = q.stats().await?;
            sum.length += s.length;
            sum.pending += s.pending;
            sum.dead += s.dead;
            sum.lag = sum.lag.zip(s.lag).map(|(a, b)| a + b);
            for c in s.consumers {
                consumers
                    .entry(c.name.clone())
                    .and_modify(|e| {
                        e.pending += c.pending;
                        e.idle_ms = e.idle_ms.min(c.idle_ms);
                    })
                    .or_insert(c);
            }
        }
        sum.consumers = consumers.into_values().collect();
        Ok(sum)
    }

    /// How many workers have a live heartbeat (workers beat on every partition; partition 0
    /// is read).
    pub async fn live_workers(&self) -> Result<usize, QueueError> {
        self.first().live_workers().await
    }

    /// Whether `worker`'s heartbeat is live.
    pub async fn is_alive(&self, worker: &str) -> Result<bool, QueueError> {
        self.first().is_alive(worker).await
    }

    /// The oldest `count` dead letters over all partitions, oldest first.
    pub async fn dlq_list(&self, count: usize) -> Result<Vec<DeadLetter>, QueueError> {
        let mut all = Vec::new();
        for q in &self.parts {
            all.extend(q.dlq_list(count).await?);
        }
        all.sort_by_key(|l| l.at_ms);
        all.truncate(count);
        Ok(all)
    }

    /// Requeues dead letters on the partition they died on; returns how many.
    pub async fn dlq_requeue(&self, which: DlqSelection) -> Result<usize, QueueError> {
        let mut n = 0;
        for q in &self.parts {
            n += q.dlq_requeue(which.clone()).await?;
        }
        Ok(n)
    }

    /// Deletes every dead letter of every partition; returns how many there were.
    pub async fn dlq_purge(&self) -> Result<u64, QueueError> {
        let mut n = 0;
        for q in &self.parts {
            n += q.dlq_purge().await?;
        }
        Ok(n)
    }
}
