//! The sandbox's root filesystem, assembled by each init inside its own mount namespace.
//!
//! Host directories are never exposed writable: each allowlisted directory is a read-only bind
//! mount on a root tmpfs whose own mount is read-only, and the job writes only to `/tmp`, the
//! working directory and `/dev` (with `/dev/shm`). Those are directories of one size-capped
//! tmpfs, the sandbox's *disk*, each bind-mounted writable, so `disk_mb` bounds everything a job
//! can write, together: RAM a job fills through files is not counted by `RLIMIT_AS`, so
//! separate caps per directory would have let it hold several times its disk size. Without an
//! image, the disk is the root tmpfs itself. An unpacked image (`--rootfs`) is instead the lower
//! layer of an overlay whose upper layer lives on the disk, so the job may change it in RAM. The
//! old root is detached after `pivot_root`, so nothing of the host outside the allowlist
//! (`/home`, `/root`, `/run`, `/var`, `/srv`, ...) is reachable.
//!
//! Read-only binds rather than overlays for the host directories: a job's root maps to a host
//! user that owns none of them, so an overlay's writable upper layer would only ever have turned
//! writes away with EACCES instead of EROFS, while costing two mounts per directory, slower path
//! lookups, and an RCU grace period per overlay when the sandbox is torn down. Bind mounts of
//! one tmpfs rather than a tmpfs each: every superblock costs its creation, its shrinker and
//! memory-cgroup bookkeeping, and its tear-down, once per sandbox.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::wire::RootSource;

/// Device nodes bound from the host into `/dev`.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Name of the old root inside the new one, between `pivot_root` and its detach.
const OLD_ROOT: &str = ".oldroot";

/// A failed isolation step: what was being done, on which path, and the errno.
#[derive(Debug, thiserror::Error)]
#[error("{step} {path}: {errno}")]
pub struct SetupError {
    pub step: &'static str,
    pub path: PathBuf,
    pub errno: Errno,
}

fn fail<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> SetupError + 'a {
    move |errno| SetupError {
        step,
        path: path.to_owned(),
        errno,
    }
}

