//! A process named for the kernel's lifetime: its pid and start time, `<pid>:<start>`.
//!
//! Marks made with it (a directory's name, an environment variable, an interface's alias) let
//! a later process tell what a process killed outright left behind from what a live one still
//! holds: a pid may be reused, but never with the same start time.

/// `<pid>:<start time>` of this process.
pub fn tag() -> String {
    let pid = std::process::id();
    format!("{pid}:{}", start_time(pid).unwrap_or(0))
}

/// Whether the process a tag names is still running (a zombie not yet reaped is not).
pub fn alive(tag: &str) -> bool {
    let Some((pid, start)) = tag.split_once(':') else {
        return false;
    };
    match (pid.parse::<u32>(), start.parse::<u64>()) {
        (Ok(pid), Ok(start)) => start_time(pid) == Some(start),
        _ => false,
    }
}

/// The tag a name `<prefix><pid>:<start>-...` carries.
pub fn tag_in<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = name.strip_prefix(prefix)?;
    let (pid, after) = rest.split_once(':')?;
    let start = after.split('-').next()?;
    let tag = &rest[..pid.len() + 1 + start.len()];
    (pid.parse::<u32>().is_ok() && start.parse::<u64>().is_ok() && after.len() > start.len())
        .then_some(tag)
}

/// Directories in `dir` named `<prefix><owner>-...` whose owner is gone (symlinks are skipped):
/// what processes killed outright left behind.
pub fn abandoned(dir: &std::path::Path, prefix: &str) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let gone = name
                .to_str()
                .and_then(|n| tag_in(n, prefix))
                .is_some_and(|owner| !alive(owner));
            gone && e.file_type().is_ok_and(|t| t.is_dir())
        })
        .map(|e| e.path())
        .collect()
}

/// Start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`); `None` when
/// there is no such process or it has exited.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    if matches!(rest.next(), Some("Z" | "X")) {
        return None;
    }
    rest.nth(18)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reused_pid_is_not() {
        let me = tag();
        assert!(alive(&me), "{me}");
        let pid = std::process::id();
        // The same pid with another start time: a process that is gone.
        assert!(!alive(&format!("{pid}:1")));
        assert!(!alive("garbage"));
        assert!(!alive(&format!("{}:0", u32::MAX)));
    }

    #[test]
    fn names_carry_their_tag() {
        assert_eq!(tag_in("fb-12:345-abc", "fb-"), Some("12:345"));
        assert_eq!(tag_in("fb-12:345-redis-abc", "fb-"), Some("12:345"));
        assert_eq!(tag_in("fb-12:345", "fb-"), None);
        assert_eq!(tag_in("fb-abc", "fb-"), None);
        assert_eq!(tag_in("fb-12:x-a", "fb-"), None);
        assert_eq!(tag_in("other-12:345-a", "fb-"), None);
    }
}
