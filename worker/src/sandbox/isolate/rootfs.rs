//! The sandbox's root filesystem: a template the zygote builds once, copied by each init into
//! its own mount namespace.
//!
//! Host directories are never exposed writable: each allowlisted directory is a read-only bind
//! mount on a small root tmpfs, the *template* ([`build_template`]), whose superblock and mount
//! are read-only, and the job writes only to `/tmp`, the working directory and `/dev/shm`.
//! Those are directories of one size-capped tmpfs, the sandbox's *disk*, each bind-mounted
//! writable, so `disk_mb` bounds everything a job can write, together: RAM a job fills through
//! files is not counted by `RLIMIT_AS`, so separate caps per directory would have let it hold
//! several times its disk size. An unpacked image (`--rootfs`) is instead the lower layer of
//! an overlay whose upper layer lives on the disk, so the job may change it in RAM; it has no
//! template. The old root is detached after `pivot_root`, so nothing of the host outside the
//! allowlist (`/home`, `/root`, `/run`, `/var`, `/srv`, ...) is reachable.
//!
//! Read-only binds rather than overlays for the host directories: a job's root maps to a host
//! user that owns none of them, so an overlay's writable upper layer would only ever have turned
//! writes away with EACCES instead of EROFS, while costing two mounts per directory, slower path
//! lookups, and an RCU grace period per overlay when the sandbox is torn down. Bind mounts of
//! one tmpfs rather than a tmpfs each: every superblock costs its creation, its shrinker and
//! memory-cgroup bookkeeping, and its tear-down, once per sandbox.
//!
//! The disk caps inodes as well as bytes ([`disk_inodes`]): an empty file costs no page of the
//! tmpfs but about a kilobyte of kernel memory (inode and dentry), which `size` does not count.
//! A host directory's own submounts (a tmpfs under an allowlisted directory, say) are made
//! read-only with it, in one recursive step, so none stays writable inside.

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::MsFlags;
use serde::{Deserialize, Serialize};

use super::setup_error::SetupError;
use crate::sandbox::kernel::sys;
use crate::sandbox::kernel::syscalls::{Host, Syscalls};

/// Where the sandbox root comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RootSource {
    /// Host directories exposed read-only at the same path (symlinks are recreated).
    Allowlist(Vec<PathBuf>),
    /// An unpacked root filesystem used as the single lower layer.
    Image(PathBuf),
}

/// Device nodes bound from the host into `/dev`.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// A failed isolation step: what was being done, on which path, and the errno.
#[derive(Debug, thiserror::Error)]
#[error("{step} {path}: {errno}")]
pub struct RootfsError {
    pub step: &'static str,
    pub path: PathBuf,
    pub errno: Errno,
}

impl From<RootfsError> for SetupError {
    fn from(e: RootfsError) -> SetupError {
        SetupError::errno(e.step, e.errno).at(e.path.display().to_string())
    }
}

fn fail<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> RootfsError + 'a {
    move |errno| RootfsError {
        step,
        path: path.to_owned(),
        errno,
    }
}

fn io_fail<'a>(
    step: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> RootfsError + 'a {
    move |e| RootfsError {
        step,
        path: path.to_owned(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

const NOSUID_NODEV: MsFlags = MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV);

fn tmpfs(k: &impl Syscalls, target: &Path, options: &str) -> Result<(), RootfsError> {
    k.mount(
        Some(Path::new("tmpfs")),
        target,
        Some("tmpfs"),
        NOSUID_NODEV,
        Some(options),
    )
    .map_err(fail("mount tmpfs", target))
}

/// Everything the init needs to build its root.
pub struct RootPlan<'a> {
    pub source: &'a RootSource,
    /// Host directory holding the empty `root` and `layers` mount points.
    pub staging: &'a Path,
    pub work_dir: &'a str,
    pub disk_mb: u64,
}

/// Builds the root template in the zygote's own mount namespace, once, before any sandbox:
/// the root's skeleton (a small tmpfs holding the mount points, the recreated symlinks and
/// `/dev`), every allowlisted directory bound read-only on it, the device nodes bound in, and
/// then the tmpfs made read-only, superblock and mount. Each init copies it with one recursive
/// bind ([`enter`]) instead of building the same tree again; only the disk, `/proc` and the
/// pivot are its own. An image root (`--rootfs`) has no template: its overlay is per sandbox.
pub fn build_template(
    source: &RootSource,
    staging: &Path,
    work_dir: &str,
) -> Result<(), RootfsError> {
    // The template's directories and symlinks belong to the zygote's root, which a sandbox's
    // root is not when the node runs as host root: they must be open to others (0755), not
    // whatever the node's umask (027, 077 on hardened hosts) would leave them.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    build_template_with(&Host, source, staging, work_dir)
}