fn io_fail<'a>(
    step: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> SetupError + 'a {
    move |e| SetupError {
        step,
        path: path.to_owned(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

const NOSUID_NODEV: MsFlags = MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV);

fn tmpfs(target: &Path, options: &str) -> Result<(), SetupError> {
    mount(
        Some("tmpfs"),
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

/// Builds the root and pivots into it. Runs in the init, in its fresh mount namespace.
pub fn enter(plan: &RootPlan<'_>) -> Result<(), SetupError> {
    // Private first: nothing we mount may propagate back to the zygote or the host.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(fail("make-rprivate", Path::new("/")))?;
    let root = plan.staging.join("root");
    let disk_size = format!("size={}m", plan.disk_mb);
    // The directory holding the job's writable directories: the root tmpfs itself, or, with an
    // image, the tmpfs that also holds the overlay's upper layer.
    let disk = match plan.source {
        RootSource::Allowlist(dirs) => {
            tmpfs(&root, &format!("{disk_size},mode=0755"))?;
            for dir in dirs {
                expose(dir, &root)?;
            }
            root.clone()
        }
        RootSource::Image(image) => {
            let layers = plan.staging.join("layers");
            tmpfs(&layers, &format!("{disk_size},mode=0700"))?;
            overlay(image, &root, &layers.join("image"))?;
            layers.join("rw")
        }
    };
    let work = plan.work_dir.trim_start_matches('/');
    for dir in ["dev", "proc", "tmp", work, OLD_ROOT] {
        let dir = root.join(dir);
        fs::create_dir_all(&dir).map_err(io_fail("mkdir", &dir))?;
    }
    populate_dev(&writable(&root, &disk, "dev", 0o755)?)?;
    writable(&root, &disk, "tmp", 0o1777)?;
    writable(&root, &disk, work, 0o755)?;
    // proc must be mounted while the host's proc is still visible in this namespace (the
    // kernel refuses a proc mount that would reveal more than an existing one).
    let proc = root.join("proc");
    mount(
        Some("proc"),
        &proc,
        Some("proc"),
        NOSUID_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(fail("mount proc", &proc))?;
    let old = root.join(OLD_ROOT);
    nix::unistd::pivot_root(&root, &old).map_err(fail("pivot_root", &root))?;
    nix::unistd::chdir("/").map_err(fail("chdir", Path::new("/")))?;
    let old = Path::new("/").join(OLD_ROOT);
    umount2(&old, MntFlags::MNT_DETACH).map_err(fail("detach old root", &old))?;
    fs::remove_dir(&old).map_err(io_fail("rmdir", &old))?;
    if matches!(plan.source, RootSource::Allowlist(_)) {
        // The root's own mount holds only mount points and symlinks: read-only. The writable
        // directories are mounts of their own and stay writable.
        let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | NOSUID_NODEV;
        mount(None::<&str>, "/", None::<&str>, flags, None::<&str>)
            .map_err(fail("remount root read-only", Path::new("/")))?;
    }
    Ok(())
}

/// Makes `disk/rel` (mode `mode`) and binds it writable on `root/rel`; returns the latter.
/// Without an image the disk is the root, so the directory is bound on itself: it becomes a
/// mount of its own, which stays writable when the root's mount turns read-only.
fn writable(root: &Path, disk: &Path, rel: &str, mode: u32) -> Result<PathBuf, SetupError> {
    let (dir, target) = (disk.join(rel), root.join(rel));
    fs::create_dir_all(&dir).map_err(io_fail("mkdir", &dir))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).map_err(io_fail("chmod", &dir))?;
    bind(&dir, &target, MsFlags::empty()).map_err(fail("bind", &target))?;
    Ok(target)
}

/// Bind-mounts `src` on `target`, with `flags` added to `MS_BIND`.
fn bind(src: &Path, target: &Path, flags: MsFlags) -> nix::Result<()> {
    mount(
        Some(src),
        target,
        None::<&str>,
        MsFlags::MS_BIND | flags,
        None::<&str>,
    )
}

/// Exposes one host directory (or recreates one host symlink) under `root`.
fn expose(dir: &Path, root: &Path) -> Result<(), SetupError> {
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
    read_only_bind(dir, &target)
}

fn overlay(lower: &Path, target: &Path, layer: &Path) -> Result<(), SetupError> {
    let (upper, work) = (layer.join("upper"), layer.join("work"));
    for d in [&upper, &work, &target.to_path_buf()] {
        fs::create_dir_all(d).map_err(io_fail("mkdir", d))?;
    }
    let lower_s = lower.to_string_lossy();
    if lower_s.contains([',', ':']) {
        return Err(SetupError {
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
    mount(
        Some("overlay"),
        target,
        Some("overlay"),
        NOSUID_NODEV,
        Some(options.as_str()),
    )
    .map_err(fail("mount overlay", target))
}

fn read_only_bind(dir: &Path, target: &Path) -> Result<(), SetupError> {
    bind(dir, target, MsFlags::MS_REC).map_err(fail("bind", target))?;
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | NOSUID_NODEV;
    mount(None::<&str>, target, None::<&str>, flags, None::<&str>)
        .map_err(fail("remount read-only", target))
}

fn populate_dev(dev: &Path) -> Result<(), SetupError> {
    for name in DEVICES {
        let (host, node) = (Path::new("/dev").join(name), dev.join(name));
        fs::File::create(&node).map_err(io_fail("create", &node))?;
        bind(&host, &node, MsFlags::empty()).map_err(fail("bind device", &host))?;
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

/// Resizes the job's disk (after the pivot). `/tmp` is a mount of the disk's superblock, so
/// remounting it (not as a bind) changes the size for every writable directory at once.
pub fn resize(disk_mb: u64) -> Result<(), SetupError> {
    let options = format!("size={disk_mb}m");
    let target = Path::new("/tmp");
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_REMOUNT | NOSUID_NODEV,
        Some(options.as_str()),
    )
    .map_err(fail("resize the disk", target))
}
