//! What becomes of a delivery once its run is over: stored, dead-lettered, left pending or
//! handed back.
//!
//! The job task gathers what it observed (the outcome's status and error, whether the stop
//! reached `Kill` during the run, whether the sandbox zygote is still alive, the delivery
//! count and the job's attempt limit); [`disposition`] decides from that alone. Which
//! liveness check the sandbox needs first is decided by [`SandboxCheck::after`], so a job's
//! own failure never pays for the wait a set-up fault does.

use forkbox_queue::Status;

/// How the job task learns whether the sandbox is still alive before it decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SandboxCheck {
    /// No need: the run went well, or was killed at the end of the grace period.
    Skip,
    /// Ask the engine now.
    Now,
    /// Give the engine a moment to notice a zygote that died under a set-up fault.
    Settled,
}

impl SandboxCheck {
    pub(crate) fn after(status: Status, killed: bool) -> SandboxCheck {
        if abandoned(status, killed) {
            return SandboxCheck::Skip;
        }
        match status {
            Status::Ok => SandboxCheck::Skip,
            Status::Error => SandboxCheck::Settled,
            _ => SandboxCheck::Now,
        }
    }
}

/// What the job task observed of one run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ran<'a> {
    pub status: Status,
    /// The outcome's error text, if any.
    pub error: Option<&'a str>,
    /// The stop reached `Kill` while the job ran.
    pub killed: bool,
    /// The answer of the [`SandboxCheck`] (true when it was skipped).
    pub sandbox_alive: bool,
    /// The node was short of its own resources (descriptors, memory) when the run failed.
    pub node_short: bool,
    /// Deliveries of this entry so far, this one included.
    pub deliveries: u64,
    /// The job's own attempt limit, or the queue's.
    pub max_attempts: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Disposition {
    /// A result (`ok`, `failed`, `timeout`, `cancelled`, ...): stored.
    Store,
    /// Dead-lettered with this status and reason.
    DeadLetter { status: Status, reason: String },
    /// A sandbox set-up fault with deliveries left: left pending for the reclaimer to retry.
    Retry,
    /// Killed because the grace period ran out: left pending, untouched, counted abandoned.
    Abandon,
    /// The run failed because the sandbox zygote is gone, or its set-up because the node ran
    /// short of descriptors or memory: a fault of the node, not of the job, so it is handed
    /// back for another node, no attempt charged.
    HandBack,
}

fn abandoned(status: Status, killed: bool) -> bool {
    killed && status == Status::Cancelled
}

