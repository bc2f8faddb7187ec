//! One job, end to end: checks that need no sandbox, the payload, the hand-over, the wait for
//! its report and exit, and the fold into an [`Outcome`].

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use forkbox_queue::schema::{EffectiveLimits, Job, Outcome, Status};
use nix::errno::Errno;
use tokio::sync::mpsc;

use super::event_loop::RunEvents;
use super::events::Unregister;
use super::outcome::{self, Observed, Terms};
use super::output::{self, read_all, OutputChunk};
use super::payload::{exec_args_limit, exec_bytes, job_env, memfd_with, pipe};
use super::run_error::RunError;
use super::start::Engine;
use crate::sandbox::isolate::setup_error::SetupError;
use crate::sandbox::isolate::{cgroup, collect, limits};
use crate::sandbox::kernel::clock::mono_ns;
use crate::sandbox::process::stage;
use crate::sandbox::process::wire::{CompilePlan, Payload, StageReport, ToZygote};

/// How a run in a slot ended ([`Engine::run_in`]): its outcome and, when its set-up failed on
/// a system call (the engine's own, or one in the sandbox), that call's errno, as it was
/// known where it failed: the node tells a host short of descriptors or memory from the
/// errno, never from the outcome's text.
#[derive(Debug)]
pub struct RunEnd {
    pub outcome: Outcome,
    pub setup_errno: Option<Errno>,
}

impl RunEnd {
    fn of(outcome: Outcome) -> RunEnd {
        RunEnd {
            outcome,
            setup_errno: None,
        }
    }
}

/// One of an engine's slots, held while a job runs in it ([`Engine::slot`]).
#[derive(Debug)]
pub struct Slot {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Engine {
    /// Runs one job to completion in the next free slot: [`Engine::run_in`] without a cancel
    /// and without streaming its output.
    pub async fn run(&self, job: &Job) -> Outcome {
        let slot = self.slot().await;
        self.run_in(slot, job, std::future::pending(), None)
            .await
            .outcome
    }

    /// A slot outside the engine's count, for the node's own short work beside its jobs (its
    /// runtime probes, one at a time), so the jobs' slots stay theirs. Never for a job of a
    /// queue.
    pub fn slot_beside(&self) -> Slot {
        Slot { _permit: None }
    }

    /// Waits for one of the engine's `slots` (first come, first served): the only count of
    /// running jobs. A caller that orders jobs itself (the node's dispatcher) takes the slot
    /// first, so a job that waits for one has not reached the engine, then runs in it.
    pub async fn slot(&self) -> Slot {
        let permit = self.inner.slots.clone().acquire_owned().await;
        Slot {
            _permit: Some(permit.expect("the engine's slots are never closed")),
        }
    }

    /// Runs one job in a slot already taken ([`Engine::slot`]), given back when the job is over.
    /// When `cancel` completes first, the sandbox is killed and the outcome is `cancelled`;
    /// with `output`, stdout and stderr chunks are also sent there as they arrive (within the
    /// output cap).
    pub async fn run_in(
        &self,
        slot: Slot,
        job: &Job,
        cancel: impl std::future::Future<Output = ()>,
        output: Option<mpsc::UnboundedSender<OutputChunk>>,
    ) -> RunEnd {
        let _slot = slot;
        // The runtime's engine shares this one's slots: the slot holds there too.
        if let (Some(_), Some(runtime)) = (job.runtime, &self.runtime) {
            return Box::pin(runtime.execute_checked(job, cancel, output)).await;
        }
        self.execute_checked(job, cancel, output).await
    }

