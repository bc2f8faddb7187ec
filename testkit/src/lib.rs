//! Forkbox's test harness, shared by the test suites of every crate and never shipped.
//!
//! - [`skip::skipped`]: how a test reports what it could not run here, so that a skip is
//!   counted and never a silent pass;
//! - [`RedisCluster`]: a private Redis Cluster with primaries and replicas, and failovers on
//!   demand;
//! - [`certs::TestCerts`] and [`certs::tls_server`]: a CA, server and client certificates made
//!   on the spot, and a `redis-server` that speaks TLS only.
//!
//! The private [`RedisServer`] itself lives in `forkbox-private-redis`, since `forkbox up` and
//! the load generator run one too; it is re-exported here so a test names one crate.

#![forbid(unsafe_code)]

pub mod certs;
pub mod redis_cluster;
pub mod skip;

pub use certs::{tls_server, TestCerts, TestCertsError};
pub use forkbox_private_redis::{
    parse_nodes, random_password, NodeView, RedisServer, RedisServerError, RedisServerOptions,
    ServerTls, SLOTS,
};
pub use redis_cluster::{RedisCluster, RedisClusterError};
pub use skip::skipped;
