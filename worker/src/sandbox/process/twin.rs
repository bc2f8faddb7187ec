//! The twin copy, the mechanism of a session's fork: makes a process `T` a copy of a frozen
//! process `F`, across two sandboxes of the same warm zygote.
//!
//! `F` is a fork of a session's kernel (sandbox A) that stopped itself with SIGSTOP; `T` is a
//! fresh fork of the same zygote in another sandbox (B), stopped the same way. Both start
//! from one address space (the zygote's), so only what the session changed differs. The
//! copier (trusted code outside every sandbox: the node, which owns the zygote's user
//! namespace) seizes both with ptrace and, from the one thread that seized them:
//! 1. maps: unmaps `T`'s mappings `F` lacks, moves `T`'s break to `F`'s, grows its stack to
//!    `F`'s, and maps what only `F` has at the same address (anonymous, or the same path
//!    opened by `T` itself, in B's root), by system calls injected into `T` at the `syscall`
//!    instruction it stopped after;
//! 2. memory: every page `F` holds privately (written, copy-on-write, or swapped, as its
//!    `pagemap` says) is read through `/proc/F/mem` (which, unlike `process_vm_readv`, does
//!    not unshare the pages `F` shares with its parent) and written into `T` through
//!    `/proc/T/mem`, in runs of up to 1 MiB (so protections do not matter); a page `T` holds
//!    privately and `F` does not is dropped (`MADV_DONTNEED`);
//! 3. files: `F`'s descriptors that name a file or directory are opened again by `T` at the
//!    same number, flags and offset (B's disk is a copy of A's); `T`'s standard streams stay
//!    its own; anything else (sockets, pipes, event descriptors, threads, other signal
//!    dispositions or limits) is named in [`TwinReport::not_carried`], never dropped unsaid;
//!    the working directory and umask follow;
//! 4. registers (general, the whole extended state, the signal mask) from `F`, with no
//!    system call to restart; then `T` is detached and continued, and runs on as `F` would.
//!
//! Bounded: `F`'s private memory must fit the twin's memory limit (checked before `T` is
//! touched), and every step checks a deadline. Once `T` has been changed, any failure kills
//! it: a half-made twin never runs. `F` is left stopped, for the caller to continue or kill.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::unistd::Pid;

use crate::sandbox::kernel::sys::Tracee;

const PAGE: u64 = 4096;
/// Pages read from `F` and written to `T` in one call.
const CHUNK_PAGES: usize = 256;
/// Where the copier maps its scratch page in `T` (for paths): below any program's mappings,
/// above `vm.mmap_min_addr`, and mapped only if free (`MAP_FIXED_NOREPLACE`).
const SCRATCH: u64 = 0x10_0000;

/// pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAP: u64 = 1 << 62;
const PM_FILE: u64 = 1 << 61;

/// The bounds of one copy.
#[derive(Debug, Clone)]
pub struct TwinLimits {
    /// The twin's memory limit: `F`'s private memory above it is refused.
    pub memory_bytes: u64,
    /// The whole copy's deadline, from the call.
    pub timeout: Duration,
    /// Reads `T`'s pages before writing them, and skips those already equal (one write
    /// fewer each, and a page `T` still shares with the zygote stays shared; one more read).
    pub skip_identical: bool,
}

/// What a copy did.
#[derive(Debug, Clone, Default)]
pub struct TwinReport {
    /// `F`'s private memory (the size the limit is checked against).
    pub private_bytes: u64,
    /// Bytes written into `T`.
    pub copied_bytes: u64,
    /// Bytes equal in both, not written (with `skip_identical`).
    pub identical_bytes: u64,
    /// Bytes of `T`'s own dropped.
    pub dropped_bytes: u64,
    pub unmapped: usize,
    pub mapped: usize,
    /// Descriptors opened again in `T` (number, path).
    pub carried_fds: Vec<(i32, String)>,
    /// What `F` holds that `T` does not get, each named (`fd 5: socket:[1234]`).
    pub not_carried: Vec<String>,
    /// `T`'s resident memory once made (VmRSS), before it runs.
    pub twin_rss_kb: u64,
    /// Of it, the written pages `T` alone maps (`Private_Dirty`): its own copies, beyond the
    /// pages it still shares with the zygote and the files' pages it maps.
    pub twin_private_kb: u64,
    pub elapsed: Duration,
    /// Where `elapsed` went.
    pub steps: TwinSteps,
}

/// Where a copy's time went, step by step.
#[derive(Debug, Clone, Default)]
pub struct TwinSteps {
    /// Seizing both processes, reading their maps, pagemaps, descriptors and limits, and the
    /// plans made from them.
    pub inspect: Duration,
    /// The maps step: `T`'s mappings removed, moved and made (injected calls).
    pub maps: Duration,
    /// Reading `F`'s private pages.
    pub memory_read: Duration,
    /// Writing them into `T` (with `skip_identical`, comparing them with `T`'s first).
    pub memory_write: Duration,
    /// The rest of the memory step: `T`'s pagemap read, its own pages dropped.
    pub memory_other: Duration,
    /// The files step: descriptors opened again, the working directory and umask.
    pub fds: Duration,
    /// `T`'s memory figures read, the registers set, `T` let go.
    pub finish: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum TwinError {
    #[error("process {pid} is not stopped (state {state:?}); both must have stopped themselves")]
    NotStopped { pid: Pid, state: String },
    #[error("seizing process {pid} with ptrace: {errno}")]
    Seize { pid: Pid, errno: Errno },
    #[error("the twin {pid} has {threads} threads; it must have one")]
    TwinThreads { pid: Pid, threads: usize },
    #[error(
        "the twin is not stopped after a syscall instruction (found {found:#06x} at {rip:#x})"
    )]
    NoSyscallInstruction { rip: u64, found: u64 },
    #[error("the frozen process holds {needed} bytes of private memory, over the twin's limit of {limit}")]
    OverLimit { needed: u64, limit: u64 },
    #[error("the frozen process maps a deleted file at {start:#x}: {path}")]
    DeletedMapping { start: u64, path: String },
    #[error(
        "the frozen process has a shared mapping at {start:#x} ({path}), which a copy cannot share"
    )]
    SharedMapping { start: u64, path: String },
    #[error("the frozen process maps {path} at {start:#x}, which the twin cannot open in its root: {errno}")]
    UnreachableMapping {
        start: u64,
        path: String,
        errno: Errno,
    },
    #[error("the kernel's mapping {name} differs between the two processes")]
    SpecialMapping { name: String },
    #[error("the processes' heaps start at different addresses ({frozen:#x}, {twin:#x})")]
    HeapStart { frozen: u64, twin: u64 },
    #[error("{call} in the twin failed: {errno}")]
    Injected { call: String, errno: Errno },
    #[error("{what} of process {pid}: {errno}")]
    Trace {
        what: &'static str,
        pid: Pid,
        errno: Errno,
    },
    #[error("reading {path}: {error}")]
    Proc {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("copying the page run at {addr:#x}: {error}")]
    Memory { addr: u64, error: std::io::Error },
    #[error("the copy passed its deadline of {timeout:?} while {step}")]
    Deadline {
        timeout: Duration,
        step: &'static str,
    },
}

