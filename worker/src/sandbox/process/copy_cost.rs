//! What a sandbox's init costs for being a copy of the warm runtime's zygote: a measurement
//! (`forkbox-bench init-copy`), not a part of any sandbox.
//!
//! Every sandbox of the Python runtime's zygote starts as a `clone3` of the zygote, so its init
//! inherits the interpreter's address space and pays for it twice: page tables copied at the
//! clone and torn down at its exit, although the init never runs Python. An init that does not
//! hold the interpreter (the zygote marking the interpreter's mappings `MADV_DONTFORK` around
//! the clone) would pay neither. This measures both in one process, alternated: a fork of this
//! process that exits at once, with nothing left out (*whole*: today's init), without the
//! mappings the interpreter's warm-up added (*lean*: those the init provably never touches),
//! and without the part of the `brk` heap the warm-up grew as well (*leanest*: CPython's
//! larger objects live in the same heap as the init's own allocations, so this one is a bound,
//! not a build). The same fork before the warm-up (*plain*) is what a plain zygote's init
//! inherits.

use std::time::Instant;

use nix::sys::resource::{getrusage, UsageWho};

use crate::sandbox::kernel::sys::{self, SingleThreaded};
use crate::sandbox::runtime::python::{self, PythonSettings, WarmRequest};

/// What to measure.
#[derive(Debug, Clone)]
pub struct CopyCostPlan {
    pub python: PythonSettings,
    /// The environment the interpreter is initialised in (a job's default one).
    pub env: Vec<(String, String)>,
    /// Forks per mode and round.
    pub iterations: usize,
    /// Rounds; each runs every mode once, in an order that rotates by round.
    pub rounds: usize,
}

/// Which part of the address space a measured fork's child inherits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyMode {
    /// This process before the interpreter's warm-up (a plain zygote's init).
    Plain,
    /// Everything (the warm runtime's init today).
    Whole,
    /// Everything but the mappings the warm-up added.
    Lean,
    /// Everything but those and the heap's growth during the warm-up.
    Leanest,
    /// Everything, and the child enters a sandbox's six namespaces (user, mount, pid, ipc,
    /// uts, network) through its init's pidfd before it exits: what a launcher made from
    /// outside its sandbox adds.
    Entering,
}

/// One mode's figures in one round, per fork (parent and child together).
#[derive(Debug, Clone, Copy)]
pub struct CopyFigures {
    pub mode: CopyMode,
    pub round: usize,
    /// CPU of this process (the fork, the marking) per fork, µs.
    pub parent_us: f64,
    /// CPU of the child (its start and its exit), per fork, µs.
    pub child_us: f64,
    /// Wall time per fork, µs, from before the marking to the child reaped.
    pub wall_us: f64,
}

impl CopyFigures {
    /// Parent and child together.
    pub fn tree_us(&self) -> f64 {
        self.parent_us + self.child_us
    }
}

/// What the warm-up added to this process's address space.
#[derive(Debug, Clone, Copy, Default)]
pub struct AddedMemory {
    /// Ranges of the mappings the warm-up added (what *lean* leaves out).
    pub ranges: usize,
    pub added_kib: u64,
    /// Of those, anonymous (copy-on-write) memory, KiB: what a fork copies page tables for.
    pub added_anon_kib: u64,
    /// The heap's growth during the warm-up, KiB (what *leanest* leaves out as well).
    pub heap_growth_kib: u64,
    /// Anonymous memory outside the heap in mappings the warm-up did not add, KiB, after it.
    pub kept_anon_kib: u64,
}

/// Everything measured.
#[derive(Debug, Clone)]
pub struct CopyCost {
    pub memory: AddedMemory,
    pub figures: Vec<CopyFigures>,
    /// `sys.modules` after the warm-up.
    pub modules: usize,
    /// Why *entering* was not measured (no namespaces could be made here), if it was not.
    pub entering_skipped: Option<String>,
}

