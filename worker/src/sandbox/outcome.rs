//! How what a run observed folds into its [`Outcome`]: a pure function, so the precedence of
//! the statuses (a protocol contract) is tested as a table.
//!
//! Precedence, first match wins: a set-up failure (the program never ran; `cancelled` when our
//! own kill caused it, `invalid` when the job's input did, else `error`), then timeout >
//! cancelled > output > OOM (cgroup: a kill at the job's own limit is `memory_limit`, one for
//! memory outside it a plain kill that says so) > CPU (cgroup) > the init's report (its CPU
//! budget, a signal, the exit code; on top, out-of-memory evidence without a kill) > no report
//! (`error`).

use forkbox_queue::schema::{
    MemoryBound, Outcome, OutputMode, RuntimeUse, Status, EXIT_SANDBOX_ERROR, EXIT_TIMEOUT,
};

use super::cgroup::Accounting;
use super::limits::{self, MemoryEnforcement};
use super::wire::{Exit, Fault, Report};

/// The kills the engine itself asked for during a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Kills {
    /// The run's cancel future completed.
    pub cancelled: bool,
    /// stdout or stderr went past the output cap.
    pub output: bool,
    /// The job's cgroup used up its CPU time.
    pub cpu: bool,
}

impl Kills {
    pub fn any(&self) -> bool {
        self.cancelled || self.output || self.cpu
    }
}

/// One output stream as captured: at most the cap, and whether there was more.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Captured {
    pub bytes: Vec<u8>,
    pub truncated: bool,
}

/// Everything a run observed, gathered by the engine's event loop.
#[derive(Debug, Clone, Default)]
pub(super) struct Observed {
    /// The init's report, if it wrote one that parses.
    pub report: Option<Report>,
    /// The zygote's exit event (with a cgroup, or when the sandbox ended without a report).
    pub exit: Option<Exit>,
    pub kills: Kills,
    pub stdout: Captured,
    pub stderr: Captured,
    /// The cgroup's CPU time when the report arrived (the teardown after it is not the job's).
    pub cpu_at_report_us: Option<u64>,
    /// What the job's cgroup saw, when it had one.
    pub accounting: Option<Accounting>,
}

/// What the fold needs to know of the job itself.
#[derive(Debug, Clone, Default)]
pub(super) struct Terms {
    /// When the engine was asked to run it (CLOCK_MONOTONIC).
    pub requested_ns: i64,
    pub cpu_ms: u64,
    pub memory_mb: u64,
    pub memory: MemoryEnforcement,
    pub runtime: Option<RuntimeUse>,
    /// Whether output past the cap ends the job (`kill`) or is only cut (`truncate`).
    pub output_mode: OutputMode,
}

/// The `error` of a job the kernel's OOM killer took while it was under its own memory limit.
pub(super) const OOM_OUTSIDE_THE_LIMIT: &str =
    "killed by the kernel's OOM killer: the host (or the node's cgroup) ran out of memory, \
     not this job's memory limit";