/// One line of `/proc/<pid>/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Vma {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    pub offset: u64,
    pub path: String,
}

impl Vma {
    fn is_special(&self) -> bool {
        matches!(
            self.path.as_str(),
            "[vdso]" | "[vvar]" | "[vvar_vclock]" | "[vsyscall]"
        )
    }

    fn is_shared(&self) -> bool {
        self.perms.as_bytes().get(3) == Some(&b's')
    }

    fn is_anonymous(&self) -> bool {
        self.path.is_empty() || self.path.starts_with("[anon:")
    }

    /// The `PROT_*` bits of its permissions.
    fn prot(&self) -> u64 {
        let b = self.perms.as_bytes();
        let mut prot = 0;
        for (i, bit) in [libc::PROT_READ, libc::PROT_WRITE, libc::PROT_EXEC]
            .into_iter()
            .enumerate()
        {
            if b.get(i).is_some_and(|c| *c != b'-') {
                prot |= bit as u64;
            }
        }
        prot
    }

    fn pages(&self) -> usize {
        ((self.end - self.start) / PAGE) as usize
    }
}

/// Parses `/proc/<pid>/maps`.
pub(crate) fn parse_maps(text: &str) -> Vec<Vma> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(6, ' ');
            let range = fields.next()?;
            let perms = fields.next()?.to_owned();
            let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
            let _dev = fields.next()?;
            let _inode = fields.next()?;
            let path = fields.next().unwrap_or("").trim_start().to_owned();
            let (start, end) = range.split_once('-')?;
            Some(Vma {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                perms,
                offset,
                path,
            })
        })
        .collect()
}

/// What the maps step does to `T`.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct MapPlan {
    /// `T`'s mappings to remove (start, end).
    pub unmap: Vec<(u64, u64)>,
    /// `F`'s mappings to make in `T`.
    pub map: Vec<Vma>,
    /// The break to set in `T`, when `F` has a heap.
    pub heap_end: Option<u64>,
    /// `F`'s stack, when it reaches lower than `T`'s (its start), and `T`'s lower part to drop.
    pub grow_stack_to: Option<u64>,
    pub drop_stack: Option<(u64, u64)>,
}

/// The maps step, from both processes' maps: a mapping equal in both (range, permissions,
/// offset, path) stays; the heap and the stack are moved, never remapped (their kernel flags
/// would be lost).
pub(crate) fn plan_maps(f: &[Vma], t: &[Vma]) -> Result<MapPlan, TwinError> {
    let kept = |v: &Vma| !v.is_special() && v.path != "[heap]" && v.path != "[stack]";
    let mut plan = MapPlan::default();
    for v in f.iter().filter(|v| v.is_special()) {
        if !t.contains(v) {
            return Err(TwinError::SpecialMapping {
                name: v.path.clone(),
            });
        }
    }
    for v in t.iter().filter(|v| kept(v) && !f.contains(v)) {
        plan.unmap.push((v.start, v.end));
    }
    for v in f.iter().filter(|v| kept(v) && !t.contains(v)) {
        if v.path.ends_with(" (deleted)") {
            return Err(TwinError::DeletedMapping {
                start: v.start,
                path: v.path.clone(),
            });
        }
        if v.is_shared() {
            return Err(TwinError::SharedMapping {
                start: v.start,
                path: v.path.clone(),
            });
        }
        plan.map.push(v.clone());
    }
    // The heap may show as several mappings (one not merged with the next); the break is
    // the end of the last.
    plan.heap_end = f.iter().filter(|v| v.path == "[heap]").map(|v| v.end).max();
    let stack = |m: &[Vma]| m.iter().find(|v| v.path == "[stack]").map(|v| v.start);
    if let (Some(fs), Some(ts)) = (stack(f), stack(t)) {
        if fs < ts {
            plan.grow_stack_to = Some(fs);
        } else if ts < fs {
            plan.drop_stack = Some((ts, fs));
        }
    }
    Ok(plan)
}

/// What to do with a run of pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PageAction {
    /// `F` holds it privately: copy it.
    Copy,
    /// Only `T` holds it privately: drop `T`'s, so it reads as `F`'s (the file's, or zero).
    Drop,
}

/// A page held privately: written (or copied on write), or swapped out.
fn private(entry: u64) -> bool {
    entry & PM_SWAP != 0 || (entry & PM_PRESENT != 0 && entry & PM_FILE == 0)
}

/// Runs of (first page, pages, action) from both processes' pagemap entries for one range.
pub(crate) fn page_runs(f: &[u64], t: &[u64]) -> Vec<(usize, usize, PageAction)> {
    let action = |i: usize| {
        let tf = t.get(i).copied().unwrap_or(0);
        if private(f[i]) {
            Some(PageAction::Copy)
        } else if private(tf) {
            Some(PageAction::Drop)
        } else {
            None
        }
    };
    let mut runs = Vec::new();
    let mut i = 0;
    while i < f.len() {
        let Some(a) = action(i) else {
            i += 1;
            continue;
        };
        let start = i;
        while i < f.len()
            && action(i) == Some(a)
            && (a == PageAction::Drop || i - start < CHUNK_PAGES)
        {
            i += 1;
        }
        runs.push((start, i - start, a));
    }
    runs
}

