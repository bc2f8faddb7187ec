//! Why the engine could not take a job to an outcome of its own (the job's result is then
//! `error`, with this text): one variant per operation of a run that can fail.

use nix::errno::Errno;

use crate::sandbox::isolate::cgroup::CgroupError;

#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    #[error("the sandbox zygote is gone; restart the node")]
    ZygoteGone,
    #[error("the sandbox zygote died during the job")]
    ZygoteDied,
    #[error("{0}")]
    EncodePayload(serde_json::Error),
    #[error("stdin: {0}")]
    DecodeStdin(base64::DecodeError),
    #[error("memfd: {0}")]
    MemfdCreate(Errno),
    #[error("memfd: {0}")]
    MemfdWrite(std::io::Error),
    #[error("memfd seals: {0}")]
    MemfdSeal(Errno),
    #[error("pipe: {0}")]
    Pipe(Errno),
    #[error("the compile stage's socket: {0}")]
    StageSocket(Errno),
    #[error("sending the job to the zygote: {0}")]
    SendJob(Errno),
    #[error("telling the zygote about the job: {0}")]
    SendStarted(Errno),
    /// Without the launcher's pid the program would run unlimited.
    #[error("cgroup placement failed (job not run): job {req}: launcher pid unknown")]
    LauncherPidUnknown { req: u64 },
    #[error("cgroup placement failed (job not run): {0}")]
    CgroupPlacement(CgroupError),
}

impl RunError {
    /// The errno of the system call that failed, where the failure was one: the node tells a
    /// host short of descriptors or memory from it, never from the text.
    pub(crate) fn errno(&self) -> Option<Errno> {
        match self {
            RunError::MemfdCreate(e)
            | RunError::MemfdSeal(e)
            | RunError::Pipe(e)
            | RunError::StageSocket(e)
            | RunError::SendJob(e)
            | RunError::SendStarted(e) => Some(*e),
            RunError::MemfdWrite(e) => e.raw_os_error().map(Errno::from_raw),
            _ => None,
        }
    }
}
