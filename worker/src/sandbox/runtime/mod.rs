//! Warm runtimes: interpreters initialised once per engine, in the zygote, before any sandbox
//! exists, so that every sandbox inherits the initialised state copy-on-write and a job's
//! program starts without paying the interpreter's start-up.
//!
//! A runtime has three sides, one per process of the sandbox tree:
//! - the **zygote** warms it once (loads and initialises the interpreter, pre-imports its
//!   modules) and reports what it got, never touching a job;
//! - the **engine** decides per job, as a pure function of the job and of what the zygote
//!   reported, whether its command line can run warm ([`python::plan`]), and says why not;
//! - the **launcher**, after every isolation step a cold job gets, hands the plan to the
//!   interpreter instead of calling `execve`.
//!
//! A second interpreter joins as a module beside [`python`] with the same three entry points.

pub mod python;
pub(crate) mod session;
