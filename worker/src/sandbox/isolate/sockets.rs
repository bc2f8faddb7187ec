//! The memory a sandbox's sockets hold, counted by its init for the memory budget (`memory`)
//! where no cgroup charges it.
//!
//! A socket's queued bytes are in no `/proc/<pid>` file, and the kernel caps what one socket
//! holds only at `2 × net.core.wmem_max` (or `rmem_max`), which a new network namespace
//! inherits from the host and cannot lower (read-only there on Linux 6.x): a job of a few
//! hundred socket pairs filled at `SO_SNDBUF` holds gigabytes. Every sandbox has a network
//! namespace of its own, so its sockets are that namespace's, and the init, which lives in it
//! and is not under the job's seccomp filter, asks the kernel for them through a
//! `NETLINK_SOCK_DIAG` socket: every Unix socket (`UNIX_DIAG_MEMINFO`), every TCP, UDP and
//! UDP-Lite socket of either family (`INET_DIAG_SKMEMINFO`) and every netlink socket
//! (`NETLINK_DIAG_MEMINFO`). A listed socket counts what it has in its receive queue, its
//! backlog, its write queue, its sent buffers not yet freed (for a Unix socket, what waits in
//! its peer's queue: the kernel charges it to the sender) and its ancillary memory.
//!
//! A socket that is closed leaves the namespace's tables, but what it sent may still wait in
//! its peer's queue, charged to the closed socket, which the kernel frees only once that is
//! read: no dump shows it. `/proc/net/protocols` counts every socket not yet freed per
//! protocol and namespace, so the count over what the dumps listed is the number of such
//! sockets, and each is taken to hold the most one socket can: twice its largest buffer (a
//! buffer's worth queued, plus one message of up to a buffer). The same worst case covers a
//! socket of a protocol no dump lists (MPTCP, raw, ping: not open to jobs today) and every
//! socket of a dump the kernel refused, so the count fails closed.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sys::socket::{
    recv, sendto, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};

/// `SOCK_DIAG_BY_FAMILY`, the request of every dump.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;

/// `UDIAG_SHOW_MEMINFO` and the attribute it answers with.
const UDIAG_SHOW_MEMINFO: u32 = 0x20;
const UNIX_DIAG_MEMINFO: u16 = 5;
/// The `inet_diag_req_v2` extension bit of `INET_DIAG_SKMEMINFO`, and the attribute.
const INET_DIAG_SKMEMINFO: u16 = 7;
/// `NDIAG_SHOW_MEMINFO`, every netlink protocol, and the attribute.
const NDIAG_SHOW_MEMINFO: u32 = 0x1;
const NDIAG_PROTO_ALL: u8 = 255;
const NETLINK_DIAG_MEMINFO: u16 = 0;

/// The fields of a `sk_meminfo` (`SK_MEMINFO_*`) that are memory a socket holds.
const RMEM_ALLOC: usize = 0;
const WMEM_ALLOC: usize = 2;
const WMEM_QUEUED: usize = 5;
const OPTMEM: usize = 6;
const BACKLOG: usize = 7;

/// Where the fixed part of each dump's answer ends and its attributes begin.
const UNIX_DIAG_MSG_LEN: usize = 16;
const INET_DIAG_MSG_LEN: usize = 72;
const NETLINK_DIAG_MSG_LEN: usize = 28;

/// One dump, and the lines of `/proc/net/protocols` whose sockets it lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dump {
    Unix,
    Inet { family: u8, protocol: u8 },
    Netlink,
}

const DUMPS: &[(Dump, &[&str])] = &[
    (Dump::Unix, &["UNIX", "UNIX-STREAM"]),
    (inet(libc::AF_INET, libc::IPPROTO_TCP), &["TCP"]),
    (inet(libc::AF_INET, libc::IPPROTO_UDP), &["UDP"]),
    (inet(libc::AF_INET, libc::IPPROTO_UDPLITE), &["UDP-Lite"]),
    (inet(libc::AF_INET6, libc::IPPROTO_TCP), &["TCPv6"]),
    (inet(libc::AF_INET6, libc::IPPROTO_UDP), &["UDPv6"]),
    (inet(libc::AF_INET6, libc::IPPROTO_UDPLITE), &["UDPLITEv6"]),
    (Dump::Netlink, &["NETLINK"]),
];

const fn inet(family: i32, protocol: i32) -> Dump {
    Dump::Inet {
        family: family as u8,
        protocol: protocol as u8,
    }
}