/// The template's tmpfs: mount points, symlinks and device-node placeholders only, never a
/// file's contents.
const TEMPLATE_OPTIONS: &str = "size=1m,nr_inodes=4096,mode=0755";

/// [`build_template`], its mounts made through `k`.
pub(super) fn build_template_with(
    k: &impl Syscalls,
    source: &RootSource,
    staging: &Path,
    work_dir: &str,
) -> Result<(), RootfsError> {
    let RootSource::Allowlist(dirs) = source else {
        return Ok(());
    };
    let root = staging.join("root");
    tmpfs(k, &root, TEMPLATE_OPTIONS)?;
    for dir in dirs {
        expose(k, dir, &root)?;
    }
    mount_points(&root, work_dir)?;
    populate_dev(k, &root.join("dev"))?;
    // Read-only twice: the superblock (no mount of it anywhere can write), then this mount,
    // which every sandbox copies with its flags (the kernel locks them in the copy a less
    // privileged user namespace gets).
    k.mount(
        None,
        &root,
        None,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | NOSUID_NODEV,
        Some(TEMPLATE_OPTIONS),
    )
    .map_err(fail("remount the template read-only", &root))?;
    k.mount(
        None,
        &root,
        None,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | NOSUID_NODEV,
        None,
    )
    .map_err(fail("make the template's mount read-only", &root))
}

/// Builds the root and pivots into it. Runs in the init, in its fresh mount namespace.
/// Returns a descriptor of `/proc/sys` on the writable proc mount, which the job cannot reach
/// (its `/proc/sys` is a read-only mount on top), for the init to set the sandbox's own
/// namespaced sysctls (see `ipc`).
pub fn enter(plan: &RootPlan<'_>) -> Result<OwnedFd, RootfsError> {
    enter_with(&Host, plan)
}

/// [`enter`], its mounts, pivot and detach made through `k`. The steps, in order: make every
/// mount private; the root (a copy of the template, or an overlay on the image); the disk and
/// the writable directories bound from it; proc, its sysctls protected; pivot; detach the old
/// root.
pub(super) fn enter_with(k: &impl Syscalls, plan: &RootPlan<'_>) -> Result<OwnedFd, RootfsError> {
    // Private first: nothing we mount may propagate back to the zygote or the host.
    k.mount(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
    )
    .map_err(fail("make-rprivate", Path::new("/")))?;
    match plan.source {
        RootSource::Allowlist(_) => enter_template(k, plan),
        RootSource::Image(image) => enter_image(k, plan, image),
    }
}

/// The allowlist's root: a copy of the zygote's template ([`build_template`]). The template's
/// mounts came into this namespace locked (a less privileged user namespace's copy), and the
/// kernel refuses to pivot into a locked mount, so the init binds it once more, recursively:
/// the copy's top mount is its own, and every mount keeps its read-only, nosuid and nodev
/// flags, still locked. The disk is a tmpfs of its own, mounted on the staging directory's
/// `layers` (in the old root, so it disappears from view with it), whose `tmp`, working
/// directory and `shm` are bound on the root's mount points.
fn enter_template(k: &impl Syscalls, plan: &RootPlan<'_>) -> Result<OwnedFd, RootfsError> {
    let root = plan.staging.join("root");
    bind(k, &root, &root, MsFlags::MS_REC).map_err(fail("copy the root template", &root))?;
    let disk = plan.staging.join("layers");
    disk_tmpfs(k, &disk, plan.disk_mb, 0o755)?;
    bind_disk(k, &disk, &root, plan.work_dir)?;
    // POSIX semaphores and shared memory (Python's multiprocessing) live in /dev/shm.
    writable(k, &disk, "dev/shm", &root.join("dev/shm"), 0o1777)?;
    let sysctls = mount_proc(k, &root)?;
    pivot(k, &root)?;
    Ok(sysctls)
}

