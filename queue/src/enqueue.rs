//! Putting jobs on a queue.
//!
//! Every enqueue goes through one Lua script that checks the id's idempotency marker and
//! result, adds the stream entry and sets the marker, so two clients racing to enqueue the same
//! id add it once. Ids that the caller leaves out are uuid v7 (time-ordered, so they sort like
//! the stream). Jobs added by other clients with a raw XADD skip all this and are still valid.

use crate::error::QueueError;
use crate::keys::JOB_FIELD;
use crate::queue::Queue;
use crate::schema::Job;
use crate::scripts::SCRIPTS;

/// Jobs per pipeline in [`Queue::enqueue_batch`]: bounds the memory of one round trip.
const BATCH_CHUNK: usize = 1000;

/// What happened to one enqueued job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id (assigned when the job had none).
    pub id: String,
    /// False when the id was already pending or had a live result, so nothing was added.
    pub new: bool,
    /// The stream entry id: this call's entry, or the first copy's while it is known.
    pub entry_id: Option<String>,
}

impl Queue {
    /// Enqueues `job` and returns its id. An id the job already carries is idempotent: see
    /// [`Queue::enqueue_idempotent`].
    pub async fn enqueue(&self, job: &Job) -> Result<String, QueueError> {
        Ok(self.enqueue_idempotent(job).await?.id)
    }

    /// Enqueues `job` unless a job with the same id is still pending or its result is alive
    /// (the marker `forkbox:{Q}:idem:<id>` lives `result_ttl_s` from enqueue and again from
    /// completion). A job without id gets a fresh uuid v7 and is always new.
    pub async fn enqueue_idempotent(&self, job: &Job) -> Result<Enqueued, QueueError> {
        let mut out = self.enqueue_chunk(std::slice::from_ref(job), None).await?;
        Ok(out.pop().expect("one job in, one result out"))
    }

    /// Enqueues `jobs` as members of batch `batch` (overriding their own `batch`), pipelined.
    /// The batch's `total` counts each job once, however often it is submitted.
    pub async fn enqueue_batch(
        &self,
        jobs: &[Job],
        batch: &str,
    ) -> Result<Vec<Enqueued>, QueueError> {
        let mut out = Vec::with_capacity(jobs.len());
        for chunk in jobs.chunks(BATCH_CHUNK) {
            out.extend(self.enqueue_chunk(chunk, Some(batch)).await?);
        }
        Ok(out)
    }

    async fn enqueue_chunk(
        &self,
        jobs: &[Job],
        batch: Option<&str>,
    ) -> Result<Vec<Enqueued>, QueueError> {
        let mut pipe = redis::pipe();
        let mut ids = Vec::with_capacity(jobs.len());
        let now = crate::queue::now_ms();
        for job in jobs {
            ids.push(self.add_enqueue(&mut pipe, job, batch, now)?);
        }
        let replies: Vec<(i64, String)> = self
            .broker
            .query_scripted(&pipe, &[&SCRIPTS.enqueue])
            .await
            .map_err(|source| QueueError::Enqueue {
                queue: self.name().to_owned(),
                source,
            })?;
        Ok(ids
            .into_iter()
            .zip(replies)
            .map(|(id, (new, entry))| Enqueued {
                id,
                new: new == 1,
                entry_id: (!entry.is_empty()).then_some(entry),
            })
            .collect())
    }

    /// Adds the enqueue script's call for `job` (as a member of `batch`, when given) to `pipe`
    /// and returns the job's id (a fresh uuid v7 when it has none); fails, adding nothing, when
    /// the job is not valid, not for this queue, or larger than the queue takes.
    pub(crate) fn add_enqueue(
        &self,
        pipe: &mut redis::Pipeline,
        job: &Job,
        batch: Option<&str>,
        now: u64,
    ) -> Result<String, QueueError> {
        let mut job = job.clone();
        if let Some(b) = batch {
            job.batch = Some(b.to_owned());
        }
        let id = job
            .id
            .get_or_insert_with(|| uuid::Uuid::now_v7().to_string())
            .clone();
        job.validate().map_err(QueueError::InvalidJob)?;
        crate::delivery::check_for_queue(&job, &self.keys).map_err(QueueError::InvalidJob)?;
        let payload = serde_json::to_string(&job).expect("a Job always serializes");
        if payload.len() > self.config.max_job_bytes {
            return Err(QueueError::InvalidJob(crate::schema::JobError::TooLarge {
                size: payload.len(),
                limit: self.config.max_job_bytes,
            }));
        }
        let batch_key = self.keys.batch(job.batch.as_deref().unwrap_or(""));
        pipe.invoke_script(
            SCRIPTS
                .enqueue
                .key(self.keys.jobs())
                .key(self.keys.idem(&id))
                .key(batch_key)
                .key(self.keys.cancel_ahead())
                .key(self.keys.cancelled())
                .arg(payload)
                .arg(self.ttl_for(job.result_ttl_s))
                .arg(if job.batch.is_some() { "1" } else { "0" })
                .arg(&id)
                .arg(now)
                .arg(self.publish_command())
                .arg(self.keys.cancel_channel()),
        );
        Ok(id)
    }

    /// Adds a raw payload as a job entry, exactly as `XADD forkbox:{Q}:jobs * job <payload>`
    /// from any client would: no validation, no id, no idempotency. For tests and tools.
    pub async fn enqueue_raw(&self, payload: &[u8]) -> Result<String, QueueError> {
        redis::cmd("XADD")
            .arg(self.keys.jobs())
            .arg("*")
            .arg(JOB_FIELD)
            .arg(payload)
            .query_async(&mut self.conn())
            .await
            .map_err(|source| QueueError::Enqueue {
                queue: self.name().to_owned(),
                source,
            })
    }
}
