//! A fork's disk: the node copies the parent sandbox's working directory into a branch's,
//! from the host, through each sandbox's init (`/proc/<init>/root`), before the twin is made
//! (the twin opens the parent's files again by path, in its own disk).
//!
//! What the sandboxes hold is untrusted: every entry is opened beneath its directory with no
//! symlink, magic link or mount crossed (`open_beneath`), a symlink is copied as a symlink and
//! never followed, and what is neither a file, a directory nor a symlink (a fifo, a socket) is
//! named and left out. What the node creates is given to the owner of the branch's working
//! directory (the sandbox's root), so the branch can change it.
//!
//! A copy is bounded while it runs, not checked after: it makes at most the bytes and the
//! entries the session's disk can hold ([`CopyBound`]) and stops at the first past them,
//! naming the bound. The tree read can hold more than the disk: a session writes on during
//! the copy, and a file linked under several names is copied once per name. Without the bound
//! the node would read and write all of it first (into a checkpoint's directory, which no
//! tmpfs of the session's bounds).

use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstat, Mode, SFlag};
use nix::unistd::{Gid, Uid};

use crate::sandbox::isolate::rootfs::disk_inodes;
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

/// What one copy may make: the size and the inodes of a disk of `disk_mb` MiB (the
/// session's, which the copy's destination has too, or stands for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyBound {
    pub disk_mb: u64,
}

impl CopyBound {
    /// The bytes of the files copied, at most.
    pub fn bytes(self) -> u64 {
        self.disk_mb.saturating_mul(1 << 20)
    }

