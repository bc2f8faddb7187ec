//! Seeing Redis lose data under the node, and saying what was lost.
//!
//! Redis loses data when it restarts without persistence, is flushed, or fails over to a
//! replica that never had it. The node sees it two ways: its queue handle found the consumer
//! group gone and made it again ([`forkbox_queue::Queue::groups_recreated`]), or the `run_id`
//! of `INFO server` changed between two of upkeep's checks (a restart; on a single server
//! only). Either way upkeep's next claim refresh says which of the entries the node holds are
//! no longer pending for it: their jobs run on, but their results cannot be stored (the
//! completion script stores only for a pending entry). For each queue partition that lost
//! something the node logs one warning naming the group it recreated and how many of its
//! in-flight results it cannot store, counts `forkbox_redis_data_lost_total`, and serves on.
//! A restart that lost nothing of the node's (the group and every held entry still there) is
//! logged at `info`.

use std::collections::HashMap;

use forkbox_queue::{Broker, Queue};

use crate::node::metrics as m;

/// What upkeep has seen of Redis' data so far.
#[derive(Debug, Default)]
pub struct LossWatch {
    /// The server's `run_id` at the last check.
    run_id: Option<String>,
    /// A restart seen and not yet reported, per queue partition.
    restarted: HashMap<(String, usize), bool>,
    /// [`Queue::groups_recreated`] as last reported, per queue partition.
    recreated: HashMap<(String, usize), u64>,
}

impl LossWatch {
    /// Checks the server's `run_id`; a change marks every queue as restarted until
    /// [`LossWatch::settle`] reports it. A failed check changes nothing.
    pub async fn check_restart(&mut self, broker: &Broker, queues: &[Queue]) {
        let now = match broker.run_id().await {
            Ok(Some(id)) => id,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!("could not read Redis' run id: {e}");
                return;
            }
        };
        if self.run_id.as_ref().is_some_and(|before| *before != now) {
            for q in queues {
                self.restarted.insert(key(q), true);
            }
        }
        self.run_id = Some(now);
    }

    /// After a successful claim refresh of `q`: reports a loss seen since the last one, given
    /// the held entries the refresh found no longer pending for this node (`gone`). Returns
    /// whether it did, so the caller does not also report those entries one by one.
    pub fn settle(&mut self, q: &Queue, gone: usize) -> bool {
        let k = key(q);
        let restarted = self.restarted.remove(&k).unwrap_or(false);
        let now = q.groups_recreated();
        let seen = self.recreated.entry(k).or_insert(0);
        let recreated = now > *seen;
        *seen = now;
        if !(recreated || restarted && gone > 0) {
            if restarted {
                tracing::info!(
                    queue = q.name(),
                    "Redis restarted (its run id changed); {} and the entries this node holds \
                     are still there",
                    q.keys().jobs()
                );
            }
            return false;
        }
        let what = if recreated {
            format!(
                "the consumer group of {} was gone (Redis restarted without persistence, was \
                 flushed, or failed over to an empty replica) and is recreated; jobs queued and \
                 results stored before are lost",
                q.keys().jobs()
            )
        } else {
            format!(
                "Redis restarted (its run id changed) without entries of {} this node holds",
                q.keys().jobs()
            )
        };
        tracing::warn!(
            queue = q.name(),
            "Redis lost data: {what}; {gone} in-flight result(s) of this node cannot be stored \
             (their entries are gone). Serving on"
        );
        ::metrics::counter!(m::REDIS_DATA_LOST, "queue" => q.name().to_owned()).increment(1);
        true
    }
}

fn key(q: &Queue) -> (String, usize) {
    (q.name().to_owned(), q.keys().partition_index())
}