/// What `fdinfo` says of a descriptor: its open flags and offset.
pub(crate) fn parse_fdinfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let flags = u64::from_str_radix(field("flags:")?, 8).ok()?;
    let pos = field("pos:")?.parse().ok()?;
    Some((flags, pos))
}

/// One descriptor of `F` that `T` opens again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Carry {
    pub fd: i32,
    pub path: String,
    pub flags: u64,
    pub pos: u64,
}

/// The files step: what `T` opens, closes, and what it cannot get.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct FdPlan {
    pub carry: Vec<Carry>,
    pub close: Vec<i32>,
    pub not_carried: Vec<String>,
}

/// A descriptor of `F`: its number, its link (`/work/a`, `socket:[12]`), whether it is a
/// directory, and its flags and offset.
pub(crate) struct FdSeen {
    pub fd: i32,
    pub link: String,
    pub dir: bool,
    pub flags: u64,
    pub pos: u64,
}

/// The files step, from `F`'s descriptors and `T`'s numbers. Standard streams and the numbers
/// in `own` stay `T`'s own (its sandbox's); a file or directory (read from its start) is
/// opened again; anything else is named, and `T`'s own descriptor at that number, if any,
/// closed.
pub(crate) fn plan_fds(f: &[FdSeen], t: &[i32], own: &[i32]) -> FdPlan {
    let mut plan = FdPlan::default();
    let mut held: BTreeSet<i32> = own.iter().copied().collect();
    for seen in f.iter().filter(|s| s.fd > 2 && !own.contains(&s.fd)) {
        let named = seen.link.starts_with('/') && !seen.link.ends_with(" (deleted)");
        if named && (!seen.dir || seen.pos == 0) {
            held.insert(seen.fd);
            plan.carry.push(Carry {
                fd: seen.fd,
                path: seen.link.clone(),
                flags: seen.flags,
                pos: seen.pos,
            });
        } else if named {
            plan.not_carried.push(format!(
                "fd {}: directory {} read to position {}",
                seen.fd, seen.link, seen.pos
            ));
        } else {
            plan.not_carried
                .push(format!("fd {}: {}", seen.fd, seen.link));
        }
    }
    plan.close = t
        .iter()
        .copied()
        .filter(|fd| *fd > 2 && !held.contains(fd))
        .collect();
    plan
}

/// Makes the stopped process `twin` a copy of the stopped process `frozen` (see the module's
/// documentation). Every ptrace call is made by the calling thread: run it on a thread of its
/// own (a blocking task), never on an async executor's. On success `twin` runs as `frozen`
/// would; `frozen` stays stopped.
pub fn make_twin(frozen: Pid, twin: Pid, limits: &TwinLimits) -> Result<TwinReport, TwinError> {
    make_twin_keeping(frozen, twin, limits, &[])
}

/// [`make_twin`], where `T`'s descriptors numbered in `own` (above its standard streams) stay
/// its own, as its standard streams do, and `F`'s at those numbers are neither carried nor
/// named: a session's kernel keeps its pipes to its own supervisor at fixed numbers, so the
/// copied interpreter talks to the twin's sandbox over them.
pub fn make_twin_keeping(
    frozen: Pid,
    twin: Pid,
    limits: &TwinLimits,
    own: &[i32],
) -> Result<TwinReport, TwinError> {
    let held = HeldFrozen::seize(frozen)?;
    make_twin_of(held.state(), twin, limits, own)
}

/// `F` seized by the calling thread, which holds it stopped until this is dropped, and what
/// a copy takes of it through ptrace (its registers, extended state and signal mask), read
/// once: any number of twins can then be made of it, each on a thread of its own
/// ([`make_twin_of`]), since the rest of `F` is read through `/proc`, which needs no tracer.
pub struct HeldFrozen {
    _held: Tracee,
    state: FrozenState,
}

/// What twins are made from: valid while its [`HeldFrozen`] holds `F` (it can only be borrowed
/// from it).
pub struct FrozenState {
    pid: Pid,
    regs: libc::user_regs_struct,
    xstate: Vec<u8>,
    mask: u64,
}

impl HeldFrozen {
    /// Seizes the stopped process `frozen` and reads its registers.
    pub fn seize(frozen: Pid) -> Result<HeldFrozen, TwinError> {
        let f = seize_stopped(frozen, false)?;
        let regs = f
            .regs()
            .map_err(|e| trace("reading registers", frozen, e))?;
        let xstate = f
            .xstate()
            .map_err(|e| trace("reading the extended state", frozen, e))?;
        let mask = f
            .sigmask()
            .map_err(|e| trace("reading the signal mask", frozen, e))?;
        Ok(HeldFrozen {
            _held: f,
            state: FrozenState {
                pid: frozen,
                regs,
                xstate,
                mask,
            },
        })
    }

    pub fn state(&self) -> &FrozenState {
        &self.state
    }
}

/// Seizes a process that stopped itself; an error if it was running.
fn seize_stopped(pid: Pid, exit_kill: bool) -> Result<Tracee, TwinError> {
    let (tracee, stop) =
        Tracee::seize(pid, exit_kill).map_err(|errno| TwinError::Seize { pid, errno })?;
    // A process in a group stop reports its stop signal when interrupted; a running one
    // reports the interruption's trap (and is let go when `tracee` drops).
    if !matches!(
        stop,
        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
    ) {
        let state = proc_stat(pid)?.first().cloned().unwrap_or_default();
        return Err(TwinError::NotStopped { pid, state });
    }
    Ok(tracee)
}

