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
//! socket of a dump the kernel refused, so the count fails closed. Two things keep it from
//! charging a job for what it does not hold:
//!
//! - the largest buffer is the one the kernel applies to the namespace: its own
//!   `net.core.wmem_max`/`rmem_max` where the kernel has them per namespace, the host's
//!   (handed down by the engine) where it does not (6.1 shows them in no other namespace);
//! - a closed peer of a listed stream or seqpacket Unix socket whose queue is empty holds
//!   nothing, and is not counted (see `Folded::unix`). A connected socket keeps its peer
//!   alive after the peer's close: the init's own channel with the launcher (a seqpacket
//!   pair), whose other end is gone once the program runs, is one in every sandbox.
//!
//! The worst case bounds the job against its limit; it is no measure of what the job held,
//! so it is kept apart (`Counted::unseen`) from what the dumps show (`Counted::seen`), and
//! only the latter goes into the peak. What closed senders hold is seen in part: the bytes
//! waiting in listed Unix sockets' queues that no listed socket sent.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sys::socket::{
    connect, recvfrom, sendto, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag,
    SockProtocol, SockType,
};

/// `SOCK_DIAG_BY_FAMILY`, the request of every dump.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;

/// `UDIAG_SHOW_PEER`, `UDIAG_SHOW_RQLEN` and `UDIAG_SHOW_MEMINFO`, and the attributes they
/// answer with.
const UDIAG_SHOW_PEER: u32 = 0x4;
const UDIAG_SHOW_RQLEN: u32 = 0x10;
const UDIAG_SHOW_MEMINFO: u32 = 0x20;
const UNIX_DIAG_PEER: u16 = 2;
const UNIX_DIAG_RQLEN: u16 = 4;
/// Where a `unix_diag_msg` has the socket's type and its state. A listening
/// socket's `RQLEN` counts connections, not bytes.
const UNIX_TYPE_AT: usize = 1;
const UNIX_STATE_AT: usize = 2;
const TCP_LISTEN: u8 = 10;
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

/// The largest socket buffer taken where no sysctl tells it, in bytes.
const UNKNOWN_BUFFER_MAX: u64 = 64 << 20;

/// What a count of buffers found, in bytes: what it saw held, and apart the worst case of
/// what it could not see, which bounds the job but is no measure of it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub seen: u64,
    pub unseen: u64,
}

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
                let show = UDIAG_SHOW_PEER | UDIAG_SHOW_RQLEN | UDIAG_SHOW_MEMINFO;
                body.extend_from_slice(&show.to_ne_bytes());
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

/// What one dump listed: its sockets, the bytes they hold and, for Unix sockets, the bytes
/// waiting in their receive queues (`RQLEN`: a stream's whole queue, a datagram socket's
/// next datagram) and the bytes they sent that are not freed yet (`wmem_alloc`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    pub sockets: u64,
    pub bytes: u64,
    pub queued: u64,
    pub sent: u64,
    /// Unlisted sockets known to hold nothing: the closed peers of listed Unix stream or
    /// seqpacket sockets whose receive queues are empty (see [`Folded::unix`]).
    pub idle_peers: u64,
}

/// A dump's answer as it is folded.
#[derive(Debug, Default)]
struct Folded {
    listed: Listed,
}

impl Folded {
    fn finish(self) -> Listed {
        self.listed
    }

    /// One listed Unix socket: its fixed part and its attributes.
    ///
    /// A connected stream or seqpacket socket keeps its peer alive once that is closed: the
    /// peer leaves the namespace's table, not `/proc/net/protocols`, and the dump shows it as
    /// a peer of inode 0 (it has no file any more; one not accepted yet has none either).
    /// Such a peer is of the same namespace (a pair is made in one, and a connection's other
    /// end where the connecting socket is) and is no other socket's peer. Its own queue was
    /// emptied at its close (one not accepted holds what the listed socket sent, charged to
    /// that one), and what it sent can only be in the listed socket's queue: with that queue
    /// empty, it holds nothing but its own structure, and is no socket to count at the worst
    /// case.
    fn unix(&mut self, fixed: &[u8], attrs: &[u8]) {
        let u32_attr = |kind| {
            attribute(attrs, kind)
                .filter(|a| a.len() >= 4)
                .map(|a| u32_at(a, 0))
        };
        if fixed[UNIX_STATE_AT] == TCP_LISTEN {
            return;
        }
        let rqueue = u32_attr(UNIX_DIAG_RQLEN).unwrap_or(0);
        let sent = attribute(attrs, UNIX_DIAG_MEMINFO)
            .filter(|a| a.len() >= 4 * (WMEM_ALLOC + 1))
            .map_or(0, |a| u32_at(a, 4 * WMEM_ALLOC));
        self.listed.queued = self.listed.queued.saturating_add(rqueue.into());
        self.listed.sent = self.listed.sent.saturating_add(sent.into());
        let connected =
            [libc::SOCK_STREAM, libc::SOCK_SEQPACKET].contains(&i32::from(fixed[UNIX_TYPE_AT]));
        // Without an `RQLEN` the queue is not known to be empty.
        let empty = u32_attr(UNIX_DIAG_RQLEN) == Some(0);
        if connected && empty && u32_attr(UNIX_DIAG_PEER) == Some(0) {
            self.listed.idle_peers += 1;
        }
    }
}

