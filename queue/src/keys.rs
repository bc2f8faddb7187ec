//! The Redis key layout of a queue.
//!
//! A queue `Q` is split into `N` partitions (1 by default). Every key of a partition carries
//! that partition's hash tag, so all of a partition's keys live in one Redis Cluster slot and
//! every Lua script may touch any of them. Partition 0's tag is `{Q}`: with `N = 1` the layout
//! is the v1 layout exactly. Partition `p >= 1` has the tag `{Q:p:k}`, `k` the smallest
//! integer that puts its slot in the `p`-th band after partition 0's ([`partition_tag`]): the
//! partitions land in `N` different equal bands of the 16384 slots, which on a cluster whose
//! slots are split evenly (what `redis-cli --cluster create` does) are served by different
//! primaries when `N` is the number of primaries. A job goes to partition
//! `crc16(id) mod N` ([`partition_of`]), so an idempotent re-enqueue, a result lookup and a
//! cancel find it from the id alone. The layout is part of the wire contract
//! (docs/protocol.md): clients in other languages build these names by hand, so they change
//! only with a protocol version.

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

/// What follows a queue's prefix in a `reply_to` key: `forkbox:{Q}:replies:<name>`.
pub const REPLIES_PREFIX: &str = "replies:";

/// Longest `<name>` of a `reply_to` key.
pub const MAX_REPLY_NAME_LEN: usize = 128;

/// How long a job's `wake:<id>` stream outlives its completion (less when the result's TTL is
/// shorter): long enough for a waiter that found no result to start its blocking `XREAD`. A
/// waiter that comes later finds the result itself.
pub const WAKE_LINGER_MS: u64 = 10_000;

/// Most partitions a queue may have: each gets a band of at least 64 slots.
pub const MAX_PARTITIONS: usize = 256;

/// Hash slots of a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16384;

/// Field of the meta hash `forkbox:{Q}:meta` that holds the queue's partition count.
pub const PARTITIONS_FIELD: &str = "partitions";

/// Why a queue name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("queue name {name:?} is invalid: {reason}")]
    InvalidQueueName { name: String, reason: &'static str },
    #[error("queue {queue}: {partitions} partitions is not 1 to {MAX_PARTITIONS}")]
    InvalidPartitions { queue: String, partitions: usize },
}

/// The names of one queue partition's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    queue: String,
    partition: usize,
    tag: String,
    prefix: String,
}

/// CRC16-CCITT (XMODEM), the checksum Redis Cluster maps keys to slots with (and Python's
/// `binascii.crc_hqx(data, 0)`).
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of hash tag `tag` (the text between the braces).
pub fn tag_slot(tag: &str) -> u16 {
    crc16(tag.as_bytes()) % CLUSTER_SLOTS
}

/// Which of `partitions` equal bands of the slot space `slot` is in.
fn band(slot: u16, partitions: usize) -> usize {
    usize::from(slot) * partitions / usize::from(CLUSTER_SLOTS)
}

/// The hash tag of partition `partition` of queue `queue` split into `partitions`: `Q` for
/// partition 0; for `p >= 1`, `Q:p:k` with the smallest `k >= 0` such that
/// `band(slot(tag)) == (band(slot(Q)) + p) mod N`, where `band(s) = floor(s * N / 16384)`.
pub fn partition_tag(queue: &str, partition: usize, partitions: usize) -> String {
    if partition == 0 {
        return queue.to_owned();
    }
    let want = (band(tag_slot(queue), partitions) + partition) % partitions;
    // Each candidate lands in the wanted band with probability 1/N: the search is short.
    (0u64..)
        .map(|k| format!("{queue}:{partition}:{k}"))
        .find(|tag| band(tag_slot(tag), partitions) == want)
        .expect("some k lands in every band")
}

