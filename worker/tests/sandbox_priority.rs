//! A node started at a lowered priority (`nice`, systemd's `Nice=`) runs its jobs, and they
//! run at the node's priority: never better, whatever the zygote could raise itself to.

mod sandbox_support;

use std::process::Stdio;

use sandbox_support::{forkbox_argv, identities};

#[test]
fn a_niced_node_runs_its_jobs_at_its_own_priority() {
    for who in identities() {
        let mut argv = vec!["nice".to_owned(), "-n".into(), "7".into()];
        argv.extend(forkbox_argv(who));
        argv.extend(["run", "--no-daemon", "--", "nice"].map(String::from));
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .output()
            .expect("spawning forkbox under nice");
        assert_eq!(
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned()
            ),
            (Some(0), "7\n".to_owned()),
            "{who:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
