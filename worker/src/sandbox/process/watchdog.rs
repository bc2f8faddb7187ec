//! The watchdog: each running sandbox's deadline, an absolute CLOCK_MONOTONIC timerfd armed at
//! the program's exec plus its timeout, in the zygote's epoll loop. Absolute, so a late
//! wake-up of the zygote does not move the deadline; the kill goes through the init's pidfd,
//! so its precision is the scheduler's, not a polling tick's. The zygote handles deadlines
//! before any other ready event.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};

use crate::sandbox::isolate::setup_error::SetupError;
use crate::sandbox::kernel::clock::mono_ns;
use crate::sandbox::kernel::sys;

impl AsFd for Deadline {
    /// The timer, for the event loop: readable once the deadline passed.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.timer.as_fd()
    }
}

/// A sandbox's deadline.
pub(super) struct Deadline {
    timer: TimerFd,
    /// When it expires (CLOCK_MONOTONIC).
    at_ns: i64,
}

impl Deadline {
    /// Arms a deadline `timeout_ms` after the exec at `exec_ns`; the error is why no timer
    /// could be armed (the caller then kills the sandbox: a job never runs unwatched).
    pub fn arm(exec_ns: i64, timeout_ms: u64) -> Result<Deadline, SetupError> {
        let at_ns = exec_ns.saturating_add((timeout_ms as i64).saturating_mul(1_000_000));
        let timer = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_CLOEXEC | TimerFlags::TFD_NONBLOCK,
        )
        .map_err(|e| SetupError::errno("arm the watchdog (timerfd_create)", e))?;
        let at = TimeSpec::from_duration(std::time::Duration::from_nanos(at_ns.max(0) as u64));
        timer
            .set(
                Expiration::OneShot(at),
                TimerSetTimeFlags::TFD_TIMER_ABSTIME,
            )
            .map_err(|e| SetupError::errno("arm the watchdog (timerfd_settime)", e))?;
        Ok(Deadline { timer, at_ns })
    }

    /// Kills the sandbox whose init is `pidfd` (the whole pid namespace dies with it); returns
    /// the overshoot: how late the kill came, in nanoseconds.
    pub fn expire(&self, pidfd: &OwnedFd) -> i64 {
        let _ = sys::pidfd_kill(pidfd);
        mono_ns() - self.at_ns
    }
}