/// Folds what a run observed into its outcome.
pub(super) fn fold(seen: Observed, terms: Terms) -> Outcome {
    let Observed {
        report,
        exit,
        kills,
        stdout,
        stderr,
        cpu_at_report_us,
        accounting,
    } = seen;
    let setup_error = report
        .as_ref()
        .and_then(|r| r.setup_error.clone())
        .or_else(|| exit.as_ref().and_then(|e| e.error.clone()));
    if let Some(error) = setup_error {
        if kills.cancelled {
            // Our own kill landed before the program started (the launcher was still
            // writing files, say): the job was cancelled, and its sandbox did not fail.
            return Outcome::not_run(Status::Cancelled, "cancelled before the program started");
        }
        if error.fault == Fault::Job {
            return Outcome::not_run(Status::Invalid, format!("job not run: {error}"));
        }
        let mut o = Outcome::not_run(
            Status::Error,
            format!("sandbox set-up failed, job not run: {error}"),
        );
        o.stderr = String::from_utf8_lossy(&stderr.bytes).into_owned();
        return o;
    }
    let exit = exit.unwrap_or_default();
    let exec_ns = report.as_ref().and_then(|r| r.exec_ns).or(exit.exec_ns);
    let exit_ns = report
        .as_ref()
        .and_then(|r| r.exit_ns)
        .unwrap_or(exit.exit_ns);
    // Without cgroups the peak is the largest process's, or the most the processes held
    // together at one of the init's checks if that is more, plus what the job held outside
    // its processes at the end (with cgroups, memory.peak has all of it).
    let (cpu_us, rss_kb) = match &report {
        Some(r) => (r.cpu_us, r.max_rss_kb.max(r.memory_counted_kb) + r.held_kb),
        None => (exit.cpu_us, exit.max_rss_kb),
    };
    let mut outcome = Outcome {
        status: Status::Ok,
        exit_code: 0,
        signal: None,
        timed_out: exit.timed_out,
        stdout: String::from_utf8_lossy(&stdout.bytes).into_owned(),
        stderr: String::from_utf8_lossy(&stderr.bytes).into_owned(),
        stdout_truncated: stdout.truncated,
        stderr_truncated: stderr.truncated,
        duration_ms: exec_ns
            .map(|e| (exit_ns - e).max(0) as f64 / 1e6)
            .unwrap_or(0.0),
        spawn_us: exec_ns
            .map(|e| ((e - terms.requested_ns).max(0) / 1000) as u64)
            .unwrap_or(0),
        cpu_ms: cpu_at_report_us
            .or(accounting.and_then(|a| a.cpu_us))
            .unwrap_or(cpu_us)
            / 1000,
        max_rss_kb: accounting.and_then(|a| a.memory_peak_kb).unwrap_or(rss_kb),
        memory_bound_by: Some(match terms.memory {
            MemoryEnforcement::Cgroup => MemoryBound::Cgroup,
            MemoryEnforcement::DataRlimit => MemoryBound::SandboxBudget,
        }),
        files: Default::default(),
        files_truncated: Vec::new(),
        watchdog_overshoot_us: exit.overshoot_ns.map(|ns| ns / 1000),
        error: None,
        runtime: terms.runtime,
        compile: None,
    };
    let killed_by = |o: &mut Outcome, status| {
        o.status = status;
        o.signal = Some(libc::SIGKILL);
        o.exit_code = 128 + libc::SIGKILL;
    };
    if exit.timed_out {
        killed_by(&mut outcome, Status::Timeout);
        outcome.exit_code = EXIT_TIMEOUT;
    } else if kills.cancelled {
        killed_by(&mut outcome, Status::Cancelled);
    } else if terms.output_mode == OutputMode::Kill
        && (kills.output || stdout.truncated || stderr.truncated)
    {
        // Past the cap the sandbox is killed (its pipes stay open until then); whichever of
        // the kill and our noticing came first, the job ended because of its output.
        killed_by(&mut outcome, Status::OutputLimit);
    } else if accounting.is_some_and(|a| a.oom_killed && a.out_of_memory) {
        killed_by(&mut outcome, Status::MemoryLimit);
    } else if accounting.is_some_and(|a| a.oom_killed) {
        // Killed for memory the host or the node's cgroup ran short of, with the job under
        // its own limit (sandboxes are the OOM killer's first choice): not the job's limit.
        killed_by(&mut outcome, Status::Signaled);
        outcome.error = Some(OOM_OUTSIDE_THE_LIMIT.into());
    } else if kills.cpu {
        killed_by(&mut outcome, Status::CpuLimit);
    } else if let Some(r) = report {
        if r.memory_budget_exceeded {
            // The init stopped the whole sandbox: its processes together held more than the
            // job's memory.
            killed_by(&mut outcome, Status::MemoryLimit);
        } else if r.cpu_budget_exceeded {
            // The init stopped the whole sandbox: its processes together used up the
            // job's CPU time. The program's own ending is what that kill made of it.
            outcome.status = Status::CpuLimit;
            outcome.signal = r.signal;
            outcome.exit_code = r
                .signal
                .map_or(r.exit_code.unwrap_or(EXIT_SANDBOX_ERROR), |s| 128 + s);
        } else if let Some(sig) = r.signal {
            let cpu_exhausted =
                sig == libc::SIGXCPU || (sig == libc::SIGKILL && outcome.cpu_ms >= terms.cpu_ms);
            outcome.status = if cpu_exhausted {
                Status::CpuLimit
            } else {
                Status::Signaled
            };
            outcome.signal = Some(sig);
            outcome.exit_code = 128 + sig;
        } else {
            let code = r.exit_code.unwrap_or(EXIT_SANDBOX_ERROR);
            outcome.exit_code = code;
            outcome.status = if code == 0 {
                Status::Ok
            } else {
                Status::Failed
            };
        }
        let failed = matches!(outcome.status, Status::Failed | Status::Signaled);
        let out_of_memory = match terms.memory {
            // Both words: the kernel's, that the job reached memory.max with nothing left to
            // reclaim and nothing was killed, and the runtime's, that an allocation failed.
            MemoryEnforcement::Cgroup => {
                failed
                    && accounting.is_some_and(|a| a.out_of_memory)
                    && limits::says_out_of_memory(&stderr.bytes)
            }
            MemoryEnforcement::DataRlimit => limits::out_of_memory_evident(
                failed,
                &stderr.bytes,
                outcome.max_rss_kb,
                terms.memory_mb,
            ),
        };
        if out_of_memory {
            outcome.status = Status::MemoryLimit;
        }
        outcome.files = r.files;
        outcome.files_truncated = r.files_truncated;
        outcome.error = r.collect_error;
    } else {
        outcome.status = Status::Error;
        outcome.exit_code = EXIT_SANDBOX_ERROR;
        outcome.error = Some("the sandbox init died without a report".into());
    }
    outcome
}