/// One mapping of `/proc/<pid>/smaps`: its range, whether it is private, its name, and its
/// anonymous memory.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mapping {
    start: usize,
    end: usize,
    private: bool,
    name: String,
    anon_kib: u64,
}

/// Parses `/proc/<pid>/smaps` text.
fn parse_smaps(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((start, end)) = first.split_once('-').and_then(|(s, e)| {
            Some((
                usize::from_str_radix(s, 16).ok()?,
                usize::from_str_radix(e, 16).ok()?,
            ))
        }) {
            let perms = fields.next().unwrap_or("");
            let name = fields.nth(3).unwrap_or("").to_owned();
            out.push(Mapping {
                start,
                end,
                private: perms.ends_with('p'),
                name,
                anon_kib: 0,
            });
        } else if first == "Anonymous:" {
            if let (Some(last), Some(kib)) = (out.last_mut(), fields.next()) {
                last.anon_kib = kib.parse().unwrap_or(0);
            }
        }
    }
    out
}

/// Mappings no fork may leave out whoever added them: the stack, the kernel's pages, and the
/// heap (counted apart).
fn is_special(name: &str) -> bool {
    name.starts_with('[')
}

/// `range` minus every range of `taken` (sorted or not): the parts of it nothing covered.
fn subtract(range: Range, taken: &[Range]) -> Vec<Range> {
    let mut parts = vec![range];
    for &(ts, te) in taken {
        parts = parts
            .into_iter()
            .flat_map(|(s, e)| {
                if te <= s || ts >= e {
                    vec![(s, e)]
                } else {
                    [(s, ts.max(s)), (te.min(e), e)]
                        .into_iter()
                        .filter(|(a, b)| a < b)
                        .collect()
                }
            })
            .collect();
    }
    parts
}

/// An address range, `[start, end)`.
type Range = (usize, usize);

/// What the warm-up added: the ranges *lean* leaves out, the heap's growth, and their sizes.
struct Added {
    mappings: Vec<Range>,
    heap: Vec<Range>,
    memory: AddedMemory,
}

/// What the warm-up added, from the mappings before and after it: the ranges *lean* leaves out
/// (private, not special, not mapped before), the heap's growth, and the sizes.
fn added(before: &[Mapping], after: &[Mapping]) -> Added {
    let taken: Vec<Range> = before.iter().map(|m| (m.start, m.end)).collect();
    let mut ranges = Vec::new();
    let mut heap = Vec::new();
    let mut memory = AddedMemory::default();
    for m in after {
        let new = subtract((m.start, m.end), &taken);
        let new_kib: u64 = new.iter().map(|(s, e)| ((e - s) / 1024) as u64).sum();
        if m.name == "[heap]" {
            memory.heap_growth_kib += new_kib;
            heap.extend(new);
        } else if m.private && !is_special(&m.name) && !new.is_empty() {
            memory.added_kib += new_kib;
            let whole_kib = ((m.end - m.start) / 1024) as u64;
            // Anonymous memory of a mapping partly there before, split by size.
            memory.added_anon_kib += m.anon_kib * new_kib / whole_kib.max(1);
            memory.kept_anon_kib += m.anon_kib - m.anon_kib * new_kib / whole_kib.max(1);
            ranges.extend(new);
        } else {
            memory.kept_anon_kib += m.anon_kib;
        }
    }
    ranges.sort_unstable();
    memory.ranges = ranges.len();
    Added {
        mappings: ranges,
        heap,
        memory,
    }
}

fn smaps() -> Result<Vec<Mapping>, String> {
    std::fs::read_to_string("/proc/self/smaps")
        .map(|t| parse_smaps(&t))
        .map_err(|e| format!("/proc/self/smaps: {e}"))
}

fn cpu_us(who: UsageWho) -> u64 {
    getrusage(who).map_or(0, |u| {
        let us = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
        us(u.user_time()) + us(u.system_time())
    })
}

/// The namespaces a sandbox's init has that a launcher made from outside would enter.
const SANDBOX_NAMESPACES: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWNET;

