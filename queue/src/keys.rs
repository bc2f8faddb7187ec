//! The Redis key layout of a queue.
//!
//! Every key of queue `Q` carries the hash tag `{Q}`, so all of a queue's keys live in one
//! Redis Cluster slot and every Lua script may touch any of them. The layout is part of the wire
//! contract (docs/protocol.md): clients in other languages build these names by hand, so they
//! change only with a protocol version.

/// The consumer group every worker of every queue reads through.
pub const GROUP: &str = "workers";

/// Stream entry field that holds a job's JSON.
pub const JOB_FIELD: &str = "job";

/// Stream entry field set to `1` by the enqueue script, which added the entry only after finding
/// neither a pending copy nor a live result of its id: a fresh read need not check it again.
pub const VETTED_FIELD: &str = "vetted";

/// Stream entry field that holds a result's JSON (results stream and `reply_to` streams).
pub const RESULT_FIELD: &str = "result";

/// Longest accepted queue name.
pub const MAX_QUEUE_NAME_LEN: usize = 64;

/// Why a queue name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("queue name {name:?} is invalid: {reason}")]
    InvalidQueueName { name: String, reason: &'static str },
}

/// The names of one queue's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    queue: String,
    prefix: String,
}

impl Keys {
    /// The layout of queue `queue`. Names are 1 to 64 printable ASCII characters without
    /// spaces, braces or colons: braces would break the hash tag, colons the key hierarchy.
    pub fn new(queue: &str) -> Result<Keys, KeyError> {
        let bad = |reason| KeyError::InvalidQueueName {
            name: queue.to_owned(),
            reason,
        };
        if queue.is_empty() || queue.len() > MAX_QUEUE_NAME_LEN {
            return Err(bad("must be 1 to 64 characters"));
        }
        if !queue
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'{' | b'}' | b':'))
        {
            return Err(bad(
                "must be printable ASCII without spaces, braces or colons",
            ));
        }
        Ok(Keys {
            queue: queue.to_owned(),
            prefix: format!("forkbox:{{{queue}}}:"),
        })
    }

    /// The queue's name.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// `forkbox:{Q}:` — the prefix every key of the queue starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `forkbox:{Q}:jobs` — the job stream, read through consumer group [`GROUP`].
    pub fn jobs(&self) -> String {
        format!("{}jobs", self.prefix)
    }

    /// `forkbox:{Q}:result:<id>` — the result JSON (string, with TTL).
    pub fn result(&self, id: &str) -> String {
        format!("{}result:{id}", self.prefix)
    }

    /// `forkbox:{Q}:done:<id>` — a list that gets one element (the status) at completion.
    pub fn done(&self, id: &str) -> String {
        format!("{}done:{id}", self.prefix)
    }

    /// `forkbox:{Q}:results` — the capped stream of every result.
    pub fn results(&self) -> String {
        format!("{}results", self.prefix)
    }

    /// `forkbox:{Q}:dead` — the dead-letter stream.
    pub fn dead(&self) -> String {
        format!("{}dead", self.prefix)
    }

    /// `forkbox:{Q}:batch:<batch>` — the batch's counters (hash).
    pub fn batch(&self, batch: &str) -> String {
        format!("{}batch:{batch}", self.prefix)
    }

    /// `forkbox:{Q}:cancelled` — cancelled ids (sorted set, score = cancel time in ms).
    pub fn cancelled(&self) -> String {
        format!("{}cancelled", self.prefix)
    }

    /// `forkbox:{Q}:cancel` — the pub/sub channel a cancelled id is published on.
    pub fn cancel_channel(&self) -> String {
        format!("{}cancel", self.prefix)
    }

    /// `forkbox:{Q}:worker:<name>` — a worker's heartbeat (string with TTL).
    pub fn worker(&self, name: &str) -> String {
        format!("{}worker:{name}", self.prefix)
    }

    /// `forkbox:{Q}:idem:<id>` — marks an id as enqueued (value: its stream entry id).
    pub fn idem(&self, id: &str) -> String {
        format!("{}idem:{id}", self.prefix)
    }

    /// Whether `key` is one of the queue's fixed keys, which a job's `reply_to` must not name.
    pub fn is_reserved(&self, key: &str) -> bool {
        [self.jobs(), self.results(), self.dead(), self.cancelled()]
            .iter()
            .any(|k| k == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_carries_the_hash_tag() {
        let k = Keys::new("default").unwrap();
        assert_eq!(k.jobs(), "forkbox:{default}:jobs");
        assert_eq!(k.result("a"), "forkbox:{default}:result:a");
        assert_eq!(k.done("a"), "forkbox:{default}:done:a");
        assert_eq!(k.results(), "forkbox:{default}:results");
        assert_eq!(k.dead(), "forkbox:{default}:dead");
        assert_eq!(k.batch("b"), "forkbox:{default}:batch:b");
        assert_eq!(k.cancelled(), "forkbox:{default}:cancelled");
        assert_eq!(k.cancel_channel(), "forkbox:{default}:cancel");
        assert_eq!(k.worker("w1"), "forkbox:{default}:worker:w1");
        assert_eq!(k.idem("a"), "forkbox:{default}:idem:a");
    }

    #[test]
    fn names_that_break_the_tag_are_refused() {
        for bad in ["", "a}b", "{a", "a b", "a:b", &"x".repeat(65)] {
            assert!(Keys::new(bad).is_err(), "{bad:?}");
        }
        assert!(Keys::new("high-priority_2.x").is_ok());
    }
}
