//! What an engine gives a sandbox when its configuration or the job says nothing.

/// The job's working directory inside every sandbox (also its `HOME`).
pub const DEFAULT_WORK_DIR: &str = "/work";
/// Host directories exposed by default (those that exist).
pub const DEFAULT_ALLOWLIST: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];
/// `PATH` inside the sandbox unless the job sets one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Host uid (and gid) that the sandbox's root maps to when the node runs as host root.
pub const DEFAULT_ROOT_MAPPED_ID: u32 = 100_000;