/// An image's root: an overlay on the image whose upper layer lives on the disk, built in full
/// by each init; `/dev` is a directory of the disk too, so the job may change it.
fn enter_image(
    k: &impl Syscalls,
    plan: &RootPlan<'_>,
    image: &Path,
) -> Result<OwnedFd, RootfsError> {
    let root = plan.staging.join("root");
    let layers = plan.staging.join("layers");
    disk_tmpfs(k, &layers, plan.disk_mb, 0o700)?;
    overlay(k, image, &root, &layers.join("image"))?;
    let disk = layers.join("rw");
    mount_points(&root, plan.work_dir)?;
    let dev = root.join("dev");
    writable(k, &disk, "dev", &dev, 0o755)?;
    populate_dev(k, &dev)?;
    bind_disk(k, &disk, &root, plan.work_dir)?;
    let sysctls = mount_proc(k, &root)?;
    pivot(k, &root)?;
    Ok(sysctls)
}

/// What every sandbox mounts of its own over its root, by mount point (the working directory,
/// which its disk covers too, aside), and what it is: an allowlisted host directory at or
/// below one would be hidden.
pub const OWN_MOUNTS: [(&str, &str); 3] = [
    ("dev", "its own devices"),
    ("proc", "its own proc"),
    ("tmp", "its own disk"),
];

/// The mount points every sandbox covers with something of its own, as absolute paths, with
/// what it puts there: [`OWN_MOUNTS`] and the working directory `work_dir` (its disk). A host
/// directory at or below one cannot be exposed.
pub fn own_mount_points(work_dir: &str) -> Vec<(String, &'static str)> {
    let own = OWN_MOUNTS.map(|(dir, what)| (format!("/{dir}"), what));
    let work = (work_dir.to_owned(), "its own disk as the working directory");
    own.into_iter().chain([work]).collect()
}

/// The mount points every root has: [`OWN_MOUNTS`] and the working directory.
fn mount_points(root: &Path, work_dir: &str) -> Result<(), RootfsError> {
    let own = OWN_MOUNTS.iter().map(|(dir, _)| *dir);
    for dir in own.chain([work_dir.trim_start_matches('/')]) {
        let dir = root.join(dir);
        fs::create_dir_all(&dir).map_err(io_fail("mkdir", &dir))?;
    }
    Ok(())
}

/// Binds the disk's `tmp` and working directory on the root's.
fn bind_disk(
    k: &impl Syscalls,
    disk: &Path,
    root: &Path,
    work_dir: &str,
) -> Result<(), RootfsError> {
    writable(k, disk, "tmp", &root.join("tmp"), 0o1777)?;
    let work = work_dir.trim_start_matches('/');
    writable(k, disk, work, &root.join(work), 0o755)
}

/// Makes `root` the root. From inside it, the pivot needs no mount point for the old root: it
/// lands on top of the new one, where "." names it, and is detached at once, with everything
/// of the host beneath it.
fn pivot(k: &impl Syscalls, root: &Path) -> Result<(), RootfsError> {
    k.chdir(root).map_err(fail("chdir", root))?;
    let here = Path::new(".");
    k.pivot_root(here, here).map_err(fail("pivot_root", root))?;
    k.detach(here)
        .map_err(fail("detach old root", Path::new("/")))?;
    k.chdir(Path::new("/"))
        .map_err(fail("chdir", Path::new("/")))
}

/// Mounts a fresh proc on `root/proc` and protects its sysctls. Before the pivot: the kernel
/// refuses a proc mount that would reveal more than one already in the namespace, so the
/// host's must still be visible.
fn mount_proc(k: &impl Syscalls, root: &Path) -> Result<OwnedFd, RootfsError> {
    let proc = root.join("proc");
    k.mount(
        Some(Path::new("proc")),
        &proc,
        Some("proc"),
        NOSUID_NODEV | MsFlags::MS_NOEXEC,
        None,
    )
    .map_err(fail("mount proc", &proc))?;
    protect_proc(k, &proc)
}

/// Paths of a sandbox's proc that write kernel state beyond its own processes, made read-only
/// as container runtimes do. `/proc/sys` holds the sysctls: those a user namespace's root may
/// write are the namespaced ones (network, ipc, mqueue, uts, user), which would let the job
/// lift the bounds the init sets (the ipc ones) or change its network namespace; the rest are
/// owned by host root already. `/proc/sysrq-trigger` is owned by host root too: read-only as
/// a second wall.
const READ_ONLY_PROC: &[&str] = &["sys", "sysrq-trigger"];

