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

use crate::sandbox::kernel::sys::SysvCounts;

/// Kernel memory per queued SysV message beyond its text (`struct msg_msg`), a lower bound.
const MSG_HEADER_BYTES: u64 = 48;

/// What the job holds outside its processes, in KiB: the used part of the filesystem at
/// `disk` plus the SysV objects listed under `proc/sysvipc`.
pub fn held_kb(disk: &Path, proc: &Path) -> u64 {
    held_kb_with(disk, proc, crate::sandbox::kernel::sys::sysv_counts().ok())
}

/// [`held_kb`], with the kernel's count of SysV objects (`None`: unknown, every table read).
/// Most jobs leave no SysV object, and this runs between the program's exit and its result:
/// a table is read only when something is counted in it (reading both took tens of
/// microseconds; the counts are one system call each).
fn held_kb_with(disk: &Path, proc: &Path, counts: Option<SysvCounts>) -> u64 {
    let disk = nix::sys::statvfs::statvfs(disk)
        .map(|s| (s.blocks() - s.blocks_free()) * s.fragment_size())
        .unwrap_or(0);
    let table = |name: &str, counted: fn(&SysvCounts) -> u64| {
        if counts.as_ref().is_some_and(|c| counted(c) == 0) {
            return String::new();
        }
        std::fs::read_to_string(proc.join("sysvipc").join(name)).unwrap_or_default()
    };
    let shm = table("shm", |c| c.segments);
    let msg = table("msg", |c| c.queues);
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
    fn a_table_is_read_only_when_the_kernel_counts_something_in_it() {
        // No disk to measure (it would move with whatever else writes there): tables only.
        let none = tempfile::tempdir().unwrap();
        let disk = none.path().join("missing");
        let proc = tempfile::tempdir().unwrap();
        std::fs::create_dir(proc.path().join("sysvipc")).unwrap();
        // One 1 MiB segment and one queue of 1 KiB in two messages.
        std::fs::write(
            proc.path().join("sysvipc/shm"),
            "key shmid rss\n0 1 1048576\n",
        )
        .unwrap();
        std::fs::write(
            proc.path().join("sysvipc/msg"),
            "key msqid cbytes qnum\n0 1 1024 2\n",
        )
        .unwrap();
        let held =
            |segments, queues| held_kb_with(&disk, proc.path(), Some(counts(segments, queues)));
        assert_eq!(held(0, 0), 0, "nothing counted, nothing read");
        assert_eq!(held(1, 0), 1024);
        assert_eq!(held(0, 1), (1024 + 2 * MSG_HEADER_BYTES) / 1024);
        assert_eq!(
            held_kb_with(&disk, proc.path(), None),
            (1_048_576 + 1024 + 2 * MSG_HEADER_BYTES) / 1024,
            "counts unknown: both tables read"
        );
    }

    fn counts(segments: u64, queues: u64) -> SysvCounts {
        SysvCounts { segments, queues }
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
