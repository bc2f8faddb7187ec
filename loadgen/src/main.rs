//! `forkbox-loadgen`: drives a Forkbox cluster and reports throughput and latency.
//!
//! Exit status: 0 when every job got exactly one result, 1 when a job was lost or duplicated
//! or the run failed, 130 when interrupted. The first Ctrl-C (or SIGTERM) stops sending and
//! writes a partial report; the second abandons the run without one, and the guards still kill
//! the workers and remove the simulated hosts on the way out.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use forkbox_loadgen::cli::Args;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = Args::parse();
    if let Some(warning) = args.take_deprecated_redis_env(std::env::var("FORKBOX_REDIS").ok()) {
        eprintln!("forkbox-loadgen: warning: {warning}");
    }
    if args.cleanup {
        return cleanup();
    }
    if let Some(url) = args.gateway.clone() {
        let c = forkbox_loadgen::gateway::Compare {
            url,
            pid: args.gateway_pid,
            redis: args.redis.clone().unwrap_or_default(),
            queue: args.queue.clone(),
            jobs: args.jobs.unwrap_or(2000) as usize,
            concurrency: args.concurrency.unwrap_or(2),
        };
        return match forkbox_loadgen::gateway::compare(&c).await {
            Ok(r) => {
                print!("{}", r.table());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("forkbox-loadgen: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    let (cancel_tx, cancel_rx) = watch::channel(false);
    let (abort_tx, mut abort_rx) = watch::channel(false);
    tokio::spawn(async move {
        let Ok(mut term) = signal(SignalKind::terminate()) else {
            return;
        };
        let mut count = 0;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            count += 1;
            if count == 1 {
                eprintln!("forkbox-loadgen: interrupted; finishing with a partial report (again to abort)");
                let _ = cancel_tx.send(true);
            } else {
                let _ = abort_tx.send(true);
            }
        }
    });
    let result = tokio::select! {
        r = forkbox_loadgen::run::run(args, cancel_rx) => r,
        _ = abort_rx.changed() => Err(anyhow::anyhow!("aborted")),
    };
    match result {
        Ok(report) => {
            println!("{}", report.summary_table());
            if report.interrupted {
                eprintln!("forkbox-loadgen: the run was interrupted");
                ExitCode::from(130)
            } else if !report.ok {
                eprintln!(
                    "forkbox-loadgen: FAILED: {} lost, {} duplicated{}",
                    report.lost,
                    report.duplicated,
                    if report.completed == 0 && report.lost > 0 {
                        " (no job got a result: is a worker serving this queue on this Redis?)"
                    } else {
                        ""
                    }
                );
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        // Abandoned at the second Ctrl-C: interrupted too, with no report.
        Err(_) if *abort_rx.borrow() => {
            eprintln!("forkbox-loadgen: aborted; no report written");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("forkbox-loadgen: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// `--cleanup`: 0 when nothing is left of load generators that are gone.
fn cleanup() -> ExitCode {
    let swept = forkbox_loadgen::orphans::sweep(&mut forkbox_loadgen::netns::SystemIp);
    match swept.summary() {
        Some(line) => eprintln!("forkbox-loadgen: {line}"),
        None => eprintln!("forkbox-loadgen: nothing left behind by earlier runs"),
    }
    if swept.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
