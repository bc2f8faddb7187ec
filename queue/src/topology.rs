//! The nodes of a Redis Cluster as a client learns them, so that it can reconnect through any.
//!
//! A cluster client is given seed URLs, often one (a managed service's endpoint, the node a
//! user wrote down). redis-rs's cluster client opens every new connection, and reconnects once
//! it has lost all of its nodes, through its seeds only: with the one seed's node dead, no
//! new connection opens, even though its replica has taken over. So before any client is
//! built, [`learn`] asks the seeds for the whole cluster (`CLUSTER NODES`) and returns the
//! seeds followed by every other node, each as a URL in the seed's form (its scheme, user,
//! password and options, with the node's address): every later connection, blocking read and
//! subscription starts from that list, and any node of it that is alive will do.

use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::link::{connection_config, CONNECT_TIMEOUT};
use crate::RedisTls;

/// How long asking one seed for the cluster's nodes may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// `seeds` followed by every other node the first seed that answers `CLUSTER NODES` names
/// (see the module docs). When no seed answers, or none is a cluster node, the seeds alone:
/// the cluster client then reports the failure by name.
pub async fn learn(seeds: &[String], tls: &RedisTls) -> Vec<String> {
    for seed in seeds {
        if let Some(text) = cluster_nodes(seed, tls).await {
            return known_nodes(seeds, &node_addrs(&text));
        }
    }
    seeds.to_vec()
}

async fn cluster_nodes(seed: &str, tls: &RedisTls) -> Option<String> {
    let client = crate::connect::redis_client(seed, tls).ok()?;
    let config = connection_config(Some(ASK_TIMEOUT)).set_connection_timeout(CONNECT_TIMEOUT);
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .ok()?;
    let v = conn
        .req_packed_command(redis::cmd("CLUSTER").arg("NODES"))
        .await
        .ok()?;
    redis::from_owned_redis_value(v).ok()
}

/// The `host:port` of every node in a `CLUSTER NODES` reply that has an address (not one
/// still in handshake or without one). A node that lists itself without an IP (a cluster of
/// one before it met the others) is left out: the seed that answered is in the list already.
pub fn node_addrs(text: &str) -> Vec<(String, u16)> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (addr, flags) = (f.get(1)?, f.get(2)?);
            if flags
                .split(',')
                .any(|fl| fl == "noaddr" || fl == "handshake")
            {
                return None;
            }
            // ip:port@cport[,hostname]
            let addr = addr.split(['@', ',']).next()?;
            let (host, port) = addr.rsplit_once(':')?;
            let port: u16 = port.parse().ok()?;
            (!host.is_empty() && port != 0).then(|| (host.to_owned(), port))
        })
        .collect()
}

/// `seeds`, then a URL for each node of `nodes` no seed names, in the first seed's form.
pub fn known_nodes(seeds: &[String], nodes: &[(String, u16)]) -> Vec<String> {
    let mut out = seeds.to_vec();
    let Some(first) = seeds.first() else {
        return out;
    };
    let mut seen: Vec<Option<(String, u16)>> = seeds.iter().map(|s| addr_of(s)).collect();
    for (host, port) in nodes {
        let key = Some((host.clone(), *port));
        if !seen.contains(&key) {
            out.push(with_addr(first, host, *port));
            seen.push(key);
        }
    }
    out
}

/// Where a URL's authority starts and ends (after `scheme://` and any `user:password@`).
fn host_span(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://")? + 3;
    let rest = &url[start..];
    let end = start + rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let host_start = url[start..end]
        .rfind('@')
        .map_or(start, |at| start + at + 1);
    Some((host_start, end))
}

/// The `host:port` a `redis://` URL names (6379 when it names no port).
fn addr_of(url: &str) -> Option<(String, u16)> {
    let (a, b) = host_span(url)?;
    let hostport = &url[a..b];
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(':') && p.chars().all(|c| c.is_ascii_digit()) => {
            (h, p.parse().ok()?)
        }
        _ => (hostport, 6379),
    };
    Some((host.trim_matches(['[', ']']).to_owned(), port))
}

/// `url` with its host and port replaced by `host:port`: the same scheme, credentials, path
/// and options.
fn with_addr(url: &str, host: &str, port: u16) -> String {
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    match host_span(url) {
        Some((a, b)) => format!("{}{host}:{port}{}", &url[..a], &url[b..]),
        None => format!("redis://{host}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_addressed_node_of_a_cluster_nodes_reply_is_read() {
        let text = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 10.0.0.2:7001@17001,node-b master,fail - 0 0 2 disconnected
c3 127.0.0.1:7002@17002 slave a1 0 0 1 connected
d4 :0@0 master,noaddr - 0 0 3 disconnected
e5 127.0.0.1:7004@17004 handshake - 0 0 0 connected
f6 ::1:7005@17005 slave a1 0 0 1 connected
";
        assert_eq!(
            node_addrs(text),
            [
                ("127.0.0.1".to_owned(), 7000),
                ("10.0.0.2".to_owned(), 7001),
                ("127.0.0.1".to_owned(), 7002),
                ("::1".to_owned(), 7005),
            ]
        );
    }

    #[test]
    fn learnt_nodes_follow_the_seeds_in_the_first_seeds_form() {
        let nodes = [
            ("127.0.0.1".to_owned(), 7000),
            ("127.0.0.1".to_owned(), 7001),
            ("::1".to_owned(), 7002),
        ];
        let table: &[(&[&str], &[&str])] = &[
            (
                &["redis://127.0.0.1:7000"],
                &[
                    "redis://127.0.0.1:7000",
                    "redis://127.0.0.1:7001",
                    "redis://[::1]:7002",
                ],
            ),
            (
                &["rediss://u:p%40ss@127.0.0.1:7001/#insecure"],
                &[
                    "rediss://u:p%40ss@127.0.0.1:7001/#insecure",
                    "rediss://u:p%40ss@127.0.0.1:7000/#insecure",
                    "rediss://u:p%40ss@[::1]:7002/#insecure",
                ],
            ),
        ];
        for (seeds, want) in table {
            let seeds: Vec<String> = seeds.iter().map(|s| s.to_string()).collect();
            assert_eq!(known_nodes(&seeds, &nodes), *want, "{seeds:?}");
        }
        // A seed naming a node by another name is kept; every node is added by address.
        let seeds = vec!["redis://localhost:7000".to_owned()];
        assert_eq!(
            known_nodes(&seeds, &nodes),
            [
                "redis://localhost:7000",
                "redis://127.0.0.1:7000",
                "redis://127.0.0.1:7001",
                "redis://[::1]:7002",
            ]
        );
        assert_eq!(
            addr_of("redis://h"),
            Some(("h".to_owned(), 6379)),
            "the default port"
        );
        assert_eq!(known_nodes(&[], &nodes), Vec::<String>::new());
    }
}