/// The partition (0 to `partitions - 1`) job id `id` belongs to: `crc16(id) mod N`.
pub fn partition_of(id: &str, partitions: usize) -> usize {
    usize::from(crc16(id.as_bytes())) % partitions.max(1)
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
        if !valid_queue_chars(queue) {
            return Err(bad(
                "must be printable ASCII without spaces, braces or colons",
            ));
        }
        Ok(Keys {
            queue: queue.to_owned(),
            partition: 0,
            tag: queue.to_owned(),
            prefix: format!("forkbox:{{{queue}}}:"),
        })
    }

    /// The layout of partition `partition` of queue `queue` split into `partitions`.
    pub fn partition(queue: &str, partition: usize, partitions: usize) -> Result<Keys, KeyError> {
        let base = Keys::new(queue)?;
        if partitions == 0 || partitions > MAX_PARTITIONS || partition >= partitions {
            return Err(KeyError::InvalidPartitions {
                queue: queue.to_owned(),
                partitions,
            });
        }
        let tag = partition_tag(queue, partition, partitions);
        Ok(Keys {
            prefix: format!("forkbox:{{{tag}}}:"),
            partition,
            tag,
            ..base
        })
    }

    /// The queue's name.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Which partition of the queue these keys are (0 for an unpartitioned queue).
    pub fn partition_index(&self) -> usize {
        self.partition
    }

    /// The hash tag (`Q`, or `Q:p:k` for partition `p >= 1`).
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// `forkbox:{Q}:meta` — the queue's layout (hash: `partitions`), on partition 0 only.
    pub fn meta(&self) -> String {
        format!("forkbox:{{{}}}:meta", self.queue)
    }

    /// `forkbox:{T}:` — the prefix every key of the partition starts with.
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

    /// `forkbox:{Q}:wake:<id>` — a stream that gets one entry (the status) at completion and
    /// lives a few seconds ([`WAKE_LINGER_MS`]): waiters block on it with `XREAD`, a read-only
    /// command, so waiting needs no write right.
    pub fn wake(&self, id: &str) -> String {
        format!("{}wake:{id}", self.prefix)
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

    /// `forkbox:{Q}:batch-lines:<batch>` — input line number -> job id of the batch's jobs, as
    /// `forkbox batch submit` recorded them (hash).
    pub fn batch_lines(&self, batch: &str) -> String {
        format!("{}batch-lines:{batch}", self.prefix)
    }

    /// `forkbox:{Q}:cancelled` — cancelled ids (sorted set, score = cancel time in ms).
    pub fn cancelled(&self) -> String {
        format!("{}cancelled", self.prefix)
    }

    /// `forkbox:{Q}:cancel-ahead` — ids cancelled before any job had them (sorted set, score =
    /// when each cancel lapses, Unix ms); the enqueue script applies them.
    pub fn cancel_ahead(&self) -> String {
        format!("{}cancel-ahead", self.prefix)
    }

    /// `forkbox:{Q}:cancel` — the pub/sub channel a cancelled id is published on.
    pub fn cancel_channel(&self) -> String {
        format!("{}cancel", self.prefix)
    }

    /// `forkbox:{Q}:worker:<name>` — a worker's heartbeat (string with TTL).
    pub fn worker(&self, name: &str) -> String {
        format!("{}worker:{name}", self.prefix)
    }

    /// `forkbox:{Q}:runtimes:<name>` — what a live worker can run (JSON, same TTL as its
    /// heartbeat).
    pub fn runtimes(&self, name: &str) -> String {
        format!("{}runtimes:{name}", self.prefix)
    }

    /// `forkbox:{Q}:idem:<id>` — marks an id as enqueued (value: its stream entry id).
    pub fn idem(&self, id: &str) -> String {
        format!("{}idem:{id}", self.prefix)
    }

    /// `forkbox:{Q}:replies:<name>` — a stream a job of this queue may name as `reply_to`.
    pub fn replies(&self, name: &str) -> String {
        format!("{}{REPLIES_PREFIX}{name}", self.prefix)
    }

    /// `forkbox:{Q}:session:<sid>` — a session's record (hash: `node`, `state`, `reason`,
    /// `created_ms`, `expires_ms`, `idle_s`, `last_call_ms`, `spec`, `runtime`, ...).
    pub fn session(&self, sid: &str) -> String {
        format!("{}session:{sid}", self.prefix)
    }

    /// `forkbox:{Q}:sessions` — live session ids (sorted set, score = `expires_ms`).
    pub fn sessions(&self) -> String {
        format!("{}sessions", self.prefix)
    }

    /// `forkbox:{Q}:calls:<node>` — calls to the sessions of node `node` (stream, field
    /// `call`), read by that node alone.
    pub fn calls(&self, node: &str) -> String {
        format!("{}calls:{node}", self.prefix)
    }

    /// `forkbox:{Q}:call:<cid>` — a call's events (stream, field `event`).
    pub fn call(&self, cid: &str) -> String {
        format!("{}call:{cid}", self.prefix)
    }
}

