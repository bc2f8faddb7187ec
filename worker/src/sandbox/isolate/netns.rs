//! Network namespaces for the sandboxes: a new one for every sandbox with a loopback network,
//! and a small pool of reused ones for sandboxes with none.
//!
//! Every sandbox has a network namespace of its own while it lives. The zygote creates it (so
//! it is owned by the zygote's user namespace: a sandbox's root, in a child user namespace,
//! holds no capability over it and cannot change its configuration) while it builds the
//! sandbox, ahead of demand.
//!
//! With `"network": "loopback"` the namespace has `lo` up and is never handed to a second
//! sandbox: a job with inet sockets changes kernel state in its namespace without any packet
//! leaving and without any socket outliving it (the SNMP and extended TCP counters, IPv6 flow
//! labels, neighbour and route caches, fragment queues, TIME_WAIT), and no fingerprint of a
//! namespace can be shown to cover every such table of every kernel. The zygote drops it when
//! the sandbox is gone; the kernel tears it down in the background.
//!
//! With `"network": "none"` the sandbox's seccomp program lets it make Unix sockets alone
//! (`seccomp::UNIX_ONLY_FAMILIES`), and `lo` stays down. A Unix socket is the only state a
//! job can leave in such a namespace, and every Unix socket of a namespace, bound or not, in
//! flight over `SCM_RIGHTS` or not, is listed in its `/proc/net/unix`. So once a sandbox's
//! processes are all gone the zygote reads that table, through a descriptor opened from inside
//! the namespace when it was made, and hands the namespace to its next `none` sandbox only when
//! the table is empty; otherwise (a socket kept alive in flight until the kernel's garbage
//! collector gets to it) the namespace is dropped and a new one made. A namespace serves one
//! sandbox at a time, so two concurrent jobs never share one and cannot reach each other's
//! abstract sockets; the pool holds as many as the zygote keeps sandboxes.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{AsFd, OwnedFd};

use forkbox_queue::schema::Network;
use nix::sched::{setns, unshare, CloneFlags};

use super::setup_error::SetupError;
use crate::sandbox::kernel::sys;

/// A network namespace made for a sandbox.
pub struct NetNs {
    fd: OwnedFd,
    /// Its `/proc/net/unix`, opened from inside it (`none` namespaces only): the file keeps
    /// showing that namespace's sockets whichever namespace reads it later.
    unix: Option<fs::File>,
}

impl NetNs {
    /// Whether no Unix socket is left in the namespace (the table is its header alone).
    /// Unreadable counts as not empty: the namespace is then dropped (fail closed).
    pub fn is_empty(&mut self) -> bool {
        let Some(table) = self.unix.as_mut() else {
            return false;
        };
        let mut text = String::new();
        if table.seek(SeekFrom::Start(0)).is_err() || table.read_to_string(&mut text).is_err() {
            return false;
        }
        unix_table_is_empty(&text)
    }
}

/// Whether a `/proc/net/unix` listing has no socket: its header line and nothing else.
pub fn unix_table_is_empty(text: &str) -> bool {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    matches!(lines.next(), Some(h) if h.starts_with("Num")) && lines.next().is_none()
}

/// Makes the sandboxes' namespaces, from the zygote's own (its home), and keeps the `none`
/// namespaces that are free to serve again.
pub struct NetFactory {
    home: OwnedFd,
    free: Vec<NetNs>,
    /// Most free namespaces kept.
    keep: usize,
}

fn open_current() -> Result<OwnedFd, SetupError> {
    const PATH: &str = "/proc/thread-self/ns/net";
    fs::File::open(PATH)
        .map(OwnedFd::from)
        .map_err(|e| SetupError::io("open", &e).at(PATH))
}

impl NetFactory {
    /// Remembers the caller's namespace as home; keeps at most `keep` free `none` namespaces.
    /// Single-threaded callers only (the zygote).
    pub fn new(keep: usize) -> Result<NetFactory, SetupError> {
        Ok(NetFactory {
            home: open_current()?,
            free: Vec::new(),
            keep,
        })
    }

    /// A namespace for a sandbox of `network`: for `none`, a free one if any, else a new one
    /// with every interface down; for `loopback`, always a new one with `lo` up.
    pub fn take(&mut self, network: Network) -> Result<NetNs, SetupError> {
        if network == Network::None {
            if let Some(ns) = self.free.pop() {
                return Ok(ns);
            }
        }
        self.make(network)
    }