impl Dump {
    /// The request: a `nlmsghdr` and the family's request structure.
    fn request(self, seq: u32) -> Vec<u8> {
        let mut body = Vec::with_capacity(56);
        match self {
            Dump::Unix => {
                // unix_diag_req: family, protocol, pad, states, ino, show, cookie.
                body.extend_from_slice(&[libc::AF_UNIX as u8, 0, 0, 0]);
                body.extend_from_slice(&u32::MAX.to_ne_bytes());
                body.extend_from_slice(&0u32.to_ne_bytes());
                body.extend_from_slice(&UDIAG_SHOW_MEMINFO.to_ne_bytes());
                body.extend_from_slice(&[0xff; 8]);
            }
            Dump::Inet { family, protocol } => {
                // inet_diag_req_v2: family, protocol, ext, pad, states, an empty sockid.
                let ext = 1u8 << (INET_DIAG_SKMEMINFO - 1);
                body.extend_from_slice(&[family, protocol, ext, 0]);
                body.extend_from_slice(&u32::MAX.to_ne_bytes());
                body.extend_from_slice(&[0; 48]);
            }
            Dump::Netlink => {
                // netlink_diag_req: family, protocol, pad, ino, show, cookie.
                body.extend_from_slice(&[libc::AF_NETLINK as u8, NDIAG_PROTO_ALL, 0, 0]);
                body.extend_from_slice(&0u32.to_ne_bytes());
                body.extend_from_slice(&NDIAG_SHOW_MEMINFO.to_ne_bytes());
                body.extend_from_slice(&[0xff; 8]);
            }
        }
        let mut message = Vec::with_capacity(NLMSG_HDRLEN + body.len());
        message.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        message.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        message.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        message.extend_from_slice(&seq.to_ne_bytes());
        message.extend_from_slice(&0u32.to_ne_bytes());
        message.extend(body);
        message
    }

    /// Where the attributes of one answer begin, and the type of its memory attribute.
    fn layout(self) -> (usize, u16) {
        match self {
            Dump::Unix => (UNIX_DIAG_MSG_LEN, UNIX_DIAG_MEMINFO),
            Dump::Inet { .. } => (INET_DIAG_MSG_LEN, INET_DIAG_SKMEMINFO),
            Dump::Netlink => (NETLINK_DIAG_MSG_LEN, NETLINK_DIAG_MEMINFO),
        }
    }
}

/// What one dump listed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    pub sockets: u64,
    pub bytes: u64,
}

/// How one batch of a dump's answer ends.
#[derive(Debug, PartialEq, Eq)]
enum Batch {
    More,
    Done,
    Refused,
}

/// Folds one `recv` of a dump's answer into `listed`. Messages of another request (what is
/// left of an earlier dump) are skipped.
fn fold_answer(dump: Dump, seq: u32, mut data: &[u8], listed: &mut Listed) -> Batch {
    let (fixed, meminfo) = dump.layout();
    while data.len() >= NLMSG_HDRLEN {
        let len = u32_at(data, 0) as usize;
        if len < NLMSG_HDRLEN || len > data.len() {
            return Batch::Refused;
        }
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        let ours = u32_at(data, 8) == seq;
        let message = &data[NLMSG_HDRLEN..len];
        data = &data[align(len).min(data.len())..];
        if !ours {
            continue;
        }
        match kind {
            NLMSG_DONE => return Batch::Done,
            NLMSG_ERROR => return Batch::Refused,
            _ if message.len() >= fixed => {
                listed.sockets += 1;
                listed.bytes = listed
                    .bytes
                    .saturating_add(held_bytes(&message[fixed..], meminfo));
            }
            _ => return Batch::Refused,
        }
    }
    Batch::More
}

/// The bytes a socket holds, from its memory attribute among `attrs` (none: nothing held).
fn held_bytes(mut attrs: &[u8], meminfo: u16) -> u64 {
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
        if len < 4 || len > attrs.len() {
            return 0;
        }
        if kind == meminfo {
            let field = |i: usize| {
                let at = 4 + 4 * i;
                (at + 4 <= len).then(|| u64::from(u32_at(attrs, at)))
            };
            return [RMEM_ALLOC, WMEM_ALLOC, WMEM_QUEUED, OPTMEM, BACKLOG]
                .into_iter()
                .filter_map(field)
                .sum();
        }
        attrs = &attrs[align(len).min(attrs.len())..];
    }
    0
}

fn u32_at(data: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
}

/// Netlink's 4-byte alignment of messages and attributes.
fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// The sockets of each line of a `/proc/net/protocols` (its third column): every socket of
/// that protocol in the reader's network namespace that the kernel has not freed yet.
fn in_use(protocols: &str) -> HashMap<String, u64> {
    protocols
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.next()?;
            let sockets = fields.nth(1)?.parse().ok()?;
            Some((name.to_owned(), sockets))
        })
        .collect()
}

