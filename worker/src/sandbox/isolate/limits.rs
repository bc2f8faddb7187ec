//! How a job's limits map onto the kernel's mechanisms, on either kind of host.
//!
//! Memory is bounded as resident memory, never as address space: V8, the JVM, Go and BEAM
//! reserve gigabytes of `PROT_NONE` address space up front and touch only what they use, so an
//! address-space limit (`RLIMIT_AS`) stops them before they start. With cgroup v2 the job's
//! cgroup has `memory.max` and no memory rlimit at all. Without cgroups the program gets
//! `RLIMIT_DATA`, which counts writable private mappings (heap, anonymous memory) but not
//! reservations without access: runtimes start, and a program that keeps allocating gets
//! `ENOMEM`. The kernel reports nothing about such a failure, so whether it ended the program
//! is decided from what can be observed ([`out_of_memory_evident`]). (A cgroup reports more:
//! memory.events `oom` counts the times the job reached `memory.max` with nothing left to
//! reclaim and the kernel went to its OOM path, which usually kills; see `outcome::fold`.)
//!
//! Whatever the limits, a sandbox's processes are the kernel OOM killer's first choice on the
//! host ([`rank_first_for_oom`]), and a job cannot make itself unkillable when the node can
//! prevent it ([`floor_oom_score`]).

use forkbox_queue::schema::EffectiveLimits;
use nix::sys::resource::{rlim_t, setrlimit, Resource};
use serde::{Deserialize, Serialize};

/// An rlimit the launcher could not set.
#[derive(Debug, thiserror::Error)]
#[error("{name}: {errno}")]
pub struct RlimitError {
    /// Names the step (`rlimit pids`, ...).
    pub name: &'static str,
    pub errno: nix::errno::Errno,
}

/// What bounds the program's memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryEnforcement {
    /// The job's cgroup (`memory.max`, `memory.swap.max=0`): no memory rlimit.
    Cgroup,
    /// `RLIMIT_DATA` per process.
    #[default]
    DataRlimit,
}

/// A sandbox's `oom_score_adj` (-1000 to 1000): the highest, so that a job starts as the OOM
/// killer's first choice when the host or the node's cgroup runs out of memory, whatever
/// `oom_score_adj` the node itself runs at (an `OOMScoreAdjust=-1000` would otherwise pass to
/// every job and make it unkillable). A job may lower its own, down to [`floor_oom_score`]'s.
pub const SANDBOX_OOM_SCORE_ADJ: i32 = 1000;

/// Raises this process (the sandbox's init, before anything of the job runs) to
/// [`SANDBOX_OOM_SCORE_ADJ`]; every process of the sandbox inherits it. Raising needs no
/// privilege.
pub fn rank_first_for_oom() -> std::io::Result<()> {
    set_own_oom_score_adj(SANDBOX_OOM_SCORE_ADJ)
}

/// Sets this process (the zygote, as it starts, while it still holds the node's
/// capabilities) to `oom_score_adj` 0. A job may lower its own value, but only down to the last
/// one set with `CAP_SYS_RESOURCE` above it: written with the capability (a node run as host
/// root), 0 becomes that floor for every sandbox, so no job can make itself unkillable even
/// under a node at -1000. Without it the write only lifts a negative value, and the floor stays
/// the node's own `oom_score_adj_min` (docs/security.md).
pub fn floor_oom_score() -> std::io::Result<()> {
    set_own_oom_score_adj(0)
}

fn set_own_oom_score_adj(value: i32) -> std::io::Result<()> {
    std::fs::write("/proc/self/oom_score_adj", value.to_string())
}

/// One resource limit the program is exec'd under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimit {
    pub resource: Resource,
    pub soft: rlim_t,
    pub hard: rlim_t,
    /// Names the step when setting it fails.
    pub name: &'static str,
}

const MIB: u64 = 1024 * 1024;

/// Signals a job may have queued at once (`RLIMIT_SIGPENDING`), real-time signals and POSIX
/// timers (each takes one) together. Since Linux 5.14 the kernel charges them up the chain of
/// user namespaces to the host uid that made the sandbox's (host root, for a node run as root),
/// checking each level against the limit it had: without a limit of the job's own, a job
/// inherited the node's (96,367 on a 24 GiB host) and took host root's whole count. 256 per
/// job keeps 64 slots under a fifth of such a node's.
pub const SIGNALS_PER_JOB: u64 = 256;

/// Bytes of POSIX message queues a job may hold (`RLIMIT_MSGQUEUE`), charged up the chain of
/// user namespaces as [`SIGNALS_PER_JOB`] are: the node's 800 KiB default would be one job's.
/// One queue of the sizes the ipc namespace allows by default (10 × 2 KiB, see `ipc`) fits.
pub const MESSAGE_QUEUE_BYTES_PER_JOB: u64 = 32 * 1024;

