//! Network namespaces for the sandboxes, reused when the kernel shows them untouched.
//!
//! Every sandbox has a network namespace of its own with only `lo` up. Creating one and, above
//! all, tearing it down (`cleanup_net`, with its RCU grace periods) is the costliest part of a
//! sandbox's life, yet most jobs never touch the network. So the zygote keeps the namespaces of
//! finished sandboxes and hands them to new ones, but only when nothing can carry over: the
//! namespace is owned by the zygote's user namespace (a sandbox's root, in a child user
//! namespace, holds no capability over it and cannot change its configuration), no socket is
//! left in it, and its loopback counters are exactly what they were when it was created, so no
//! packet was ever sent in it. A job that created a socket that outlived it, or sent a single
//! packet, leaves a namespace that is thrown away, and the next sandbox gets a fresh one.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};

use nix::sched::{setns, unshare, CloneFlags};

use super::sys;

/// What must be unchanged for a namespace to be reused: the loopback's statistics line and
/// the number of sockets open in the namespace. Both are per namespace; were a kernel to count
/// sockets machine-wide, a mismatch would only cost the reuse, never let a used namespace pass.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    loopback: String,
    sockets: u64,
}

/// A network namespace lent to one sandbox.
pub struct NetNs {
    fd: OwnedFd,
    created: Fingerprint,
}

/// The zygote's namespaces: its own, and the clean ones waiting for a sandbox.
pub struct NetPool {
    home: OwnedFd,
    free: Vec<NetNs>,
    /// Namespaces kept at most; more clean ones than sandboxes can never be needed.
    cap: usize,
}

fn open_current() -> Result<OwnedFd, String> {
    fs::File::open("/proc/thread-self/ns/net")
        .map(OwnedFd::from)
        .map_err(|e| format!("open /proc/thread-self/ns/net: {e}"))
}

/// Reads the fingerprint of the namespace the calling thread is in.
fn fingerprint() -> Result<Fingerprint, String> {
    let dev = fs::read_to_string("/proc/thread-self/net/dev")
        .map_err(|e| format!("read /proc/thread-self/net/dev: {e}"))?;
    let loopback = dev
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with("lo:"))
        .ok_or("no lo in /proc/thread-self/net/dev")?
        .to_owned();
    let sockstat = fs::read_to_string("/proc/thread-self/net/sockstat")
        .map_err(|e| format!("read /proc/thread-self/net/sockstat: {e}"))?;
    let sockets = sockstat
        .lines()
        .find_map(|l| l.strip_prefix("sockets: used "))
        .and_then(|n| n.trim().parse().ok())
        .ok_or("no socket count in /proc/thread-self/net/sockstat")?;
    Ok(Fingerprint { loopback, sockets })
}

impl NetPool {
    /// Remembers the caller's namespace as home. Single-threaded callers only (the zygote).
    pub fn new(cap: usize) -> Result<NetPool, String> {
        Ok(NetPool {
            home: open_current()?,
            free: Vec::new(),
            cap,
        })
    }

    /// A clean namespace: a kept one, or a new one with `lo` up.
    pub fn take(&mut self) -> Result<NetNs, String> {
        if let Some(ns) = self.free.pop() {
            return Ok(ns);
        }
        unshare(CloneFlags::CLONE_NEWNET).map_err(|e| format!("unshare network namespace: {e}"))?;
        let made = sys::loopback_up()
            .map_err(|e| format!("bring up lo: {e}"))
            .and_then(|()| Ok((open_current()?, fingerprint()?)));
        self.go_home();
        let (fd, created) = made?;
        Ok(NetNs { fd, created })
    }

    /// Clones a child into `ns` (the caller stays in its own namespace). In the child, the
    /// namespaces it was cloned with are new; the network one is `ns`.
    pub fn clone_into(&self, ns: &NetNs, flags: libc::c_int) -> Result<sys::Forked, String> {
        setns(ns.fd.as_fd(), CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("enter network namespace: {e}"))?;
        let cloned = sys::clone_into_namespaces(flags);
        // Only the parent goes home: the child has no capability over the zygote's namespaces.
        if !matches!(cloned, Ok(sys::Forked::Child)) {
            self.go_home();
        }
        cloned.map_err(|e| format!("clone sandbox namespaces: {e}"))
    }

    /// Takes a namespace back once its sandbox is gone: kept if untouched, else dropped (the
    /// kernel tears it down once no process and no descriptor holds it).
    pub fn give_back(&mut self, ns: NetNs) {
        let clean = setns(ns.fd.as_fd(), CloneFlags::CLONE_NEWNET).is_ok() && {
            let now = fingerprint();
            self.go_home();
            now.as_ref() == Ok(&ns.created)
        };
        if clean && self.free.len() < self.cap {
            self.free.push(ns);
        }
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
