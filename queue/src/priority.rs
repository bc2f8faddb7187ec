//! Reading several queues in priority order (`--queues high,default`), each over its
//! partitions.
//!
//! A set is a list of priority levels, highest first; a level is one queue's partitions (one
//! stream for an unpartitioned queue). [`QueueSet::read`] first reads each stream without
//! blocking, level by level, until the free slots are filled; a lower level is served only when
//! every higher one is empty. Within a level the partition read first turns with every read,
//! so a busy partition cannot starve the others, and each partition is read in stream order.
//! When all are empty it blocks on them at once (as many streams as there are free slots, in
//! the same turning order) with a single XREADGROUP over several streams (COUNT split so the
//! total never exceeds the free slots) and returns whatever arrives first. The single blocking
//! call needs all streams on one Redis server. In a Redis Cluster the hash tags put them in
//! different slots (a multi-key command must stay in one slot, even on one node), so there it
//! blocks on each stream at once, on a dedicated connection per stream; the first to answer
//! ends the others early (`CLIENT UNBLOCK`) and the entries of every read are returned, none
//! dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::delivery::Delivery;
use crate::error::QueueError;
use crate::partitioned::Partitioned;
use crate::queue::Queue;
use crate::reply;

/// Queues in priority order, highest first, each over its partitions, all on one broker.
#[derive(Debug, Clone)]
pub struct QueueSet {
    /// Priority levels, highest first: one queue's partitions each.
    levels: Vec<Vec<Queue>>,
    /// Every partition of every level, in level order.
    queues: Vec<Queue>,
    /// Turns the partition read first within a level.
    turn: Arc<AtomicUsize>,
}

impl QueueSet {
    /// `queues`, highest priority first, each unpartitioned. They must come from the same
    /// [`crate::Broker`].
    pub fn new(queues: Vec<Queue>) -> Result<QueueSet, QueueError> {
        QueueSet::levels(queues.into_iter().map(|q| vec![q]).collect())
    }

    /// `queues`, highest priority first, each read over all its partitions.
    pub fn of_partitioned(queues: Vec<Partitioned>) -> Result<QueueSet, QueueError> {
        QueueSet::levels(
            queues
                .into_iter()
                .map(|q| q.partitions().to_vec())
                .collect(),
        )
    }

    fn levels(levels: Vec<Vec<Queue>>) -> Result<QueueSet, QueueError> {
        let queues: Vec<Queue> = levels.iter().flatten().cloned().collect();
        if let Some(first) = queues.first() {
            if queues.iter().any(|q| !q.broker.same_as(&first.broker)) {
                return Err(QueueError::MixedBrokers);
            }
        }
        Ok(QueueSet {
            levels,
            queues,
            turn: Arc::default(),
        })
    }

    /// Every partition of every queue, highest priority first.
    pub fn queues(&self) -> &[Queue] {
        &self.queues
    }

    /// The queue partition a delivery came from, to complete it on.
    pub fn get(&self, name: &str, partition: usize) -> Option<&Queue> {
        self.queues
            .iter()
            .find(|q| q.name() == name && q.keys.partition_index() == partition)
    }

    /// Every stream in the order of this read: levels by priority, each level's partitions
    /// starting at the turning offset.
    fn read_order(&self) -> Vec<&Queue> {
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        self.levels
            .iter()
            .flat_map(|level| {
                let start = turn % level.len().max(1);
                level[start..].iter().chain(&level[..start])
            })
            .collect()
    }

    /// Creates every queue's group.
    pub async fn ensure_groups(&self) -> Result<(), QueueError> {
        for q in &self.queues {
            q.ensure_group().await?;
        }
        Ok(())
    }

    /// Up to `count` new deliveries, higher queues first; blocks up to `block_ms` (0: not at
    /// all) only when every queue is empty.
    pub async fn read(
        &self,
        consumer: &str,
        count: usize,
        block_ms: u64,
    ) -> Result<Vec<Delivery>, QueueError> {
        let mut out = Vec::new();
        if self.queues.len() == 1 {
            return self.queues[0].read(consumer, count, block_ms).await;
        }
        let order = self.read_order();
        for q in &order {
            let left = count - out.len();
            if left == 0 {
                return Ok(out);
            }
            match q.read(consumer, left, 0).await {
                Ok(got) => out.extend(got),
                // Entries already read are delivered: return them; the failing queue fails
                // again on the next read if it is still failing.
                Err(_) if !out.is_empty() => return Ok(out),
                Err(e) => return Err(e),
            }
        }
        if !out.is_empty() || block_ms == 0 || count == 0 {
            return Ok(out);
        }
        // Block on as many queues as the slots allow, highest first, COUNT split evenly so
        // the sum stays within `count`.
        let watched: Vec<Queue> = order[..order.len().min(count)]
            .iter()
            .map(|q| (*q).clone())
            .collect();
        let watched = &watched[..];
        let per_queue = count / watched.len();
        if watched[0].broker.is_cluster() {
            return read_each_blocking(watched, consumer, per_queue, block_ms).await;
        }
        let mut cmd = crate::delivery::read_group(consumer, per_queue, block_ms);
        for q in watched {
            cmd.arg(q.keys.jobs());
        }
        for _ in watched {
            cmd.arg(">");
        }
        let first = &watched[0];
        let v = first
            .run_read(&cmd, Some(std::time::Duration::from_millis(block_ms)))
            .await
            .map_err(|e| first.read_err(e))?;
        let mut by_stream = reply::xread(&v);
        // Priority order, whatever order Redis answered in.
        by_stream.sort_by_key(|(key, _)| watched.iter().position(|q| q.keys.jobs() == *key));
        for (key, entries) in by_stream {
            let Some(q) = watched.iter().find(|q| q.keys.jobs() == key) else {
                continue;
            };
            let fresh = entries
                .iter()
                .map(|e| Delivery::from_entry(&q.keys, e, 1, q.config.max_job_bytes))
                .collect();
            out.extend(q.skip_completed(fresh).await);
        }
        Ok(out)
    }
}

/// The cluster form of the blocking step: one blocking read per queue at once. The first to
/// answer wakes the others (`CLIENT UNBLOCK`), and every read's entries are returned: Redis
/// hands an entry out the instant it arrives, so a read dropped rather than awaited would
/// leave its entries pending on the consumer with no one to run them.
async fn read_each_blocking(
    watched: &[Queue],
    consumer: &str,
    per_queue: usize,
    block_ms: u64,
) -> Result<Vec<Delivery>, QueueError> {
    let (wake, woken) = tokio::sync::watch::channel(false);
    let mut reads = tokio::task::JoinSet::new();
    for (rank, q) in watched.iter().enumerate() {
        let (q, consumer, mut woken) = (q.clone(), consumer.to_owned(), woken.clone());
        reads.spawn(async move {
            let r = q
                .read_until(&consumer, per_queue, block_ms, Some(&mut woken))
                .await;
            (rank, r)
        });
    }
    let mut got = Vec::new();
    while let Some(done) = reads.join_next().await {
        let _ = wake.send(true);
        got.push(done.expect("a read task does not panic"));
    }
    got.sort_by_key(|(rank, _)| *rank);
    let mut out = Vec::new();
    let mut failed = None;
    for (_, r) in got {
        match r {
            Ok(ds) => out.extend(ds),
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    match failed {
        Some(e) if out.is_empty() => Err(e),
        _ => Ok(out),
    }
}
