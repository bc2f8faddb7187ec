//! Helpers shared by the sandbox test binaries.

use std::time::{Duration, Instant};

/// Polls `f` every 20 ms until it holds or `deadline` has passed; the last answer.
pub fn wait_until(deadline: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}