pub(crate) fn disposition(ran: &Ran<'_>) -> Disposition {
    if abandoned(ran.status, ran.killed) {
        return Disposition::Abandon;
    }
    // A run that ended badly while the zygote died is the node's fault, whatever status it got
    // (a sandbox killed with its zygote looks `signaled`): rerun elsewhere.
    if ran.status != Status::Ok && !ran.sandbox_alive {
        return Disposition::HandBack;
    }
    if ran.status == Status::Error && ran.node_short {
        return Disposition::HandBack;
    }
    match ran.status {
        Status::Error if ran.deliveries >= u64::from(ran.max_attempts) => Disposition::DeadLetter {
            status: Status::Error,
            reason: format!(
                "sandbox set-up failed on all {} deliveries; last: {}",
                ran.deliveries,
                ran.error.unwrap_or_default()
            ),
        },
        Status::Error => Disposition::Retry,
        // The job's own fault (refused by the node, files or a working directory that cannot
        // be set up): dead-lettered as `invalid`, as a malformed job is.
        Status::Invalid => Disposition::DeadLetter {
            status: Status::Invalid,
            reason: ran.error.unwrap_or("invalid job").to_owned(),
        },
        _ => Disposition::Store,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(status: Status) -> Ran<'static> {
        Ran {
            status,
            error: None,
            killed: false,
            sandbox_alive: true,
            node_short: false,
            deliveries: 1,
            max_attempts: 3,
        }
    }

    fn dead(status: Status, reason: &str) -> Disposition {
        Disposition::DeadLetter {
            status,
            reason: reason.to_owned(),
        }
    }

    #[test]
    fn every_branch_of_the_disposition() {
        use Disposition::*;
        let fault = Some("mount failed");
        let cases: Vec<(&str, Ran, Disposition)> = vec![
            ("ok", ran(Status::Ok), Store),
            ("failed", ran(Status::Failed), Store),
            ("timeout", ran(Status::Timeout), Store),
            ("cpu", ran(Status::CpuLimit), Store),
            ("memory", ran(Status::MemoryLimit), Store),
            ("output", ran(Status::OutputLimit), Store),
            ("signaled", ran(Status::Signaled), Store),
            ("cancelled by a client", ran(Status::Cancelled), Store),
            (
                "killed at the end of the grace period",
                Ran {
                    killed: true,
                    ..ran(Status::Cancelled)
                },
                Abandon,
            ),
            (
                "killed, zygote gone too",
                Ran {
                    killed: true,
                    sandbox_alive: false,
                    ..ran(Status::Cancelled)
                },
                Abandon,
            ),
            (
                "finished on its own as the kill came",
                Ran {
                    killed: true,
                    ..ran(Status::Failed)
                },
                Store,
            ),
            (
                "ok although the zygote is gone",
                Ran {
                    sandbox_alive: false,
                    ..ran(Status::Ok)
                },
                Store,
            ),
            (
                "signaled with its zygote",
                Ran {
                    sandbox_alive: false,
                    ..ran(Status::Signaled)
                },
                HandBack,
            ),
            (
                "set-up fault, zygote gone",
                Ran {
                    sandbox_alive: false,
                    deliveries: 3,
                    ..ran(Status::Error)
                },
                HandBack,
            ),
            (
                "set-up fault of the node's descriptors, on the last delivery",
                Ran {
                    error: Some("memfd: EMFILE: Too many open files"),
                    node_short: true,
                    deliveries: 3,
                    ..ran(Status::Error)
                },
                HandBack,
            ),
            (
                "a job's own failure while the node is short",
                Ran {
                    node_short: true,
                    ..ran(Status::Failed)
                },
                Store,
            ),
            (
                "invalid, zygote gone",
                Ran {
                    sandbox_alive: false,
                    ..ran(Status::Invalid)
                },
                HandBack,
            ),
            (
                "set-up fault with deliveries left",
                Ran {
                    error: fault,
                    deliveries: 2,
                    ..ran(Status::Error)
                },
                Retry,
            ),
            (
                "set-up fault on the last delivery",
                Ran {
                    error: fault,
                    deliveries: 3,
                    ..ran(Status::Error)
                },
                dead(
                    Status::Error,
                    "sandbox set-up failed on all 3 deliveries; last: mount failed",
                ),
            ),
            (
                "set-up fault past the last delivery, no text",
                Ran {
                    deliveries: 4,
                    ..ran(Status::Error)
                },
                dead(
                    Status::Error,
                    "sandbox set-up failed on all 4 deliveries; last: ",
                ),
            ),
            (
                "invalid with a reason",
                Ran {
                    error: Some("disk_mb over the node's maximum"),
                    ..ran(Status::Invalid)
                },
                dead(Status::Invalid, "disk_mb over the node's maximum"),
            ),
            (
                "invalid without a reason",
                ran(Status::Invalid),
                dead(Status::Invalid, "invalid job"),
            ),
        ];
        for (name, input, want) in cases {
            assert_eq!(disposition(&input), want, "{name}");
        }
    }

    #[test]
    fn only_a_set_up_fault_waits_for_the_engine() {
        use SandboxCheck::*;
        for status in Status::ALL {
            let want = match status {
                Status::Ok => Skip,
                Status::Error => Settled,
                _ => Now,
            };
            assert_eq!(SandboxCheck::after(status, false), want, "{status:?}");
            let killed = if status == Status::Cancelled {
                Skip
            } else {
                want
            };
            assert_eq!(
                SandboxCheck::after(status, true),
                killed,
                "{status:?} killed"
            );
        }
    }
}
