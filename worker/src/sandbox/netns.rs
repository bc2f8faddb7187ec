//! Network namespaces for the sandboxes: a new one for every sandbox, never reused.
//!
//! Every sandbox has a network namespace of its own with only `lo` up. The zygote creates it
//! (so it is owned by the zygote's user namespace: a sandbox's root, in a child user namespace,
//! holds no capability over it and cannot change its configuration) while it builds the
//! sandbox, ahead of demand, and drops it when the sandbox is gone; the kernel tears it down in
//! the background once no process and no descriptor holds it. A namespace is never handed to
//! a second sandbox: a job changes kernel state in its namespace without any packet leaving
//! and without any socket outliving it (the SNMP and extended TCP counters, IPv6 flow labels,
//! neighbour and route caches, fragment queues, conntrack-free socket statistics), and no
//! fingerprint of a namespace can be shown to cover every such table of every kernel.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};

use nix::sched::{setns, unshare, CloneFlags};

use super::sys;
use super::wire::SetupError;

/// A network namespace made for one sandbox.
pub struct NetNs {
    fd: OwnedFd,
}

/// Makes the sandboxes' namespaces, from the zygote's own (its home).
pub struct NetFactory {
    home: OwnedFd,
}

fn open_current() -> Result<OwnedFd, SetupError> {
    const PATH: &str = "/proc/thread-self/ns/net";
    fs::File::open(PATH)
        .map(OwnedFd::from)
        .map_err(|e| SetupError::io("open", &e).at(PATH))
}

impl NetFactory {
    /// Remembers the caller's namespace as home. Single-threaded callers only (the zygote).
    pub fn new() -> Result<NetFactory, SetupError> {
        Ok(NetFactory {
            home: open_current()?,
        })
    }

    /// A new namespace with `lo` up.
    pub fn make(&self) -> Result<NetNs, SetupError> {
        unshare(CloneFlags::CLONE_NEWNET)
            .map_err(|e| SetupError::errno("unshare network namespace", e))?;
        let made = sys::loopback_up()
            .map_err(|e| SetupError::errno("bring up lo", e))
            .and_then(|()| open_current());
        self.go_home();
        Ok(NetNs { fd: made? })
    }

    /// Clones a child into `ns` (the caller stays in its own namespace). In the child, the
    /// namespaces it was cloned with are new; the network one is `ns`.
    pub fn clone_into(
        &self,
        one: &sys::SingleThreaded,
        ns: &NetNs,
        flags: libc::c_int,
    ) -> Result<sys::Forked, SetupError> {
        setns(ns.fd.as_fd(), CloneFlags::CLONE_NEWNET)
            .map_err(|e| SetupError::errno("enter network namespace", e))?;
        let cloned = one.clone_into_namespaces(flags);
        // Only the parent goes home: the child has no capability over the zygote's namespaces.
        if !matches!(cloned, Ok(sys::Forked::Child(_))) {
            self.go_home();
        }
        cloned.map_err(|e| SetupError::errno("clone sandbox namespaces", e))
    }

    /// Back to the zygote's own namespace. Failing that, every later sandbox would start in a
    /// namespace it does not own, so the zygote stops (and the engine reports it gone).
    fn go_home(&self) {
        if let Err(e) = setns(self.home.as_fd(), CloneFlags::CLONE_NEWNET) {
            eprintln!("forkbox zygote: return to its network namespace: {e}");
            sys::exit_now(1);
        }
    }
}
