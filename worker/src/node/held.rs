//! The stream entries a node holds: delivered to it and not yet completed.
//!
//! Upkeep refreshes their claims so the reclaimer leaves them alone; the outbox and the job
//! tasks remove them once they are stored, dead-lettered, handed back or left pending. The
//! entries left pending (or handed back) on purpose are remembered for a while, so that the
//! reader's recovery of entries whose read reply was lost
//! ([`forkbox_queue::Queue::recover_stranded`]) does not take them back before their time.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::node::metrics as m;

/// Stream entries this node holds (delivered, not yet completed), per queue partition, so
/// their claims can be refreshed. Entry ids are unique within one partition's stream only.
#[derive(Debug, Default)]
pub struct Held {
    entries: Mutex<HashMap<(String, usize), HashSet<String>>>,
    /// Entries left pending on purpose, with when: for the reclaimer, not this node's
    /// recovery of stranded entries.
    left: Mutex<HashMap<(String, usize), HashMap<String, Instant>>>,
}

impl Held {
    pub fn add(&self, queue: &str, partition: usize, entry_id: &str) {
        let key = (queue.to_owned(), partition);
        if let Some(left) = self.left.lock().expect("left lock").get_mut(&key) {
            left.remove(entry_id);
        }
        let mut entries = self.entries.lock().expect("held lock");
        let set = entries.entry(key).or_default();
        set.insert(entry_id.to_owned());
        Held::gauge(&entries, queue);
    }

    /// No longer held, and left pending on purpose (a retry after the visibility timeout, a
    /// hand-back, a node stopping).
    pub fn leave(&self, queue: &str, partition: usize, entry_id: &str) {
        self.remove(queue, partition, entry_id);
        self.left
            .lock()
            .expect("left lock")
            .entry((queue.to_owned(), partition))
            .or_default()
            .insert(entry_id.to_owned(), Instant::now());
    }

    /// The entries of partition `partition` of `queue` that are held or were left pending
    /// less than `forget_after` ago (older ones are forgotten: by then the reclaimer has
    /// taken them).
    pub fn held_or_left(
        &self,
        queue: &str,
        partition: usize,
        forget_after: Duration,
    ) -> HashSet<String> {
        let key = (queue.to_owned(), partition);
        let mut out: HashSet<String> = self.of(queue, partition).into_iter().collect();
        let mut left = self.left.lock().expect("left lock");
        if let Some(l) = left.get_mut(&key) {
            l.retain(|_, at| at.elapsed() < forget_after);
            out.extend(l.keys().cloned());
        }
        out
    }

    pub fn remove(&self, queue: &str, partition: usize, entry_id: &str) {
        let mut entries = self.entries.lock().expect("held lock");
        if let Some(set) = entries.get_mut(&(queue.to_owned(), partition)) {
            set.remove(entry_id);
            Held::gauge(&entries, queue);
        }
    }

    /// The in-flight gauge of `queue`: its entries over all partitions.
    fn gauge(entries: &HashMap<(String, usize), HashSet<String>>, queue: &str) {
        let n: usize = entries
            .iter()
            .filter(|((q, _), _)| q == queue)
            .map(|(_, s)| s.len())
            .sum();
        ::metrics::gauge!(m::IN_FLIGHT, "queue" => queue.to_owned()).set(n as f64);
    }

    /// The held entry ids of partition `partition` of `queue`.
    pub fn of(&self, queue: &str, partition: usize) -> Vec<String> {
        self.entries
            .lock()
            .expect("held lock")
            .get(&(queue.to_owned(), partition))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .expect("held lock")
            .values()
            .map(HashSet::len)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_entries_are_tracked_per_queue_partition() {
        let h = Held::default();
        h.add("a", 0, "1-0");
        h.add("a", 0, "2-0");
        h.add("b", 0, "1-0");
        // Another partition's stream may hand out the same entry id.
        h.add("a", 1, "1-0");
        h.remove("a", 0, "1-0");
        assert_eq!(h.of("a", 0), ["2-0"]);
        assert_eq!(h.of("a", 1), ["1-0"]);
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn entries_left_pending_are_told_apart_until_forgotten_or_held_again() {
        let h = Held::default();
        h.add("a", 0, "1-0");
        h.add("a", 0, "2-0");
        h.leave("a", 0, "2-0");
        assert_eq!(h.of("a", 0), ["1-0"]);
        let long = Duration::from_secs(3600);
        let both: HashSet<String> = ["1-0".to_owned(), "2-0".to_owned()].into();
        assert_eq!(h.held_or_left("a", 0, long), both);
        assert_eq!(h.held_or_left("a", 1, long), HashSet::new());
        assert_eq!(
            h.held_or_left("a", 0, Duration::ZERO),
            ["1-0".to_owned()].into()
        );
        // Forgotten for good once past the bound.
        assert_eq!(h.held_or_left("a", 0, long), ["1-0".to_owned()].into());
        h.leave("a", 0, "1-0");
        h.add("a", 0, "1-0");
        assert_eq!(h.held_or_left("a", 0, long), ["1-0".to_owned()].into());
        assert_eq!(h.len(), 1);
    }
}
