//! Taking over the entries of workers that died, and keeping live workers' entries.
//!
//! An entry stays in the pending list of the consumer it was delivered to until acknowledged.
//! A worker that runs a job refreshes its claim ([`Queue::refresh_claims`]) well within the
//! visibility timeout; an entry idle past the timeout therefore belongs to a dead or stuck
//! worker, and any worker may take it with [`Queue::reclaim`] (XAUTOCLAIM). Each claim counts
//! as a delivery; once a job has been handed out `max_attempts` times without a result it goes
//! to the dead-letter stream instead of being run again.

use crate::scripts::CheckedCall;
use std::collections::{HashMap, HashSet};

use redis::Value;

use crate::error::QueueError;
use crate::keys::GROUP;
use crate::queue::Queue;
use crate::reply;
use crate::schema::Status;
use crate::scripts::SCRIPTS;
use crate::Delivery;

/// Entries asked for per XAUTOCLAIM call; the cursor loop continues past it.
pub const RECLAIM_PAGE: usize = 100;

/// What one [`Queue::reclaim`] did.
#[derive(Debug, Default)]
pub struct Reclaimed {
    /// Entries now owned by the reclaiming consumer, to be run by it.
    pub deliveries: Vec<Delivery>,
    /// Entry ids moved to the dead-letter stream (attempts exhausted).
    pub dead_lettered: Vec<String>,
    /// Entries whose id already had a result: acknowledged and dropped.
    pub duplicates: usize,
    /// Pending entries whose stream entry had been deleted; Redis dropped them from the
    /// pending list (Redis 7 reports their ids; 6.2 does not, and they are not counted).
    pub deleted: Vec<String>,
    /// The scan stopped at `limit` before the end of the pending list: more idle entries may
    /// be waiting, so reclaim again as soon as slots are free rather than a period later.
    pub more: bool,
}

/// How idle [`Queue::hand_back`] makes an entry look: past any visibility timeout.
pub const HANDED_BACK_IDLE_MS: u64 = 86_400_000;