/// Makes [`READ_ONLY_PROC`] read-only under `proc`; returns an `O_PATH` descriptor of the
/// writable `sys` beneath, opened first.
fn protect_proc(k: &impl Syscalls, proc: &Path) -> Result<OwnedFd, RootfsError> {
    let sys_dir = proc.join("sys");
    let sysctls = k
        .open_dir_path(&sys_dir)
        .map_err(io_fail("open", &sys_dir))?;
    for rel in READ_ONLY_PROC {
        let path = proc.join(rel);
        if *rel != "sys" && !path.exists() {
            // Not built into this kernel.
            continue;
        }
        bind(k, &path, &path, MsFlags::MS_REC).map_err(fail("bind", &path))?;
        let flags = MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | NOSUID_NODEV
            | MsFlags::MS_NOEXEC;
        k.mount(None, &path, None, flags, None)
            .map_err(fail("remount read-only", &path))?;
    }
    Ok(sysctls)
}

/// Makes `disk/rel` (mode `mode`) and binds it writable on `target`, a mount of its own that
/// stays writable under a read-only root.
fn writable(
    k: &impl Syscalls,
    disk: &Path,
    rel: &str,
    target: &Path,
    mode: u32,
) -> Result<(), RootfsError> {
    let dir = disk.join(rel);
    fs::create_dir_all(&dir).map_err(io_fail("mkdir", &dir))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).map_err(io_fail("chmod", &dir))?;
    bind(k, &dir, target, MsFlags::empty()).map_err(fail("bind", target))
}

/// Bind-mounts `src` on `target`, with `flags` added to `MS_BIND`.
fn bind(k: &impl Syscalls, src: &Path, target: &Path, flags: MsFlags) -> nix::Result<()> {
    k.mount(Some(src), target, None, MsFlags::MS_BIND | flags, None)
}

/// Exposes one host directory (or recreates one host symlink) under `root`.
fn expose(k: &impl Syscalls, dir: &Path, root: &Path) -> Result<(), RootfsError> {
    let rel = dir.strip_prefix("/").unwrap_or(dir);
    let target = root.join(rel);
    let meta = match fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_fail("stat", dir)(e)),
    };
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent).map_err(io_fail("mkdir", parent))?;
    }
    if meta.file_type().is_symlink() {
        let dest = fs::read_link(dir).map_err(io_fail("readlink", dir))?;
        return symlink(&dest, &target).map_err(io_fail("symlink", &target));
    }
    if !meta.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(&target).map_err(io_fail("mkdir", &target))?;
    read_only_bind(k, dir, &target)
}

fn overlay(
    k: &impl Syscalls,
    lower: &Path,
    target: &Path,
    layer: &Path,
) -> Result<(), RootfsError> {
    let (upper, work) = (layer.join("upper"), layer.join("work"));
    for d in [&upper, &work, &target.to_path_buf()] {
        fs::create_dir_all(d).map_err(io_fail("mkdir", d))?;
    }
    let lower_s = lower.to_string_lossy();
    if lower_s.contains([',', ':']) {
        return Err(RootfsError {
            step: "overlay lowerdir",
            path: lower.to_owned(),
            errno: Errno::EINVAL,
        });
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        lower_s,
        upper.display(),
        work.display()
    );
    k.mount(
        Some(Path::new("overlay")),
        target,
        Some("overlay"),
        NOSUID_NODEV,
        Some(options.as_str()),
    )
    .map_err(fail("mount overlay", target))
}

/// Binds `dir` and every mount beneath it on `target`, all read-only, nosuid and nodev: a
/// remount would change the top mount alone and leave a writable submount writable.
fn read_only_bind(k: &impl Syscalls, dir: &Path, target: &Path) -> Result<(), RootfsError> {
    bind(k, dir, target, MsFlags::MS_REC).map_err(fail("bind", target))?;
    k.mount_setattr_recursive(
        target,
        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
    )
    .map_err(fail("make read-only, recursively", target))
}

