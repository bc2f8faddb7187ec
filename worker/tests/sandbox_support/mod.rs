//! Helpers shared by the sandbox test binaries: who runs `forkbox` (host root, or `nobody`
//! for the rootless case) and polling.

#![allow(dead_code)]

pub mod escapes;
pub mod session;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Polls `f` every 20 ms until it holds or `deadline` has passed; the last answer.
pub fn wait_until(deadline: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// The `forkbox` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_forkbox");

/// Who runs `forkbox`: host root, or `nobody` through `runuser` (the rootless case).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    Root,
    Unprivileged,
}

pub fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// Whether this is the VM tier's emulated guest (`tests/vm/guest.sh`): root with every
/// capability, every cgroup-v2 controller, and the emulator (TCG, no hardware virtualisation),
/// where the JVM's JIT-compiled code has crashed on its own once in a while.
pub fn emulated_guest() -> bool {
    std::env::var_os("FORKBOX_VM_GUEST").is_some_and(|v| v == "1")
}

/// The wall-clock timeout of a test's job that sets none of its own: the node's default
/// (10 s), and six times it in the emulated guest, where starting Python alone has taken
/// seconds on a loaded host. A test of the timeout itself sets its own and keeps it.
pub fn job_timeout_ms() -> u64 {
    let default = forkbox_queue::schema::DEFAULT_TIMEOUT_MS;
    if emulated_guest() {
        6 * default
    } else {
        default
    }
}

/// `--timeout-ms` with [`job_timeout_ms`] for a `forkbox run` whose options `opts` set no
/// timeout, in the emulated guest; nothing on other hosts (the default applies there).
pub fn timeout_args(opts: &[&str]) -> Vec<String> {
    if emulated_guest() && !opts.contains(&"--timeout-ms") {
        vec!["--timeout-ms".into(), job_timeout_ms().to_string()]
    } else {
        Vec::new()
    }
}

/// How long a test waits for a job's program to appear: 20 s, and six times that in the
/// emulated guest.
pub fn start_deadline() -> Duration {
    Duration::from_secs(if emulated_guest() { 120 } else { 20 })
}

/// The network the sandboxes of these suites get unless a test asks for one: the node's
/// default (`none`), or `FORKBOX_NETWORK_DEFAULT` (which `forkbox` reads too), so that the
/// isolation suites run in either mode.
pub fn network_default() -> forkbox_queue::Network {
    match std::env::var("FORKBOX_NETWORK_DEFAULT") {
        Ok(v) => v.parse().expect("FORKBOX_NETWORK_DEFAULT"),
        Err(_) => forkbox_queue::Network::default(),
    }
}

/// The errno of a TCP connection to the host's Redis port from inside a sandbox of
/// `network`: refused in a namespace of its own, never made without one.
pub fn host_tcp_errno(network: forkbox_queue::Network) -> i32 {
    match network {
        forkbox_queue::Network::None => libc::EAFNOSUPPORT,
        forkbox_queue::Network::Loopback => libc::ECONNREFUSED,
    }
}

/// The identities this host lets us test; the root variant is skipped, and says so, when the
/// tests do not run as root.
pub fn identities() -> Vec<Identity> {
    if is_root() {
        vec![Identity::Root, Identity::Unprivileged]
    } else {
        forkbox_testkit::skipped(format!(
            "root variant (tests run as uid {})",
            nix::unistd::Uid::effective()
        ));
        vec![Identity::Unprivileged]
    }
}

/// The binary where `nobody` can reach it: a checkout under a private home directory is not
/// traversable by other users, so it is copied to a world-readable place once.
pub fn unprivileged_bin() -> &'static Path {
    static COPY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        let reachable = Command::new("runuser")
            .args(["-u", "nobody", "--", "test", "-x", BIN])
            .status();
        if reachable.is_ok_and(|s| s.success()) {
            return PathBuf::from(BIN);
        }
        let dir = std::env::temp_dir().join(format!("forkbox-test-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join("forkbox");
        std::fs::copy(BIN, &copy).unwrap();
        for p in [&dir, &copy] {
            std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
        copy
    })
}

/// The program and leading arguments that run `forkbox` as `who`.
pub fn forkbox_argv(who: Identity) -> Vec<String> {
    match (who, is_root()) {
        (Identity::Unprivileged, true) => vec![
            "runuser".into(),
            "-u".into(),
            "nobody".into(),
            "--".into(),
            unprivileged_bin().to_string_lossy().into_owned(),
        ],
        _ => vec![BIN.into()],
    }
}

/// `forkbox` as `who`, ready for its arguments.
pub fn forkbox(who: Identity) -> Command {
    let argv = forkbox_argv(who);
    let mut c = Command::new(&argv[0]);
    c.args(&argv[1..]);
    c
}