    /// Checks what needs no sandbox, then runs the job.
    async fn execute_checked(
        &self,
        job: &Job,
        cancel: impl std::future::Future<Output = ()>,
        output: Option<mpsc::UnboundedSender<OutputChunk>>,
    ) -> RunEnd {
        if let Err(e) = job
            .validate()
            .and_then(|()| self.inner.config.ceilings.check(job))
        {
            return RunEnd::of(Outcome::not_run(Status::Invalid, e.to_string()));
        }
        let exec = exec_bytes(job, &self.inner.config.work_dir);
        let exec_limit = exec_args_limit();
        if exec > exec_limit {
            return RunEnd::of(Outcome::not_run(
                Status::Invalid,
                format!(
                    "{}: the command and env take {exec} bytes at exec, over the {exec_limit} \
                     bytes this host's stack limit allows (a quarter of RLIMIT_STACK)",
                    if job.argv.is_some() { "argv" } else { "cmd" }
                ),
            ));
        }
        match self.execute(job, cancel, output).await {
            Ok(end) => end,
            Err(e) => RunEnd {
                outcome: Outcome::not_run(Status::Error, e.to_string()),
                setup_errno: e.errno(),
            },
        }
    }

    /// The job as the launcher needs it, and whether (and why not) it runs warm.
    pub(super) fn payload(
        &self,
        job: &Job,
        limits: EffectiveLimits,
    ) -> (Payload, Option<forkbox_queue::RuntimeUse>) {
        let inner = &self.inner;
        let mut payload = Payload {
            job: job.clone(),
            argv: job.command(),
            env: job_env(job, &inner.config.work_dir),
            limits,
            memory: if inner.cgroups.is_some() {
                limits::MemoryEnforcement::Cgroup
            } else {
                limits::MemoryEnforcement::DataRlimit
            },
            collect_max_bytes: inner.config.collect_max_bytes,
            warm: None,
            compile: job.compile.as_ref().map(|stage| CompilePlan {
                argv: stage.command(),
                limits: stage.resolve(&limits),
                timeout_ms: inner
                    .config
                    .ceilings
                    .compile_timeout_ms(job)
                    .unwrap_or_else(|| stage.timeout_ms()),
            }),
        };
        let runtime_use = job.runtime.map(|name| {
            let decision = self.warm_plan(job, &payload.argv, &payload.env);
            let (warm, note) = match decision {
                Ok(plan) => (Some(plan), None),
                Err(note) => (None, Some(note)),
            };
            payload.warm = warm;
            forkbox_queue::RuntimeUse {
                name,
                warm: payload.warm.is_some(),
                note,
            }
        });
        (payload, runtime_use)
    }

