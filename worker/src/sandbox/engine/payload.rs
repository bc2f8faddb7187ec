//! What a job becomes before it is handed over: its clean environment, the memfds that carry
//! it, and the check that its command line fits the kernel's bound at exec.

use std::io::{Seek, Write};
use std::os::fd::OwnedFd;

use forkbox_queue::schema::{exec_footprint, Job};

use super::defaults::DEFAULT_PATH;
use super::run_error::RunError;

/// What argv and the whole environment take at exec, counted by the protocol's rule.
pub(super) fn exec_bytes(job: &Job, work_dir: &str) -> usize {
    let command = job.command();
    let env = job_env(job, work_dir);
    exec_footprint(
        command.iter().map(String::as_str),
        env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    )
}

/// The kernel's bound on argv and environment at exec for a process with our stack rlimit
/// (the sandbox inherits it); the rule is the protocol's
/// [`forkbox_queue::schema::exec_args_limit`].
pub(super) fn exec_args_limit() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_STACK)
        .map(|(soft, _)| soft)
        .unwrap_or(8 * 1024 * 1024);
    forkbox_queue::schema::exec_args_limit(soft)
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
pub(super) fn memfd_with(bytes: &[u8]) -> Result<OwnedFd, RunError> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::memfd::MemFdCreateFlag;
    let fd = nix::sys::memfd::memfd_create(
        c"forkbox-job",
        MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
    )
    .map_err(RunError::MemfdCreate)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes).map_err(RunError::MemfdWrite)?;
    file.rewind().map_err(RunError::MemfdWrite)?;
    let seals = SealFlag::F_SEAL_WRITE
        | SealFlag::F_SEAL_GROW
        | SealFlag::F_SEAL_SHRINK
        | SealFlag::F_SEAL_SEAL;
    fcntl(
        std::os::fd::AsRawFd::as_raw_fd(&file),
        FcntlArg::F_ADD_SEALS(seals),
    )
    .map_err(RunError::MemfdSeal)?;
    Ok(file.into())
}

pub(super) fn pipe() -> Result<(OwnedFd, OwnedFd), RunError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(RunError::Pipe)
}