/// [`make_twin_keeping`] from an `F` another thread holds: the twin is seized (and let go)
/// by the calling thread, so twins of one `F` can be made side by side.
pub fn make_twin_of(
    frozen: &FrozenState,
    twin: Pid,
    limits: &TwinLimits,
    own: &[i32],
) -> Result<TwinReport, TwinError> {
    let started = Instant::now();
    let deadline = Deadline {
        started,
        at: started + limits.timeout,
        timeout: limits.timeout,
    };
    let t = seize_stopped(twin, true)?;
    let threads = proc_tasks(twin)?.len();
    if threads != 1 {
        return Err(TwinError::TwinThreads { pid: twin, threads });
    }
    let mut report = TwinReport::default();
    let mut touched = false;
    let result = copy(
        frozen,
        &t,
        (limits, own),
        &deadline,
        &mut report,
        &mut touched,
    );
    match result {
        Ok(()) => {
            let at = Instant::now();
            let pidfd = t.detach().map_err(|errno| trace("detach", twin, errno))?;
            crate::sandbox::kernel::sys::pidfd_signal(&pidfd, libc::SIGCONT)
                .map_err(|errno| trace("continue", twin, errno))?;
            report.steps.finish += at.elapsed();
            report.elapsed = started.elapsed();
            Ok(report)
        }
        Err(e) => {
            if touched {
                // A half-made twin never runs.
                let _ = t.signal(libc::SIGKILL);
            }
            Err(e)
        }
    }
}

/// The copy proper, both processes seized; `touched` once `T` has been changed.
fn copy(
    f: &FrozenState,
    t: &Tracee,
    (limits, own): (&TwinLimits, &[i32]),
    deadline: &Deadline,
    report: &mut TwinReport,
    touched: &mut bool,
) -> Result<(), TwinError> {
    let (fp, tp) = (f.pid, t.pid());
    let f_maps = parse_maps(&read_proc(fp, "maps")?);
    let t_maps = parse_maps(&read_proc(tp, "maps")?);
    let f_pagemap = open_proc(fp, "pagemap", false)?;
    let mut f_entries = Vec::with_capacity(f_maps.len());
    for v in &f_maps {
        f_entries.push(if v.is_special() {
            Vec::new()
        } else {
            pagemap_entries(&f_pagemap, v.start, v.pages(), fp)?
        });
    }
    report.private_bytes =
        f_entries.iter().flatten().filter(|e| private(**e)).count() as u64 * PAGE;
    if report.private_bytes > limits.memory_bytes {
        return Err(TwinError::OverLimit {
            needed: report.private_bytes,
            limit: limits.memory_bytes,
        });
    }
    let plan = plan_maps(&f_maps, &t_maps)?;
    let fds = plan_fds(&fds_of(fp)?, &fd_numbers(tp)?, own);
    report.not_carried.extend(fds.not_carried.iter().cloned());
    report.not_carried.extend(kernel_state_not_carried(fp, tp)?);
    heap_starts_match(fp, tp)?;
    let inj = Injector::new(t)?;
    deadline.check("attaching")?;
    *touched = true;
    let mut at = Instant::now();
    report.steps.inspect = at - deadline.started;
    inj.map_scratch()?;
    apply_maps(&inj, &plan, report)?;
    report.steps.maps = lap(&mut at);
    deadline.check("mapping")?;
    copy_memory(fp, &inj, &f_maps, &f_entries, limits, deadline, report)?;
    let _ = lap(&mut at);
    apply_fds(&inj, &fds, report)?;
    carry_cwd_and_umask(&inj, fp, report)?;
    report.steps.fds = lap(&mut at);
    inj.call("munmap", libc::SYS_munmap, [SCRATCH, PAGE, 0, 0, 0, 0])?;
    report.twin_rss_kb = status_field(&read_proc(tp, "status")?, "VmRSS:");
    let rollup = read_proc(tp, "smaps_rollup")?;
    report.twin_private_kb = status_field(&rollup, "Private_Dirty:");
    deadline.check("copying")?;
    set_registers(f, t)?;
    report.steps.finish = lap(&mut at);
    Ok(())
}

struct Deadline {
    started: Instant,
    at: Instant,
    timeout: Duration,
}

/// The time since `at`, which moves to now.
fn lap(at: &mut Instant) -> Duration {
    let now = Instant::now();
    let d = now - *at;
    *at = now;
    d
}

impl Deadline {
    fn check(&self, step: &'static str) -> Result<(), TwinError> {
        if Instant::now() > self.at {
            return Err(TwinError::Deadline {
                timeout: self.timeout,
                step,
            });
        }
        Ok(())
    }
}

fn trace(what: &'static str, pid: Pid, errno: Errno) -> TwinError {
    TwinError::Trace { what, pid, errno }
}

fn proc_path(pid: Pid, file: &str) -> PathBuf {
    Path::new("/proc").join(pid.as_raw().to_string()).join(file)
}

fn proc_error(path: PathBuf) -> impl FnOnce(std::io::Error) -> TwinError {
    move |error| TwinError::Proc { path, error }
}

fn read_proc(pid: Pid, file: &str) -> Result<String, TwinError> {
    let path = proc_path(pid, file);
    std::fs::read_to_string(&path).map_err(proc_error(path))
}

fn open_proc(pid: Pid, file: &str, write: bool) -> Result<File, TwinError> {
    let path = proc_path(pid, file);
    std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .open(&path)
        .map_err(proc_error(path))
}

/// The fields of `/proc/<pid>/stat` after the command name (the state first).
fn proc_stat(pid: Pid) -> Result<Vec<String>, TwinError> {
    let stat = read_proc(pid, "stat")?;
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    Ok(after.split_whitespace().map(str::to_owned).collect())
}

fn proc_tasks(pid: Pid) -> Result<Vec<i32>, TwinError> {
    let path = proc_path(pid, "task");
    let dir = std::fs::read_dir(&path).map_err(proc_error(path))?;
    Ok(dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect())
}

fn status_field(status: &str, name: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn pagemap_entries(
    pagemap: &File,
    start: u64,
    pages: usize,
    pid: Pid,
) -> Result<Vec<u64>, TwinError> {
    let mut bytes = vec![0u8; pages * 8];
    pagemap
        .read_exact_at(&mut bytes, start / PAGE * 8)
        .map_err(proc_error(proc_path(pid, "pagemap")))?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default()))
        .collect())
}

