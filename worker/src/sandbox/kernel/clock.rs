//! The one clock every process of the sandbox tree stamps its events with, so that the engine,
//! the zygote and each init can subtract each other's times.

/// CLOCK_MONOTONIC in nanoseconds; shared by the engine and the zygote.
pub fn mono_ns() -> i64 {
    let ts =
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    ts.tv_sec() * 1_000_000_000 + ts.tv_nsec()
}
