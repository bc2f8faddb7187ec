//! What `CLUSTER NODES` says of a Redis Cluster: each node's port, role, health and slots.
//!
//! The load generator reads it to find the primary to kill in a failover run, and the test
//! harness's cluster to wait for a failover.

/// Slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// One row of `CLUSTER NODES` as a live node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub id: String,
    pub port: u16,
    pub primary: bool,
    pub failed: bool,
    /// Slot ranges served (primaries only), inclusive.
    pub slots: Vec<(u16, u16)>,
}

impl NodeView {
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

/// Parses `CLUSTER NODES`: `<id> <ip:port@bus> <flags> <primary> <ping> <pong> <epoch> <link>
/// <slot>...`, where a slot is `n`, `a-b`, or a `[...]` migration mark (ignored).
pub fn parse_nodes(text: &str) -> Vec<NodeView> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let flags: Vec<&str> = f[2].split(',').collect();
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|a| (a, a)),
                })
                .collect();
            Some(NodeView {
                id: f[0].to_owned(),
                port,
                primary: flags.contains(&"master"),
                failed: flags.contains(&"fail") || flags.contains(&"fail?"),
                slots,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_rows_parse() {
        let text = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [5461->-b2]
b2 127.0.0.1:7001@17001 master,fail - 0 0 2 disconnected
c3 127.0.0.1:7002@17002 slave a1 0 0 1 connected
d4 127.0.0.1:7003@17003 master - 0 0 3 connected 5461 5462-10922
";
        let v = parse_nodes(text);
        assert_eq!(v.len(), 4);
        assert_eq!(v[0].port, 7000);
        assert!(v[0].primary && !v[0].failed && v[0].serves(5460) && !v[0].serves(5461));
        assert!(v[1].primary && v[1].failed && v[1].slots.is_empty());
        assert!(!v[2].primary);
        assert_eq!(v[3].slots, vec![(5461, 5461), (5462, 10922)]);
    }
}