    async fn execute(
        &self,
        job: &Job,
        cancel: impl std::future::Future<Output = ()>,
        output: Option<mpsc::UnboundedSender<OutputChunk>>,
    ) -> Result<RunEnd, RunError> {
        let inner = &self.inner;
        if !inner.alive.load(Ordering::Acquire) {
            return Err(RunError::ZygoteGone);
        }
        let limits = job.limits.resolve(&inner.config.defaults);
        if let Some(refused) = files_past_disk(job, &limits) {
            return Ok(RunEnd::of(refused));
        }
        let (payload, runtime_use) = self.payload(job, limits);
        let payload_fd =
            memfd_with(&serde_json::to_vec(&payload).map_err(RunError::EncodePayload)?)?;
        let stdin_bytes = match &job.stdin {
            Some(data) => data.to_bytes().map_err(RunError::DecodeStdin)?,
            None => Vec::new(),
        };
        let stdin_fd = memfd_with(&stdin_bytes)?;
        let (stdout_r, stdout_w) = pipe()?;
        let (stderr_r, stderr_w) = pipe()?;
        let (report_r, report_w) = pipe()?;
        // A staged job's compile stage is reported on a socket of its own, read beside the run
        // (the init's report is lost when the sandbox is killed from outside); the engine
        // answers on it once the sandbox holds the run stage's limits.
        let stage_pipe = payload
            .compile
            .as_ref()
            .map(|_| stage_socket())
            .transpose()?;

        let requested_ns = mono_ns();
        let mut fds = vec![
            payload_fd.as_fd(),
            stdin_fd.as_fd(),
            stdout_w.as_fd(),
            stderr_w.as_fd(),
            report_w.as_fd(),
        ];
        if let Some((_, w)) = &stage_pipe {
            fds.push(w.as_fd());
        }
        let network = job.network.unwrap_or(inner.config.network_default);
        // What the sandbox as a whole may take: both stages' (the launcher holds the compile
        // stage to its own limits, the program's rlimits to the run stage's).
        let sandbox = match &payload.compile {
            Some(plan) => stage::sandbox_limits(&limits, plan),
            None => limits,
        };
        let stage_ms = payload
            .compile
            .as_ref()
            .map(|plan| plan.timeout_ms.saturating_add(stage::WATCHDOG_MARGIN_MS));
        let timeouts = (inner.config.ceilings.timeout_ms(job), stage_ms);
        let (req, events, cgroup_job, _) =
            self.hand_over(network, timeouts, false, &sandbox, &fds)?;
        drop(fds);
        let _unregister = Unregister {
            waiters: &inner.waiters,
            req,
        };
        drop((payload_fd, stdin_fd, stdout_w, stderr_w, report_w));
        // The stage's report carries its output, encoded (at most 6 bytes a byte, two streams).
        let stage_output = payload
            .compile
            .as_ref()
            .map_or(0, |plan| plan.limits.output_bytes.saturating_mul(12));
        let run_stage = cgroup_job.as_ref().map(|cg| cg.run_stage(&limits));
        let stage_report = stage_pipe.map(|(r, w)| {
            drop(w);
            tokio::spawn(between_stages(
                r,
                stage_output.saturating_add(64 * 1024),
                run_stage,
            ))
        });
        // From here on, a dropped future must not leave the sandbox running.
        let mut kill_guard = KillGuard {
            engine: self,
            req,
            armed: true,
        };

        let (capture, over_rx) = output::capture(stdout_r, stderr_r, limits.output_bytes, output);
        let mut capture = std::pin::pin!(capture);
        // The report carries the collected files, encoded, and a few fixed fields.
        let report = read_all(
            report_r,
            collect::encoded_bound(inner.config.collect_max_bytes).saturating_add(64 * 1024),
        );

        let mut watched = self
            .watch(
                RunEvents {
                    req,
                    events,
                    cgroup: cgroup_job,
                    over: over_rx,
                    report,
                    capture: capture.as_mut(),
                    assigned: None,
                },
                &sandbox,
                job.output_mode.unwrap_or_default(),
                cancel,
            )
            .await?;
        kill_guard.armed = false;
        let (stdout, stderr) = match watched.captured.take() {
            Some(both) => both,
            None => capture.await,
        };
        // The program's own figures, when its launcher lived to tell them.
        let run_measured = watched.report.as_ref().is_some_and(|r| r.run.is_some());
        let (compiled, accounting) =
            stage_and_accounting(stage_report, watched.cgroup.take(), run_measured).await;
        let watchdog_killed = watched.exit.as_ref().is_some_and(|e| e.timed_out);
        let observed = Observed {
            report: watched.report,
            exit: watched.exit,
            kills: watched.kills,
            stdout,
            stderr,
            cpu_at_report_us: watched.cpu_at_report_us,
            accounting,
        };
        let terms = Terms {
            requested_ns,
            cpu_ms: limits.cpu_ms,
            memory_mb: limits.memory_mb,
            memory: payload.memory,
            runtime: runtime_use,
            output_mode: job.output_mode.unwrap_or_default(),
        };
        let ended = stage::Ended {
            run_measured,
            watchdog_killed,
        };
        Ok(settle(
            observed,
            terms,
            payload.compile.as_ref(),
            compiled,
            ended,
        ))
    }
}

/// Once the sandbox is gone: the compile stage's report (a staged job's) and the cgroup's
/// accounting, the cgroup removed, with a staged program's peak its own
/// ([`stage::run_peak_kb`]).
async fn stage_and_accounting(
    stage_report: Option<tokio::task::JoinHandle<(Vec<u8>, Option<std::fs::File>)>>,
    cgroup: Option<cgroup::JobCgroup>,
    run_measured: bool,
) -> (Option<StageReport>, Option<cgroup::Accounting>) {
    let (compiled, run_peak_kb) = match stage_report {
        Some(task) => {
            let (report, peak) = task.await.unwrap_or_default();
            // Read before the cgroup goes.
            (
                stage::read_report(&report),
                peak.as_ref().and_then(cgroup::reset_peak_kb),
            )
        }
        None => (None, None),
    };
    let accounting = cgroup.and_then(|cg| {
        cg.finish()
            .map_err(|e| tracing::warn!("job cgroup left behind: {e}"))
            .ok()
    });
    let accounting = accounting.map(|a| cgroup::Accounting {
        memory_peak_kb: stage::run_peak_kb(a.memory_peak_kb, run_peak_kb, run_measured),
        ..a
    });
    (compiled, accounting)
}

/// A staged job's stage socket: the engine's end and the sandbox's.
fn stage_socket() -> Result<(OwnedFd, OwnedFd), RunError> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(RunError::StageSocket)
}

