//! The pure parts of serving sessions: the capacity check, a call's output cap, and when a
//! session is due to end. No Redis, no sandbox: unit-tested here.

use std::time::{Duration, Instant};

use forkbox_queue::session::EndReason;
use forkbox_queue::Event;
use serde_json::Value;

use crate::node::config::SessionSettings;

/// Why a node refuses a new session: the message names the limit.
pub(crate) fn capacity_refusal(
    settings: &SessionSettings,
    node: &str,
    live: usize,
    live_memory_mb: u64,
    memory_mb: u64,
) -> Option<String> {
    if live >= settings.max_sessions {
        return Some(format!(
            "session capacity: {live} of {} sessions live on node {node} (--max-sessions)",
            settings.max_sessions
        ));
    }
    if live_memory_mb + memory_mb > settings.memory_mb {
        return Some(format!(
            "session capacity: {memory_mb} MiB asked with {live_memory_mb} of {} MiB of session \
             memory in use on node {node} (--session-memory-mb)",
            settings.memory_mb
        ));
    }
    None
}

/// One call's output as it streams: `stdout`/`stderr` events pass until their bytes reach
/// `cap` (the create job's `limits.output_bytes`); the event that crosses it is cut, the rest
/// dropped, and the result's own `stdout`/`stderr` are cut to the cap.
#[derive(Debug)]
pub(crate) struct CallOutput {
    cap: u64,
    streamed: u64,
    pub(crate) truncated: bool,
}

impl CallOutput {
    pub(crate) fn new(cap: u64) -> CallOutput {
        CallOutput {
            cap,
            streamed: 0,
            truncated: false,
        }
    }

    /// The event to relay for `event`, if any.
    pub(crate) fn pass(&mut self, event: Event) -> Option<Event> {
        match event {
            Event::Stdout { data } => self.cut(data).map(|data| Event::Stdout { data }),
            Event::Stderr { data } => self.cut(data).map(|data| Event::Stderr { data }),
            Event::Result(mut r) => {
                for key in ["stdout", "stderr"] {
                    if let Some(Value::String(s)) = r.get_mut(key) {
                        if s.len() as u64 > self.cap {
                            truncate_utf8(s, self.cap as usize);
                            self.truncated = true;
                        }
                    }
                }
                if self.truncated {
                    r.insert("output_truncated".into(), Value::Bool(true));
                }
                Some(Event::Result(r))
            }
            other => Some(other),
        }
    }

    fn cut(&mut self, mut data: String) -> Option<String> {
        let room = self.cap.saturating_sub(self.streamed);
        if room == 0 {
            self.truncated |= !data.is_empty();
            return None;
        }
        if data.len() as u64 > room {
            truncate_utf8(&mut data, room as usize);
            self.truncated = true;
        }
        self.streamed += data.len() as u64;
        Some(data)
    }
}

/// Cuts `s` to at most `max` bytes, at a character boundary.
fn truncate_utf8(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut at = max;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s.truncate(at);
}

/// A session's clocks: its end of life, its idle timeout, and the backstop of the call it
/// runs.
#[derive(Debug, Clone)]
pub(crate) struct Clocks {
    pub(crate) expires: Instant,
    pub(crate) idle: Duration,
    /// When the last call came or ended.
    pub(crate) last_activity: Instant,
    /// The running call's backstop: no terminal event by then ends the session.
    pub(crate) backstop: Option<Instant>,
}

impl Clocks {
    /// Why the session is due to end at `now`, if it is: `busy` says whether a call runs or
    /// waits (a session is idle only when none does).
    pub(crate) fn due(&self, now: Instant, busy: bool) -> Option<(EndReason, String)> {
        if now >= self.expires {
            return Some((EndReason::Ttl, "the session reached its ttl".into()));
        }
        if let Some(b) = self.backstop {
            if now >= b {
                return Some((
                    EndReason::Crashed,
                    "unresponsive: no answer to a call within its timeout_ms and 5 s".into(),
                ));
            }
        }
        if !busy && now >= self.last_activity + self.idle {
            return Some((
                EndReason::Idle,
                format!("no call for idle_s ({} s)", self.idle.as_secs()),
            ));
        }
        None
    }

    /// The next time [`Clocks::due`] may say something new.
    pub(crate) fn next(&self, busy: bool) -> Instant {
        let mut at = self.expires;
        if let Some(b) = self.backstop {
            at = at.min(b);
        }
        if !busy {
            at = at.min(self.last_activity + self.idle);
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_names_the_limit() {
        let s = SessionSettings {
            max_sessions: 2,
            memory_mb: 1000,
            ..SessionSettings::default()
        };
        assert_eq!(capacity_refusal(&s, "n", 1, 500, 500), None);
        let full = capacity_refusal(&s, "n", 2, 0, 1).unwrap();
        assert_eq!(
            full,
            "session capacity: 2 of 2 sessions live on node n (--max-sessions)"
        );
        let mem = capacity_refusal(&s, "n", 1, 600, 500).unwrap();
        assert!(mem.contains("--session-memory-mb"), "{mem}");
    }

    #[test]
    fn output_stops_at_the_cap_and_the_result_says_so() {
        let mut o = CallOutput::new(5);
        assert_eq!(
            o.pass(Event::Stdout { data: "abc".into() }),
            Some(Event::Stdout { data: "abc".into() })
        );
        assert_eq!(
            o.pass(Event::Stderr {
                data: "déf".into()
            }),
            Some(Event::Stderr { data: "d".into() })
        );
        // The cut fell on a character boundary: one byte of room is left.
        assert_eq!(
            o.pass(Event::Stdout { data: "xy".into() }),
            Some(Event::Stdout { data: "x".into() })
        );
        assert_eq!(o.pass(Event::Stdout { data: "z".into() }), None);
        let result = serde_json::json!({"kind": "result", "ok": true, "stdout": "abcdefgh"});
        let Some(Event::Result(r)) = o.pass(serde_json::from_value(result).unwrap()) else {
            panic!("a result passes");
        };
        assert_eq!(r["stdout"], "abcde");
        assert_eq!(r["output_truncated"], true);
    }

    #[test]
    fn a_session_ends_at_its_first_due_clock() {
        let t0 = Instant::now();
        let c = Clocks {
            expires: t0 + Duration::from_secs(100),
            idle: Duration::from_secs(10),
            last_activity: t0,
            backstop: None,
        };
        assert!(c.due(t0 + Duration::from_secs(5), false).is_none());
        assert_eq!(
            c.due(t0 + Duration::from_secs(11), false).unwrap().0,
            EndReason::Idle
        );
        // A call running is not idleness.
        assert!(c.due(t0 + Duration::from_secs(11), true).is_none());
        assert_eq!(
            c.due(t0 + Duration::from_secs(100), true).unwrap().0,
            EndReason::Ttl
        );
        let running = Clocks {
            backstop: Some(t0 + Duration::from_secs(20)),
            ..c.clone()
        };
        assert_eq!(
            running.due(t0 + Duration::from_secs(21), true).unwrap().0,
            EndReason::Crashed
        );
        assert_eq!(running.next(true), t0 + Duration::from_secs(20));
        assert_eq!(c.next(false), t0 + Duration::from_secs(10));
    }
}
