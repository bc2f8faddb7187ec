//! The stream entries a node holds: delivered to it and not yet completed.
//!
//! Upkeep refreshes their claims so the reclaimer leaves them alone; the outbox and the job
//! tasks remove them once they are stored, dead-lettered, handed back or left pending.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use crate::node::metrics as m;

/// Stream entries this node holds (delivered, not yet completed), per queue partition, so
/// their claims can be refreshed. Entry ids are unique within one partition's stream only.
#[derive(Debug, Default)]
pub struct Held {
    entries: Mutex<HashMap<(String, usize), HashSet<String>>>,
}

impl Held {
    pub fn add(&self, queue: &str, partition: usize, entry_id: &str) {
        let mut entries = self.entries.lock().expect("held lock");
        let set = entries.entry((queue.to_owned(), partition)).or_default();
        set.insert(entry_id.to_owned());
        Held::gauge(&entries, queue);
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
}
