//! The sandbox user namespace's own counts (`/proc/sys/user/max_*`), set to nothing by its init.
//!
//! The kernel keeps these counts per user namespace and per uid, and charges each object up the
//! chain of user namespaces to the host uid that made the sandbox's (host root, for a node run
//! as root), checking every level against its own maximum. A new user namespace starts with
//! every maximum at `INT_MAX`, so without a lower one a sandbox's objects count only against
//! the host uid's: one job could take them all, and host root's (or the rootless node's own)
//! processes would be refused. Namespaces, inotify and fanotify are refused to jobs by the
//! seccomp policy already; a maximum of 0 at the sandbox's level keeps them refused should the
//! policy ever let one through. The init sets them while it holds `CAP_SYS_RESOURCE` over the
//! namespace (which the kernel asks of a writer), before the launcher exists; the job's
//! `/proc/sys` is read-only, and it holds no capability to raise them.

use std::ffi::CString;
use std::os::fd::OwnedFd;

use nix::errno::Errno;

use super::setup_error::SetupError;
use crate::sandbox::kernel::sys;

/// Every count of `/proc/sys/user` and the maximum a sandbox gets: none of each.
pub const MAXIMUMS: &[(&str, u64)] = &[
    ("user/max_user_namespaces", 0),
    ("user/max_mnt_namespaces", 0),
    ("user/max_pid_namespaces", 0),
    ("user/max_net_namespaces", 0),
    ("user/max_ipc_namespaces", 0),
    ("user/max_uts_namespaces", 0),
    ("user/max_cgroup_namespaces", 0),
    ("user/max_time_namespaces", 0),
    ("user/max_inotify_instances", 0),
    ("user/max_inotify_watches", 0),
    ("user/max_fanotify_groups", 0),
    ("user/max_fanotify_marks", 0),
];

/// A count the init could not set.
#[derive(Debug, thiserror::Error)]
#[error("set user namespace count {path} to {value}: {errno}")]
pub struct CountError {
    pub path: &'static str,
    pub value: u64,
    pub errno: Errno,
}

impl From<CountError> for SetupError {
    fn from(e: CountError) -> SetupError {
        SetupError::errno(
            format!("set user namespace count {} to {}", e.path, e.value),
            e.errno,
        )
    }
}

/// Sets the calling process's user namespace's maximums through `sysctls`, a descriptor of a
/// writable `/proc/sys`. A count this kernel does not have (`ENOENT`: fanotify's before 5.19,
/// time namespaces' before 5.6) is not there to fill.
pub fn bound(sysctls: &OwnedFd) -> Result<(), CountError> {
    for &(path, value) in MAXIMUMS {
        let fail = |errno| CountError { path, value, errno };
        let c = CString::new(path).map_err(|_| fail(Errno::EINVAL))?;
        match sys::write_file_at(sysctls, &c, value.to_string().as_bytes()) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(fail(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_count_of_this_kernel_is_listed() {
        let Ok(dir) = std::fs::read_dir("/proc/sys/user") else {
            forkbox_testkit::skipped("no /proc/sys/user on this host");
            return;
        };
        for entry in dir.flatten() {
            let name = format!("user/{}", entry.file_name().to_string_lossy());
            assert!(
                MAXIMUMS.iter().any(|(p, _)| *p == name),
                "{name} is not bounded"
            );
        }
    }

    #[test]
    fn a_failed_count_reads_as_a_set_up_error() {
        let e = CountError {
            path: "user/max_user_namespaces",
            value: 0,
            errno: Errno::EACCES,
        };
        assert_eq!(
            SetupError::from(e).to_string(),
            "set user namespace count user/max_user_namespaces to 0: EACCES: Permission denied"
        );
    }
}
