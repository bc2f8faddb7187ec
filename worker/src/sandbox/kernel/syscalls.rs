//! A narrow seam over the calls whose order the set-up depends on: mounts, `pivot_root` and
//! the old root's detach, and the hardening `prctl`s (no_new_privs, capabilities, seccomp).
//!
//! Set-up code is generic over [`Syscalls`]; the real path uses [`Host`], a unit struct whose
//! methods are the plain calls (monomorphised, so the seam costs nothing), and unit tests use
//! a recorder that logs each call instead of making it, so the order ("proc before pivot",
//! "no_new_privs, then capabilities, then seccomp") is tested without root or namespaces.
//! Ordinary file operations on the staging directory (mkdir, chmod, symlink) stay outside the
//! seam: tests point the staging directory at a tempdir.

use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;

use super::sys::{self, SockFilter};

/// The set-up calls whose order matters.
pub trait Syscalls {
    fn mount(
        &self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> nix::Result<()>;
    /// `mount_setattr(AT_RECURSIVE)` setting `set` on `path` and every mount beneath it.
    fn mount_setattr_recursive(&self, path: &Path, set: u64) -> nix::Result<()>;
    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> nix::Result<()>;
    fn chdir(&self, dir: &Path) -> nix::Result<()>;
    /// Lazily detaches the mount on `target` (`MNT_DETACH`).
    fn detach(&self, target: &Path) -> nix::Result<()>;
    /// An `O_PATH` descriptor of the directory `dir`.
    fn open_dir_path(&self, dir: &Path) -> std::io::Result<OwnedFd>;
    fn set_no_new_privs(&self) -> nix::Result<()>;
    /// Drops every capability up to `last` from every set, and the bounding and ambient sets.
    fn drop_all_capabilities(&self, last: libc::c_ulong) -> nix::Result<()>;
    fn install_seccomp(&self, program: &[SockFilter]) -> nix::Result<()>;
    fn unshare(&self, flags: CloneFlags) -> nix::Result<()>;
    /// Brings the loopback interface of the current network namespace up.
    fn loopback_up(&self) -> nix::Result<()>;
    fn sethostname(&self, name: &str) -> nix::Result<()>;
}

/// The real calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct Host;

impl Syscalls for Host {
    fn mount(
        &self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> nix::Result<()> {
        nix::mount::mount(source, target, fstype, flags, data)
    }

    fn mount_setattr_recursive(&self, path: &Path, set: u64) -> nix::Result<()> {
        sys::mount_setattr_recursive(path, set)
    }

    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> nix::Result<()> {
        nix::unistd::pivot_root(new_root, put_old)
    }

    fn chdir(&self, dir: &Path) -> nix::Result<()> {
        nix::unistd::chdir(dir)
    }

    fn detach(&self, target: &Path) -> nix::Result<()> {
        nix::mount::umount2(target, MntFlags::MNT_DETACH)
    }

    fn open_dir_path(&self, dir: &Path) -> std::io::Result<OwnedFd> {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(dir)
            .map(OwnedFd::from)
    }

    fn set_no_new_privs(&self) -> nix::Result<()> {
        nix::sys::prctl::set_no_new_privs()
    }

    fn drop_all_capabilities(&self, last: libc::c_ulong) -> nix::Result<()> {
        sys::drop_all_capabilities(last)
    }

    fn install_seccomp(&self, program: &[SockFilter]) -> nix::Result<()> {
        sys::install_seccomp(program)
    }

    fn unshare(&self, flags: CloneFlags) -> nix::Result<()> {
        nix::sched::unshare(flags)
    }

    fn loopback_up(&self) -> nix::Result<()> {
        sys::loopback_up()
    }

    fn sethostname(&self, name: &str) -> nix::Result<()> {
        nix::unistd::sethostname(name)
    }
}

#[cfg(test)]
pub(crate) mod recording {
    //! A [`Syscalls`] that records each call instead of making it.

    use std::cell::RefCell;
    use std::os::fd::OwnedFd;
    use std::path::{Path, PathBuf};

    use nix::errno::Errno;
    use nix::mount::MsFlags;
    use nix::sched::CloneFlags;

    use super::Syscalls;
    use crate::sandbox::kernel::sys::SockFilter;

    /// One recorded call.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Call {
        Mount {
            source: Option<PathBuf>,
            target: PathBuf,
            fstype: Option<String>,
            flags: MsFlags,
        },
        SetAttr(PathBuf),
        PivotRoot {
            new_root: PathBuf,
            put_old: PathBuf,
        },
        Chdir(PathBuf),
        Detach(PathBuf),
        OpenDirPath(PathBuf),
        NoNewPrivs,
        DropCapabilities(libc::c_ulong),
        Seccomp(usize),
        Unshare(CloneFlags),
        LoopbackUp,
        Sethostname(String),
    }

    /// Records calls; fails with EPERM the first call `fail` matches (and every later one it
    /// matches), as a kernel refusing that step would.
    #[derive(Default)]
    pub struct Recorder {
        pub calls: RefCell<Vec<Call>>,
        pub fail: Option<fn(&Call) -> bool>,
    }

    impl Recorder {
        pub fn calls(&self) -> Vec<Call> {
            self.calls.borrow().clone()
        }

        fn record(&self, call: Call) -> nix::Result<()> {
            let refused = self.fail.is_some_and(|f| f(&call));
            self.calls.borrow_mut().push(call);
            if refused {
                Err(Errno::EPERM)
            } else {
                Ok(())
            }
        }
    }

    impl Syscalls for Recorder {
        fn mount(
            &self,
            source: Option<&Path>,
            target: &Path,
            fstype: Option<&str>,
            flags: MsFlags,
            _data: Option<&str>,
        ) -> nix::Result<()> {
            self.record(Call::Mount {
                source: source.map(Path::to_owned),
                target: target.to_owned(),
                fstype: fstype.map(str::to_owned),
                flags,
            })
        }

        fn mount_setattr_recursive(&self, path: &Path, _set: u64) -> nix::Result<()> {
            self.record(Call::SetAttr(path.to_owned()))
        }

        fn pivot_root(&self, new_root: &Path, put_old: &Path) -> nix::Result<()> {
            self.record(Call::PivotRoot {
                new_root: new_root.to_owned(),
                put_old: put_old.to_owned(),
            })
        }

        fn chdir(&self, dir: &Path) -> nix::Result<()> {
            self.record(Call::Chdir(dir.to_owned()))
        }

        fn detach(&self, target: &Path) -> nix::Result<()> {
            self.record(Call::Detach(target.to_owned()))
        }

        fn open_dir_path(&self, dir: &Path) -> std::io::Result<OwnedFd> {
            self.record(Call::OpenDirPath(dir.to_owned()))
                .map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
            // Any directory stands in: nothing reads through it in a test.
            super::Host.open_dir_path(Path::new("/"))
        }

        fn set_no_new_privs(&self) -> nix::Result<()> {
            self.record(Call::NoNewPrivs)
        }

        fn drop_all_capabilities(&self, last: libc::c_ulong) -> nix::Result<()> {
            self.record(Call::DropCapabilities(last))
        }

        fn install_seccomp(&self, program: &[SockFilter]) -> nix::Result<()> {
            self.record(Call::Seccomp(program.len()))
        }

        fn unshare(&self, flags: CloneFlags) -> nix::Result<()> {
            self.record(Call::Unshare(flags))
        }

        fn loopback_up(&self) -> nix::Result<()> {
            self.record(Call::LoopbackUp)
        }

        fn sethostname(&self, name: &str) -> nix::Result<()> {
            self.record(Call::Sethostname(name.to_owned()))
        }
    }
}