#[cfg(test)]
mod tests {
    use nix::errno::Errno;

    use super::super::wire::SetupError;
    use super::*;

    const KILL: i32 = libc::SIGKILL;

    fn report(exit_code: Option<i32>, signal: Option<i32>) -> Report {
        Report {
            exit_code,
            signal,
            exec_ns: Some(1_000_000),
            exit_ns: Some(3_000_000),
            cpu_us: 7_000,
            max_rss_kb: 900,
            ..Report::default()
        }
    }

    fn exited() -> Exit {
        Exit {
            exit_ns: 4_000_000,
            ..Exit::default()
        }
    }

    fn terms() -> Terms {
        Terms {
            requested_ns: 500_000,
            cpu_ms: 100,
            memory_mb: 64,
            memory: MemoryEnforcement::Cgroup,
            runtime: None,
            output_mode: OutputMode::Kill,
        }
    }

    /// With `output_mode: truncate` the cap only cuts: the program's own ending decides the
    /// status, and the flags say which stream was cut.
    #[test]
    fn truncated_output_keeps_the_programs_ending() {
        let cut = Captured {
            bytes: b"x".to_vec(),
            truncated: true,
        };
        let truncate = Terms {
            output_mode: OutputMode::Truncate,
            ..terms()
        };
        for (code, status) in [(0, Status::Ok), (3, Status::Failed)] {
            let seen = Observed {
                report: Some(report(Some(code), None)),
                stderr: cut.clone(),
                ..Observed::default()
            };
            let o = fold(seen.clone(), truncate.clone());
            assert_eq!((o.status, o.exit_code, o.signal), (status, code, None));
            assert!(o.stderr_truncated && !o.stdout_truncated);
            assert_eq!(fold(seen, terms()).status, Status::OutputLimit);
        }
    }

