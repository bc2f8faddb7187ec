//! A private `redis-server`: started on a free loopback port, password-protected, owned and
//! killed by the process that started it.
//!
//! It is not part of the wire protocol (`forkbox-queue`), yet products run it: `forkbox up
//! --own-redis` serves its node and sample jobs from one, and the load generator starts one
//! when no `--redis` is given. The test harness (`forkbox-testkit`) builds its clusters and
//! TLS servers on it. [`cluster_view`] reads what `CLUSTER NODES` says, which the load
//! generator's failover runs and the harness's cluster both need.

#![forbid(unsafe_code)]

pub mod cluster_view;
pub mod server;

pub use cluster_view::{parse_nodes, NodeView, SLOTS};
pub use server::{random_password, RedisServer, RedisServerError, RedisServerOptions, ServerTls};
