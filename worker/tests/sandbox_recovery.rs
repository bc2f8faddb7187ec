//! The engine hands each job straight to a ready launcher the zygote gave it. A launcher that
//! died while it waited must cost no job: the engine sees its channel closed and takes the
//! next sandbox, or has the zygote build one.
//!
//! A test binary of its own: it kills every launcher of the one engine in this process.

mod sandbox_support;

use std::time::Duration;

use forkbox::sandbox::{Engine, EngineConfig};
use forkbox_queue::schema::{Job, Status};
use nix::sys::signal::Signal;
use sandbox_support::wait_until;

const BIN: &str = env!("CARGO_BIN_EXE_forkbox");

/// Children of every thread of `pid`.
fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// The zygote of this process's engine.
fn zygote() -> i32 {
    children(std::process::id() as i32)
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("__zygote"))
        })
        .expect("the engine runs a zygote")
}

/// The launchers: the children of the sandbox inits, which are the children of the zygote.
fn launchers() -> Vec<i32> {
    children(zygote()).into_iter().flat_map(children).collect()
}

fn signal(pid: i32, sig: Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).unwrap();
}

/// Blocked receiving its job: it has told the zygote it is ready.
fn is_waiting(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/wchan"))
        .is_ok_and(|w| w.contains("wait_for_more_packets"))
}

/// Dead: gone, or a zombie (its descriptors are closed either way).
fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launchers_killed_while_ready_cost_no_job() {
    let engine = tokio::task::spawn_blocking(|| {
        Engine::start(EngineConfig {
            zygote_exe: BIN.into(),
            slots: 2,
            ..EngineConfig::default()
        })
    })
    .await
    .unwrap()
    .expect("engine");
    let warm = engine.run(&Job::shell("echo warm")).await;
    assert_eq!(warm.stdout, "warm\n", "{:?}", warm.error);

    // Round 0 as it happens. In round 1 the zygote is stopped meanwhile, so the engine cannot
    // learn that its launchers are gone before it tries them with a job.
    for round in 0..2 {
        // The whole pool (slots + 1) is built and waiting for jobs. (Killing a sandbox still
        // being built would count as a failed build, which fails a job with the reason.)
        assert!(
            wait_until(Duration::from_secs(20), || {
                let l = launchers();
                l.len() >= 3 && l.iter().all(|p| is_waiting(*p))
            }),
            "round {round}: the pool was not rebuilt: {:?}",
            launchers()
        );
        // Their ready messages are read by the zygote as soon as it is scheduled.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let killed = launchers();
        let zygote = zygote();
        if round == 1 {
            signal(zygote, Signal::SIGSTOP);
        }
        for pid in &killed {
            signal(*pid, Signal::SIGKILL);
        }
        assert!(
            wait_until(Duration::from_secs(10), || killed
                .iter()
                .all(|p| is_dead(*p))),
            "round {round}: killed launchers still alive"
        );
        for i in 0..4 {
            let job = Job::shell(format!("echo {round}-{i}"));
            let run = tokio::spawn({
                let engine = engine.clone();
                async move { engine.run(&job).await }
            });
            if round == 1 && i == 0 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                signal(zygote, Signal::SIGCONT);
            }
            let out = run.await.unwrap();
            assert_eq!(
                (out.status, out.stdout.as_str()),
                (Status::Ok, format!("{round}-{i}\n").as_str()),
                "round {round}, job {i}: {:?}",
                out.error
            );
        }
    }
}
