//! Memory a job holds outside its processes when it ends: its disk's files (the tmpfs behind
//! `/tmp`, the working directory and `/dev/shm`) and the SysV shared memory and message queues
//! of its ipc namespace. None of it shows in a process's RSS (a detached segment is mapped by
//! no process, a tmpfs page belongs to no process at all), so without cgroups, where the job's
//! peak is its largest process's RSS, the init adds what is held here when the program ends.
//! With cgroups the kernel charges all of it to the job and `memory.peak` has it already.
//!
//! Read by the init after every process of the sandbox is gone: what is left then stays until
//! the namespaces are torn down. A job that freed such memory before it ended is not counted
//! (a measure at the end, not a sampled peak).

use std::path::Path;

/// Kernel memory per queued SysV message beyond its text (`struct msg_msg`), a lower bound.
const MSG_HEADER_BYTES: u64 = 48;

/// What the job holds outside its processes, in KiB: the used part of the filesystem at
/// `disk` plus the SysV objects listed under `proc/sysvipc`.
pub fn held_kb(disk: &Path, proc: &Path) -> u64 {
    let disk = nix::sys::statvfs::statvfs(disk)
        .map(|s| (s.blocks() - s.blocks_free()) * s.fragment_size())
        .unwrap_or(0);
    // Most jobs leave no SysV object, and this runs between the program's exit and its
    // result: a table is read only when the kernel counts something in it (one system call
    // each, where reading both tables took tens of microseconds).
    let counts = super::sys::sysv_counts().ok();
    let present = |n: fn(&super::sys::SysvCounts) -> u64| counts.as_ref().is_none_or(|c| n(c) > 0);
    let read = |name: &str, there: bool| {
        there
            .then(|| std::fs::read_to_string(proc.join("sysvipc").join(name)).ok())
            .flatten()
            .unwrap_or_default()
    };
    let shm = read("shm", present(|c| c.segments));
    let msg = read("msg", present(|c| c.queues));
    (disk + shm_bytes(&shm) + msg_bytes(&msg)) / 1024
}

/// Resident bytes of every shared memory segment in `/proc/sysvipc/shm`.
fn shm_bytes(table: &str) -> u64 {
    sum_columns(table, &["rss"], &[1])
}

/// Bytes queued in every message queue of `/proc/sysvipc/msg`, with each message's header.
fn msg_bytes(table: &str) -> u64 {
    sum_columns(table, &["cbytes", "qnum"], &[1, MSG_HEADER_BYTES])
}

/// Sums `weights[i] × column[i]` over the rows of a `/proc/sysvipc` table, whose first line
/// names the columns. A table without those columns counts nothing.
fn sum_columns(table: &str, columns: &[&str], weights: &[u64]) -> u64 {
    let mut lines = table.lines();
    let Some(header) = lines.next() else {
        return 0;
    };
    let names: Vec<&str> = header.split_whitespace().collect();
    let Some(at) = columns
        .iter()
        .map(|c| names.iter().position(|n| n == c))
        .collect::<Option<Vec<usize>>>()
    else {
        return 0;
    };
    lines
        .map(|row| {
            let fields: Vec<&str> = row.split_whitespace().collect();
            at.iter()
                .zip(weights)
                .map(|(&i, w)| {
                    fields
                        .get(i)
                        .and_then(|f| f.parse::<u64>().ok())
                        .unwrap_or(0)
                        * w
                })
                .sum::<u64>()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_counts_its_resident_bytes() {
        let table = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n\
                     \x20        0          5   600              41943040  2233  2233      0     0     0     0     0 1796187766 1796187766 1796187766              41943040                     0\n\
                     \x20        0          6   600               1048576  2233  2233      1     0     0     0     0 1796187766          0 1796187766                  4096                     0\n";
        assert_eq!(shm_bytes(table), 41943040 + 4096);
        assert_eq!(shm_bytes(""), 0);
        assert_eq!(shm_bytes("key shmid size\n0 5 4096\n"), 0, "no rss column");
    }

    #[test]
    fn message_queues_count_their_text_and_headers() {
        let table = "       key      msqid perms      cbytes       qnum lspid lrpid   uid   gid  cuid  cgid      stime      rtime      ctime\n\
                     \x20        0          0   600       16384          2    10     0     0     0     0     0 1796187766          0 1796187766\n\
                     \x20        0          1   600           0          0     0     0     0     0     0     0          0          0 1796187766\n";
        assert_eq!(msg_bytes(table), 16384 + 2 * MSG_HEADER_BYTES);
    }

    #[test]
    fn a_disk_counts_its_used_blocks() {
        let none = tempfile::tempdir().unwrap();
        // No sysvipc tables to read: the disk alone. The root filesystem has used blocks (its
        // exact count moves with whatever else writes there, so only that it counts).
        assert!(held_kb(Path::new("/"), none.path()) > 0);
        // A disk that cannot be measured counts nothing.
        assert_eq!(held_kb(&none.path().join("missing"), none.path()), 0);
    }
}