/// A process in namespaces of its own, standing for a sandbox's init: it waits until the pipe
/// it holds the read end of is closed.
struct Target {
    pid: nix::unistd::Pid,
    pidfd: std::os::fd::OwnedFd,
    hold: Option<std::os::fd::OwnedFd>,
}

impl Target {
    fn start(one: &SingleThreaded) -> Result<Target, String> {
        let (r, w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
        match one
            .clone_into_namespaces(SANDBOX_NAMESPACES)
            .map_err(|e| format!("clone3 into new namespaces: {e}"))?
        {
            sys::Forked::Child(_) => {
                drop(w);
                let _ = nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&r), &mut [0u8; 1]);
                sys::exit_now(0)
            }
            sys::Forked::Parent { pid, pidfd } => Ok(Target {
                pid,
                pidfd: pidfd.ok_or_else(|| "clone3 gave no pidfd".to_owned())?,
                hold: Some(w),
            }),
        }
    }

    fn stop(mut self) {
        self.hold.take();
        let _ = sys::wait4_blocking(self.pid);
    }
}

/// What each measured fork's child does.
enum Child<'a> {
    ExitWithout(&'a [Range]),
    Enter(&'a Target),
}

/// `iterations` forks, each child reaped: the figures per fork.
fn measure(
    one: &SingleThreaded,
    mode: CopyMode,
    round: usize,
    child: &Child<'_>,
    iterations: usize,
) -> Result<CopyFigures, String> {
    let n = iterations.max(1);
    let started = Instant::now();
    let parent_before = cpu_us(UsageWho::RUSAGE_SELF);
    let mut child_us = 0u64;
    for _ in 0..n {
        let pid = match child {
            Child::ExitWithout(without) => one.fork_and_exit_without(without),
            Child::Enter(target) => one.fork_enter_and_exit(&target.pidfd, SANDBOX_NAMESPACES),
        }
        .map_err(|e| format!("fork ({mode:?}): {e}"))?;
        let (status, usage) = sys::wait4_blocking(pid).map_err(|e| format!("wait4: {e}"))?;
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            return Err(format!(
                "{mode:?}: the child failed (wait status {status:#x})"
            ));
        }
        child_us += usage.cpu_us;
    }
    let parent_us = cpu_us(UsageWho::RUSAGE_SELF).saturating_sub(parent_before);
    Ok(CopyFigures {
        mode,
        round,
        parent_us: parent_us as f64 / n as f64,
        child_us: child_us as f64 / n as f64,
        wall_us: started.elapsed().as_secs_f64() * 1e6 / n as f64,
    })
}

