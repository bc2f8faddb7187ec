//! A live session's checkpoint and its restores at the engine level, with real sandboxes: what
//! the session held at the checkpoint (a variable, a file) comes back after it changed both;
//! two restores are two sessions of their own; the checkpoint's frozen interpreter keeps no
//! CPU (it is stopped) and its memory is the session's; a checkpoint continued from inside the
//! session is refused by name; the checkpoint outlives its kernel's replacement; a disk's copy
//! stops at the session's disk size. Run by host root and by `nobody` (the rootless node).

mod sandbox_support;

use std::collections::BTreeMap;

use forkbox::sandbox::{CheckpointError, DiskCopyError, Engine, ForkError, SessionSpec};
use forkbox_queue::schema::{FileData, Limits, Runtime};
use sandbox_support::session::{run, value, warm_engine, zygote};

fn engine() -> Engine {
    warm_engine(&zygote("FORKBOX_SESSION_ZYGOTE"), 2)
}

fn spec() -> SessionSpec {
    let mut files = BTreeMap::new();
    files.insert(
        "notes.txt".to_owned(),
        FileData::Text("at the start\n".into()),
    );
    SessionSpec {
        runtime: Some(Runtime::Python),
        ttl_ms: 180_000,
        limits: Limits {
            memory_mb: Some(256),
            disk_mb: Some(16),
            ..Limits::default()
        },
        files,
        ..SessionSpec::default()
    }
}

/// The process state letter of host pid `pid` (`T`: stopped), from its `/proc`.
fn state_of(pid: i32) -> char {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .and_then(|v| v.trim().chars().next())
        .unwrap_or('-')
}

/// The CPU time a process has used, in clock ticks (`utime` + `stime` of its `stat`).
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_restores_what_the_session_held_when_it_was_taken() {
    let engine = tokio::task::spawn_blocking(engine).await.unwrap();
    let spec = spec();
    let mut parent = engine.open_session(spec.clone()).await.expect("parent");
    value(
        &mut parent,
        "x = 41\nblob = b'c' * (48 << 20)\nopen('notes.txt', 'a').write('checkpointed\\n')",
    )
    .await;
    let mut cp = engine
        .checkpoint_session(&mut parent, &spec)
        .await
        .expect("the checkpoint");
    let f = cp.frozen_pid().as_raw();
    assert!(cp.disk.files >= 1, "{:?}", cp.disk);
    let disk_dir = cp.disk_dir();
    assert!(
        disk_dir.join("notes.txt").is_file(),
        "{}",
        disk_dir.display()
    );
    // It keeps no CPU: stopped, and its CPU time does not move while the session works.
    assert_eq!(state_of(f), 'T');
    let ticks = cpu_ticks(f);
    value(&mut parent, "sum(range(3_000_000))").await;
    assert_eq!(cpu_ticks(f), ticks);
    // Its memory is the session's: the session lets go of 48 MiB, the checkpoint keeps it.
    value(&mut parent, "del blob\nimport gc; gc.collect()").await;
    let held_kb = parent.usage().memory_kb;
    assert!(
        held_kb > 40 << 10,
        "{held_kb} KiB counted with the checkpoint held"
    );
    // The session breaks its environment: a variable and a file.
    value(
        &mut parent,
        "x = None\nimport os\nos.remove('notes.txt')\nopen('junk', 'w').write('j')",
    )
    .await;
    let mut first = engine
        .restore_checkpoint(&mut cp, &spec)
        .await
        .expect("a restore")
        .session;
    let mut second = engine
        .restore_checkpoint(&mut cp, &spec)
        .await
        .expect("a second restore")
        .session;
    for s in [&mut first, &mut second] {
        assert_eq!(value(s, "x + 1").await, "42");
        assert_eq!(
            value(s, "open('notes.txt').read()").await,
            "'at the start\\ncheckpointed\\n'"
        );
        assert_eq!(value(s, "import os; os.path.exists('junk')").await, "False");
    }
    // Two restores are two sessions: one's change is not the other's, nor the parent's.
    value(&mut first, "x = 1\nopen('notes.txt', 'w').write('first')").await;
    assert_eq!(value(&mut second, "x").await, "41");
    assert_eq!(
        value(&mut second, "open('notes.txt').read()").await,
        "'at the start\\ncheckpointed\\n'"
    );
    assert_eq!(value(&mut parent, "x is None").await, "True");
    // The frozen interpreter stays as it was, for more restores.
    assert_eq!(state_of(f), 'T');
    cp.check(None).expect("still intact");
    // Dropped, the checkpoint ends: its process, its disk's copy and the memory it held.
    drop(cp);
    assert!(!disk_dir.exists(), "{} left", disk_dir.display());
    let stopped = value(
        &mut parent,
        "import time\n\
         def stopped():\n    \
             return [p for p in os.listdir('/proc') if p.isdigit() and \
             open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[0] == 'T']\n\
         for _ in range(100):\n    \
             if not stopped():\n        \
                 break\n    \
             time.sleep(0.05)\n\
         len(stopped())",
    )
    .await;
    assert_eq!(stopped, "0", "the checkpoint's process is gone");
    let freed_kb = parent.usage().memory_kb;
    assert!(
        freed_kb + (40 << 10) < held_kb,
        "{freed_kb} KiB after the checkpoint ended, {held_kb} KiB with it"
    );
    for s in [first, second, parent] {
        s.kill().await;
    }
}

