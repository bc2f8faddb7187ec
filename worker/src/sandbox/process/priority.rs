//! The processes' scheduling priority: the zygote raises its own where the host lets it (so the
//! watchdog's kills do not queue behind the jobs it watches), and every sandbox goes back down.

use std::sync::atomic::{AtomicI32, Ordering};

use nix::errno::Errno;

use crate::sandbox::kernel::sys;

/// The zygote's nice value when the host lets it raise its priority.
const ZYGOTE_NICE: i32 = -5;

/// The nice value the zygote was started with (the node's): set once, before the first
/// sandbox is forked, so each sandbox reads the value its zygote saw.
static NODE_NICE: AtomicI32 = AtomicI32::new(0);

/// In the zygote: remembers the node's priority, then raises its own if it may (only with
/// privilege; without, it stays the node's).
pub fn raise_zygote() {
    if let Ok(nice) = sys::nice() {
        NODE_NICE.store(nice, Ordering::Relaxed);
    }
    let _ = sys::set_nice(ZYGOTE_NICE);
}

/// In a sandbox's init: the normal priority, or the node's own where that is lower (a node
/// started under `nice` keeps its jobs there). Only ever down, which needs no privilege, so a
/// sandbox never inherits the zygote's raised priority.
pub fn reset_for_sandbox() -> Result<(), Errno> {
    sys::set_nice(NODE_NICE.load(Ordering::Relaxed).max(0))
}