/// `F`'s descriptors as `/proc` shows them.
fn fds_of(pid: Pid) -> Result<Vec<FdSeen>, TwinError> {
    let mut out = Vec::new();
    for fd in fd_numbers(pid)? {
        let link_path = proc_path(pid, &format!("fd/{fd}"));
        // A descriptor closed between the listing and the read is not held.
        let Ok(link) = std::fs::read_link(&link_path) else {
            continue;
        };
        let Ok(info) = read_proc(pid, &format!("fdinfo/{fd}")) else {
            continue;
        };
        let (flags, pos) = parse_fdinfo(&info).unwrap_or((0, 0));
        let dir = std::fs::metadata(&link_path).is_ok_and(|m| m.is_dir());
        out.push(FdSeen {
            fd,
            link: link.to_string_lossy().into_owned(),
            dir,
            flags,
            pos,
        });
    }
    Ok(out)
}

fn fd_numbers(pid: Pid) -> Result<Vec<i32>, TwinError> {
    let path = proc_path(pid, "fd");
    let dir = std::fs::read_dir(&path).map_err(proc_error(path))?;
    let mut fds: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    Ok(fds)
}

/// What the copy does not carry of the kernel's per-process state, named: threads beyond the
/// one copied, signal dispositions and resource limits that differ from `T`'s own.
fn kernel_state_not_carried(fp: Pid, tp: Pid) -> Result<Vec<String>, TwinError> {
    let mut out = Vec::new();
    for tid in proc_tasks(fp)?.into_iter().filter(|t| *t != fp.as_raw()) {
        let comm =
            std::fs::read_to_string(format!("/proc/{fp}/task/{tid}/comm")).unwrap_or_default();
        out.push(format!("thread {tid} ({})", comm.trim()));
    }
    let (fs, ts) = (read_proc(fp, "status")?, read_proc(tp, "status")?);
    for field in ["SigIgn:", "SigCgt:"] {
        let mask = |s: &str| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or(0)
        };
        let differ = mask(&fs) ^ mask(&ts);
        for bit in (0..64).filter(|b| differ & (1 << b) != 0) {
            let what = if field == "SigIgn:" {
                "ignored"
            } else {
                "caught"
            };
            out.push(format!("signal {}: {what} in one process only", bit + 1));
        }
    }
    let (fl, tl) = (read_proc(fp, "limits")?, read_proc(tp, "limits")?);
    for (a, b) in fl.lines().zip(tl.lines()) {
        if a != b {
            out.push(format!(
                "limit: {}",
                a.split("  ").next().unwrap_or(a).trim()
            ));
        }
    }
    Ok(out)
}

fn heap_starts_match(fp: Pid, tp: Pid) -> Result<(), TwinError> {
    // start_brk is field 48 of stat; `proc_stat` starts at field 3.
    let start_brk = |pid| -> Result<u64, TwinError> {
        Ok(proc_stat(pid)?
            .get(45)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    };
    let (frozen, twin) = (start_brk(fp)?, start_brk(tp)?);
    if frozen != twin {
        return Err(TwinError::HeapStart { frozen, twin });
    }
    Ok(())
}

/// System calls made by `T` on the copier's behalf: its registers are set for the call at a
/// `syscall` instruction it stopped after, it runs that one instruction, and the result is
/// read back.
struct Injector<'a> {
    t: &'a Tracee,
    base: libc::user_regs_struct,
    gadget: u64,
    mem: File,
}

impl<'a> Injector<'a> {
    fn new(t: &'a Tracee) -> Result<Injector<'a>, TwinError> {
        let pid = t.pid();
        let base = t.regs().map_err(|e| trace("reading registers", pid, e))?;
        let gadget = base.rip.wrapping_sub(2);
        let word = t.peek(gadget).map_err(|e| trace("reading code", pid, e))?;
        if word & 0xffff != 0x050f {
            return Err(TwinError::NoSyscallInstruction {
                rip: base.rip,
                found: word & 0xffff,
            });
        }
        let mem = open_proc(pid, "mem", true)?;
        Ok(Injector {
            t,
            base,
            gadget,
            mem,
        })
    }

    /// Makes the call `nr` in `T`; its result, or its errno named after `call`.
    fn call(&self, call: &str, nr: i64, args: [u64; 6]) -> Result<u64, TwinError> {
        let pid = self.t.pid();
        let mut regs = self.base;
        regs.rax = nr as u64;
        regs.orig_rax = u64::MAX;
        regs.rip = self.gadget;
        (regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9) =
            (args[0], args[1], args[2], args[3], args[4], args[5]);
        self.t
            .set_regs(&regs)
            .map_err(|e| trace("setting registers", pid, e))?;
        // A stop reported before the instruction ran (a group stop still pending) leaves the
        // instruction pointer where it was: step again.
        let mut after = regs;
        for _ in 0..8 {
            self.t
                .step()
                .map_err(|e| trace("running a system call", pid, e))?;
            after = self
                .t
                .regs()
                .map_err(|e| trace("reading registers", pid, e))?;
            if after.rip != self.gadget {
                break;
            }
        }
        if after.rip != self.gadget + 2 {
            return Err(TwinError::Injected {
                call: format!("{call} (stopped at {:#x})", after.rip),
                errno: Errno::EINTR,
            });
        }
        let ret = after.rax as i64;
        if (-4095..0).contains(&ret) {
            return Err(TwinError::Injected {
                call: call.to_owned(),
                errno: Errno::from_raw(-ret as i32),
            });
        }
        Ok(after.rax)
    }

    fn map_scratch(&self) -> Result<(), TwinError> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
        let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let got = self.call(
            "mmap of the scratch page",
            libc::SYS_mmap,
            [SCRATCH, PAGE, prot, flags as u64, u64::MAX, 0],
        )?;
        if got != SCRATCH {
            return Err(TwinError::Injected {
                call: format!("mmap of the scratch page (placed at {got:#x})"),
                errno: Errno::EEXIST,
            });
        }
        Ok(())
    }