impl Queue {
    /// Claims for `consumer` the entries idle for at least `min_idle_ms` (normally the
    /// visibility timeout), looping XAUTOCLAIM on its cursor until it returns `0-0` or `limit`
    /// entries are held for running (pass the free slots). Entries whose delivery count now
    /// exceeds the job's `max_attempts` (else the queue's) are dead-lettered with reason
    /// `exceeded max_attempts (N deliveries)`, N being the deliveries that reached a worker;
    /// entries whose id has a result are acknowledged and dropped. Neither counts towards
    /// `limit`. A later call starts the scan again from the beginning.
    pub async fn reclaim(
        &self,
        consumer: &str,
        min_idle_ms: u64,
        limit: usize,
    ) -> Result<Reclaimed, QueueError> {
        let err = |source| QueueError::Reclaim {
            queue: self.name().to_owned(),
            source,
        };
        let jobs = self.keys.jobs();
        let mut out = Reclaimed::default();
        let mut cursor = "0-0".to_owned();
        let mut exhausted: Vec<(Delivery, String)> = Vec::new();
        let mut duplicates = Vec::new();
        loop {
            let page = (limit - out.deliveries.len()).min(RECLAIM_PAGE);
            if page == 0 {
                out.more = true;
                break;
            }
            let r: redis::RedisResult<Value> = redis::cmd("XAUTOCLAIM")
                .arg(&jobs)
                .arg(GROUP)
                .arg(consumer)
                .arg(min_idle_ms)
                .arg(&cursor)
                .arg("COUNT")
                .arg(page)
                .query_async(&mut self.conn())
                .await;
            let v = match r {
                Err(e) if e.code() == Some("NOGROUP") => {
                    self.recreate_lost_group().await?;
                    break;
                }
                r => r.map_err(err)?,
            };
            let (next, entries, deleted) =
                reply::autoclaim(&v).ok_or_else(|| QueueError::UnexpectedReply {
                    queue: self.name().to_owned(),
                    command: "XAUTOCLAIM",
                    detail: format!("{v:?}"),
                })?;
            out.deleted.extend(deleted);
            let gone: Vec<String> = entries
                .iter()
                .filter(|e| e.fields.is_none())
                .map(|e| e.id.clone())
                .collect();
            self.ack_and_delete(&gone).await.map_err(err)?;
            let entries: Vec<_> = entries.into_iter().filter(|e| e.fields.is_some()).collect();
            if !entries.is_empty() {
                // The delivery counts (XAUTOCLAIM does not return them) and whether a result
                // exists, for the whole page in one round trip.
                let mut pipe = redis::pipe();
                let mut deliveries = Vec::with_capacity(entries.len());
                for e in &entries {
                    pipe.cmd("XPENDING")
                        .arg(&jobs)
                        .arg(GROUP)
                        .arg(&e.id)
                        .arg(&e.id)
                        .arg(1);
                }
                for e in &entries {
                    let d = Delivery::from_entry(&self.keys, e, 1, self.config.max_job_bytes);
                    pipe.exists(self.keys.result(&d.id));
                    deliveries.push(d);
                }
                let replies: Vec<Value> = pipe.query_async(&mut self.conn()).await.map_err(err)?;
                let (pending, exists) = replies.split_at(entries.len());
                let counts: HashMap<String, u64> = pending
                    .iter()
                    .flat_map(reply::pending_rows)
                    .map(|(id, _, _, n)| (id, n))
                    .collect();
                for (mut d, has_result) in deliveries.into_iter().zip(exists) {
                    d.deliveries = counts.get(&d.entry_id).copied().unwrap_or(1);
                    let max = u64::from(d.max_attempts(self.config.max_attempts));
                    if reply::int(has_result) == Some(1) {
                        duplicates.push(d.entry_id);
                    } else if d.deliveries > max {
                        let reason = format!(
                            "exceeded max_attempts ({} deliveries)",
                            d.deliveries.saturating_sub(1)
                        );
                        // The dead letter records the deliveries that reached a worker.
                        d.deliveries = d.deliveries.saturating_sub(1).max(1);
                        exhausted.push((d, reason));
                    } else {
                        out.deliveries.push(d);
                    }
                }
            }
            if next == "0-0" {
                break;
            }
            cursor = next;
        }
        out.duplicates = duplicates.len();
        self.ack_and_delete(&duplicates).await.map_err(err)?;
        if !exhausted.is_empty() {
            let letters: Vec<(&Delivery, Status, &str)> = exhausted
                .iter()
                .map(|(d, r)| (d, Status::Error, r.as_str()))
                .collect();
            match self.dead_letter_as(&letters, consumer).await {
                Ok(_) => {}
                // One letter Redis refuses must not keep the others (and every later pass)
                // from being dead-lettered.
                Err(e) if e.is_refused() => {
                    for r in self.dead_letter_each(&letters, consumer).await {
                        r?;
                    }
                }
                Err(e) => return Err(e),
            }
            out.dead_lettered = exhausted.into_iter().map(|(d, _)| d.entry_id).collect();
        }
        Ok(out)
    }