/// The engine's side of a staged job between its stages: reads the compile stage's report to
/// its end (at most `max` bytes) and, when the stage succeeded, sets the sandbox's cgroup (if
/// it has one) to the run stage's limits, then lets the program start. Returns the report and
/// the cgroup's `memory.peak` reset at the program's start, where the kernel has that. When
/// the limits cannot be set the program is not let start (its launcher stops the job).
async fn between_stages(
    sock: OwnedFd,
    max: u64,
    run_stage: Option<cgroup::RunStage>,
) -> (Vec<u8>, Option<std::fs::File>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let std_sock = std::os::unix::net::UnixStream::from(sock);
    let Ok(mut sock) = std_sock
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(std_sock))
    else {
        return (Vec::new(), None);
    };
    let mut report = Vec::new();
    let _ = (&mut sock).take(max).read_to_end(&mut report).await;
    if !stage::read_report(&report).is_some_and(|r| stage::succeeded(&r)) {
        return (report, None);
    }
    let peak = match run_stage {
        None => None,
        Some(run) => match tokio::task::spawn_blocking(move || run.apply()).await {
            Ok(Ok(peak)) => peak,
            Ok(Err(e)) => {
                tracing::warn!("staged job: setting the run stage's limits: {e}");
                return (report, None);
            }
            Err(_) => return (report, None),
        },
    };
    let _ = sock.write_all(&[stage::RUN_LIMITS_SET]).await;
    (report, peak)
}

/// A job whose files do not fit its disk: the launcher would run out of room writing them, a
/// fault of the job, not of the sandbox, so not worth a retry.
pub(super) fn files_past_disk(job: &Job, limits: &EffectiveLimits) -> Option<Outcome> {
    let file_bytes: u64 = job.files.values().map(|d| d.byte_len() as u64).sum();
    (file_bytes > limits.disk_mb * 1024 * 1024).then(|| {
        Outcome::not_run(
            Status::Invalid,
            format!(
                "files: {file_bytes} bytes do not fit the job's disk of {} MiB \
                 (limits.disk_mb)",
                limits.disk_mb
            ),
        )
    })
}

/// What a run observed, folded into its end: the outcome (a staged job's with its compile
/// stage settled) and the errno of a set-up that failed on a system call.
fn settle(
    observed: Observed,
    terms: Terms,
    compile: Option<&CompilePlan>,
    compiled: Option<StageReport>,
    ended: stage::Ended,
) -> RunEnd {
    let setup_errno = outcome::setup_error(&observed).and_then(SetupError::errno_value);
    let outcome = outcome::fold(observed, terms);
    let outcome = match compile {
        Some(plan) => stage::settle(outcome, compiled, plan, ended),
        None => outcome,
    };
    RunEnd {
        outcome,
        setup_errno,
    }
}

/// Kills the sandbox of a run whose future was dropped before it finished.
struct KillGuard<'a> {
    engine: &'a Engine,
    req: u64,
    armed: bool,
}

impl Drop for KillGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.engine.send(ToZygote::Kill { req: self.req });
        }
    }
}
