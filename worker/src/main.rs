//! The `forkbox` command line.

use std::process::ExitCode;

use clap::Parser;

mod cmd;

fn main() -> ExitCode {
    // The zygote must stay single-threaded: dispatch to it before anything starts a thread.
    if std::env::args_os().nth(1).is_some_and(|a| a == "__zygote") {
        forkbox::sandbox::zygote_main();
    }
    let cli = cmd::Cli::parse();
    cmd::main(cli)
}
