//! `forkbox run` sends its job to a running `forkbox daemon` of the same user (or root's), and
//! only to one: `--no-daemon`, or no daemon, runs it in a zygote of its own, and a socket
//! served by another user is refused before anything is sent.

mod sandbox_support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use sandbox_support::{is_root, wait_until, BIN};

fn run(socket: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["run", "--socket", socket.to_str().unwrap()])
        .args(args)
        .env_remove("FORKBOX_SOCKET")
        .stdin(Stdio::null())
        .output()
        .expect("spawning forkbox")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn run_uses_a_running_daemon_unless_told_not_to() {
    // The daemon exposes a directory a run of its own would not: where the job ran shows.
    let exposed = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(exposed.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let marker = exposed.path().join("marker");
    std::fs::write(&marker, "in the daemon's root\n").unwrap();
    std::fs::set_permissions(&marker, std::fs::Permissions::from_mode(0o644)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("forkbox.sock");
    let _daemon = Killed(
        Command::new(BIN)
            .args([
                "daemon",
                "--slots",
                "1",
                "--socket",
                socket.to_str().unwrap(),
            ])
            .args(["--allow", exposed.path().to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_until(Duration::from_secs(60), || socket.exists()),
        "the daemon's socket"
    );
    let job = format!("cat {}", marker.display());
    let out = run(&socket, &["-c", &job]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "in the daemon's root\n");
    // Its exit code and --json pass through as from a run of its own.
    let out = run(&socket, &["--json", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome["status"], "failed");

    let out = run(&socket, &["--no-daemon", "-c", &job]);
    assert!(!out.status.success(), "--no-daemon ran in the daemon");
    // No daemon there: the run starts its own zygote.
    let out = run(&dir.path().join("nothing.sock"), &["-c", "echo alone"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "alone\n");
}

#[test]
fn a_socket_served_by_another_user_is_refused() {
    if !is_root() {
        forkbox_testkit::skipped("serving a socket as another user needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = dir.path().join("forkbox.sock");
    let script = format!(
        "import socket, time\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.bind({:?})\n\
         s.listen(8)\n\
         while True:\n\
         \x20   c, _ = s.accept()\n\
         \x20   print(c.recv(1 << 20), flush=True)\n",
        socket.to_str().unwrap()
    );
    // As `nobody`, directly (a `runuser` between would leave it running when killed).
    let server = Killed(
        Command::new("python3")
            .args(["-c", &script])
            .uid(65534)
            .gid(65534)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_until(Duration::from_secs(10), || socket.exists()));
    let out = run(&socket, &["-c", "echo secret"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("is served by uid 65534") && err.contains("refusing"),
        "{err}"
    );
    drop(server);
}