    /// Each row: what was observed, and the status, exit code and signal it must fold to.
    /// Rows stack observations so that each shows what wins over what.
    #[test]
    fn statuses_follow_their_precedence() {
        let kills = |cancelled, output, cpu| Kills {
            cancelled,
            output,
            cpu,
        };
        let all = kills(true, true, true);
        let oom = Some(Accounting {
            oom_killed: true,
            out_of_memory: true,
            ..Accounting::default()
        });
        let cut = Captured {
            bytes: b"x".to_vec(),
            truncated: true,
        };
        let timed_out = Exit {
            timed_out: true,
            overshoot_ns: Some(2_000),
            ..exited()
        };
        let base = Observed {
            report: Some(report(Some(0), None)),
            ..Observed::default()
        };
        let rows: Vec<(&str, Observed, Status, i32, Option<i32>)> = vec![
            (
                "timeout wins over every kill and the OOM",
                Observed {
                    exit: Some(timed_out.clone()),
                    kills: all,
                    stdout: cut.clone(),
                    accounting: oom,
                    report: Some(report(None, Some(KILL))),
                    ..Observed::default()
                },
                Status::Timeout,
                EXIT_TIMEOUT,
                Some(KILL),
            ),
            (
                "cancelled wins over output, OOM and CPU",
                Observed {
                    exit: Some(exited()),
                    kills: all,
                    stdout: cut.clone(),
                    accounting: oom,
                    ..Observed::default()
                },
                Status::Cancelled,
                128 + KILL,
                Some(KILL),
            ),
            (
                "output (the engine's kill) wins over OOM and CPU",
                Observed {
                    exit: Some(exited()),
                    kills: kills(false, true, true),
                    accounting: oom,
                    ..Observed::default()
                },
                Status::OutputLimit,
                128 + KILL,
                Some(KILL),
            ),
            (
                "output cut short without a kill noticed yet is output",
                Observed {
                    stderr: cut.clone(),
                    ..base.clone()
                },
                Status::OutputLimit,
                128 + KILL,
                Some(KILL),
            ),
            (
                "the cgroup's OOM kill wins over its CPU kill",
                Observed {
                    exit: Some(exited()),
                    kills: kills(false, false, true),
                    accounting: oom,
                    report: Some(report(None, Some(KILL))),
                    ..Observed::default()
                },
                Status::MemoryLimit,
                128 + KILL,
                Some(KILL),
            ),
            (
                "an OOM kill from outside the job's limit (host, node cgroup) is a plain kill",
                Observed {
                    exit: Some(exited()),
                    kills: kills(false, false, true),
                    accounting: Some(Accounting {
                        oom_killed: true,
                        ..Accounting::default()
                    }),
                    ..Observed::default()
                },
                Status::Signaled,
                128 + KILL,
                Some(KILL),
            ),
            (
                "the cgroup's CPU kill wins over the report",
                Observed {
                    kills: kills(false, false, true),
                    report: Some(report(Some(0), None)),
                    ..Observed::default()
                },
                Status::CpuLimit,
                128 + KILL,
                Some(KILL),
            ),
            (
                "the init's CPU budget keeps the program's own ending",
                Observed {
                    report: Some(Report {
                        cpu_budget_exceeded: true,
                        ..report(None, Some(KILL))
                    }),
                    ..Observed::default()
                },
                Status::CpuLimit,
                128 + KILL,
                Some(KILL),
            ),
            (
                "the init's CPU budget with an exit code",
                Observed {
                    report: Some(Report {
                        cpu_budget_exceeded: true,
                        ..report(Some(3), None)
                    }),
                    ..Observed::default()
                },
                Status::CpuLimit,
                3,
                None,
            ),
            (
                "the init's memory budget is the memory limit, whatever the program's ending",
                Observed {
                    report: Some(Report {
                        memory_budget_exceeded: true,
                        ..report(None, Some(KILL))
                    }),
                    ..Observed::default()
                },
                Status::MemoryLimit,
                128 + KILL,
                Some(KILL),
            ),
            (
                "SIGXCPU is the CPU rlimit",
                Observed {
                    report: Some(report(None, Some(libc::SIGXCPU))),
                    ..Observed::default()
                },
                Status::CpuLimit,
                128 + libc::SIGXCPU,
                Some(libc::SIGXCPU),
            ),
            (
                "SIGKILL after the whole CPU time is the CPU rlimit",
                Observed {
                    report: Some(Report {
                        cpu_us: 100_000,
                        ..report(None, Some(KILL))
                    }),
                    ..Observed::default()
                },
                Status::CpuLimit,
                128 + KILL,
                Some(KILL),
            ),
            (
                "SIGKILL before the CPU time is up is a signal",
                Observed {
                    report: Some(report(None, Some(KILL))),
                    ..Observed::default()
                },
                Status::Signaled,
                128 + KILL,
                Some(KILL),
            ),
            (
                "another signal",
                Observed {
                    report: Some(report(None, Some(libc::SIGSEGV))),
                    ..Observed::default()
                },
                Status::Signaled,
                128 + libc::SIGSEGV,
                Some(libc::SIGSEGV),
            ),
            ("exit 0", base.clone(), Status::Ok, 0, None),
            (
                "a non-zero exit",
                Observed {
                    report: Some(report(Some(3), None)),
                    ..Observed::default()
                },
                Status::Failed,
                3,
                None,
            ),
            (
                "a report with neither exit code nor signal",
                Observed {
                    report: Some(report(None, None)),
                    ..Observed::default()
                },
                Status::Failed,
                EXIT_SANDBOX_ERROR,
                None,
            ),
            (
                "no report",
                Observed {
                    exit: Some(exited()),
                    ..Observed::default()
                },
                Status::Error,
                EXIT_SANDBOX_ERROR,
                None,
            ),
        ];
        for (name, seen, status, exit_code, signal) in rows {
            let o = fold(seen, terms());
            assert_eq!(
                (o.status, o.exit_code, o.signal),
                (status, exit_code, signal),
                "{name}"
            );
            // Only that kill says why in `error`.
            let outside = o.error.as_deref() == Some(OOM_OUTSIDE_THE_LIMIT);
            assert_eq!(
                outside,
                name.starts_with("an OOM kill from outside"),
                "{name}"
            );
        }
    }