/// The rlimits of a program with `limits`, its memory bounded by `memory`.
pub fn rlimits(limits: &EffectiveLimits, memory: MemoryEnforcement) -> Vec<Rlimit> {
    let rl = |resource, soft, hard, name| Rlimit {
        resource,
        soft,
        hard,
        name,
    };
    let cpu_s = limits.cpu_ms.div_ceil(1000);
    let mut out = Vec::with_capacity(8);
    if memory == MemoryEnforcement::DataRlimit {
        let bytes = limits.memory_mb * MIB;
        out.push(rl(Resource::RLIMIT_DATA, bytes, bytes, "rlimit memory"));
    }
    out.extend([
        rl(
            Resource::RLIMIT_NPROC,
            limits.pids,
            limits.pids,
            "rlimit pids",
        ),
        // SIGXCPU at the limit, SIGKILL a second later if it is caught.
        rl(Resource::RLIMIT_CPU, cpu_s, cpu_s + 1, "rlimit cpu"),
        rl(
            Resource::RLIMIT_FSIZE,
            limits.file_size_mb * MIB,
            limits.file_size_mb * MIB,
            "rlimit file size",
        ),
        rl(
            Resource::RLIMIT_NOFILE,
            limits.open_files,
            limits.open_files,
            "rlimit open files",
        ),
        rl(Resource::RLIMIT_CORE, 0, 0, "rlimit core"),
        rl(
            Resource::RLIMIT_SIGPENDING,
            SIGNALS_PER_JOB,
            SIGNALS_PER_JOB,
            "rlimit pending signals",
        ),
        rl(
            Resource::RLIMIT_MSGQUEUE,
            MESSAGE_QUEUE_BYTES_PER_JOB,
            MESSAGE_QUEUE_BYTES_PER_JOB,
            "rlimit message queues",
        ),
    ]);
    out
}

/// How far back from the end of stderr a runtime's out-of-memory message is looked for: its
/// last words, after which a stack trace may follow (V8 prints about 2 KiB of one).
const STDERR_TAIL: usize = 16 * 1024;

/// What runtimes print when an allocation fails, lowercased: CPython (`MemoryError`), V8
/// ("JavaScript heap out of memory", "Fatal process out of memory"), C++ (`std::bad_alloc`;
/// and libstdc++'s "terminate called recursively", all that is left when two threads fail an
/// allocation at once: the second aborts the process while the first is still printing), the
/// JVM (`java.lang.OutOfMemoryError`), Go ("runtime: out of memory"), Ruby
/// (`NoMemoryError: failed to allocate memory`), Perl ("Out of memory!"), BEAM ("Cannot
/// allocate N bytes of memory"), glibc's and bash's `ENOMEM` text ("Cannot allocate memory").
const OUT_OF_MEMORY_MARKS: &[&str] = &[
    "memoryerror",
    "out of memory",
    "bad_alloc",
    "outofmemoryerror",
    "failed to allocate memory",
    "cannot allocate",
    "terminate called recursively",
];

/// Whether a program bounded by `RLIMIT_DATA` clearly ended because its memory ran out. Clear
/// means all of: it ended in failure (`failed`: a non-zero exit or a signal), the tail of its
/// stderr carries a runtime's out-of-memory message, and its peak resident memory reached at
/// least half the limit (so it did use memory up to the limit's neighbourhood, rather than
/// print such a message or ask for one allocation larger than the limit). The rest stays
/// `failed` with the program's own message: what the rlimit cannot tell apart.
pub fn out_of_memory_evident(
    failed: bool,
    stderr: &[u8],
    peak_rss_kb: u64,
    memory_mb: u64,
) -> bool {
    failed
        && peak_rss_kb.saturating_mul(2) >= memory_mb.saturating_mul(1024)
        && says_out_of_memory(stderr)
}

/// Whether the tail of `stderr` carries a runtime's out-of-memory message.
pub fn says_out_of_memory(stderr: &[u8]) -> bool {
    let tail = &stderr[stderr.len().saturating_sub(STDERR_TAIL)..];
    let text = String::from_utf8_lossy(tail).to_lowercase();
    OUT_OF_MEMORY_MARKS.iter().any(|m| text.contains(m))
}