    /// Writes `path` (NUL-terminated) into the scratch page; its address in `T`.
    fn put_path(&self, path: &str) -> Result<u64, TwinError> {
        let mut bytes = path.as_bytes().to_vec();
        bytes.push(0);
        if bytes.len() as u64 > PAGE || path.as_bytes().contains(&0) {
            return Err(TwinError::Injected {
                call: format!("passing the path {path:?}"),
                errno: Errno::ENAMETOOLONG,
            });
        }
        self.mem
            .write_all_at(&bytes, SCRATCH)
            .map_err(|error| TwinError::Memory {
                addr: SCRATCH,
                error,
            })?;
        Ok(SCRATCH)
    }

    /// `openat(AT_FDCWD, path, flags)` in `T`: the path resolves in `T`'s own root.
    fn open(&self, path: &str, flags: u64) -> Result<u64, TwinError> {
        let at = self.put_path(path)?;
        let flags = flags | libc::O_CLOEXEC as u64;
        self.call(
            &format!("open {path}"),
            libc::SYS_openat,
            [libc::AT_FDCWD as u64, at, flags, 0, 0, 0],
        )
    }
}

/// The maps step (see [`plan_maps`]), in an order that never lets two mappings collide: `T`'s
/// extra mappings go first, then the break moves, then `F`'s mappings come.
fn apply_maps(
    inj: &Injector<'_>,
    plan: &MapPlan,
    report: &mut TwinReport,
) -> Result<(), TwinError> {
    for (start, end) in &plan.unmap {
        inj.call(
            "munmap",
            libc::SYS_munmap,
            [*start, end - start, 0, 0, 0, 0],
        )?;
    }
    report.unmapped = plan.unmap.len();
    if let Some(end) = plan.heap_end {
        let got = inj.call("brk", libc::SYS_brk, [end, 0, 0, 0, 0, 0])?;
        if got != end {
            return Err(TwinError::Injected {
                call: format!("brk to {end:#x} (got {got:#x})"),
                errno: Errno::ENOMEM,
            });
        }
    }
    if let Some(start) = plan.grow_stack_to {
        // The kernel grows a stack on a fault below it, a fault in a system call's write
        // included; a mapping made there instead would lose the stack's flags.
        let ts = libc::CLOCK_MONOTONIC as u64;
        inj.call(
            "growing the stack",
            libc::SYS_clock_gettime,
            [ts, start, 0, 0, 0, 0],
        )?;
    }
    if let Some((start, end)) = plan.drop_stack {
        inj.call(
            "madvise",
            libc::SYS_madvise,
            [start, end - start, libc::MADV_DONTNEED as u64, 0, 0, 0],
        )?;
    }
    let mut opened: BTreeMap<&str, u64> = BTreeMap::new();
    for v in &plan.map {
        let len = v.end - v.start;
        let prot = v.prot();
        let fixed = (libc::MAP_PRIVATE | libc::MAP_FIXED) as u64;
        let got = if v.is_anonymous() {
            let flags = fixed | libc::MAP_ANONYMOUS as u64;
            inj.call(
                "mmap",
                libc::SYS_mmap,
                [v.start, len, prot, flags, u64::MAX, 0],
            )?
        } else {
            let fd = match opened.get(v.path.as_str()) {
                Some(fd) => *fd,
                None => {
                    let fd = inj
                        .open(&v.path, libc::O_RDONLY as u64)
                        .map_err(|e| match e {
                            TwinError::Injected { errno, .. } => TwinError::UnreachableMapping {
                                start: v.start,
                                path: v.path.clone(),
                                errno,
                            },
                            other => other,
                        })?;
                    opened.insert(&v.path, fd);
                    fd
                }
            };
            inj.call(
                &format!("mmap of {}", v.path),
                libc::SYS_mmap,
                [v.start, len, prot, fixed, fd, v.offset],
            )?
        };
        if got != v.start {
            return Err(TwinError::Injected {
                call: format!("mmap at {:#x} (placed at {got:#x})", v.start),
                errno: Errno::EEXIST,
            });
        }
    }
    for fd in opened.into_values() {
        inj.call("close", libc::SYS_close, [fd, 0, 0, 0, 0, 0])?;
    }
    report.mapped = plan.map.len();
    Ok(())
}

/// The memory step: `F`'s private pages into `T`, `T`'s own dropped.
fn copy_memory(
    fp: Pid,
    inj: &Injector<'_>,
    f_maps: &[Vma],
    f_entries: &[Vec<u64>],
    limits: &TwinLimits,
    deadline: &Deadline,
    report: &mut TwinReport,
) -> Result<(), TwinError> {
    let started = Instant::now();
    let tp = inj.t.pid();
    let f_mem = open_proc(fp, "mem", false)?;
    let t_pagemap = open_proc(tp, "pagemap", false)?;
    let mut buf = vec![0u8; CHUNK_PAGES * PAGE as usize];
    let mut tbuf = vec![0u8; CHUNK_PAGES * PAGE as usize];
    for (v, entries) in f_maps.iter().zip(f_entries) {
        if v.is_special() || v.is_shared() {
            continue;
        }
        deadline.check("copying memory")?;
        let t_entries = pagemap_entries(&t_pagemap, v.start, v.pages(), tp)?;
        for (first, pages, action) in page_runs(entries, &t_entries) {
            let addr = v.start + first as u64 * PAGE;
            let len = pages as u64 * PAGE;
            if action == PageAction::Drop {
                inj.call(
                    "madvise",
                    libc::SYS_madvise,
                    [addr, len, libc::MADV_DONTNEED as u64, 0, 0, 0],
                )?;
                report.dropped_bytes += len;
                continue;
            }
            let chunk = &mut buf[..len as usize];
            let at = Instant::now();
            read_pages(&f_mem, addr, chunk)?;
            report.steps.memory_read += at.elapsed();
            let at = Instant::now();
            // With `skip_identical`, T's view of the same pages (its own, the zygote's it
            // still shares, or the file's) decides which need writing.
            let theirs = &mut tbuf[..len as usize];
            let compare = limits.skip_identical && read_pages(&inj.mem, addr, theirs).is_ok();
            let page = PAGE as usize;
            let same =
                |i: usize| compare && chunk[i * page..][..page] == theirs[i * page..][..page];
            let mut i = 0;
            while i < pages {
                if same(i) {
                    report.identical_bytes += PAGE;
                    i += 1;
                    continue;
                }
                let start = i;
                while i < pages && !same(i) {
                    i += 1;
                }
                let at = addr + start as u64 * PAGE;
                inj.mem
                    .write_all_at(&chunk[start * page..i * page], at)
                    .map_err(|error| TwinError::Memory { addr: at, error })?;
                report.copied_bytes += (i - start) as u64 * PAGE;
            }
            report.steps.memory_write += at.elapsed();
        }
    }
    report.steps.memory_other = started
        .elapsed()
        .saturating_sub(report.steps.memory_read + report.steps.memory_write);
    Ok(())
}