    #[test]
    fn a_failed_set_up_is_cancelled_invalid_or_error() {
        let failed = |error: SetupError, cancelled| Observed {
            exit: Some(Exit {
                error: Some(error),
                ..exited()
            }),
            kills: Kills {
                cancelled,
                ..Kills::default()
            },
            stderr: Captured {
                bytes: b"said".to_vec(),
                truncated: false,
            },
            ..Observed::default()
        };
        let cwd = SetupError::errno("cwd", Errno::ENOENT).at("/x").of_job();
        let rows = [
            (
                failed(cwd.clone(), true),
                Status::Cancelled,
                "cancelled before the program started",
                "",
            ),
            (
                failed(cwd, false),
                Status::Invalid,
                "job not run: cwd /x: ENOENT: No such file or directory",
                "",
            ),
            (
                failed(SetupError::errno("seccomp", Errno::EINVAL), false),
                Status::Error,
                "sandbox set-up failed, job not run: seccomp: EINVAL: Invalid argument",
                "said",
            ),
            (
                // The init's report carries it too, and it wins over a timeout.
                Observed {
                    report: Some(Report {
                        setup_error: Some(SetupError::errno("stdin", Errno::EBADF)),
                        ..Report::default()
                    }),
                    exit: Some(Exit {
                        timed_out: true,
                        ..exited()
                    }),
                    ..Observed::default()
                },
                Status::Error,
                "sandbox set-up failed, job not run: stdin: EBADF: Bad file number",
                "",
            ),
        ];
        for (seen, status, error, stderr) in rows {
            let o = fold(seen, terms());
            assert_eq!(o.status, status, "{error}");
            assert_eq!(o.exit_code, EXIT_SANDBOX_ERROR, "{error}");
            assert_eq!(o.error.as_deref(), Some(error));
            assert_eq!(o.stderr, stderr, "{error}");
        }
    }