    /// The entries read (files, directories, symlinks, and what is left out), at most.
    pub fn entries(self) -> u64 {
        disk_inodes(self.disk_mb)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DiskCopyError {
    #[error(
        "the disk's copy stopped at {path}: past its bound of {bound} {what}, what a disk of \
         {disk_mb} MiB (the session's disk size) holds"
    )]
    OverBound {
        path: PathBuf,
        what: &'static str,
        bound: u64,
        disk_mb: u64,
    },
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
/// the one of the sandbox whose init is `to` (entries already there are overwritten), within
/// `bound`.
pub fn copy_work(
    from: i32,
    to: i32,
    work: &str,
    bound: CopyBound,
) -> Result<DiskCopy, DiskCopyError> {
    let (src, dst) = (open_work(from, work)?, open_work(to, work)?);
    copy_to_owner(&src, &dst, Path::new(work), bound)
}

/// Copies the node's directory `dir` (a checkpoint's disk) into the working directory `work`
/// of the sandbox whose init is `to`, within `bound`.
pub fn copy_dir_in(
    dir: &Path,
    to: i32,
    work: &str,
    bound: CopyBound,
) -> Result<DiskCopy, DiskCopyError> {
    let src = open_dir(dir.to_owned())?;
    let dst = open_work(to, work)?;
    copy_to_owner(&src, &dst, Path::new(work), bound)
}

/// Copies the working directory `work` of the sandbox whose init is `from` into the node's
/// directory `dir` (a checkpoint's disk, empty), whose entries are then given to the owner of
/// `dir`, within `bound`.
pub fn copy_work_out(
    from: i32,
    work: &str,
    dir: &Path,
    bound: CopyBound,
) -> Result<DiskCopy, DiskCopyError> {
    let src = open_work(from, work)?;
    let dst = open_dir(dir.to_owned())?;
    copy_to_owner(&src, &dst, Path::new(work), bound)
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

/// Copies the tree under `src` into `dst`, as the owner of `dst`, to whom all it makes goes,
/// stopping at the first byte or entry past `bound`.
fn copy_to_owner(
    src: &OwnedFd,
    dst: &OwnedFd,
    here: &Path,
    bound: CopyBound,
) -> Result<DiskCopy, DiskCopyError> {
    let st = fstat(dst.as_raw_fd()).map_err(|errno| entry("reading", here, errno))?;
    let owner = (Uid::from_raw(st.st_uid), Gid::from_raw(st.st_gid));
    // The disks are mounted in the sandboxes' user namespaces, where host root has no id: a
    // file host root creates there would have no owner (the kernel refuses, EOVERFLOW). So
    // this thread works as the branch's owner, and only this thread.
    let _as_owner = AsOwner::enter(owner);
    let mut copy = Copying {
        owner,
        bound,
        entries: 0,
        out: DiskCopy::default(),
    };
    copy.dir(src, dst, here, 0)?;
    Ok(copy.out)
}

/// A copy under way: what it made so far, against its bound.
struct Copying {
    owner: (Uid, Gid),
    bound: CopyBound,
    /// The entries read so far.
    entries: u64,
    out: DiskCopy,
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

/// The names in the directory `dir` (without `.` and `..`), at most `most`: past it, `None`.
fn names(dir: &OwnedFd, path: &Path, most: u64) -> Result<Option<Vec<Vec<u8>>>, DiskCopyError> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut listing = nix::dir::Dir::openat(Some(dir.as_raw_fd()), ".", flags, Mode::empty())
        .map_err(|errno| entry("listing", path, errno))?;
    let mut out = Vec::new();
    for e in listing.iter() {
        let e = e.map_err(|errno| entry("listing", path, errno))?;
        let name = e.file_name().to_bytes();
        if name != b"." && name != b".." {
            if out.len() as u64 >= most {
                return Ok(None);
            }
            out.push(name.to_vec());
        }
    }
    Ok(Some(out))
}

impl Copying {
    fn over(&self, what: &'static str, bound: u64, path: &Path) -> DiskCopyError {
        DiskCopyError::OverBound {
            path: path.to_owned(),
            what,
            bound,
            disk_mb: self.bound.disk_mb,
        }
    }

    fn dir(
        &mut self,
        src: &OwnedFd,
        dst: &OwnedFd,
        path: &Path,
        depth: usize,
    ) -> Result<(), DiskCopyError> {
        let most = self.bound.entries();
        // Read no more names than the entries left: a directory is listed whole before its
        // entries are copied.
        let Some(listed) = names(src, path, most - self.entries)? else {
            return Err(self.over("entries", most, path));
        };
        self.entries += listed.len() as u64;
        let owner = self.owner;
        for raw in listed {
            let name = OsStr::from_bytes(&raw);
            let here = path.join(name);
            let st =
                nix::sys::stat::fstatat(Some(src.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_err(|errno| entry("reading", &here, errno))?;
            let mode = Mode::from_bits_truncate(st.st_mode & 0o777);
            match SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT) {
                SFlag::S_IFDIR if depth >= MAX_DEPTH => self.out.not_copied.push(format!(
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
                    self.dir(&from, &into, &here, depth + 1)?;
                    give(&into, owner, mode, &here)?;
                }
                SFlag::S_IFREG => {
                    let left = self.bound.bytes() - self.out.bytes;
                    let copied = copy_file(src, dst, name, &here, (owner, mode), left)?;
                    let Some(n) = copied else {
                        return Err(self.over("bytes", self.bound.bytes(), &here));
                    };
                    self.out.bytes += n;
                    self.out.files += 1;
                }
                SFlag::S_IFLNK => {
                    let target = nix::fcntl::readlinkat(Some(src.as_raw_fd()), name)
                        .map_err(|errno| entry("reading", &here, errno))?;
                    match nix::unistd::symlinkat(target.as_os_str(), Some(dst.as_raw_fd()), name) {
                        Ok(()) => {}
                        Err(Errno::EEXIST) => self.out.not_copied.push(format!(
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
                _ => self.out.not_copied.push(format!(
                    "{}: neither a file, a directory nor a symlink",
                    here.display()
                )),
            }
        }
        Ok(())
    }
}

/// Copies one regular file (checked again once open: it may have changed since it was
/// listed), reading at most one byte past `left`; returns its size, or `None` when it is
/// more than `left` (what was written of it is left, cut).
fn copy_file(
    src: &OwnedFd,
    dst: &OwnedFd,
    name: &OsStr,
    here: &Path,
    (owner, mode): ((Uid, Gid), Mode),
    left: u64,
) -> Result<Option<u64>, DiskCopyError> {
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
    let (from, mut into) = (File::from(from), File::from(into));
    // The size read at the open is no bound: the file can grow while it is copied.
    let n = std::io::copy(&mut from.take(left.saturating_add(1)), &mut into).map_err(|error| {
        DiskCopyError::Write {
            path: here.to_owned(),
            error,
        }
    })?;
    if n > left {
        return Ok(None);
    }
    let (atime, mtime) = (
        nix::sys::time::TimeSpec::new(st.st_atime, st.st_atime_nsec),
        nix::sys::time::TimeSpec::new(st.st_mtime, st.st_mtime_nsec),
    );
    nix::sys::stat::futimens(into.as_raw_fd(), &atime, &mtime)
        .map_err(|errno| entry("timing", here, errno))?;
    Ok(Some(n))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies the directory `src` into `dst` (both the test's) within `bound`.
    fn copy(src: &Path, dst: &Path, bound: CopyBound) -> Result<DiskCopy, DiskCopyError> {
        let (src, dst) = (open_dir(src.to_owned())?, open_dir(dst.to_owned())?);
        copy_to_owner(&src, &dst, Path::new("/work"), bound)
    }

    /// The bytes of the regular files under `dir`.
    fn bytes_under(dir: &Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| {
                let t = e.file_type().unwrap();
                match () {
                    _ if t.is_dir() => bytes_under(&e.path()),
                    _ if t.is_file() => e.metadata().unwrap().len(),
                    _ => 0,
                }
            })
            .sum()
    }

    const ONE_MIB: CopyBound = CopyBound { disk_mb: 1 };

    #[test]
    fn a_tree_within_the_bound_is_copied_whole() {
        let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::create_dir(src.path().join("d")).unwrap();
        std::fs::write(src.path().join("d/a"), vec![7u8; 1 << 19]).unwrap();
        std::fs::write(src.path().join("b"), vec![8u8; (1 << 19) - 1]).unwrap();
        let copied = copy(src.path(), dst.path(), ONE_MIB).unwrap();
        assert_eq!((copied.files, copied.bytes), (2, (1 << 20) - 1));
        assert_eq!(bytes_under(dst.path()), (1 << 20) - 1);
    }

    /// A tree holding more bytes than the disk (a file linked under several names, or one
    /// written while it is copied): the copy stops at the bound, having written no more.
    #[test]
    fn a_copy_stops_at_its_bound_of_bytes_having_made_no_more() {
        let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(src.path().join("big"), vec![1u8; 3 << 19]).unwrap();
        for i in 0..4 {
            std::fs::hard_link(src.path().join("big"), src.path().join(format!("l{i}"))).unwrap();
        }
        let e = copy(src.path(), dst.path(), ONE_MIB).unwrap_err();
        let DiskCopyError::OverBound {
            what, bound, path, ..
        } = &e
        else {
            panic!("{e}");
        };
        assert_eq!((*what, *bound), ("bytes", 1 << 20), "{e}");
        assert!(path.starts_with("/work"), "{e}");
        assert!(
            e.to_string().contains("1048576 bytes") && e.to_string().contains("1 MiB"),
            "{e}"
        );
        // What was written is within the bound (and one byte past it, at most, to tell).
        assert!(
            bytes_under(dst.path()) <= (1 << 20) + 1,
            "{}",
            bytes_under(dst.path())
        );
    }

    #[test]
    fn a_copy_stops_at_its_bound_of_entries() {
        let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let most = ONE_MIB.entries();
        for i in 0..=most {
            std::fs::write(src.path().join(format!("f{i}")), b"").unwrap();
        }
        let e = copy(src.path(), dst.path(), ONE_MIB).unwrap_err();
        assert!(
            matches!(e, DiskCopyError::OverBound { what: "entries", bound, .. } if bound == most),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(dst.path()).unwrap().count(), 0);
    }

    #[test]
    fn entries_are_counted_over_the_whole_tree() {
        let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let most = ONE_MIB.entries();
        // Half in the top directory (one of them a directory), half in the one below.
        for i in 0..most / 2 {
            std::fs::write(src.path().join(format!("f{i}")), b"").unwrap();
        }
        std::fs::create_dir(src.path().join("d")).unwrap();
        for i in 0..most / 2 {
            std::fs::write(src.path().join(format!("d/f{i}")), b"").unwrap();
        }
        let e = copy(src.path(), dst.path(), ONE_MIB).unwrap_err();
        assert!(
            matches!(
                e,
                DiskCopyError::OverBound {
                    what: "entries",
                    ..
                }
            ),
            "{e}"
        );
    }
}
