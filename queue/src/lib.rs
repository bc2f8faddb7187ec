//! The Forkbox wire protocol.
//!
//! This crate is the contract between any Redis client and the worker nodes: the v1 job and
//! result JSON schemas ([`schema`]), the Redis key layout, and the queue operations. It holds no
//! sandbox code, so clients and tools can depend on it without pulling in the engine.

#![forbid(unsafe_code)]

pub mod schema;

pub use schema::{EffectiveLimits, FileData, Job, JobError, JobResult, Limits, Outcome, Status};