    /// Takes back `consumer`'s own entries that a read was handed but whose reply never
    /// reached it: pending on `consumer`, idle at least `min_idle_ms`, and not in `skip` (the
    /// entries the caller holds or left pending on purpose). A reply is lost when its
    /// connection fails or times out after Redis handed the entries out, or when a cluster
    /// connection sends a command again after such a failure (the first reply is lost, the
    /// second reads other entries). Pass a `min_idle_ms` longer than any read may take to
    /// answer (the block time plus [`crate::RESPONSE_TIMEOUT`]), so that no read still on its
    /// way is taken. Each entry is claimed back (XCLAIM with its idle bound, so an entry
    /// another worker reclaimed meanwhile is left alone) with its delivery count unchanged:
    /// the lost delivery reached no worker, and this one stands for it. At most `limit`
    /// entries; those whose id already has a result are acknowledged and dropped.
    pub async fn recover_stranded(
        &self,
        consumer: &str,
        min_idle_ms: u64,
        skip: &HashSet<String>,
        limit: usize,
    ) -> Result<Vec<Delivery>, QueueError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let err = |source| QueueError::Reclaim {
            queue: self.name().to_owned(),
            source,
        };
        let jobs = self.keys.jobs();
        let rows: Value = match redis::cmd("XPENDING")
            .arg(&jobs)
            .arg(GROUP)
            .arg("IDLE")
            .arg(min_idle_ms)
            .arg("-")
            .arg("+")
            .arg(skip.len() + limit)
            .arg(consumer)
            .query_async(&mut self.conn())
            .await
        {
            Err(e) if e.code() == Some("NOGROUP") => return Ok(Vec::new()),
            r => r.map_err(err)?,
        };
        let stranded: Vec<(String, u64)> = reply::pending_rows(&rows)
            .into_iter()
            .filter(|(id, owner, _, _)| owner == consumer && !skip.contains(id))
            .take(limit)
            .map(|(id, _, _, n)| (id, n))
            .collect();
        if stranded.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for (id, n) in &stranded {
            pipe.cmd("XCLAIM")
                .arg(&jobs)
                .arg(GROUP)
                .arg(consumer)
                .arg(min_idle_ms)
                .arg(id)
                .arg("RETRYCOUNT")
                .arg(*n);
        }
        let claimed: Vec<Value> = pipe.query_async(&mut self.conn()).await.map_err(err)?;
        let counts: HashMap<&str, u64> = stranded.iter().map(|(id, n)| (id.as_str(), *n)).collect();
        let out: Vec<Delivery> = claimed
            .iter()
            .flat_map(reply::entries)
            .filter(|e| e.fields.is_some())
            .map(|e| {
                let n = counts.get(e.id.as_str()).copied().unwrap_or(1);
                Delivery::from_entry(&self.keys, &e, n, self.config.max_job_bytes)
            })
            .collect();
        // Claimed now: a failed check must not drop them (their idle time starts again).
        match self.discard_completed(out.clone()).await {
            Ok((keep, _)) => Ok(keep),
            Err(_) => Ok(out),
        }
    }

    /// Hands `consumer`'s entries back for any worker to take now: each `(entry id, delivery
    /// count)` still owned by `consumer` is made to look idle for [`HANDED_BACK_IDLE_MS`]
    /// (past any visibility timeout, so the next [`Queue::reclaim`] anywhere takes it) and its
    /// delivery count is set one lower, so that the reclaim's count is the attempt this
    /// worker was given: a worker that cannot run jobs charges none to them. Entries owned by
    /// another consumer or acknowledged meanwhile are left alone. One round trip; returns how
    /// many were handed back.
    pub async fn hand_back(
        &self,
        consumer: &str,
        entries: &[(&str, u64)],
    ) -> Result<u64, QueueError> {
        if entries.is_empty() {
            return Ok(0);
        }
        let idle = HANDED_BACK_IDLE_MS.max(self.config.visibility_timeout_ms.saturating_mul(2));
        let mut inv = SCRIPTS.hand_back.key(self.keys.jobs());
        inv.arg(GROUP).arg(consumer).arg(idle);
        for (entry_id, deliveries) in entries {
            inv.arg(*entry_id).arg(deliveries.saturating_sub(1));
        }
        inv.checked()
            .checked()
            .invoke_async(&mut self.conn())
            .await
            .map_err(|source| QueueError::HandBack {
                queue: self.name().to_owned(),
                source,
            })
    }

    /// Resets the idle time of `consumer`'s running entries (XCLAIM `0` JUSTID: no delivery
    /// count bump) so the reclaimer leaves them alone; call it every third of the visibility
    /// timeout or so. Returns the entry ids the consumer no longer owns: another worker
    /// reclaimed them (this worker stalled past the timeout) or they were acknowledged. The
    /// worker may stop such a job; completing it anyway is harmless (the first result wins).
    /// A consumer group found gone (Redis lost its data) is made again, and every one of
    /// `entry_ids` is returned: they went with it.
    pub async fn refresh_claims(
        &self,
        consumer: &str,
        entry_ids: &[String],
    ) -> Result<Vec<String>, QueueError> {
        if entry_ids.is_empty() {
            return Ok(Vec::new());
        }
        let r = SCRIPTS
            .refresh_claims
            .key(self.keys.jobs())
            .arg(GROUP)
            .arg(consumer)
            .arg(entry_ids)
            .checked()
            .invoke_async(&mut self.conn())
            .await;
        match r {
            // A script's error carries the code after the script's own words.
            Err(e) if e.code() == Some("NOGROUP") || e.to_string().contains("NOGROUP") => {
                self.recreate_lost_group().await?;
                Ok(entry_ids.to_vec())
            }
            r => r.map_err(|source| QueueError::RefreshClaims {
                queue: self.name().to_owned(),
                source,
            }),
        }
    }
}
