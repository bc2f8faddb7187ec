//! What a load generator killed outright (SIGKILL, the OOM killer, a lost machine) leaves behind,
//! and its removal by the next run or `--cleanup`.
//!
//! Ctrl-C and errors clean up through guards, but a killed process runs no code. So everything a
//! run starts is marked with its owner, the load generator's pid and start time (which together
//! name one process for the kernel's lifetime; a reused pid has another start time):
//! - worker nodes carry it in their environment, [`OWNER_ENV`];
//! - temporary directories (logs, the load generator's own Redis data) carry it in their name,
//!   [`temp_prefix`]; `redis-server` runs in its directory (it overwrites its environment with
//!   its process title), which marks it;
//! - a run's simulated hosts carry it as the alias of their bridge, `fbl<run>`.
//!
//! A sweep removes what is marked with an owner that is no longer running: it SIGKILLs such
//! processes (a worker's zygote and sandboxes go with it), deletes such a bridge with the run's
//! namespaces `fbl-<run>-*` (their veth pairs go with them), and removes such directories.

use std::path::Path;

use forkbox_queue::owner;

use crate::netns::{link_names, IpCommand, ALIAS_PREFIX};

/// Environment variable naming the load generator a process was started by.
pub const OWNER_ENV: &str = "FORKBOX_LOADGEN_OWNER";
/// Name prefix of this process's temporary directories: `forkbox-loadgen-<owner>-`.
pub fn temp_prefix() -> String {
    format!("{TEMP_PREFIX}{}-", owner::tag())
}

const TEMP_PREFIX: &str = "forkbox-loadgen-";

/// Processes marked with an owner, by environment or by working directory: (pid, owner
/// tag). Processes of other users are skipped (unreadable), and so is this process.
pub fn marked_processes() -> Vec<(u32, String)> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let needle = format!("{OWNER_ENV}=");
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(|pid| {
            let proc = Path::new("/proc").join(pid.to_string());
            let by_cwd = std::fs::read_link(proc.join("cwd")).ok().and_then(|cwd| {
                cwd.components()
                    .find_map(|c| owner::tag_in(c.as_os_str().to_str()?, TEMP_PREFIX))
                    .map(str::to_owned)
            });
            let tag = by_cwd.or_else(|| {
                let env = std::fs::read(proc.join("environ")).ok()?;
                env.split(|&b| b == 0)
                    .filter_map(|v| std::str::from_utf8(v).ok())
                    .find_map(|v| v.strip_prefix(&needle).map(str::to_owned))
            })?;
            Some((pid, tag))
        })
        .collect()
}

/// What a sweep removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    pub processes: usize,
    pub directories: usize,
    /// Runs whose simulated hosts were removed, with their namespace count.
    pub hosts: Vec<(String, usize)>,
    pub errors: Vec<String>,
}

impl Swept {
    pub fn is_empty(&self) -> bool {
        self.processes == 0
            && self.directories == 0
            && self.hosts.is_empty()
            && self.errors.is_empty()
    }

    /// One line for the operator; `None` when there was nothing to do.
    pub fn summary(&self) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let mut parts = vec![
            format!("{} process(es)", self.processes),
            format!("{} temporary director(ies)", self.directories),
        ];
        for (run, n) in &self.hosts {
            parts.push(format!("run {run}'s bridge and {n} namespace(s)"));
        }
        let mut line = format!(
            "removed what load generators no longer running left behind: {}",
            parts.join(", ")
        );
        for e in &self.errors {
            line.push_str(&format!("; {e}"));
        }
        Some(line)
    }
}

/// Removes the processes and simulated hosts of owners that are gone. `ip` is used only when a
/// marked bridge exists, and its absence (no iproute2, no privilege) is not an error.
pub fn sweep(ip: &mut impl IpCommand) -> Swept {
    let mut swept = Swept::default();
    for (pid, owner) in marked_processes() {
        if owner::alive(&owner) {
            continue;
        }
        let killed = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        swept.processes += usize::from(killed);
    }
    for dir in owner::abandoned(&std::env::temp_dir(), TEMP_PREFIX) {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => swept.directories += 1,
            Err(e) => swept
                .errors
                .push(format!("removing {}: {e}", dir.display())),
        }
    }
    let Ok(links) = ip.ip(&["-o", "link", "show", "type", "bridge"]) else {
        return swept;
    };
    for (bridge, owner) in marked_bridges(&links) {
        if owner::alive(&owner) {
            continue;
        }
        let run = bridge.trim_start_matches("fbl").to_owned();
        match crate::netns::remove_run(ip, &run) {
            Ok(n) => swept.hosts.push((run, n)),
            Err(errors) => swept.errors.extend(errors.iter().map(ToString::to_string)),
        }
    }
    swept
}

/// `(bridge, owner)` for each bridge of `ip -o link show type bridge` whose alias marks it.
fn marked_bridges(links: &str) -> Vec<(String, String)> {
    links
        .lines()
        .filter_map(|l| {
            let name = link_names(l).next()?;
            let alias = l.split(" alias ").nth(1)?.trim();
            let owner = alias.strip_prefix(ALIAS_PREFIX)?;
            name.starts_with("fbl")
                .then(|| (name.to_owned(), owner.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkbox_queue::owner::tag as owner_tag;

    fn temp_owner(name: &str) -> Option<&str> {
        owner::tag_in(name, TEMP_PREFIX)
    }

    #[test]
    fn bridges_are_found_by_their_alias() {
        let links = "\
3: fblab12: <BROADCAST,MULTICAST,UP> mtu 1500 qdisc noqueue state UP mode DEFAULT group default qlen 1000\\    link/ether 4a:1f:00:00:00:01 brd ff:ff:ff:ff:ff:ff\\    alias forkbox-loadgen 4242:99
4: docker0: <BROADCAST> mtu 1500 qdisc noqueue state DOWN\\    link/ether 02:42:00:00:00:02 brd ff:ff:ff:ff:ff:ff
5: fblcd34: <BROADCAST> mtu 1500\\    link/ether 4a:1f:00:00:00:03 brd ff:ff:ff:ff:ff:ff
6: br-x: <BROADCAST> mtu 1500\\    link/ether 4a:1f:00:00:00:04 brd ff:ff:ff:ff:ff:ff\\    alias forkbox-loadgen 1:2
";
        assert_eq!(
            marked_bridges(links),
            vec![("fblab12".to_owned(), "4242:99".to_owned())]
        );
    }

    #[test]
    fn the_summary_names_what_was_removed() {
        assert_eq!(Swept::default().summary(), None);
        let s = Swept {
            processes: 3,
            directories: 1,
            hosts: vec![("ab12".into(), 2)],
            errors: vec![],
        };
        assert_eq!(
            s.summary().unwrap(),
            "removed what load generators no longer running left behind: 3 process(es), 1 \
             temporary director(ies), run ab12's bridge and 2 namespace(s)"
        );
    }

    #[test]
    fn temporary_directories_name_their_owner() {
        let prefix = temp_prefix();
        let name = format!("{prefix}redis-Ab3xYz");
        assert_eq!(temp_owner(&name), Some(owner_tag().as_str()));
        assert_eq!(
            temp_owner(&format!("{prefix}Zk9")),
            Some(owner_tag().as_str())
        );
        assert_eq!(temp_owner("forkbox-loadgen-Zk9abc"), None);
        assert_eq!(temp_owner("forkbox-redis-abc"), None);
        assert_eq!(temp_owner("forkbox-loadgen-12:x-a"), None);
    }
}