/// Sets the program's rlimits (the last steps before exec); the error names the one that
/// failed.
pub fn apply_rlimits(
    limits: &EffectiveLimits,
    memory: MemoryEnforcement,
) -> Result<(), RlimitError> {
    for r in rlimits(limits, memory) {
        setrlimit(r.resource, r.soft, r.hard).map_err(|errno| RlimitError {
            name: r.name,
            errno,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_never_an_address_space_limit() {
        let l = EffectiveLimits {
            memory_mb: 128,
            ..EffectiveLimits::default()
        };
        for memory in [MemoryEnforcement::Cgroup, MemoryEnforcement::DataRlimit] {
            assert!(rlimits(&l, memory)
                .iter()
                .all(|r| r.resource != Resource::RLIMIT_AS));
        }
        let data: Vec<_> = rlimits(&l, MemoryEnforcement::DataRlimit)
            .into_iter()
            .filter(|r| r.resource == Resource::RLIMIT_DATA)
            .collect();
        assert_eq!(data.len(), 1);
        assert_eq!((data[0].soft, data[0].hard), (128 * MIB, 128 * MIB));
        assert!(rlimits(&l, MemoryEnforcement::Cgroup)
            .iter()
            .all(|r| r.resource != Resource::RLIMIT_DATA));
    }

    #[test]
    fn the_other_limits_hold_on_both_hosts() {
        let l = EffectiveLimits {
            pids: 16,
            cpu_ms: 1500,
            open_files: 50,
            ..EffectiveLimits::default()
        };
        for memory in [MemoryEnforcement::Cgroup, MemoryEnforcement::DataRlimit] {
            let r = rlimits(&l, memory);
            let get = |res| {
                r.iter()
                    .find(|x| x.resource == res)
                    .map(|x| (x.soft, x.hard))
            };
            assert_eq!(get(Resource::RLIMIT_NPROC), Some((16, 16)));
            assert_eq!(get(Resource::RLIMIT_CPU), Some((2, 3)));
            assert_eq!(get(Resource::RLIMIT_NOFILE), Some((50, 50)));
            assert_eq!(get(Resource::RLIMIT_CORE), Some((0, 0)));
            assert_eq!(get(Resource::RLIMIT_FSIZE), Some((64 * MIB, 64 * MIB)));
            assert_eq!(get(Resource::RLIMIT_SIGPENDING), Some((256, 256)));
            assert_eq!(get(Resource::RLIMIT_MSGQUEUE), Some((32768, 32768)));
        }
    }

    #[test]
    fn out_of_memory_needs_failure_a_message_and_a_peak() {
        let py = b"Traceback (most recent call last):\n  File \"<string>\", line 2\nMemoryError\n";
        let node = b"FATAL ERROR: Committing semi space failed. Allocation failed - \
                     JavaScript heap out of memory\n 1: 0xb8 node::Abort() [node]\n";
        let limit = 128;
        let near = 100 * 1024;
        // (failed, stderr, peak kB, expected)
        let table: &[(bool, &[u8], u64, bool)] = &[
            (true, py, near, true),
            (true, node, near, true),
            (
                true,
                b"terminate called after throwing 'std::bad_alloc'\n",
                near,
                true,
            ),
            // node at RLIMIT_DATA, two threads failing at once (seen in an emulated guest).
            (
                true,
                b"terminate called recursively\nAborted\n",
                107 * 1024,
                true,
            ),
            (true, b"fatal error: runtime: out of memory\n", near, true),
            (
                true,
                b"Exception java.lang.OutOfMemoryError: Java heap space\n",
                near,
                true,
            ),
            (true, b"Out of memory!\n", near, true),
            (
                true,
                b"bash: xmalloc: cannot allocate 1048576 bytes\n",
                near,
                true,
            ),
            // Exited cleanly: whatever it printed, it was not stopped.
            (false, py, near, false),
            // One request beyond the limit, refused before any memory was used.
            (true, py, 9 * 1024, false),
            // Used memory, but failed for another reason.
            (true, b"ValueError: bad input\n", near, false),
            (true, b"", near, false),
            // Exactly half the limit counts.
            (true, py, 64 * 1024, true),
        ];
        for (i, (failed, stderr, peak, want)) in table.iter().enumerate() {
            assert_eq!(
                out_of_memory_evident(*failed, stderr, *peak, limit),
                *want,
                "row {i}"
            );
        }
    }

    #[test]
    fn only_the_tail_of_stderr_is_read() {
        let mut stderr = b"MemoryError\n".to_vec();
        stderr.extend(std::iter::repeat_n(b'.', STDERR_TAIL));
        assert!(!out_of_memory_evident(true, &stderr, 1 << 20, 128));
        stderr.extend(b"\nMemoryError\n");
        assert!(out_of_memory_evident(true, &stderr, 1 << 20, 128));
    }
}
