//! What a job becomes before it is handed over: its clean environment, the memfds that carry
//! it, and the check that its command line fits the kernel's bound at exec.

use std::io::{Seek, Write};
use std::os::fd::OwnedFd;

use forkbox_queue::schema::Job;

use super::wire::SetupError;
use super::DEFAULT_PATH;

/// What argv and the whole environment take at exec (strings, NULs, one pointer each).
pub(super) fn exec_bytes(job: &Job, work_dir: &str) -> usize {
    let ptr = std::mem::size_of::<usize>();
    let env: usize = job_env(job, work_dir)
        .iter()
        .map(|(k, v)| k.len() + v.len() + 2 + ptr)
        .sum();
    let args: usize = job.command().iter().map(|a| a.len() + 1 + ptr).sum();
    args + env
}

/// The kernel's bound on argv and environment at exec for a process with our stack rlimit
/// (the sandbox inherits it): a quarter of the soft limit, at least 128 KiB (`ARG_MAX`), at
/// most three quarters of 8 MiB (`_STK_LIM`).
pub(super) fn exec_args_limit() -> usize {
    const ARG_MAX: u64 = 128 * 1024;
    const STK_LIM: u64 = 8 * 1024 * 1024;
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_STACK)
        .map(|(soft, _)| soft)
        .unwrap_or(STK_LIM);
    let limit = (STK_LIM / 4 * 3).min(soft / 4).max(ARG_MAX);
    usize::try_from(limit).unwrap_or(usize::MAX)
}

/// The clean environment of a job: defaults, then the job's own variables.
pub(super) fn job_env(job: &Job, work_dir: &str) -> Vec<(String, String)> {
    let mut env: std::collections::BTreeMap<String, String> = [
        ("PATH", DEFAULT_PATH),
        ("HOME", work_dir),
        ("LANG", "C.UTF-8"),
        ("TMPDIR", "/tmp"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    env.extend(job.env.clone());
    env.into_iter().collect()
}

/// A memfd holding `bytes`, sealed against every change. The stdin memfd becomes the program's
/// descriptor 0 (opened read-write, like every memfd), so without the seals a job could grow it
/// into memory that no limit of its own counts.
pub(super) fn memfd_with(bytes: &[u8]) -> Result<OwnedFd, SetupError> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::memfd::MemFdCreateFlag;
    let fd = nix::sys::memfd::memfd_create(
        c"forkbox-job",
        MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
    )
    .map_err(|e| SetupError::errno("memfd", e))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)
        .map_err(|e| SetupError::io("memfd", &e))?;
    file.rewind().map_err(|e| SetupError::io("memfd", &e))?;
    let seals = SealFlag::F_SEAL_WRITE
        | SealFlag::F_SEAL_GROW
        | SealFlag::F_SEAL_SHRINK
        | SealFlag::F_SEAL_SEAL;
    fcntl(
        std::os::fd::AsRawFd::as_raw_fd(&file),
        FcntlArg::F_ADD_SEALS(seals),
    )
    .map_err(|e| SetupError::errno("memfd seals", e))?;
    Ok(file.into())
}

pub(super) fn pipe() -> Result<(OwnedFd, OwnedFd), SetupError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| SetupError::errno("pipe", e))
}
