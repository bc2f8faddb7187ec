//! The client side of `forkbox daemon`'s socket, for `forkbox run`: a one-shot job goes to a
//! running daemon of the same user, whose warm zygote spawns it, instead of starting a zygote
//! of its own.
//!
//! Before anything is sent, the server's identity is checked (`SO_PEERCRED`): a socket at the
//! expected path served by another user (one who got there first, in a shared directory such
//! as /tmp) is refused, never handed the job and its files.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::{bail, Context};
use forkbox_queue::schema::{Job, JobResult};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

/// Whether a server of uid `server` may be sent our jobs: our own daemon, root's, or that of
/// the user `$FORKBOX_DAEMON_USER` names (`named`: the owner of a daemon shared with
/// `forkbox daemon --group`), as the Python SDK decides.
pub fn trusted_server(server: u32, us: u32, named: Option<u32>) -> bool {
    server == us || server == 0 || named == Some(server)
}

/// The uid `$FORKBOX_DAEMON_USER` names (a user name or a uid), if it is set.
fn named_daemon_user() -> anyhow::Result<Option<u32>> {
    let Some(named) = std::env::var("FORKBOX_DAEMON_USER")
        .ok()
        .filter(|n| !n.is_empty())
    else {
        return Ok(None);
    };
    if let Ok(uid) = named.parse::<u32>() {
        return Ok(Some(uid));
    }
    match nix::unistd::User::from_name(&named) {
        Ok(Some(user)) => Ok(Some(user.uid.as_raw())),
        _ => bail!("FORKBOX_DAEMON_USER={named}: no such user"),
    }
}

/// Connects to the daemon at `path` and checks who serves it; `None` when nothing listens
/// there (no daemon: run locally), an error when someone else does.
pub fn connect(path: &Path) -> anyhow::Result<Option<UnixStream>> {
    let stream = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(_) => return Ok(None),
    };
    let server = getsockopt(&stream, PeerCredentials)
        .with_context(|| format!("{}: who serves it (SO_PEERCRED)", path.display()))?
        .uid();
    let us = nix::unistd::geteuid().as_raw();
    if !trusted_server(server, us, named_daemon_user()?) {
        bail!(
            "{} is served by uid {server}, neither this user (uid {us}) nor root: refusing to \
             send it a job (run with --no-daemon, or remove the socket)",
            path.display()
        );
    }
    Ok(Some(stream))
}

/// Runs `job` on the daemon behind `stream` and returns its result.
pub fn run(stream: UnixStream, job: &Job) -> anyhow::Result<JobResult> {
    let mut line = serde_json::to_vec(job).context("encoding the job")?;
    line.push(b'\n');
    (&stream)
        .write_all(&line)
        .context("sending the job to the daemon")?;
    let mut reader = BufReader::new(&stream);
    let mut reply = String::new();
    // The result is the last line for the request (no events: nothing asked to stream).
    loop {
        reply.clear();
        if reader
            .read_line(&mut reply)
            .context("reading the daemon's answer")?
            == 0
        {
            bail!("the daemon closed the connection before answering");
        }
        let value: serde_json::Value =
            serde_json::from_str(&reply).context("the daemon's answer is not JSON")?;
        if value.get("event").is_none() {
            return serde_json::from_value(value).context("the daemon's answer is not a result");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_own_or_roots_daemon_is_trusted() {
        assert!(trusted_server(1000, 1000, None));
        assert!(trusted_server(0, 1000, None));
        assert!(trusted_server(0, 0, None));
        assert!(!trusted_server(1001, 1000, None));
        assert!(!trusted_server(1000, 0, None));
        assert!(trusted_server(1001, 1000, Some(1001)));
        assert!(!trusted_server(1002, 1000, Some(1001)));
    }
}