fn populate_dev(k: &impl Syscalls, dev: &Path) -> Result<(), RootfsError> {
    for name in DEVICES {
        let (host, node) = (Path::new("/dev").join(name), dev.join(name));
        fs::File::create(&node).map_err(io_fail("create", &node))?;
        bind(k, &host, &node, MsFlags::empty()).map_err(fail("bind device", &host))?;
        // Read-only: the device still reads and writes (a mount's flag does not apply to
        // device I/O), but the host's node keeps its timestamps and attributes. Set, not a
        // remount: the bind carries the host mount's flags, locked in this user namespace
        // (`noexec` on some hosts' /dev), and a remount must repeat every one of them.
        k.mount_setattr_recursive(&node, sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID)
            .map_err(fail("make device read-only", &node))?;
    }
    for (name, dest) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let link = dev.join(name);
        symlink(dest, &link).map_err(io_fail("symlink", &link))?;
    }
    // POSIX semaphores and shared memory (Python's multiprocessing) live in /dev/shm.
    let shm = dev.join("shm");
    fs::create_dir(&shm).map_err(io_fail("mkdir", &shm))?;
    fs::set_permissions(&shm, fs::Permissions::from_mode(0o1777)).map_err(io_fail("chmod", &shm))
}

/// Inodes of a disk of `disk_mb` MiB: one per 4 KiB page it can hold. A file with any content
/// takes a page anyway, so the cap only ever stops empty files (and directories, symlinks),
/// whose kernel memory it bounds to about a third of the disk's size.
pub fn disk_inodes(disk_mb: u64) -> u64 {
    disk_mb.saturating_mul(256)
}

/// Mounts the sandbox's disk, a tmpfs of `disk_mb` MiB whose root has `mode`, on `target`.
fn disk_tmpfs(
    k: &impl Syscalls,
    target: &Path,
    disk_mb: u64,
    mode: u32,
) -> Result<(), RootfsError> {
    tmpfs(
        k,
        target,
        &format!("{},mode={mode:04o}", disk_options(disk_mb)),
    )
}

/// The tmpfs options of a disk of `disk_mb` MiB.
fn disk_options(disk_mb: u64) -> String {
    format!("size={disk_mb}m,nr_inodes={}", disk_inodes(disk_mb))
}

