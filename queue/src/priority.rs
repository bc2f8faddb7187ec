//! Reading several queues in priority order (`--queues high,default`).
//!
//! [`QueueSet::read`] first reads each queue without blocking, highest priority first, until
//! the free slots are filled; a lower queue is served only when every higher one is empty. When
//! all are empty it blocks on all of them at once with a single XREADGROUP over several streams
//! (COUNT split so the total never exceeds the free slots) and returns whatever arrives first.
//! The single blocking call needs all queues on one Redis server (not Redis Cluster, where the
//! queues' hash tags put them in different slots).

use crate::delivery::Delivery;
use crate::error::QueueError;
use crate::keys::GROUP;
use crate::queue::Queue;
use crate::reply;

/// Queues in priority order, highest first, all on one broker.
#[derive(Debug, Clone)]
pub struct QueueSet {
    queues: Vec<Queue>,
}

impl QueueSet {
    /// `queues`, highest priority first. They must come from the same [`crate::Broker`].
    pub fn new(queues: Vec<Queue>) -> Result<QueueSet, QueueError> {
        if let Some(first) = queues.first() {
            if queues.iter().any(|q| !q.broker.same_as(&first.broker)) {
                return Err(QueueError::MixedBrokers);
            }
        }
        Ok(QueueSet { queues })
    }

    pub fn queues(&self) -> &[Queue] {
        &self.queues
    }

    /// The queue a delivery came from, to complete it on.
    pub fn get(&self, name: &str) -> Option<&Queue> {
        self.queues.iter().find(|q| q.name() == name)
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
        for q in &self.queues {
            let left = count - out.len();
            if left == 0 {
                return Ok(out);
            }
            out.extend(q.read(consumer, left, 0).await?);
        }
        if !out.is_empty() || block_ms == 0 || count == 0 {
            return Ok(out);
        }
        // Block on as many queues as the slots allow, highest first, COUNT split evenly so
        // the sum stays within `count`.
        let watched = &self.queues[..self.queues.len().min(count)];
        let per_queue = count / watched.len();
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(GROUP)
            .arg(consumer)
            .arg("COUNT")
            .arg(per_queue)
            .arg("BLOCK")
            .arg(block_ms)
            .arg("STREAMS");
        for q in watched {
            cmd.arg(q.keys.jobs());
        }
        for _ in watched {
            cmd.arg(">");
        }
        let first = &watched[0];
        let v = first
            .run_read(&cmd, true)
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
                .map(|e| Delivery::from_entry(q.name(), e, 1, q.config.max_job_bytes))
                .collect();
            out.extend(q.skip_completed(fresh).await?);
        }
        Ok(out)
    }
}
