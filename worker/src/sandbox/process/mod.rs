//! The processes of the sandbox tree, one file each, and what passes between them:
//! - `zygote`: exec'd once by the engine, builds sandboxes ahead of demand and hands them jobs;
//!   its `watchdog` enforces each job's wall-clock limit;
//! - `init`: pid 1 of each sandbox, which sets it up, reaps and reports;
//! - `launcher`: the init's child that takes the last steps and becomes the program;
//! - `wire`: the typed messages between the engine, the zygote and each init;
//! - `identity`: the user namespaces and their id maps, one step on each side of a boundary;
//! - `twin`: the copy that makes a fresh sandbox's process a copy of a frozen one (a session's
//!   fork), run by the node from outside both sandboxes;
//! - `copy_cost`: a measurement of what an init pays for inheriting the warm interpreter
//!   (`forkbox-bench init-copy`), part of no sandbox.
//!
//! Each process's set-up is a linear list of the steps in `isolate`; nothing here imports from
//! `engine`.

pub(crate) mod copy_cost;
pub(crate) mod identity;
pub(crate) mod init;
pub(crate) mod launcher;
pub(crate) mod priority;
pub(crate) mod stage;
pub(crate) mod twin;
pub(crate) mod watchdog;
pub(crate) mod wire;
pub(crate) mod zygote;