impl Listed {
    /// Bytes that wait in the queues of listed Unix sockets and that no listed socket sent:
    /// what closed senders hold, at least (a queue's payload, beside the `truesize` the
    /// kernel charges for it, and a datagram socket's next datagram alone).
    fn of_closed_senders(&self) -> u64 {
        self.queued.saturating_sub(self.sent)
    }
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
fn fold_answer(dump: Dump, seq: u32, mut data: &[u8], folded: &mut Folded) -> Batch {
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
                let attrs = &message[fixed..];
                let listed = &mut folded.listed;
                listed.sockets += 1;
                listed.bytes = listed.bytes.saturating_add(held_bytes(attrs, meminfo));
                if dump == Dump::Unix {
                    folded.unix(&message[..fixed], attrs);
                }
            }
            _ => return Batch::Refused,
        }
    }
    Batch::More
}

/// The bytes a socket holds, from its memory attribute among `attrs` (none: nothing held).
fn held_bytes(attrs: &[u8], meminfo: u16) -> u64 {
    let Some(info) = attribute(attrs, meminfo) else {
        return 0;
    };
    let field = |i: usize| {
        let at = 4 * i;
        (at + 4 <= info.len()).then(|| u64::from(u32_at(info, at)))
    };
    [RMEM_ALLOC, WMEM_ALLOC, WMEM_QUEUED, OPTMEM, BACKLOG]
        .into_iter()
        .filter_map(field)
        .sum()
}

/// The payload of the attribute of type `kind` among `attrs`, `None` if there is none (or the
/// attributes are broken before it).
fn attribute(mut attrs: &[u8], kind: u16) -> Option<&[u8]> {
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if u16::from_ne_bytes([attrs[2], attrs[3]]) == kind {
            return Some(&attrs[4..len]);
        }
        attrs = &attrs[align(len).min(attrs.len())..];
    }
    None
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
/// the dumps of its lines listed and the peers they showed to hold nothing (`idle_peers`),
/// each at `per_socket` bytes. The counter's `own` netlink socket (1, or 0 if it has none) is
/// no job's, listed or not.
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
            .map_or(0, |l| l.sockets.saturating_add(l.idle_peers));
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