    #[test]
    fn times_and_usage_come_from_the_best_source() {
        let seen = Observed {
            report: Some(report(Some(0), None)),
            exit: Some(Exit {
                overshoot_ns: Some(5_000),
                ..exited()
            }),
            ..Observed::default()
        };
        let o = fold(seen.clone(), terms());
        // From exec to exit, from the request to exec, the init's CPU time and RSS.
        assert_eq!((o.duration_ms, o.spawn_us), (2.0, 500));
        assert_eq!((o.cpu_ms, o.max_rss_kb), (7, 900));
        assert_eq!(o.watchdog_overshoot_us, Some(5));
        // What the job held outside its processes at the end adds to the largest one's peak.
        let mut holding = seen.clone();
        holding.report.as_mut().unwrap().held_kb = 4_000;
        assert_eq!(fold(holding.clone(), terms()).max_rss_kb, 4_900);
        // The init's sum over every process counts where it is above the largest one's.
        holding.report.as_mut().unwrap().memory_counted_kb = 3_000;
        assert_eq!(fold(holding.clone(), terms()).max_rss_kb, 7_000);
        holding.report.as_mut().unwrap().memory_counted_kb = 500;
        assert_eq!(fold(holding.clone(), terms()).max_rss_kb, 4_900);
        holding.report.as_mut().unwrap().memory_counted_kb = 0;
        // A cgroup's accounting wins; its CPU time as the report arrived wins over the total.
        let accounting = Some(Accounting {
            memory_peak_kb: Some(2_000),
            cpu_us: Some(40_000),
            oom_killed: false,
            out_of_memory: false,
        });
        let o = fold(
            Observed {
                accounting,
                ..seen.clone()
            },
            terms(),
        );
        assert_eq!((o.cpu_ms, o.max_rss_kb), (40, 2_000));
        // memory.peak has the held memory already.
        let o = fold(
            Observed {
                accounting,
                ..holding
            },
            terms(),
        );
        assert_eq!(o.max_rss_kb, 2_000);
        let o = fold(
            Observed {
                accounting,
                cpu_at_report_us: Some(30_000),
                ..seen.clone()
            },
            terms(),
        );
        assert_eq!(o.cpu_ms, 30);
        // Without a report, the zygote's view; the exec time from its exit event.
        let o = fold(
            Observed {
                exit: Some(Exit {
                    exec_ns: Some(2_000_000),
                    cpu_us: 3_000,
                    max_rss_kb: 10,
                    ..exited()
                }),
                ..Observed::default()
            },
            terms(),
        );
        assert_eq!((o.duration_ms, o.cpu_ms, o.max_rss_kb), (2.0, 3, 10));
        // Every outcome of a job that ran says what bounded its memory.
        assert_eq!(o.memory_bound_by, Some(MemoryBound::Cgroup));
        let fallback = Terms {
            memory: MemoryEnforcement::DataRlimit,
            ..terms()
        };
        let o = fold(seen.clone(), fallback);
        assert_eq!(o.memory_bound_by, Some(MemoryBound::SandboxBudget));
    }

    #[test]
    fn out_of_memory_without_a_kill_is_memory_limit_on_evidence() {
        let seen = |signal, peak_kb| Observed {
            report: Some(Report {
                max_rss_kb: peak_kb,
                ..report(Some(1), signal)
            }),
            stderr: Captured {
                bytes: b"MemoryError\n".to_vec(),
                truncated: false,
            },
            ..Observed::default()
        };
        let rlimit = Terms {
            memory: MemoryEnforcement::DataRlimit,
            ..terms()
        };
        assert_eq!(
            fold(seen(None, 60_000), rlimit.clone()).status,
            Status::MemoryLimit
        );
        // Far below the limit, or under a cgroup (which reports OOM itself): the program's own.
        assert_eq!(
            fold(seen(None, 1_000), rlimit.clone()).status,
            Status::Failed
        );
        assert_eq!(fold(seen(None, 60_000), terms()).status, Status::Failed);
        // Under a cgroup: the job reached memory.max with no kill (memory.events `oom`), and
        // then failed saying it ran out of memory: the memory limit. Without the message, or
        // having survived it, the program's own.
        let at_the_limit = |code, signal, stderr: &[u8]| Observed {
            accounting: Some(Accounting {
                out_of_memory: true,
                ..Accounting::default()
            }),
            report: Some(report(code, signal)),
            stderr: Captured {
                bytes: stderr.to_vec(),
                truncated: false,
            },
            ..Observed::default()
        };
        let says = b"Traceback (most recent call last):\nMemoryError\n".as_slice();
        for (code, signal, stderr, status) in [
            (Some(1), None, says, Status::MemoryLimit),
            (None, Some(libc::SIGABRT), says, Status::MemoryLimit),
            (Some(1), None, b"ValueError\n".as_slice(), Status::Failed),
            (Some(0), None, says, Status::Ok),
        ] {
            let o = fold(at_the_limit(code, signal, stderr), terms());
            assert_eq!(o.status, status, "{code:?} {signal:?}");
        }
        // The kernel's word is needed: the message alone under a cgroup is the program's own.
        assert_eq!(fold(seen(None, 60_000), terms()).status, Status::Failed);
        // Collected files and the collect error come from the report.
        let mut r = report(Some(0), None);
        r.files_truncated = vec!["big".into()];
        r.collect_error = Some("collect: EACCES".into());
        let o = fold(
            Observed {
                report: Some(r),
                ..Observed::default()
            },
            rlimit,
        );
        assert_eq!(o.files_truncated, vec!["big".to_owned()]);
        assert_eq!(o.error.as_deref(), Some("collect: EACCES"));
    }
}