/// Resizes the job's disk, bytes and inodes (after the pivot). `/tmp` is a mount of the disk's
/// superblock, so remounting it (not as a bind) changes the size for every writable directory
/// at once.
pub fn resize(disk_mb: u64) -> Result<(), RootfsError> {
    let options = disk_options(disk_mb);
    let target = Path::new("/tmp");
    Host.mount(
        None,
        target,
        None,
        MsFlags::MS_REMOUNT | NOSUID_NODEV,
        Some(options.as_str()),
    )
    .map_err(fail("resize the disk", target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::kernel::syscalls::recording::{Call, Recorder};

    /// A staging directory with its mount points, and a fake host with one directory and one
    /// symlink to expose.
    fn staging() -> (tempfile::TempDir, PathBuf, Vec<PathBuf>) {
        let tmp = tempfile::tempdir().unwrap();
        let staging = tmp.path().join("staging");
        for sub in ["root", "layers"] {
            fs::create_dir_all(staging.join(sub)).unwrap();
        }
        let host = tmp.path().join("host");
        fs::create_dir_all(host.join("usr/bin")).unwrap();
        symlink("usr/bin", host.join("bin")).unwrap();
        (tmp, staging, vec![host.join("usr"), host.join("bin")])
    }

    /// The plan of a sandbox with a 16 MiB disk working in `/work`.
    fn plan<'a>(source: &'a RootSource, staging: &'a Path) -> RootPlan<'a> {
        RootPlan {
            source,
            staging,
            work_dir: "/work",
            disk_mb: 16,
        }
    }

    fn position(calls: &[Call], what: &str, matches: impl Fn(&Call) -> bool) -> usize {
        calls
            .iter()
            .position(matches)
            .unwrap_or_else(|| panic!("no {what} in {calls:#?}"))
    }

    fn is_mount_of(call: &Call, fs: &str) -> bool {
        matches!(call, Call::Mount { fstype: Some(t), .. } if t == fs)
    }

    #[test]
    fn the_template_is_the_allowlist_bound_read_only_then_made_read_only_itself() {
        let (_tmp, staging, dirs) = staging();
        let source = RootSource::Allowlist(dirs.clone());
        let k = Recorder::default();
        build_template_with(&k, &source, &staging, "/work").expect("recorded template");
        let calls = k.calls();
        let root = staging.join("root");
        // The skeleton's tmpfs first; each host directory bound and made read-only
        // (recursively); the symlink recreated, never bound; nothing mounted elsewhere.
        assert!(is_mount_of(&calls[0], "tmpfs"), "{calls:#?}");
        let usr = root.join(dirs[0].strip_prefix("/").unwrap());
        let bind_usr = position(
            &calls,
            "bind usr",
            |c| matches!(c, Call::Mount { target, .. } if *target == usr),
        );
        let ro_usr = position(&calls, "read-only usr", |c| {
            *c == Call::SetAttr(usr.clone())
        });
        assert!(bind_usr < ro_usr);
        let bin = root.join(dirs[1].strip_prefix("/").unwrap());
        assert!(fs::symlink_metadata(&bin).unwrap().file_type().is_symlink());
        for call in &calls {
            if let Call::Mount { target, .. } | Call::SetAttr(target) = call {
                assert!(target.starts_with(&root), "{call:?} outside the template");
            }
        }
        // The devices bound, then made read-only (their I/O is not the mount's; their
        // timestamps are the host's); the mount points of every sandbox's own mounts made.
        let null = root.join("dev/null");
        let bind_null = position(&calls, "bind /dev/null", |c| {
            matches!(c, Call::Mount { source: Some(s), target, .. }
                if s == Path::new("/dev/null") && *target == null)
        });
        assert_eq!(calls[bind_null + 1], Call::SetAttr(null.clone()));
        for dir in ["proc", "tmp", "work", "dev/shm"] {
            assert!(root.join(dir).is_dir(), "no mount point {dir}");
        }
        // Read-only last: the superblock, then the mount every sandbox copies.
        let n = calls.len();
        assert_eq!(
            calls[n - 2..],
            [
                Call::Mount {
                    source: None,
                    target: root.clone(),
                    fstype: None,
                    flags: MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | NOSUID_NODEV,
                },
                Call::Mount {
                    source: None,
                    target: root.clone(),
                    fstype: None,
                    flags: MsFlags::MS_REMOUNT
                        | MsFlags::MS_BIND
                        | MsFlags::MS_RDONLY
                        | NOSUID_NODEV,
                },
            ]
        );
    }

    #[test]
    fn an_image_root_has_no_template() {
        let (tmp, staging, _) = staging();
        let source = RootSource::Image(tmp.path().join("image"));
        let k = Recorder::default();
        build_template_with(&k, &source, &staging, "/work").expect("nothing to build");
        assert_eq!(k.calls(), []);
    }

    #[test]
    fn each_root_is_a_copy_of_the_template_with_a_disk_and_proc_of_its_own() {
        let (_tmp, staging, dirs) = staging();
        let source = RootSource::Allowlist(dirs);
        let plan = plan(&source, &staging);
        let k = Recorder::default();
        enter_with(&k, &plan).expect("recorded set-up");
        let calls = k.calls();
        let (root, disk) = (staging.join("root"), staging.join("layers"));
        let mount =
            |source: Option<&Path>, target: &Path, fstype: Option<&str>, flags| Call::Mount {
                source: source.map(Path::to_owned),
                target: target.to_owned(),
                fstype: fstype.map(str::to_owned),
                flags,
            };
        let disk_bind = |rel: &str| {
            mount(
                Some(&disk.join(rel)),
                &root.join(rel),
                None,
                MsFlags::MS_BIND,
            )
        };
        let here = PathBuf::from(".");
        assert_eq!(
            calls,
            [
                // Private before anything else is mounted.
                mount(
                    None,
                    Path::new("/"),
                    None,
                    MsFlags::MS_REC | MsFlags::MS_PRIVATE
                ),
                // The template copied in one recursive bind; then the disk, and its
                // directories bound writable on the copy's mount points.
                mount(Some(&root), &root, None, MsFlags::MS_BIND | MsFlags::MS_REC),
                mount(Some(Path::new("tmpfs")), &disk, Some("tmpfs"), NOSUID_NODEV),
                disk_bind("tmp"),
                disk_bind("work"),
                disk_bind("dev/shm"),
                // Proc while the host's is still visible, its sysctls opened, then protected.
                mount(
                    Some(Path::new("proc")),
                    &root.join("proc"),
                    Some("proc"),
                    NOSUID_NODEV | MsFlags::MS_NOEXEC
                ),
                Call::OpenDirPath(root.join("proc/sys")),
                mount(
                    Some(&root.join("proc/sys")),
                    &root.join("proc/sys"),
                    None,
                    MsFlags::MS_BIND | MsFlags::MS_REC
                ),
                mount(
                    None,
                    &root.join("proc/sys"),
                    None,
                    MsFlags::MS_REMOUNT
                        | MsFlags::MS_BIND
                        | MsFlags::MS_RDONLY
                        | NOSUID_NODEV
                        | MsFlags::MS_NOEXEC
                ),
                // (No sysrq-trigger under this test's staging root: only the real proc has
                // one.) Into the copy, pivot with the old root on top of it, and detach that.
                Call::Chdir(root.clone()),
                Call::PivotRoot {
                    new_root: here.clone(),
                    put_old: here.clone(),
                },
                Call::Detach(here),
                Call::Chdir("/".into()),
            ]
        );
        // The disk's directories: the job's own, with the usual modes.
        let mode = |d: &str| fs::metadata(disk.join(d)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(
            (mode("tmp"), mode("work"), mode("dev/shm")),
            (0o1777, 0o755, 0o1777)
        );
    }

    #[test]
    fn an_image_root_is_an_overlay_and_stays_writable() {
        let (tmp, staging, _) = staging();
        let image = tmp.path().join("image");
        fs::create_dir_all(image.join("bin")).unwrap();
        let source = RootSource::Image(image.clone());
        let plan = plan(&source, &staging);
        let k = Recorder::default();
        enter_with(&k, &plan).expect("recorded set-up");
        let calls = k.calls();
        let layers = position(
            &calls,
            "layers tmpfs",
            |c| matches!(c, Call::Mount { target, .. } if *target == staging.join("layers")),
        );
        let overlay = position(&calls, "overlay", |c| is_mount_of(c, "overlay"));
        let proc = position(&calls, "mount proc", |c| is_mount_of(c, "proc"));
        let pivot = position(&calls, "pivot_root", |c| {
            matches!(c, Call::PivotRoot { .. })
        });
        assert!(layers < overlay && overlay < proc && proc < pivot);
        // The job may change the image's files (in RAM): no read-only remount of the root, and
        // the same pivot as the template's, from inside the new root.
        let root = staging.join("root");
        let here = PathBuf::from(".");
        assert_eq!(
            calls[pivot - 1..],
            [
                Call::Chdir(root),
                Call::PivotRoot {
                    new_root: here.clone(),
                    put_old: here.clone(),
                },
                Call::Detach(here),
                Call::Chdir("/".into()),
            ]
        );
        // /dev is the disk's, the devices bound into it.
        let dev = staging.join("layers/rw/dev");
        position(
            &calls,
            "bind the disk's /dev",
            |c| matches!(c, Call::Mount { source: Some(s), .. } if *s == dev),
        );
    }

    #[test]
    fn a_refused_step_stops_the_set_up_and_names_itself() {
        let (_tmp, staging, dirs) = staging();
        let source = RootSource::Allowlist(dirs);
        let plan = plan(&source, &staging);
        let k = Recorder {
            fail: Some(|c| is_mount_of(c, "proc")),
            ..Recorder::default()
        };
        let err = enter_with(&k, &plan).unwrap_err();
        let proc = staging.join("root/proc");
        assert_eq!(
            err.to_string(),
            format!(
                "mount proc {}: EPERM: Operation not permitted",
                proc.display()
            )
        );
        // Fail closed: no pivot into a root without its proc.
        assert!(!k
            .calls()
            .iter()
            .any(|c| matches!(c, Call::PivotRoot { .. })));
    }

    #[test]
    fn a_failed_step_reads_as_a_set_up_error() {
        let e = RootfsError {
            step: "pivot_root",
            path: "/staging/root".into(),
            errno: Errno::EPERM,
        };
        let text = "pivot_root /staging/root: EPERM: Operation not permitted";
        assert_eq!(e.to_string(), text);
        assert_eq!(SetupError::from(e).to_string(), text);
    }

    #[test]
    fn the_disk_has_one_inode_per_page() {
        assert_eq!(disk_inodes(1), 256);
        assert_eq!(disk_inodes(64), 16384);
        assert_eq!(disk_options(64), "size=64m,nr_inodes=16384");
        assert_eq!(disk_inodes(u64::MAX), u64::MAX);
    }
}