    /// Takes back the `none` namespace of a sandbox whose processes are all gone: kept for the
    /// next one when no socket is left in it, dropped otherwise.
    pub fn give_back(&mut self, mut ns: NetNs) {
        if self.free.len() < self.keep && ns.is_empty() {
            self.free.push(ns);
        }
    }

    fn make(&self, network: Network) -> Result<NetNs, SetupError> {
        unshare(CloneFlags::CLONE_NEWNET)
            .map_err(|e| SetupError::errno("unshare network namespace", e))?;
        let made = self.set_up(network);
        self.go_home();
        made
    }

    /// In the new namespace: `lo` up for loopback; the socket table's descriptor for none.
    fn set_up(&self, network: Network) -> Result<NetNs, SetupError> {
        const UNIX: &str = "/proc/thread-self/net/unix";
        let unix = match network {
            Network::Loopback => {
                sys::loopback_up().map_err(|e| SetupError::errno("bring up lo", e))?;
                None
            }
            Network::None => {
                Some(fs::File::open(UNIX).map_err(|e| SetupError::io("open", &e).at(UNIX))?)
            }
        };
        Ok(NetNs {
            fd: open_current()?,
            unix,
        })
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

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, AsRawFd};

    use forkbox_queue::schema::Network;
    use nix::sched::{setns, CloneFlags};
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

    use super::{unix_table_is_empty, NetFactory, NetNs};

    fn inode(ns: &NetNs) -> u64 {
        nix::sys::stat::fstat(ns.fd.as_raw_fd()).unwrap().st_ino
    }

    /// A `none` namespace comes back to the pool only when no socket is left in it; a loopback
    /// one never comes from it.
    #[test]
    fn a_namespace_with_a_socket_left_in_it_is_dropped_and_an_empty_one_kept() {
        if !nix::unistd::Uid::effective().is_root() {
            forkbox_testkit::skipped("network namespaces need root for this unit test");
            return;
        }
        // A thread of its own: the network namespace is per thread, and this one goes home.
        std::thread::spawn(|| {
            let mut factory = NetFactory::new(4).unwrap();
            let mut ns = factory.take(Network::None).unwrap();
            assert!(ns.is_empty(), "a new namespace lists a socket");
            // A Unix socket made inside it, still open when the namespace comes back.
            setns(ns.fd.as_fd(), CloneFlags::CLONE_NEWNET).unwrap();
            let left = socket(
                AddressFamily::Unix,
                SockType::Stream,
                SockFlag::SOCK_CLOEXEC,
                None,
            )
            .unwrap();
            factory.go_home();
            assert!(!ns.is_empty());
            factory.give_back(ns);
            assert_eq!(factory.free.len(), 0, "handed on with a socket in it");
            drop(left);
            let ns = factory.take(Network::None).unwrap();
            let empty = inode(&ns);
            factory.give_back(ns);
            assert_eq!(factory.free.len(), 1);
            let again = factory.take(Network::None).unwrap();
            assert_eq!(inode(&again), empty, "an empty namespace was not handed on");
            factory.give_back(again);
            let lo = factory.take(Network::Loopback).unwrap();
            assert!(lo.unix.is_none());
            assert_ne!(inode(&lo), empty);
            assert_eq!(factory.free.len(), 1);
        })
        .join()
        .unwrap();
    }

    const HEADER: &str = "Num       RefCount Protocol Flags    Type St Inode Path\n";

    #[test]
    fn only_a_bare_header_is_an_empty_table() {
        assert!(unix_table_is_empty(HEADER));
        let bound =
            format!("{HEADER}0000000000000000: 00000002 00000000 00010000 0001 01 12345 @x\n");
        assert!(!unix_table_is_empty(&bound));
        let unbound =
            format!("{HEADER}0000000000000000: 00000003 00000000 00000000 0001 03 4242\n");
        assert!(!unix_table_is_empty(&unbound));
        // Nothing read, or not the table, is not proof of emptiness.
        assert!(!unix_table_is_empty(""));
        assert!(!unix_table_is_empty("garbage\n"));
    }
}
