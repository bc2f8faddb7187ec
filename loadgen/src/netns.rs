//! Simulated hosts: one network namespace per host, joined by veth pairs to a bridge.
//!
//! `--hosts H` puts the spawned workers in H namespaces with their own addresses, so each node
//! reaches Redis over a veth and a bridge (the bridge carries Redis' address) rather than over
//! loopback, as separate machines would. The CPUs are still shared: this simulates the network
//! path and the node isolation, not more hardware.
//!
//! Every resource is recorded the moment it is created and removed in reverse order by
//! [`SimulatedHosts::cleanup`], which `Drop` also runs, so an error half-way through set-up, a
//! panic or Ctrl-C leaves nothing behind. The bridge's alias names the load generator, so that
//! the next run removes the hosts of one killed outright ([`crate::orphans`]). All changes go through `ip`, behind the [`IpCommand`]
//! trait, so the order of the set-up is unit-tested with a recording implementation.

use std::net::Ipv4Addr;
use std::process::Command;

/// Bridge alias prefix, followed by the owner: how the next run finds the hosts of one killed
/// outright.
pub(crate) const ALIAS_PREFIX: &str = "forkbox-loadgen ";

/// The alias given to a run's bridge.
pub fn bridge_alias(owner: &str) -> String {
    format!("{ALIAS_PREFIX}{owner}")
}

/// Upper bound on `--hosts`: each host costs a namespace, two interfaces and a worker.
pub const MAX_HOSTS: usize = 32;
/// Addresses are taken from 10.213.X.0/24 with X chosen free at set-up.
const NET_A: u8 = 10;
const NET_B: u8 = 213;

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("--hosts must be 1 to {MAX_HOSTS}, got {0}")]
    Count(usize),
    #[error("`ip {args}` failed: {message}")]
    Ip { args: String, message: String },
    #[error("no free 10.{NET_B}.X.0/24 subnet")]
    NoSubnet,
}

/// Runs `ip` with arguments; returns standard output.
pub trait IpCommand {
    fn ip(&mut self, args: &[&str]) -> Result<String, NetnsError>;
}

impl<I: IpCommand + ?Sized> IpCommand for &mut I {
    fn ip(&mut self, args: &[&str]) -> Result<String, NetnsError> {
        (**self).ip(args)
    }
}

/// The real `ip` from iproute2.
#[derive(Debug, Default)]
pub struct SystemIp;