/// The largest socket buffer the sysctls under `proc` allow (`net.core.wmem_max` or
/// `rmem_max`, whichever is more), `None` where they cannot be read. On older kernels (6.1)
/// they are the host's alone and only its own network namespace shows them (not a sandbox's,
/// nor the zygote's), so the engine reads them in its own and the init is handed that figure.
pub fn buffer_max(proc: &Path) -> Option<u64> {
    let sysctl = |name: &str| -> Option<u64> {
        std::fs::read_to_string(proc.join("sys/net/core").join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some(sysctl("wmem_max")?.max(sysctl("rmem_max")?))
}

impl SocketCount {
    /// A count of the sockets of the caller's network namespace; `proc` is a `/proc` that shows
    /// it (the init's own). `host_max` is [`buffer_max`] as the host's namespace shows it, for
    /// a kernel whose sysctls are not per namespace.
    pub fn new(proc: &Path, host_max: Option<u64>) -> SocketCount {
        // Connected to the kernel: the kernel then refuses whatever another socket (a job's,
        // with a network) sends it, so no answer can be forged.
        let diag = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkSockDiag,
        )
        .ok()
        .filter(|fd| connect(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).is_ok());
        // The namespace's own figure where the kernel has one (it is the one that caps its
        // sockets), the host's where it has not; neither: the largest buffer a host is likely
        // to allow (fail closed).
        let largest = buffer_max(proc).or(host_max).unwrap_or(UNKNOWN_BUFFER_MAX);
        SocketCount {
            diag,
            protocols: proc.join("net/protocols"),
            // A buffer is at most twice the sysctl; one message past it, twice that.
            per_socket: largest.saturating_mul(4),
            seq: 0,
        }
    }

    /// What the namespace's sockets hold now, in bytes: what the dumps list, and apart the
    /// worst case of every socket they cannot (which the job may or may not hold).
    pub fn used_bytes(&mut self) -> Counted {
        let read = |path: &Path| in_use(&std::fs::read_to_string(path).unwrap_or_default());
        let before = read(&self.protocols);
        let own = u64::from(self.diag.is_some());
        let listed: Vec<(Dump, Option<Listed>)> = DUMPS
            .iter()
            .map(|(dump, names)| {
                let sockets: u64 = names.iter().filter_map(|n| before.get(*n)).sum();
                // The counter's own netlink socket alone needs no dump. With no count to go
                // by (`protocols` unreadable), every dump is made.
                let mine = if *dump == Dump::Netlink { own } else { 0 };
                let listed = if sockets > mine || before.is_empty() {
                    self.dump(*dump)
                } else {
                    Some(Listed::default())
                };
                (*dump, listed)
            })
            .collect();
        let after = read(&self.protocols);
        let unseen = unlisted_bytes(&before, &after, &listed, own, self.per_socket);
        let shown: u64 = listed.iter().filter_map(|(_, l)| l.map(|l| l.bytes)).sum();
        // What closed senders hold at least is seen in their peers' queues; the rest of their
        // worst case stays unseen.
        let closed = listed
            .iter()
            .find(|(d, _)| *d == Dump::Unix)
            .and_then(|(_, l)| l.as_ref())
            .map_or(0, Listed::of_closed_senders);
        Counted {
            seen: shown.saturating_add(closed),
            unseen: unseen.saturating_sub(closed),
        }
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
        let mut folded = Folded::default();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let (n, from) = recvfrom::<NetlinkAddr>(fd.as_raw_fd(), &mut buf).ok()?;
            // Only the kernel's answers count (port 0).
            if from.is_none_or(|a| a.pid() != 0) {
                return None;
            }
            match fold_answer(dump, self.seq, &buf[..n], &mut folded) {
                Batch::More if n > 0 => {}
                Batch::Done => return Some(folded.finish()),
                Batch::More | Batch::Refused => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// One netlink message of `kind` and sequence `seq` around `body`.
    fn message(kind: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(body);
        m.resize(align(m.len()), 0);
        m
    }

    /// A Unix socket's answer: the fixed part, an attribute before, then its meminfo.
    fn unix_socket(meminfo: [u32; 9]) -> Vec<u8> {
        let mut body = vec![0u8; UNIX_DIAG_MSG_LEN];
        // A peer attribute (type 2, one u32) first: attributes are found by type.
        body.extend_from_slice(&8u16.to_ne_bytes());
        body.extend_from_slice(&2u16.to_ne_bytes());
        body.extend_from_slice(&7u32.to_ne_bytes());
        body.extend_from_slice(&(4 + 36u16).to_ne_bytes());
        body.extend_from_slice(&UNIX_DIAG_MEMINFO.to_ne_bytes());
        for v in meminfo {
            body.extend_from_slice(&v.to_ne_bytes());
        }
        body
    }

    #[test]
    fn a_socket_holds_its_queues_backlog_sent_buffers_and_ancillary_memory() {
        // rmem, rcvbuf, wmem, sndbuf, fwd_alloc, wmem_queued, optmem, backlog, drops.
        let info = [1000, 9_000_000, 200, 9_000_000, 77_777, 30, 4, 5, 99];
        let body = unix_socket(info);
        assert_eq!(
            held_bytes(&body[UNIX_DIAG_MSG_LEN..], UNIX_DIAG_MEMINFO),
            1000 + 200 + 30 + 4 + 5
        );
        // No memory attribute, or a broken one: nothing.
        assert_eq!(held_bytes(&body[UNIX_DIAG_MSG_LEN..], 9), 0);
        assert_eq!(held_bytes(&[3, 0, 5, 0], UNIX_DIAG_MEMINFO), 0);
    }

    #[test]
    fn an_answer_is_summed_until_done_and_a_refusal_or_garbage_fails() {
        let mut answer = message(
            SOCK_DIAG_BY_FAMILY,
            7,
            &unix_socket([0, 0, 500, 0, 0, 0, 0, 0, 0]),
        );
        // A message left from an earlier request is not ours.
        answer.extend(message(
            SOCK_DIAG_BY_FAMILY,
            6,
            &unix_socket([0, 0, 1 << 30, 0, 0, 0, 0, 0, 0]),
        ));
        answer.extend(message(
            SOCK_DIAG_BY_FAMILY,
            7,
            &unix_socket([0, 0, 20, 0, 0, 0, 0, 0, 0]),
        ));
        let mut folded = Folded::default();
        assert_eq!(
            fold_answer(Dump::Unix, 7, &answer, &mut folded),
            Batch::More
        );
        assert_eq!(
            folded.listed,
            Listed {
                sockets: 2,
                bytes: 520,
                queued: 0,
                sent: 520,
                idle_peers: 0
            }
        );
        let mut listed = folded;
        let done = message(NLMSG_DONE, 7, &[0; 4]);
        assert_eq!(fold_answer(Dump::Unix, 7, &done, &mut listed), Batch::Done);
        let refused = message(NLMSG_ERROR, 7, &(-libc::ENOENT).to_ne_bytes());
        assert_eq!(
            fold_answer(Dump::Unix, 7, &refused, &mut listed),
            Batch::Refused
        );
        // Shorter than its own fixed part, or a length past the data.
        let short = message(SOCK_DIAG_BY_FAMILY, 7, &[0; 8]);
        assert_eq!(
            fold_answer(Dump::Unix, 7, &short, &mut listed),
            Batch::Refused
        );
        let mut cut = message(SOCK_DIAG_BY_FAMILY, 7, &unix_socket([0; 9]));
        cut.truncate(30);
        assert_eq!(
            fold_answer(Dump::Unix, 7, &cut, &mut listed),
            Batch::Refused
        );
    }

    /// A Unix socket's answer in `state` with `rqueue` in its `RQLEN` and `wmem` sent.
    fn unix_queue(state: u8, rqueue: u32, wmem: u32) -> Vec<u8> {
        unix_peer(libc::SOCK_STREAM, state, 7, Some(rqueue), wmem)
    }

    /// A Unix socket's answer: its type, state, peer's inode, `RQLEN` (if any) and `wmem`
    /// sent (the peer attribute `unix_socket` puts first).
    fn unix_peer(kind: i32, state: u8, peer: u32, rqueue: Option<u32>, wmem: u32) -> Vec<u8> {
        let mut body = unix_socket([0, 0, wmem, 0, 0, 0, 0, 0, 0]);
        body[UNIX_TYPE_AT] = kind as u8;
        body[UNIX_STATE_AT] = state;
        body[UNIX_DIAG_MSG_LEN + 4..UNIX_DIAG_MSG_LEN + 8].copy_from_slice(&peer.to_ne_bytes());
        if let Some(rqueue) = rqueue {
            body.extend_from_slice(&12u16.to_ne_bytes());
            body.extend_from_slice(&UNIX_DIAG_RQLEN.to_ne_bytes());
            body.extend_from_slice(&rqueue.to_ne_bytes());
            body.extend_from_slice(&0u32.to_ne_bytes());
        }
        message(SOCK_DIAG_BY_FAMILY, 3, &body)
    }

    /// The closed peer (inode 0) of a listed stream or seqpacket socket with an empty queue
    /// holds nothing; with bytes queued, of a datagram socket, or with no queue length shown,
    /// it may.
    #[test]
    fn the_closed_peer_of_an_empty_stream_socket_holds_nothing() {
        const ESTABLISHED: u8 = 1;
        let (stream, seqpacket) = (libc::SOCK_STREAM, libc::SOCK_SEQPACKET);
        let answer = [
            // A pair, both ends open.
            unix_peer(stream, ESTABLISHED, 11, Some(0), 0),
            unix_peer(stream, ESTABLISHED, 10, Some(0), 0),
            // Closed peers.
            unix_peer(seqpacket, ESTABLISHED, 0, Some(0), 0),
            unix_peer(stream, ESTABLISHED, 0, Some(0), 0),
            unix_peer(stream, ESTABLISHED, 0, Some(5), 0),
            unix_peer(libc::SOCK_DGRAM, ESTABLISHED, 0, Some(0), 0),
            unix_peer(stream, ESTABLISHED, 0, None, 0),
        ]
        .concat();
        let mut folded = Folded::default();
        assert_eq!(
            fold_answer(Dump::Unix, 3, &answer, &mut folded),
            Batch::More
        );
        let listed = folded.finish();
        assert_eq!((listed.sockets, listed.idle_peers), (7, 2));
        // Counted against `/proc/net/protocols`: 7 listed, 5 closed, two known idle.
        let table = in_use("protocol size sockets\nUNIX-STREAM 1 10\nUNIX 1 2\n");
        let listed = [(Dump::Unix, Some(listed))];
        assert_eq!(unlisted_bytes(&table, &table, &listed, 0, 10), 30);
    }

    /// Bytes in the queues of listed Unix sockets that no listed socket sent are what closed
    /// senders hold, at least; a listening socket's `RQLEN` (its pending connections) is no
    /// byte count.
    #[test]
    fn queued_bytes_no_listed_socket_sent_are_a_closed_sender_s() {
        const ESTABLISHED: u8 = 1;
        let mut answer = unix_queue(ESTABLISHED, 100_000, 0);
        answer.extend(unix_queue(ESTABLISHED, 0, 30_000));
        answer.extend(unix_queue(TCP_LISTEN, 5, 0));
        let mut folded = Folded::default();
        assert_eq!(
            fold_answer(Dump::Unix, 3, &answer, &mut folded),
            Batch::More
        );
        let listed = folded.finish();
        assert_eq!((listed.queued, listed.sent), (100_000, 30_000));
        assert_eq!(listed.of_closed_senders(), 70_000);
        // Senders still open: what they sent is theirs, nobody else's.
        let mut open = Folded::default();
        let mut answer = unix_queue(ESTABLISHED, 100_000, 0);
        answer.extend(unix_queue(ESTABLISHED, 0, 110_000));
        fold_answer(Dump::Unix, 3, &answer, &mut open);
        assert_eq!(open.finish().of_closed_senders(), 0);
    }

    const PROTOCOLS: &str = "protocol  size sockets  memory press maxhdr  slab module\n\
        UNIX-STREAM 1152      5      -1   NI       0   yes  kernel\n\
        UNIX      1152      2      -1   NI       0   yes  kernel\n\
        TCP       2304      1     326   no     320   yes  kernel\n\
        NETLINK   1096      1      -1   NI       0   no   kernel\n\
        PING      1016      0      -1   NI       0   yes  kernel\n";

    #[test]
    fn sockets_no_dump_lists_count_at_their_worst_case() {
        let before = in_use(PROTOCOLS);
        assert_eq!(before["UNIX-STREAM"], 5);
        assert_eq!(before["TCP"], 1);
        let listed = |unix: u64, tcp: Option<u64>| {
            vec![
                (
                    Dump::Unix,
                    Some(Listed {
                        sockets: unix,
                        ..Listed::default()
                    }),
                ),
                (
                    DUMPS[1].0,
                    tcp.map(|sockets| Listed {
                        sockets,
                        ..Listed::default()
                    }),
                ),
            ]
        };
        // Every socket listed, the counter's own netlink socket aside: nothing more.
        assert_eq!(
            unlisted_bytes(&before, &before, &listed(7, Some(1)), 1, 10),
            0
        );
        // Two Unix sockets closed with their bytes still queued, and a refused TCP dump.
        assert_eq!(
            unlisted_bytes(&before, &before, &listed(5, None), 1, 10),
            30
        );
        // A socket of a protocol no dump lists, and one more netlink socket than ours.
        let mut more = before.clone();
        more.insert("PING".into(), 1);
        more.insert("NETLINK".into(), 2);
        assert_eq!(unlisted_bytes(&more, &more, &listed(7, Some(1)), 1, 10), 20);
        // A socket freed between the two readings is no phantom.
        let after = in_use(&PROTOCOLS.replace("      5 ", "      4 "));
        assert_eq!(
            unlisted_bytes(&before, &after, &listed(6, Some(1)), 1, 10),
            0
        );
    }

    /// The worst case of one socket comes from the namespace's own sysctls where it shows them
    /// (the kernel caps its sockets by those), from the host's figure where it does not (a
    /// kernel whose sysctls are the host's alone), and is 64 MiB only where neither is known.
    #[test]
    fn a_socket_s_worst_case_is_the_namespace_s_or_else_the_host_s() {
        let proc = tempfile::tempdir().unwrap();
        let host = Some(212_992);
        assert_eq!(buffer_max(proc.path()), None);
        assert_eq!(SocketCount::new(proc.path(), host).per_socket, 4 * 212_992);
        assert_eq!(
            SocketCount::new(proc.path(), None).per_socket,
            4 * (64 << 20)
        );
        let core = proc.path().join("sys/net/core");
        std::fs::create_dir_all(&core).unwrap();
        std::fs::write(core.join("wmem_max"), "4194304\n").unwrap();
        // One of the two alone is no figure: the larger could be the other.
        assert_eq!(buffer_max(proc.path()), None);
        std::fs::write(core.join("rmem_max"), "8388608\n").unwrap();
        assert_eq!(buffer_max(proc.path()), Some(8 << 20));
        assert_eq!(
            SocketCount::new(proc.path(), host).per_socket,
            4 * (8 << 20)
        );
    }

    /// Against the kernel, in a network namespace of the test's own: queued bytes are counted,
    /// and stay counted (at the worst case) once their sender is closed.
    #[test]
    fn the_kernel_shows_queued_bytes_and_the_sockets_it_no_longer_lists() {
        in_a_network_namespace_of_its_own(|| {
            // The thread's own view: `/proc/self/net` shows the process's namespace.
            let mut count = SocketCount::new(Path::new("/proc/thread-self"), None);
            let (per_socket, idle) = (count.per_socket, count.used_bytes());
            assert!(
                idle.seen < 4096 && idle.unseen == 0,
                "{idle:?} in a new namespace"
            );
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            (&a).write_all(&[7u8; 100_000]).unwrap();
            let queued = count.used_bytes();
            assert!(
                (100_000..per_socket).contains(&queued.seen) && queued.unseen == 0,
                "{queued:?} counted"
            );
            // Without `/proc/net/protocols` to go by, the dumps are made all the same.
            let mut blind = SocketCount {
                protocols: PathBuf::from("/nonexistent"),
                ..SocketCount::new(Path::new("/proc/thread-self"), None)
            };
            assert!(blind.used_bytes().seen >= 100_000);
            drop(blind);
            drop(a);
            // Its bytes are seen in its peer's queue; the limit counts its worst case.
            let behind = count.used_bytes();
            assert!(
                behind.seen >= 100_000 && behind.seen + behind.unseen >= per_socket,
                "{behind:?} counted for a closed sender"
            );
            // Once its bytes are read, the closed sender (kept alive by its peer) holds
            // nothing, and nothing counts for it.
            let mut read = vec![0u8; 100_000];
            std::io::Read::read_exact(&mut &b, &mut read).unwrap();
            let drained = count.used_bytes();
            assert!(
                drained.seen < 4096 && drained.unseen == 0,
                "{drained:?} counted for a closed sender whose bytes were read"
            );
            drop(b);
            let idle = count.used_bytes();
            assert!(idle.seen < 4096 && idle.unseen == 0, "{idle:?} at the end");
        });
    }

    /// Another socket of the namespace (a job's, with a network) cannot slip the counter a
    /// forged answer: the kernel refuses to deliver it.
    #[test]
    fn no_other_socket_can_send_the_counter_an_answer() {
        in_a_network_namespace_of_its_own(|| {
            let count = SocketCount::new(Path::new("/proc/thread-self"), None);
            let diag = count.diag.as_ref().expect("a sock_diag socket");
            let port: NetlinkAddr = nix::sys::socket::getsockname(diag.as_raw_fd()).unwrap();
            let forger = socket(
                AddressFamily::Netlink,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC,
                SockProtocol::NetlinkSockDiag,
            )
            .unwrap();
            let done = message(NLMSG_DONE, 1, &[0; 4]);
            let sent = sendto(forger.as_raw_fd(), &done, &port, MsgFlags::empty());
            assert_eq!(sent, Err(nix::errno::Errno::ECONNREFUSED));
        });
    }

    /// Runs `f` on a thread moved into a new network namespace (root only: else skipped).
    fn in_a_network_namespace_of_its_own(f: impl FnOnce() + Send + 'static) {
        if !nix::unistd::Uid::effective().is_root() {
            forkbox_testkit::skipped(
                "a network namespace of its own needs root for this unit test",
            );
            return;
        }
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f();
        })
        .join()
        .unwrap();
    }
}