/// Runs the whole measurement in this process, which must be single-threaded (it loads the
/// interpreter into itself, as the runtime's zygote does).
pub fn measure_init_copy(plan: &CopyCostPlan) -> Result<CopyCost, String> {
    let one = SingleThreaded::check()
        .ok_or_else(|| "the measurement must run in a single-threaded process".to_owned())?;
    let mut figures = Vec::new();
    for round in 0..plan.rounds {
        let child = Child::ExitWithout(&[]);
        figures.push(measure(
            &one,
            CopyMode::Plain,
            round,
            &child,
            plan.iterations,
        )?);
    }
    let interpreter = python::probe(&plan.python.executable)?;
    let before = smaps()?;
    let info = python::warm_up(&WarmRequest {
        library: interpreter.library,
        preload: plan.python.preload.clone(),
        env: plan.env.clone(),
    })?;
    let after = smaps()?;
    let Added {
        mappings: lean,
        heap,
        memory,
    } = added(&before, &after);
    let mut leanest = lean.clone();
    leanest.extend(heap);
    leanest.sort_unstable();
    // Made after the warm-up, so it is a copy of the warm process like every sandbox's init.
    let target = Target::start(&one);
    let entering_skipped = target.as_ref().err().cloned();
    let mut modes = vec![
        (CopyMode::Whole, Child::ExitWithout(&[])),
        (CopyMode::Lean, Child::ExitWithout(&lean)),
        (CopyMode::Leanest, Child::ExitWithout(&leanest)),
    ];
    if let Ok(target) = &target {
        modes.push((CopyMode::Entering, Child::Enter(target)));
    }
    let result = (0..plan.rounds).try_for_each(|round| {
        (0..modes.len()).try_for_each(|k| {
            let (mode, child) = &modes[(round + k) % modes.len()];
            figures.push(measure(&one, *mode, round, child, plan.iterations)?);
            Ok::<(), String>(())
        })
    });
    drop(modes);
    if let Ok(target) = target {
        target.stop();
    }
    result?;
    Ok(CopyCost {
        memory,
        figures,
        modules: info.modules.len(),
        entering_skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0a0000000-55d0a0021000 rw-p 00000000 00:00 0                          [heap]
Size:                132 kB
Anonymous:           100 kB
7f0000000000-7f0000100000 rw-p 00000000 00:00 0 
Size:               1024 kB
Anonymous:           512 kB
7f0000200000-7f0000201000 r--p 00000000 08:01 42                         /usr/lib/libpython3.11.so.1.0
Anonymous:             0 kB
7f0000300000-7f0000301000 rw-s 00000000 00:01 7                          /memfd:x (deleted)
Anonymous:             0 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Anonymous:            12 kB
";

    #[test]
    fn smaps_gives_each_mapping_its_range_privacy_name_and_anonymous_memory() {
        let maps = parse_smaps(SMAPS);
        assert_eq!(maps.len(), 5);
        assert_eq!(maps[0].name, "[heap]");
        assert_eq!(maps[0].anon_kib, 100);
        assert_eq!(
            (maps[1].start, maps[1].end),
            (0x7f00_0000_0000, 0x7f00_0010_0000)
        );
        assert_eq!(maps[1].name, "");
        assert!(maps[1].private);
        assert_eq!(maps[2].name, "/usr/lib/libpython3.11.so.1.0");
        assert!(!maps[3].private);
    }

    #[test]
    fn subtracting_keeps_only_what_nothing_covered() {
        assert_eq!(subtract((0, 100), &[]), vec![(0, 100)]);
        assert_eq!(subtract((0, 100), &[(0, 100)]), vec![]);
        assert_eq!(
            subtract((0, 100), &[(20, 30), (50, 60)]),
            vec![(0, 20), (30, 50), (60, 100)]
        );
        assert_eq!(subtract((0, 100), &[(90, 200)]), vec![(0, 90)]);
        assert_eq!(subtract((10, 20), &[(0, 5)]), vec![(10, 20)]);
    }

    #[test]
    fn the_added_mappings_leave_out_the_stack_shared_mappings_and_what_was_there_before() {
        let after = parse_smaps(SMAPS);
        // Before: the heap's first 64 KiB and the first half of the anonymous mapping.
        let before = vec![
            Mapping {
                start: 0x55d0_a000_0000,
                end: 0x55d0_a001_0000,
                private: true,
                name: "[heap]".into(),
                anon_kib: 0,
            },
            Mapping {
                start: 0x7f00_0000_0000,
                end: 0x7f00_0008_0000,
                private: true,
                name: String::new(),
                anon_kib: 0,
            },
        ];
        let Added {
            mappings: ranges,
            heap,
            memory,
        } = added(&before, &after);
        assert_eq!(
            ranges,
            vec![
                (0x7f00_0008_0000, 0x7f00_0010_0000),
                (0x7f00_0020_0000, 0x7f00_0020_1000)
            ]
        );
        assert_eq!(heap, vec![(0x55d0_a001_0000, 0x55d0_a002_1000)]);
        assert_eq!(memory.ranges, 2);
        assert_eq!(memory.added_kib, 512 + 4);
        assert_eq!(memory.added_anon_kib, 256);
        assert_eq!(memory.heap_growth_kib, 68);
        // The stack's 12 KiB and the other half of the anonymous mapping's.
        assert_eq!(memory.kept_anon_kib, 12 + 256);
    }
}