/// The session's own code can reach its checkpoint's process (same user, same pid namespace):
/// continued, it ends at once, and a restore says so instead of copying a process that ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_continued_from_inside_the_session_is_refused_by_name() {
    let engine = tokio::task::spawn_blocking(engine).await.unwrap();
    let spec = spec();
    let mut parent = engine.open_session(spec.clone()).await.expect("parent");
    value(&mut parent, "x = 1").await;
    let mut cp = engine
        .checkpoint_session(&mut parent, &spec)
        .await
        .expect("the checkpoint");
    let found = value(
        &mut parent,
        "import os, signal, time\n\
         stopped = [int(p) for p in os.listdir('/proc') if p.isdigit() and \
         open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[0] == 'T']\n\
         for p in stopped: os.kill(p, signal.SIGCONT)\n\
         time.sleep(0.3)\n\
         len(stopped)",
    )
    .await;
    assert_eq!(found, "1", "the session sees its checkpoint's process");
    let err = engine
        .restore_checkpoint(&mut cp, &spec)
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, CheckpointError::Changed(_)), "{err}");
    assert!(err.to_string().contains("cannot be restored"), "{err}");
    // The session serves on.
    assert_eq!(value(&mut parent, "x + 1").await, "2");
    parent.kill().await;
}

/// The kernel that made the checkpoint dies and is replaced (`state_lost`): the checkpoint is
/// not its kernel's (it let go of the kernel's pipes, so the supervisor sees the death at once
/// and names it), it stays stopped, and it restores the state the dead kernel had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_outlives_its_kernels_replacement() {
    let engine = tokio::task::spawn_blocking(engine).await.unwrap();
    let spec = spec();
    let mut parent = engine.open_session(spec.clone()).await.expect("parent");
    value(&mut parent, "x = 'kept'").await;
    let mut cp = engine
        .checkpoint_session(&mut parent, &spec)
        .await
        .expect("the checkpoint");
    let r = run(&mut parent, "import os; os._exit(3)").await;
    assert_eq!(r["state_lost"], true, "{r}");
    let error = r["error"].as_str().unwrap_or_default();
    assert!(error.contains("died during the cell"), "{r}");
    assert_eq!(
        value(&mut parent, "'x' in globals()").await,
        "False",
        "a fresh interpreter serves the session"
    );
    assert_eq!(state_of(cp.frozen_pid().as_raw()), 'T');
    let mut back = engine
        .restore_checkpoint(&mut cp, &spec)
        .await
        .expect("the restore")
        .session;
    assert_eq!(value(&mut back, "x").await, "'kept'");
    back.kill().await;
    parent.kill().await;
}

/// A session's tree can hold more than its disk: a file linked under several names is copied
/// once per name (as the session writing during the copy would add). A checkpoint's copy, into
/// a directory of the node's that no tmpfs bounds, stops at the disk's size as it copies,
/// naming it; a fork's stops there too; the session serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disks_copy_stops_at_the_sessions_disk_size() {
    let engine = tokio::task::spawn_blocking(engine).await.unwrap();
    let spec = spec();
    let mut parent = engine.open_session(spec.clone()).await.expect("parent");
    // 6 MiB under four names: 24 MiB to copy, on a disk of 16 MiB.
    value(
        &mut parent,
        "import os\nopen('big', 'wb').write(b'b' * (6 << 20))\n\
         for i in range(3): os.link('big', f'big{i}')",
    )
    .await;
    let over = |e: &dyn std::fmt::Display| {
        let e = e.to_string();
        assert!(
            e.contains("stopped at /work/") && e.contains("16777216 bytes") && e.contains("16 MiB"),
            "{e}"
        );
    };
    let err = engine
        .checkpoint_session(&mut parent, &spec)
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(
            err,
            CheckpointError::Disk(DiskCopyError::OverBound {
                what: "bytes",
                disk_mb: 16,
                ..
            })
        ),
        "{err}"
    );
    over(&err);
    let fork = engine
        .fork_session(&mut parent, &spec, 1)
        .await
        .expect("the fork");
    let branch = fork.branches.into_iter().next().expect("one branch");
    // A branch's disk is a tmpfs of the same size: whichever is reached first refuses (the
    // tmpfs, when its own overhead fills it before the bound's last byte).
    let err = branch.err().expect("the branch refused");
    assert!(
        matches!(
            &err,
            ForkError::Disk(DiskCopyError::OverBound { disk_mb: 16, .. })
        ) || matches!(&err, ForkError::Disk(DiskCopyError::Write { error, .. })
            if error.raw_os_error() == Some(libc::ENOSPC)),
        "{err}"
    );
    assert_eq!(value(&mut parent, "len(os.listdir())").await, "5");
    parent.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_outside_the_warm_runtime_has_no_checkpoint() {
    let engine = tokio::task::spawn_blocking(engine).await.unwrap();
    let cold = SessionSpec {
        runtime: None,
        ..spec()
    };
    let mut parent = engine.open_session(cold.clone()).await.expect("parent");
    let err = engine
        .checkpoint_session(&mut parent, &cold)
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(err, CheckpointError::Fork(ForkError::NotWarm(_))),
        "{err}"
    );
    assert_eq!(value(&mut parent, "1 + 1").await, "2");
    parent.kill().await;
}

/// The checkpoint and its restores, run again by `nobody`: a rootless node has them too.
#[test]
fn a_rootless_node_checkpoints_its_sessions() {
    sandbox_support::session::rerun_as_nobody(
        "session_checkpoint",
        "FORKBOX_SESSION_ZYGOTE",
        &[],
        &[
            "a_checkpoint_restores_what_the_session_held_when_it_was_taken",
            "a_disks_copy_stops_at_the_sessions_disk_size",
        ],
    );
}
