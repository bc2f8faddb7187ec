//! Exposing host directories: `--allow` adds to the default allowlist (a job keeps /bin/sh),
//! `--allow-only` replaces it, and a directory the sandboxes cannot reach (under a 0700
//! directory of host root, as `/root` is, with the node started as root) is refused with the
//! reason and what to do, not a bare EACCES.

mod sandbox_support;

use std::os::unix::fs::PermissionsExt;
use std::process::{Output, Stdio};

use sandbox_support::{forkbox, identities, is_root, Identity};

fn run(who: Identity, args: &[&str]) -> Output {
    forkbox(who)
        .arg("run")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawning forkbox")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn allow_adds_to_the_default_allowlist_and_allow_only_replaces_it() {
    // Not under /tmp, which is the job's own disk inside.
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.path().join("tool"), "from the host\n").unwrap();
    std::fs::set_permissions(
        dir.path().join("tool"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let d = dir.path().to_str().unwrap();
    for who in identities() {
        let out = run(who, &["--allow", d, "-c", &format!("cat {d}/tool")]);
        assert!(
            out.status.success(),
            "{who:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        assert_eq!(text(&out.stdout), "from the host\n", "{who:?}");
        // Only what is listed: no shell.
        let out = run(who, &["--allow-only", d, "-c", "true"]);
        assert!(!out.status.success(), "{who:?}: ran without /bin/sh");
        let out = run(who, &["--allow-only", d, "--", "/bin/true"]);
        assert!(!out.status.success(), "{who:?}: /bin was exposed");
    }
}

#[test]
fn a_directory_the_sandboxes_cannot_reach_is_refused_with_the_reason() {
    if !is_root() {
        forkbox_testkit::skipped("the node runs as root only when the tests do");
        return;
    }
    // A private directory of host root, as /root is.
    let private = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let tool = private.path().join("toolchain");
    std::fs::create_dir(&tool).unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = run(
        Identity::Root,
        &["--allow", tool.to_str().unwrap(), "-c", "true"],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    let above = private.path().display().to_string();
    for needle in [
        "runs its sandboxes as host uid 100000",
        &format!("and {above} (mode 0700, owner uid 0)"),
        &format!("chmod o+x {above}"),
        "mount --bind",
    ] {
        assert!(err.contains(needle), "{needle:?} not in: {err}");
    }
}
