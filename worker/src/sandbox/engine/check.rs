//! `forkbox check`: what this host supports, and how each limit is enforced on it.

use std::fs;
use std::path::Path;

use crate::sandbox::isolate::cgroup::{self, Delegation};

/// Lines to print, and the reason no sandbox can be made (if any).
pub struct HostReport {
    pub lines: Vec<String>,
    pub fatal: Option<String>,
}

fn read(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// Probes the kernel features the sandbox relies on.
pub fn probe_host() -> HostReport {
    let mut lines = Vec::new();
    let mut fatal = None;
    // Only images (`--rootfs`) need overlayfs, so its absence is a warning, not a failure.
    let overlay =
        read("/proc/filesystems").is_some_and(|f| f.lines().any(|l| l.ends_with("overlay")));
    lines.push(if overlay {
        "ok    overlayfs: available (used with userxattr inside the user namespace, for --rootfs images)".to_owned()
    } else {
        "warn  overlayfs: not in /proc/filesystems (`modprobe overlay`); needed only for --rootfs images".to_owned()
    });
    let mut line = |ok: bool, what: &str, detail: String| {
        lines.push(format!(
            "{} {what}: {detail}",
            if ok { "ok   " } else { "FAIL " }
        ));
    };

    let max_userns = read("/proc/sys/user/max_user_namespaces").and_then(|s| s.parse::<u64>().ok());
    let debian_knob = read("/proc/sys/kernel/unprivileged_userns_clone");
    let apparmor = read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
    let mut userns_ok = max_userns != Some(0);
    let mut detail = format!(
        "max_user_namespaces={}",
        max_userns.map_or("?".into(), |n| n.to_string())
    );
    if debian_knob.as_deref() == Some("0") {
        userns_ok = false;
        detail.push_str("; disabled: run `sysctl kernel.unprivileged_userns_clone=1`");
    }
    if apparmor.as_deref() == Some("1") && !nix::unistd::Uid::current().is_root() {
        userns_ok = false;
        detail.push_str(
            "; AppArmor restricts unprivileged user namespaces: run `sysctl kernel.apparmor_restrict_unprivileged_userns=0` or add an AppArmor profile for forkbox",
        );
    }
    if max_userns == Some(0) {
        detail.push_str("; run `sysctl user.max_user_namespaces=15000`");
    }
    if !userns_ok {
        fatal = Some(format!("user namespaces unavailable ({detail})"));
    }
    line(userns_ok, "user namespaces", detail);

    let seccomp = read("/proc/sys/kernel/seccomp/actions_avail");
    let seccomp_ok = seccomp.as_deref().is_some_and(|a| a.contains("errno"));
    line(
        seccomp_ok,
        "seccomp",
        seccomp.map_or("kernel has no seccomp filter support".into(), |a| {
            format!("filter actions: {a}")
        }),
    );
    if !seccomp_ok {
        fatal.get_or_insert_with(|| "seccomp filters unavailable (CONFIG_SECCOMP_FILTER)".into());
    }

    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let (major, minor) = kernel_version(&release);
    // clone3 with CLONE_PIDFD (5.3), openat2 for collecting (5.6), mount_setattr for the
    // recursive read-only allowlist (5.12).
    let modern = (major, minor) >= (5, 12);
    line(
        modern,
        "kernel",
        format!(
            "kernel {release}: clone3 with CLONE_PIDFD, openat2 and mount_setattr {}",
            if modern {
                "available"
            } else {
                "need Linux 5.12+"
            }
        ),
    );
    if !modern {
        fatal.get_or_insert_with(|| format!("kernel {release} is too old: Linux 5.12+ is needed"));
    }

    let probe = cgroup::probe(
        Path::new("/proc/self/mountinfo"),
        Path::new("/proc/self/cgroup"),
    );
    let where_ = probe
        .dir
        .as_ref()
        .map_or("no cgroup2 membership".into(), |d| d.display().to_string());
    for (controller, present) in &probe.controllers {
        // Not fatal: limits fall back to rlimits, which the lines below name.
        let delegated = *present && probe.writable;
        lines.push(format!(
            "{} cgroup v2 {controller}: {}",
            if delegated { "ok   " } else { "warn " },
            match (present, probe.writable) {
                (true, true) => format!("delegated at {where_}"),
                (true, false) => format!("present at {where_} but not writable (no Delegate=yes)"),
                (false, _) => format!("not delegated at {where_}; rlimit fallback"),
            },
        ));
    }
    if !matches!(probe.delegation, Delegation::Delegated(_)) {
        lines.extend(delegation_hints());
    }
    HostReport { lines, fatal }
}

/// How to get cgroup delegation, and what its absence means for the runtimes a job may use.
pub fn delegation_hints() -> Vec<String> {
    vec![
        "hint  cgroup v2: run the node as a systemd unit with `Delegate=cpu memory pids` (or \
         `Delegate=yes`), as deploy/systemd/forkbox-worker.service does, or for a one-off \
         `systemd-run -p Delegate=yes --wait --pty forkbox ...`; see docs/operations.md \
         (\"Why Delegate=yes\")"
            .into(),
        "hint  without cgroups: memory is one budget per sandbox kept by its init from /proc \
         every 10 to 100 ms (a job filling memory fast overshoots by what it fills between two \
         checks and while the init waits for a CPU), plus \
         RLIMIT_DATA per process (the address space V8, the JVM, Go and BEAM only reserve is \
         not counted, so they start); socket and pipe buffers are counted by neither, and \
         an out-of-memory end inside one process is only reported as memory_limit when the \
         program's own message and its peak show it"
            .into(),
    ]
}

fn kernel_version(release: &str) -> (u32, u32) {
    let mut it = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse().ok());
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// For each limit, the mechanism that enforces it given the cgroup delegation.
pub fn limit_mechanisms(delegation: &Delegation) -> Vec<(&'static str, String)> {
    let cg = matches!(delegation, Delegation::Delegated(_));
    let why = match delegation {
        Delegation::Delegated(dir) => format!("cgroup v2 at {}", dir.display()),
        Delegation::Unavailable(reason) => format!("rlimit fallback ({reason})"),
    };
    vec![
        (
            "wall time",
            "watchdog: timerfd deadline from exec, SIGKILL to the sandbox init via pidfd".into(),
        ),
        (
            "cpu time",
            if cg {
                format!(
                    "cpu.stat usage of the whole job, checked by the engine, plus RLIMIT_CPU \
                     per process; cpu.max holds a job to one CPU ({why})"
                )
            } else {
                "one budget for the whole sandbox, kept by its init from /proc, plus \
                 RLIMIT_CPU per process (1 s granularity; SIGXCPU, then SIGKILL)"
                    .into()
            },
        ),
        (
            "memory",
            if cg {
                format!(
                    "memory.max + memory.swap.max=0 + memory.oom.group=1, resident memory of \
                     the whole job, OOM kills at the job's limit told from kills for memory \
                     outside it ({why})"
                )
            } else {
                format!(
                    "one budget for the whole sandbox, kept by its init from /proc (anonymous \
                     and shared memory and page tables of every process, killed past the \
                     limit as memory_limit), plus RLIMIT_DATA per process (writable private \
                     memory, not address space reservations) and seccomp refusing stack and \
                     shared anonymous mappings; {why}"
                )
            },
        ),
        (
            "processes",
            if cg {
                format!("pids.max ({why})")
            } else {
                "RLIMIT_NPROC, counted per sandbox (own user namespace)".into()
            },
        ),
        (
            "output",
            "stdout/stderr pipes read with a cap; the sandbox is killed past it".into(),
        ),
        ("file size", "RLIMIT_FSIZE".into()),
        ("open files", "RLIMIT_NOFILE".into()),
        (
            "disk",
            "one size-capped tmpfs for /tmp, the work dir and /dev/shm (with an image, /dev and the overlay's upper layer too)"
                .into(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_parse() {
        assert_eq!(kernel_version("6.18.44-fc-v669"), (6, 18));
        assert_eq!(kernel_version("5.3.0"), (5, 3));
        assert_eq!(kernel_version("garbage"), (0, 0));
    }

    #[test]
    fn mechanisms_follow_delegation() {
        let without =
            limit_mechanisms(&Delegation::Unavailable("controllers not delegated".into()));
        let memory = &without.iter().find(|(l, _)| *l == "memory").unwrap().1;
        assert!(
            memory.starts_with("one budget for the whole sandbox")
                && memory.contains("RLIMIT_DATA")
                && memory.contains("controllers not delegated"),
            "{memory}"
        );
        let with = limit_mechanisms(&Delegation::Delegated("/sys/fs/cgroup/x".into()));
        let pids = &with.iter().find(|(l, _)| *l == "processes").unwrap().1;
        assert!(pids.starts_with("pids.max"), "{pids}");
        let memory = &with.iter().find(|(l, _)| *l == "memory").unwrap().1;
        assert!(memory.starts_with("memory.max"), "{memory}");
        assert!(!memory.contains("RLIMIT"), "{memory}");
        let cpu = &with.iter().find(|(l, _)| *l == "cpu time").unwrap().1;
        assert!(cpu.starts_with("cpu.stat"), "{cpu}");
    }
}