/// Reads a process's pages through its `/proc/<pid>/mem`, whatever their protections.
/// Never `process_vm_readv`: it pins the pages it reads, and pinning a page the process
/// shares copy-on-write (the frozen copy with the parent, the twin with the zygote) makes
/// the kernel copy it first, as a write would: a copy of every page read, and the memory.
fn read_pages(mem: &File, addr: u64, buf: &mut [u8]) -> Result<(), TwinError> {
    mem.read_exact_at(buf, addr)
        .map_err(|error| TwinError::Memory { addr, error })
}

/// The files step (see [`plan_fds`]).
fn apply_fds(inj: &Injector<'_>, plan: &FdPlan, report: &mut TwinReport) -> Result<(), TwinError> {
    for fd in &plan.close {
        inj.call("close", libc::SYS_close, [*fd as u64, 0, 0, 0, 0, 0])?;
    }
    let keep =
        (libc::O_ACCMODE | libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECTORY | libc::O_NOATIME)
            as u64;
    for c in &plan.carry {
        let opened = inj.open(&c.path, c.flags & keep)?;
        inj.call(
            &format!("lseek in {}", c.path),
            libc::SYS_lseek,
            [opened, c.pos, libc::SEEK_SET as u64, 0, 0, 0],
        )?;
        let cloexec = c.flags & libc::O_CLOEXEC as u64;
        if opened != c.fd as u64 {
            inj.call(
                "dup3",
                libc::SYS_dup3,
                [opened, c.fd as u64, cloexec, 0, 0, 0],
            )?;
            inj.call("close", libc::SYS_close, [opened, 0, 0, 0, 0, 0])?;
        } else if cloexec == 0 {
            inj.call(
                "fcntl",
                libc::SYS_fcntl,
                [opened, libc::F_SETFD as u64, 0, 0, 0, 0],
            )?;
        }
        report.carried_fds.push((c.fd, c.path.clone()));
    }
    Ok(())
}

fn carry_cwd_and_umask(
    inj: &Injector<'_>,
    fp: Pid,
    report: &mut TwinReport,
) -> Result<(), TwinError> {
    let cwd_path = proc_path(fp, "cwd");
    let cwd = std::fs::read_link(&cwd_path).map_err(proc_error(cwd_path))?;
    let cwd = cwd.to_string_lossy();
    if cwd.starts_with('/') && !cwd.ends_with(" (deleted)") {
        let at = inj.put_path(&cwd)?;
        inj.call(
            &format!("chdir {cwd}"),
            libc::SYS_chdir,
            [at, 0, 0, 0, 0, 0],
        )?;
    } else {
        report.not_carried.push(format!("working directory {cwd}"));
    }
    let status = read_proc(fp, "status")?;
    let umask = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 8).ok())
        .unwrap_or(0o022);
    inj.call("umask", libc::SYS_umask, [umask, 0, 0, 0, 0, 0])?;
    Ok(())
}