fn valid_queue_chars(queue: &str) -> bool {
    queue
        .bytes()
        .all(|b| b.is_ascii_graphic() && !matches!(b, b'{' | b'}' | b':'))
}

/// Whether `tag` is a partition hash tag: a queue name, optionally followed by `:<p>:<k>`.
fn valid_tag(tag: &str) -> bool {
    let mut parts = tag.split(':');
    let queue = parts.next().unwrap_or_default();
    let rest: Vec<&str> = parts.collect();
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    !queue.is_empty()
        && queue.len() <= MAX_QUEUE_NAME_LEN
        && valid_queue_chars(queue)
        && (rest.is_empty() || (rest.len() == 2 && rest.iter().all(|s| digits(s))))
}

/// Splits a `reply_to` key `forkbox:{T}:replies:<name>` into `(T, name)`, `T` a partition's
/// hash tag (`Q`, or `Q:p:k` on a partitioned queue). Only that namespace
/// is accepted: it carries the queue's hash tag (one Cluster slot with the queue's other keys,
/// so the completion script may write it) and no key of the queue's own layout starts with
/// it, so a job cannot make a worker write into another job's result, a job stream, the
/// results or dead-letter stream, or another queue. The error says what is wrong.
pub fn parse_reply_to(key: &str) -> Result<(&str, &str), String> {
    let form = "must be forkbox:{<queue>}:replies:<name>";
    let rest = key
        .strip_prefix("forkbox:{")
        .ok_or_else(|| format!("{form} (the job's queue, then a name)"))?;
    let (queue, rest) = rest
        .split_once("}:")
        .ok_or_else(|| format!("{form}: no closing brace after the queue"))?;
    if !valid_tag(queue) {
        return Err(format!("{form}: {queue:?} is not a queue name"));
    }
    let name = rest.strip_prefix(REPLIES_PREFIX).ok_or_else(|| {
        format!("{form}: only keys under forkbox:{{{queue}}}:replies: may be named")
    })?;
    if name.is_empty() || name.len() > MAX_REPLY_NAME_LEN {
        return Err(format!(
            "{form}: the name must be 1 to {MAX_REPLY_NAME_LEN} characters"
        ));
    }
    if !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{form}: the name must be printable ASCII without spaces"
        ));
    }
    Ok((queue, name))
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
        assert_eq!(k.wake("a"), "forkbox:{default}:wake:a");
        assert_eq!(k.results(), "forkbox:{default}:results");
        assert_eq!(k.dead(), "forkbox:{default}:dead");
        assert_eq!(k.batch("b"), "forkbox:{default}:batch:b");
        assert_eq!(k.batch_lines("b"), "forkbox:{default}:batch-lines:b");
        assert_eq!(k.cancelled(), "forkbox:{default}:cancelled");
        assert_eq!(k.cancel_channel(), "forkbox:{default}:cancel");
        assert_eq!(k.worker("w1"), "forkbox:{default}:worker:w1");
        assert_eq!(k.idem("a"), "forkbox:{default}:idem:a");
        assert_eq!(k.replies("r"), "forkbox:{default}:replies:r");
        assert_eq!(k.session("s"), "forkbox:{default}:session:s");
        assert_eq!(k.sessions(), "forkbox:{default}:sessions");
        assert_eq!(k.calls("w1"), "forkbox:{default}:calls:w1");
        assert_eq!(k.call("c"), "forkbox:{default}:call:c");
    }

    #[test]
    fn reply_to_names_only_a_replies_stream() {
        assert_eq!(
            parse_reply_to("forkbox:{default}:replies:agent-1"),
            Ok(("default", "agent-1"))
        );
        let long = format!("forkbox:{{q}}:replies:{}", "x".repeat(129));
        for bad in [
            "",
            "r",
            "forkbox:{default}:replies:",
            "forkbox:{default}:results",
            "forkbox:{default}:result:a",
            "forkbox:{default}:done:a",
            "forkbox:{default}:wake:a",
            "forkbox:{default}:jobs",
            "forkbox:{default}:dead",
            "forkbox:{default}:batch:b",
            "forkbox:{default}:replies",
            "forkbox:{}:replies:a",
            "forkbox:{a b}:replies:a",
            "forkbox:{default}:replies:a b",
            "forkbox:{default}:replies:a\u{7f}",
            "forkbox:{default:replies:a",
            "other:{default}:replies:a",
            &long,
        ] {
            assert!(parse_reply_to(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_that_break_the_tag_are_refused() {
        for bad in ["", "a}b", "{a", "a b", "a:b", &"x".repeat(65)] {
            assert!(Keys::new(bad).is_err(), "{bad:?}");
        }
        assert!(Keys::new("high-priority_2.x").is_ok());
    }

    #[test]
    fn crc16_is_the_cluster_checksum() {
        // The reference value of the Redis Cluster specification, and slots redis-cli reports.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(tag_slot("foo"), 12182);
        assert_eq!(tag_slot("bar"), 5061);
    }

    #[test]
    fn one_partition_is_the_v1_layout() {
        assert_eq!(Keys::partition("q", 0, 1).unwrap(), Keys::new("q").unwrap());
        assert_eq!(partition_of("any-id", 1), 0);
    }

    #[test]
    fn partitions_land_in_different_bands() {
        for queue in ["default", "q", "evals", "high-priority_2.x"] {
            for n in [2usize, 3, 4, 7, 16] {
                let bands: std::collections::BTreeSet<usize> = (0..n)
                    .map(|p| band(tag_slot(Keys::partition(queue, p, n).unwrap().tag()), n))
                    .collect();
                assert_eq!(bands.len(), n, "{queue} over {n}");
            }
        }
        let k = Keys::partition("default", 1, 3).unwrap();
        assert!(k.tag().starts_with("default:1:"), "{}", k.tag());
        assert_eq!(k.jobs(), format!("forkbox:{{{}}}:jobs", k.tag()));
        assert_eq!(k.meta(), "forkbox:{default}:meta");
        assert_eq!(k.queue(), "default");
        assert_eq!(k.partition_index(), 1);
    }

    #[test]
    fn partition_counts_out_of_range_are_refused() {
        assert!(Keys::partition("q", 0, 0).is_err());
        assert!(Keys::partition("q", 3, 3).is_err());
        assert!(Keys::partition("q", 0, MAX_PARTITIONS + 1).is_err());
    }

    #[test]
    fn ids_spread_over_partitions() {
        let mut count = [0usize; 3];
        for i in 0..3000 {
            count[partition_of(&format!("job-{i}"), 3)] += 1;
        }
        assert!(count.iter().all(|&c| c > 800), "{count:?}");
    }

    #[test]
    fn reply_to_may_name_a_partition_stream() {
        assert_eq!(
            parse_reply_to("forkbox:{q:1:7}:replies:r"),
            Ok(("q:1:7", "r"))
        );
        for bad in [
            "forkbox:{q:1}:replies:r",
            "forkbox:{q:1:x}:replies:r",
            "forkbox:{q:1:2:3}:replies:r",
            "forkbox:{:1:2}:replies:r",
        ] {
            assert!(parse_reply_to(bad).is_err(), "{bad:?}");
        }
    }
}