/// The worst case of sockets no dump listed: `in_use` of every protocol (read twice around the
/// dumps; the lower of the two, so a socket made or freed meanwhile is no phantom) less what
/// the dumps of its lines listed, each at `per_socket` bytes. The counter's `own` netlink
/// socket (1, or 0 if it has none) is no job's, listed or not.
fn unlisted_bytes(
    before: &HashMap<String, u64>,
    after: &HashMap<String, u64>,
    listed: &[(Dump, Option<Listed>)],
    own: u64,
    per_socket: u64,
) -> u64 {
    let mut unlisted = 0u64;
    let mut seen: Vec<&str> = Vec::new();
    for (dump, names) in DUMPS {
        let count = |table: &HashMap<String, u64>| -> u64 {
            names
                .iter()
                .map(|n| table.get(*n).copied().unwrap_or(0))
                .sum()
        };
        let sockets = count(before).min(count(after));
        let mut shown = listed
            .iter()
            .find(|(d, _)| d == dump)
            .and_then(|(_, l)| l.as_ref())
            .map_or(0, |l| l.sockets);
        if *dump == Dump::Netlink {
            shown = shown.max(own);
        }
        unlisted += sockets.saturating_sub(shown);
        seen.extend(names.iter());
    }
    for (name, sockets) in before {
        if !seen.contains(&name.as_str()) {
            unlisted += (*sockets).min(after.get(name).copied().unwrap_or(0));
        }
    }
    unlisted.saturating_mul(per_socket)
}

/// Counts a sandbox's socket memory from inside its network namespace.
#[derive(Debug)]
pub struct SocketCount {
    /// The `NETLINK_SOCK_DIAG` socket; `None` if it could not be made (every socket then
    /// counts at its worst case).
    diag: Option<OwnedFd>,
    /// `net/protocols` of the namespace's `/proc`.
    protocols: PathBuf,
    /// The most one socket can hold, in bytes.
    per_socket: u64,
    seq: u32,
}

impl SocketCount {
    /// A count of the sockets of the caller's network namespace; `proc` is a `/proc` that shows
    /// it (the init's own).
    pub fn new(proc: &Path) -> SocketCount {
        let diag = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkSockDiag,
        )
        .ok();
        let sysctl = |name: &str| -> Option<u64> {
            std::fs::read_to_string(proc.join("sys/net/core").join(name))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        // Unreadable: the largest buffer a host is likely to allow (fail closed).
        let largest = sysctl("wmem_max")
            .zip(sysctl("rmem_max"))
            .map_or(64 << 20, |(w, r)| w.max(r));
        SocketCount {
            diag,
            protocols: proc.join("net/protocols"),
            // A buffer is at most twice the sysctl; one message past it, twice that.
            per_socket: largest.saturating_mul(4),
            seq: 0,
        }
    }

    /// What the namespace's sockets hold now, in bytes: what the dumps list, and the worst
    /// case of every socket they cannot.
    pub fn used_bytes(&mut self) -> u64 {
        let read = |path: &Path| in_use(&std::fs::read_to_string(path).unwrap_or_default());
        let before = read(&self.protocols);
        let own = u64::from(self.diag.is_some());
        let listed: Vec<(Dump, Option<Listed>)> = DUMPS
            .iter()
            .map(|(dump, names)| {
                let sockets: u64 = names.iter().filter_map(|n| before.get(*n)).sum();
                // The counter's own netlink socket alone needs no dump.
                let mine = if *dump == Dump::Netlink { own } else { 0 };
                let listed = if sockets > mine {
                    self.dump(*dump)
                } else {
                    Some(Listed::default())
                };
                (*dump, listed)
            })
            .collect();
        let after = read(&self.protocols);
        let shown: u64 = listed.iter().filter_map(|(_, l)| l.map(|l| l.bytes)).sum();
        let unlisted = unlisted_bytes(&before, &after, &listed, own, self.per_socket);
        shown.saturating_add(unlisted)
    }

    /// One dump, `None` when the kernel refused it.
    fn dump(&mut self, dump: Dump) -> Option<Listed> {
        let fd = self.diag.as_ref()?;
        self.seq = self.seq.wrapping_add(1);
        let request = dump.request(self.seq);
        sendto(
            fd.as_raw_fd(),
            &request,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )
        .ok()?;
        let mut listed = Listed::default();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).ok()?;
            match fold_answer(dump, self.seq, &buf[..n], &mut listed) {
                Batch::More if n > 0 => {}
                Batch::Done => return Some(listed),
                Batch::More | Batch::Refused => return None,
            }
        }
    }
}