/// `F`'s registers into `T`: general (no system call to restart: `T` resumes at `F`'s
/// instruction with `F`'s result), the whole extended state, the signal mask.
fn set_registers(f: &FrozenState, t: &Tracee) -> Result<(), TwinError> {
    let tp = t.pid();
    let mut regs = f.regs;
    regs.orig_rax = u64::MAX;
    t.set_regs(&regs)
        .map_err(|e| trace("setting registers", tp, e))?;
    t.set_xstate(&f.xstate)
        .map_err(|e| trace("setting the extended state", tp, e))?;
    t.set_sigmask(f.mask)
        .map_err(|e| trace("setting the signal mask", tp, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vma(start: u64, end: u64, perms: &str, path: &str) -> Vma {
        Vma {
            start,
            end,
            perms: perms.into(),
            offset: 0,
            path: path.into(),
        }
    }

    #[test]
    fn maps_lines_parse_with_and_without_a_path() {
        let text =
            "55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]\n\
                    7f0000000000-7f0000001000 r-xp 0001a000 fd:01 1234 /usr/lib/a b.so\n\
                    7f0000002000-7f0000003000 rw-p 00000000 00:00 0 \n";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 3);
        assert_eq!(
            maps[0],
            vma(0x55d0c0a00000, 0x55d0c0a21000, "rw-p", "[heap]")
        );
        assert_eq!(maps[1].path, "/usr/lib/a b.so");
        assert_eq!(maps[1].offset, 0x1a000);
        assert_eq!(maps[1].prot(), (libc::PROT_READ | libc::PROT_EXEC) as u64);
        assert!(maps[2].is_anonymous() && maps[2].path.is_empty());
    }

    #[test]
    fn the_maps_plan_keeps_equal_mappings_and_moves_heap_and_stack() {
        let lib = vma(0x7000, 0x8000, "r-xp", "/usr/lib/x.so");
        let f = vec![
            vma(0x1000, 0x5000, "rw-p", "[heap]"),
            lib.clone(),
            vma(0x9000, 0xa000, "rw-p", ""),
            vma(0xa000, 0xb000, "r--p", "/work/m.bin"),
            vma(0xe000, 0x10000, "rw-p", "[stack]"),
            vma(0x20000, 0x21000, "r-xp", "[vdso]"),
        ];
        let t = vec![
            vma(0x1000, 0x3000, "rw-p", "[heap]"),
            lib,
            vma(0x9000, 0xc000, "rw-p", ""),
            vma(0xf000, 0x10000, "rw-p", "[stack]"),
            vma(0x20000, 0x21000, "r-xp", "[vdso]"),
        ];
        let plan = plan_maps(&f, &t).unwrap();
        assert_eq!(plan.unmap, vec![(0x9000, 0xc000)]);
        assert_eq!(plan.map, vec![f[2].clone(), f[3].clone()]);
        assert_eq!(plan.heap_end, Some(0x5000));
        assert_eq!((plan.grow_stack_to, plan.drop_stack), (Some(0xe000), None));
        let deeper = [vma(0xe000, 0x10000, "rw-p", "[stack]"), f[5].clone()];
        let plan = plan_maps(&[f[4].clone(), f[5].clone()], &deeper).unwrap();
        assert_eq!(plan, MapPlan::default());
        let shallower = [vma(0xf000, 0x10000, "rw-p", "[stack]"), f[5].clone()];
        let plan = plan_maps(&shallower, &deeper).unwrap();
        assert_eq!(plan.drop_stack, Some((0xe000, 0xf000)));
    }

    #[test]
    fn what_the_copy_cannot_map_is_an_error_naming_it() {
        let vdso = vma(0x20000, 0x21000, "r-xp", "[vdso]");
        let err = |f: Vma| {
            plan_maps(&[f, vdso.clone()], std::slice::from_ref(&vdso))
                .unwrap_err()
                .to_string()
        };
        let deleted = err(vma(0x1000, 0x2000, "r--p", "/work/lib.so (deleted)"));
        assert!(
            deleted.contains("deleted file") && deleted.contains("/work/lib.so"),
            "{deleted}"
        );
        let shared = err(vma(0x1000, 0x2000, "rw-s", "/dev/zero (deleted)"));
        assert!(shared.contains("deleted"), "{shared}");
        let shared = err(vma(0x1000, 0x2000, "rw-s", "/work/shared.bin"));
        assert!(
            shared.contains("shared mapping") && shared.contains("/work/shared.bin"),
            "{shared}"
        );
        let moved = plan_maps(
            std::slice::from_ref(&vdso),
            &[vma(0x30000, 0x31000, "r-xp", "[vdso]")],
        );
        assert!(moved.unwrap_err().to_string().contains("[vdso]"));
    }

    #[test]
    fn pages_are_copied_when_private_to_the_frozen_and_dropped_when_private_to_the_twin() {
        let anon = PM_PRESENT;
        let file = PM_PRESENT | PM_FILE;
        let swapped = PM_SWAP;
        let none = 0;
        let f = [anon, swapped, file, none, none, file, anon];
        let t = [none, anon, anon, anon, none, file, file];
        assert_eq!(
            page_runs(&f, &t),
            vec![
                (0, 2, PageAction::Copy),
                (2, 2, PageAction::Drop),
                (6, 1, PageAction::Copy),
            ]
        );
        let long = vec![anon; CHUNK_PAGES + 3];
        assert_eq!(
            page_runs(&long, &[]),
            vec![
                (0, CHUNK_PAGES, PageAction::Copy),
                (CHUNK_PAGES, 3, PageAction::Copy)
            ]
        );
    }

    #[test]
    fn descriptors_are_carried_by_path_and_the_rest_named() {
        let seen = |fd, link: &str, dir, pos| FdSeen {
            fd,
            link: link.into(),
            dir,
            flags: 0o2100002,
            pos,
        };
        let f = [
            seen(0, "pipe:[7]", false, 0),
            seen(1, "pipe:[8]", false, 0),
            seen(3, "/work/data.bin", false, 100),
            seen(4, "socket:[99]", false, 0),
            seen(5, "/work", true, 0),
            seen(6, "/work/sub", true, 32),
            seen(7, "/work/gone (deleted)", false, 0),
            seen(8, "anon_inode:[eventfd]", false, 0),
        ];
        let plan = plan_fds(&f, &[0, 1, 2, 3, 4, 9], &[]);
        let carried: Vec<(i32, &str, u64)> = plan
            .carry
            .iter()
            .map(|c| (c.fd, c.path.as_str(), c.pos))
            .collect();
        assert_eq!(carried, vec![(3, "/work/data.bin", 100), (5, "/work", 0)]);
        assert_eq!(plan.close, vec![4, 9]);
        assert_eq!(
            plan.not_carried,
            vec![
                "fd 4: socket:[99]",
                "fd 6: directory /work/sub read to position 32",
                "fd 7: /work/gone (deleted)",
                "fd 8: anon_inode:[eventfd]",
            ]
        );
    }

    #[test]
    fn the_twins_own_numbers_stay_its_own_and_the_frozens_there_are_not_named() {
        let seen = |fd, link: &str| FdSeen {
            fd,
            link: link.into(),
            dir: false,
            flags: 0o2000000,
            pos: 0,
        };
        let f = [
            seen(3, "pipe:[7]"),
            seen(4, "pipe:[8]"),
            seen(5, "/work/a"),
            seen(6, "pipe:[9]"),
        ];
        let plan = plan_fds(&f, &[0, 1, 2, 3, 4, 6], &[3, 4]);
        assert_eq!(plan.carry.len(), 1);
        assert_eq!(plan.carry[0].fd, 5);
        assert_eq!(plan.close, vec![6]);
        assert_eq!(plan.not_carried, vec!["fd 6: pipe:[9]"]);
    }

    #[test]
    fn fdinfo_gives_flags_and_offset() {
        let text = "pos:\t4096\nflags:\t02100002\nmnt_id:\t31\nino:\t12\n";
        assert_eq!(parse_fdinfo(text), Some((0o2100002, 4096)));
        assert_eq!(parse_fdinfo("pos: x\n"), None);
    }
}
