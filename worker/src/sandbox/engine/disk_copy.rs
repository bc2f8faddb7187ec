//! A fork's disk: the node copies the parent sandbox's working directory into a branch's,
//! from the host, through each sandbox's init (`/proc/<init>/root`), before the twin is made
//! (the twin opens the parent's files again by path, in its own disk).
//!
//! What the sandboxes hold is untrusted: every entry is opened beneath its directory with no
//! symlink, magic link or mount crossed (`open_beneath`), a symlink is copied as a symlink and
//! never followed, and what is neither a file, a directory nor a symlink (a fifo, a socket) is
//! named and left out. What the node creates is given to the owner of the branch's working
//! directory (the sandbox's root), so the branch can change it. The branch's disk size bounds
//! the copy (its tmpfs refuses what does not fit, and the copy fails naming the file).

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstat, Mode, SFlag};
use nix::unistd::{Gid, Uid};

use crate::sandbox::kernel::sys::open_beneath;

/// Directories deeper than this are not copied (named instead).
const MAX_DEPTH: usize = 64;

/// What a copy did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskCopy {
    pub files: u64,
    pub bytes: u64,
    /// What was left out, each named (`/work/p: a fifo`).
    pub not_copied: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum DiskCopyError {
    #[error("opening the sandbox's working directory {path}: {error}")]
    OpenWork {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{step} {path} of the fork's disk: {errno}")]
    Entry {
        step: &'static str,
        path: PathBuf,
        errno: Errno,
    },
    #[error("copying {path} into the branch's disk: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// Where a branch's disk comes from: a live sandbox's working directory (its init's host
/// pid, when known), or a directory of the node's (a checkpoint's copy).
#[derive(Debug, Clone)]
pub enum DiskSource {
    Sandbox(Option<i32>),
    Dir(PathBuf),
}

/// Copies the working directory `work` of the sandbox whose init has host pid `from` into
/// the one of the sandbox whose init is `to` (entries already there are overwritten).
pub fn copy_work(from: i32, to: i32, work: &str) -> Result<DiskCopy, DiskCopyError> {
    let (src, dst) = (open_work(from, work)?, open_work(to, work)?);
    copy_to_owner(&src, &dst, Path::new(work))
}

/// Copies the node's directory `dir` (a checkpoint's disk) into the working directory `work`
/// of the sandbox whose init is `to`.
pub fn copy_dir_in(dir: &Path, to: i32, work: &str) -> Result<DiskCopy, DiskCopyError> {
    let src = open_dir(dir.to_owned())?;
    let dst = open_work(to, work)?;
    copy_to_owner(&src, &dst, Path::new(work))
}

/// Copies the working directory `work` of the sandbox whose init is `from` into the node's
/// directory `dir` (a checkpoint's disk, empty), whose entries are then given to the owner of
/// `dir`.
pub fn copy_work_out(from: i32, work: &str, dir: &Path) -> Result<DiskCopy, DiskCopyError> {
    let src = open_work(from, work)?;
    let dst = open_dir(dir.to_owned())?;
    copy_to_owner(&src, &dst, Path::new(work))
}

/// The working directory `work` of the sandbox whose init has host pid `init`, open.
fn open_work(init: i32, work: &str) -> Result<OwnedFd, DiskCopyError> {
    open_dir(PathBuf::from(format!("/proc/{init}/root{work}")))
}

fn open_dir(path: PathBuf) -> Result<OwnedFd, DiskCopyError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(&path)
        .map(OwnedFd::from)
        .map_err(|error| DiskCopyError::OpenWork { path, error })
}

/// Copies the tree under `src` into `dst`, as the owner of `dst`, to whom all it makes goes.
fn copy_to_owner(src: &OwnedFd, dst: &OwnedFd, here: &Path) -> Result<DiskCopy, DiskCopyError> {
    let st = fstat(dst.as_raw_fd()).map_err(|errno| entry("reading", here, errno))?;
    let owner = (Uid::from_raw(st.st_uid), Gid::from_raw(st.st_gid));
    // The disks are mounted in the sandboxes' user namespaces, where host root has no id: a
    // file host root creates there would have no owner (the kernel refuses, EOVERFLOW). So
    // this thread works as the branch's owner, and only this thread.
    let _as_owner = AsOwner::enter(owner);
    let mut out = DiskCopy::default();
    copy_dir(src, dst, here, owner, 0, &mut out)?;
    Ok(out)
}

/// The calling thread's filesystem ids set to an owner's until dropped (`setfsuid` and
/// `setfsgid` are per thread).
struct AsOwner {
    uid: Uid,
    gid: Gid,
}

impl AsOwner {
    fn enter((uid, gid): (Uid, Gid)) -> AsOwner {
        let gid = nix::unistd::setfsgid(gid);
        let uid = nix::unistd::setfsuid(uid);
        AsOwner { uid, gid }
    }
}

impl Drop for AsOwner {
    fn drop(&mut self) {
        nix::unistd::setfsuid(self.uid);
        nix::unistd::setfsgid(self.gid);
    }
}

fn entry(step: &'static str, path: &Path, errno: Errno) -> DiskCopyError {
    DiskCopyError::Entry {
        step,
        path: path.to_owned(),
        errno,
    }
}

/// The names in the directory `dir` (without `.` and `..`).
fn names(dir: &OwnedFd, path: &Path) -> Result<Vec<Vec<u8>>, DiskCopyError> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut listing = nix::dir::Dir::openat(Some(dir.as_raw_fd()), ".", flags, Mode::empty())
        .map_err(|errno| entry("listing", path, errno))?;
    let mut out = Vec::new();
    for e in listing.iter() {
        let e = e.map_err(|errno| entry("listing", path, errno))?;
        let name = e.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(name.to_vec());
        }
    }
    Ok(out)
}

