//! A sandbox's own `/proc`, read the one way its three readers need: the init's CPU budget
//! (`budget`) and memory budget (`memory`) while the job runs, and the zygote's reading of
//! what a sandbox used before it kills it (`usage`). Each lists the processes there and reads
//! a file or two of each; a process that is gone between the listing and the read is simply
//! missing from the sum, which each reader accounts for in its own way.

use std::path::{Path, PathBuf};

/// One process listed in a `/proc`.
pub(crate) struct Process {
    pub pid: u32,
    dir: PathBuf,
}

impl Process {
    /// One of its files (`stat`, `status`, `smaps_rollup`), or `None` once it is gone.
    pub fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join(file)).ok()
    }
}

/// The processes listed in `proc` (its numeric entries); none when it cannot be read.
pub(crate) fn processes(proc: &Path) -> impl Iterator<Item = Process> {
    std::fs::read_dir(proc)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some(Process {
                pid,
                dir: entry.path(),
            })
        })
}

/// Clock ticks per second, the unit of a `stat`'s CPU times (100 when it cannot be read).
pub(crate) fn ticks_per_s() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .map_or(100, |t| t as u64)
}

/// `utime`, `stime`, `cutime` and `cstime` (fields 14 to 17) and `starttime` (field 22) of a
/// `/proc/<pid>/stat` line. The command name (field 2) may hold spaces and parentheses: fields
/// are counted from the last `)`.
pub(crate) fn cpu_fields(stat: &str) -> Option<([u64; 4], u64)> {
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace().skip(11);
    let mut next = || fields.next()?.parse::<i64>().ok().map(|v| v.max(0) as u64);
    let times = [next()?, next()?, next()?, next()?];
    let start = fields.nth(4)?.parse().ok()?;
    Some((times, start))
}

/// The value of a `Name:   123 kB` line of a `status` or `smaps_rollup`.
pub(crate) fn field_kb(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_counted_from_the_last_parenthesis() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 11 13 20 0 1 0 5 99";
        assert_eq!(cpu_fields(stat), Some(([7, 3, 11, 13], 5)));
        assert_eq!(cpu_fields("42 (x) S 1"), None);
    }

    #[test]
    fn only_numeric_entries_are_processes() {
        let proc = tempfile::tempdir().unwrap();
        for dir in ["1", "42", "self", "sys", "7x"] {
            std::fs::create_dir(proc.path().join(dir)).unwrap();
        }
        std::fs::write(proc.path().join("42").join("stat"), "42 (a) S\n").unwrap();
        std::fs::write(proc.path().join("stat"), "cpu 1 2 3\n").unwrap();
        let mut pids: Vec<u32> = processes(proc.path()).map(|p| p.pid).collect();
        pids.sort_unstable();
        assert_eq!(pids, [1, 42]);
        let read: Vec<Option<String>> = processes(proc.path())
            .filter(|p| p.pid == 42)
            .map(|p| p.read("stat"))
            .collect();
        assert_eq!(read, [Some("42 (a) S\n".to_owned())]);
        assert_eq!(processes(&proc.path().join("missing")).count(), 0);
    }

    #[test]
    fn a_field_is_read_in_kib() {
        let status = "Name:\ta\nVmPeak:\t 999999 kB\nVmHWM:\t  65600 kB\nVmPTE:\t    64 kB\n";
        assert_eq!(field_kb(status, "VmHWM:"), Some(65_600));
        assert_eq!(field_kb(status, "VmPTE:"), Some(64));
        assert_eq!(field_kb(status, "RssAnon:"), None);
    }
}