impl IpCommand for SystemIp {
    fn ip(&mut self, args: &[&str]) -> Result<String, NetnsError> {
        let out = Command::new("ip")
            .args(args)
            .output()
            .map_err(|e| NetnsError::Ip {
                args: args.join(" "),
                message: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(NetnsError::Ip {
                args: args.join(" "),
                message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Whether `ip netns` can be used here (root, iproute2 present), with the reason when not.
pub fn available() -> Result<(), String> {
    let probe = format!("fbl-probe-{}", std::process::id());
    let mut ip = SystemIp;
    ip.ip(&["netns", "add", &probe])
        .map_err(|e| e.to_string())?;
    ip.ip(&["netns", "del", &probe])
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// One simulated host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Network namespace name, `fbl-<run>-<n>`.
    pub netns: String,
    /// Host-side end of the veth pair (attached to the bridge).
    pub veth: String,
    pub addr: Ipv4Addr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Created {
    Bridge(String),
    Netns(String),
    Link(String),
}

/// The namespaces, links and bridge of one run.
pub struct SimulatedHosts<I: IpCommand = SystemIp> {
    ip: I,
    bridge: String,
    bridge_addr: Ipv4Addr,
    hosts: Vec<Host>,
    created: Vec<Created>,
}

impl<I: IpCommand> std::fmt::Debug for SimulatedHosts<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedHosts")
            .field("bridge", &self.bridge)
            .field("hosts", &self.hosts)
            .finish()
    }
}

/// A subnet third octet not used by any address on this machine.
fn free_subnet(ip: &mut impl IpCommand, seed: u32) -> Result<u8, NetnsError> {
    let addrs = ip.ip(&["-4", "-o", "addr", "show"])?;
    for i in 0..250u32 {
        let c = (1 + (seed + i) % 250) as u8;
        let prefix = format!(" {NET_A}.{NET_B}.{c}.");
        if !addrs.contains(&prefix) {
            return Ok(c);
        }
    }
    Err(NetnsError::NoSubnet)
}

impl<I: IpCommand> SimulatedHosts<I> {
    /// Creates `count` hosts for run `run` (a short id: interface names are limited to 15
    /// characters, so keep it at most 6). On error, whatever was created is removed.
    pub fn create(mut ip: I, run: &str, count: usize) -> Result<SimulatedHosts<I>, NetnsError> {
        if count == 0 || count > MAX_HOSTS {
            return Err(NetnsError::Count(count));
        }
        let seed = run
            .bytes()
            .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
        let c = free_subnet(&mut ip, seed)?;
        let mut hosts = SimulatedHosts {
            ip,
            bridge: format!("fbl{run}"),
            bridge_addr: Ipv4Addr::new(NET_A, NET_B, c, 1),
            hosts: Vec::new(),
            created: Vec::new(),
        };
        // On error, Drop of `hosts` removes what was recorded so far.
        hosts.build(run, count, c)?;
        Ok(hosts)
    }

    fn run(&mut self, args: &[&str]) -> Result<String, NetnsError> {
        self.ip.ip(args)
    }

    fn build(&mut self, run: &str, count: usize, c: u8) -> Result<(), NetnsError> {
        let bridge = self.bridge.clone();
        self.run(&["link", "add", &bridge, "type", "bridge"])?;
        self.created.push(Created::Bridge(bridge.clone()));
        // Marks the run's owner, so that a later run removes all this if we are killed outright.
        let alias = bridge_alias(&forkbox_queue::owner::tag());
        self.run(&["link", "set", &bridge, "alias", &alias])?;
        let cidr = format!("{}/24", self.bridge_addr);
        self.run(&["addr", "add", &cidr, "dev", &bridge])?;
        self.run(&["link", "set", &bridge, "up"])?;
        for n in 0..count {
            let netns = format!("fbl-{run}-{n}");
            let veth = format!("fbl{run}h{n}");
            let peer = format!("fbl{run}p{n}");
            let addr = Ipv4Addr::new(NET_A, NET_B, c, 10 + n as u8);
            self.run(&["netns", "add", &netns])?;
            self.created.push(Created::Netns(netns.clone()));
            self.run(&["link", "add", &veth, "type", "veth", "peer", "name", &peer])?;
            self.created.push(Created::Link(veth.clone()));
            // The peer moves into the namespace before it is configured: addresses and state
            // set in the root namespace would be lost by the move.
            self.run(&["link", "set", &peer, "netns", &netns])?;
            self.run(&["link", "set", &veth, "master", &bridge])?;
            self.run(&["link", "set", &veth, "up"])?;
            self.run(&["-n", &netns, "link", "set", "lo", "up"])?;
            self.run(&["-n", &netns, "link", "set", &peer, "name", "eth0"])?;
            let cidr = format!("{addr}/24");
            self.run(&["-n", &netns, "addr", "add", &cidr, "dev", "eth0"])?;
            self.run(&["-n", &netns, "link", "set", "eth0", "up"])?;
            self.hosts.push(Host { netns, veth, addr });
        }
        Ok(())
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Redis' address as the hosts see it.
    pub fn bridge_addr(&self) -> Ipv4Addr {
        self.bridge_addr
    }

    /// Removes everything, newest first. Processes left in a namespace (a worker's orphaned
    /// sandbox) are killed first, or the namespace and its veth would outlive the run.
    pub fn cleanup(&mut self) -> Vec<NetnsError> {
        let mut errors = Vec::new();
        while let Some(c) = self.created.pop() {
            let r = match &c {
                Created::Netns(ns) => {
                    if let Ok(pids) = self.ip.ip(&["netns", "pids", ns]) {
                        for pid in pids.split_whitespace() {
                            let _ = Command::new("kill").args(["-KILL", pid]).status();
                        }
                    }
                    self.ip.ip(&["netns", "del", ns])
                }
                // Deleting one end of a veth pair deletes both.
                Created::Link(l) | Created::Bridge(l) => self.ip.ip(&["link", "del", l]),
            };
            match r {
                Ok(_) => {}
                // The veth went with its namespace already.
                Err(NetnsError::Ip { message, .. }) if message.contains("Cannot find device") => {}
                Err(e) => errors.push(e),
            }
        }
        errors
    }
}

impl<I: IpCommand> Drop for SimulatedHosts<I> {
    fn drop(&mut self) {
        for e in self.cleanup() {
            eprintln!("forkbox-loadgen: cleaning up simulated hosts: {e}");
        }
    }
}

/// Namespaces and links of run `run` still present (used by tests to check the clean-up).
pub fn leftovers(run: &str) -> Vec<String> {
    let (namespaces, links) = present(&mut SystemIp, run);
    namespaces.into_iter().chain(links).collect()
}

/// Run `run`'s namespaces and links (its bridge and host-side veths) that exist.
fn present(ip: &mut impl IpCommand, run: &str) -> (Vec<String>, Vec<String>) {
    let ns_prefix = format!("fbl-{run}-");
    let namespaces = ip.ip(&["netns", "list"]).map_or_else(
        |_| Vec::new(),
        |list| {
            list.lines()
                .filter_map(|l| l.split_whitespace().next())
                .filter(|n| n.starts_with(&ns_prefix))
                .map(str::to_owned)
                .collect()
        },
    );
    let link_prefix = format!("fbl{run}");
    let links = ip.ip(&["-o", "link", "show"]).map_or_else(
        |_| Vec::new(),
        |list| {
            link_names(&list)
                .filter(|n| n.starts_with(&link_prefix))
                .map(str::to_owned)
                .collect()
        },
    );
    (namespaces, links)
}

/// Removes what is left of run `run` (its owner was killed outright) with the same clean-up as
/// an orderly end: the host-side veths first (a namespace's own end goes with it only once its
/// last process has exited, which a SIGKILL does not wait for), then the namespaces, killing
/// what still runs in them, then the bridge. Returns the namespace count.
pub(crate) fn remove_run(ip: &mut impl IpCommand, run: &str) -> Result<usize, Vec<NetnsError>> {
    let (namespaces, links) = present(ip, run);
    let bridge = format!("fbl{run}");
    let count = namespaces.len();
    let mut created = vec![Created::Bridge(bridge.clone())];
    created.extend(namespaces.into_iter().map(Created::Netns));
    created.extend(
        links
            .into_iter()
            .filter(|l| *l != bridge)
            .map(Created::Link),
    );
    let mut hosts = SimulatedHosts {
        ip,
        bridge,
        bridge_addr: Ipv4Addr::UNSPECIFIED,
        hosts: Vec::new(),
        created,
    };
    let errors = hosts.cleanup();
    if errors.is_empty() {
        Ok(count)
    } else {
        Err(errors)
    }
}

/// Interface names in `ip -o link show` output ("7: fblabc123h0@if6: <...>").
pub(crate) fn link_names(list: &str) -> impl Iterator<Item = &str> {
    list.lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records commands; fails the command whose text contains `fail_on`.
    #[derive(Default)]
    struct Recording {
        log: Vec<String>,
        fail_on: Option<&'static str>,
        addrs: String,
    }

    impl IpCommand for Recording {
        fn ip(&mut self, args: &[&str]) -> Result<String, NetnsError> {
            let line = args.join(" ");
            if line == "-4 -o addr show" {
                return Ok(self.addrs.clone());
            }
            self.log.push(line.clone());
            if self.fail_on.is_some_and(|f| line.contains(f)) {
                return Err(NetnsError::Ip {
                    args: line,
                    message: "RTNETLINK answers: File exists".into(),
                });
            }
            Ok(String::new())
        }
    }

    #[test]
    fn builds_bridge_then_each_host_and_removes_in_reverse() {
        let mut rec = Recording::default();
        let hosts = SimulatedHosts::create(&mut rec, "ab12", 2).unwrap();
        let addrs: Vec<_> = hosts.hosts().iter().map(|h| h.addr).collect();
        let bridge_addr = hosts.bridge_addr();
        assert_eq!(hosts.hosts()[1].netns, "fbl-ab12-1");
        drop(hosts);
        assert_eq!(bridge_addr.octets()[..2], [10, 213]);
        assert_eq!(addrs[0].octets()[3], 10);
        assert_eq!(addrs[1].octets()[3], 11);
        let log = rec.log.join("\n");
        let c = bridge_addr.octets()[2];
        let owner = forkbox_queue::owner::tag();
        let want = format!(
            "link add fblab12 type bridge
link set fblab12 alias forkbox-loadgen {owner}
addr add 10.213.{c}.1/24 dev fblab12
link set fblab12 up
netns add fbl-ab12-0
link add fblab12h0 type veth peer name fblab12p0
link set fblab12p0 netns fbl-ab12-0
link set fblab12h0 master fblab12
link set fblab12h0 up
-n fbl-ab12-0 link set lo up
-n fbl-ab12-0 link set fblab12p0 name eth0
-n fbl-ab12-0 addr add 10.213.{c}.10/24 dev eth0
-n fbl-ab12-0 link set eth0 up
netns add fbl-ab12-1
link add fblab12h1 type veth peer name fblab12p1
link set fblab12p1 netns fbl-ab12-1
link set fblab12h1 master fblab12
link set fblab12h1 up
-n fbl-ab12-1 link set lo up
-n fbl-ab12-1 link set fblab12p1 name eth0
-n fbl-ab12-1 addr add 10.213.{c}.11/24 dev eth0
-n fbl-ab12-1 link set eth0 up
link del fblab12h1
netns pids fbl-ab12-1
netns del fbl-ab12-1
link del fblab12h0
netns pids fbl-ab12-0
netns del fbl-ab12-0
link del fblab12"
        );
        assert_eq!(log, want);
    }

    #[test]
    fn partial_setup_is_undone() {
        let mut rec = Recording {
            fail_on: Some("fblab12p1 netns"),
            ..Recording::default()
        };
        let e = SimulatedHosts::create(&mut rec, "ab12", 3).unwrap_err();
        assert!(e.to_string().contains("File exists"), "{e}");
        let undo: Vec<&str> = rec
            .log
            .iter()
            .skip_while(|l| !l.contains("fblab12p1 netns"))
            .skip(1)
            .map(String::as_str)
            .collect();
        assert_eq!(
            undo,
            [
                "link del fblab12h1",
                "netns pids fbl-ab12-1",
                "netns del fbl-ab12-1",
                "link del fblab12h0",
                "netns pids fbl-ab12-0",
                "netns del fbl-ab12-0",
                "link del fblab12"
            ]
        );
    }

    #[test]
    fn avoids_subnets_in_use_and_bounds_the_count() {
        let mut rec = Recording::default();
        let seed = "ab12"
            .bytes()
            .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
        let first = (1 + seed % 250) as u8;
        rec.addrs = format!("3: br0    inet 10.213.{first}.1/24 scope global br0\n");
        let hosts = SimulatedHosts::create(&mut rec, "ab12", 1).unwrap();
        assert_ne!(hosts.bridge_addr().octets()[2], first);
        drop(hosts);
        let mut rec = Recording::default();
        assert!(matches!(
            SimulatedHosts::create(&mut rec, "x", MAX_HOSTS + 1),
            Err(NetnsError::Count(_))
        ));
        assert!(rec.log.is_empty());
    }
}