fn copy_dir(
    src: &OwnedFd,
    dst: &OwnedFd,
    path: &Path,
    owner: (Uid, Gid),
    depth: usize,
    out: &mut DiskCopy,
) -> Result<(), DiskCopyError> {
    for raw in names(src, path)? {
        let name = OsStr::from_bytes(&raw);
        let here = path.join(name);
        let st = nix::sys::stat::fstatat(Some(src.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|errno| entry("reading", &here, errno))?;
        let mode = Mode::from_bits_truncate(st.st_mode & 0o777);
        match SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT) {
            SFlag::S_IFDIR if depth >= MAX_DEPTH => out.not_copied.push(format!(
                "{}: deeper than {MAX_DEPTH} directories",
                here.display()
            )),
            SFlag::S_IFDIR => {
                match nix::sys::stat::mkdirat(Some(dst.as_raw_fd()), name, Mode::S_IRWXU) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(errno) => return Err(entry("making", &here, errno)),
                }
                let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
                let from = open_beneath(src.as_fd(), name, flags)
                    .map_err(|errno| entry("opening", &here, errno))?;
                let into = open_beneath(dst.as_fd(), name, flags)
                    .map_err(|errno| entry("opening", &here, errno))?;
                // Its permissions last: a directory the parent made read-only is still filled.
                copy_dir(&from, &into, &here, owner, depth + 1, out)?;
                give(&into, owner, mode, &here)?;
            }
            SFlag::S_IFREG => {
                out.bytes += copy_file(src, dst, name, &here, (owner, mode))?;
                out.files += 1;
            }
            SFlag::S_IFLNK => {
                let target = nix::fcntl::readlinkat(Some(src.as_raw_fd()), name)
                    .map_err(|errno| entry("reading", &here, errno))?;
                match nix::unistd::symlinkat(target.as_os_str(), Some(dst.as_raw_fd()), name) {
                    Ok(()) => {}
                    Err(Errno::EEXIST) => out.not_copied.push(format!(
                        "{}: a symlink over an existing entry",
                        here.display()
                    )),
                    Err(errno) => return Err(entry("making", &here, errno)),
                }
                let (uid, gid) = owner;
                nix::unistd::fchownat(
                    Some(dst.as_raw_fd()),
                    name,
                    Some(uid),
                    Some(gid),
                    AtFlags::AT_SYMLINK_NOFOLLOW,
                )
                .map_err(|errno| entry("giving", &here, errno))?;
            }
            _ => out.not_copied.push(format!(
                "{}: neither a file, a directory nor a symlink",
                here.display()
            )),
        }
    }
    Ok(())
}

/// Copies one regular file (checked again once open: it may have changed since it was
/// listed); returns its size.
fn copy_file(
    src: &OwnedFd,
    dst: &OwnedFd,
    name: &OsStr,
    here: &Path,
    (owner, mode): ((Uid, Gid), Mode),
) -> Result<u64, DiskCopyError> {
    let read = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let from =
        open_beneath(src.as_fd(), name, read).map_err(|errno| entry("opening", here, errno))?;
    let st = fstat(from.as_raw_fd()).map_err(|errno| entry("reading", here, errno))?;
    if SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT) != SFlag::S_IFREG {
        return Err(entry("reading", here, Errno::EINVAL));
    }
    let write = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_CLOEXEC;
    let into =
        open_beneath(dst.as_fd(), name, write).map_err(|errno| entry("making", here, errno))?;
    give(&into, owner, mode, here)?;
    let (mut from, mut into) = (File::from(from), File::from(into));
    let n = std::io::copy(&mut from, &mut into).map_err(|error| DiskCopyError::Write {
        path: here.to_owned(),
        error,
    })?;
    let (atime, mtime) = (
        nix::sys::time::TimeSpec::new(st.st_atime, st.st_atime_nsec),
        nix::sys::time::TimeSpec::new(st.st_mtime, st.st_mtime_nsec),
    );
    nix::sys::stat::futimens(into.as_raw_fd(), &atime, &mtime)
        .map_err(|errno| entry("timing", here, errno))?;
    Ok(n)
}

/// Gives what the node made to the branch's owner, with the parent's permissions.
fn give(
    fd: &OwnedFd,
    (uid, gid): (Uid, Gid),
    mode: Mode,
    here: &Path,
) -> Result<(), DiskCopyError> {
    nix::unistd::fchown(fd.as_raw_fd(), Some(uid), Some(gid))
        .map_err(|errno| entry("giving", here, errno))?;
    nix::sys::stat::fchmod(fd.as_raw_fd(), mode).map_err(|errno| entry("giving", here, errno))
}
