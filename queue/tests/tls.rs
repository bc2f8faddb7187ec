//! `rediss://` against a real redis-server that speaks TLS only, with certificates made here:
//! a CA file, mutual TLS, a wrong CA, and a cluster whose bus and clients speak TLS.

use std::time::Duration;

use forkbox_queue::{Broker, Endpoint, Job, QueueConfig, RedisTls};
use forkbox_testkit::{tls_server, RedisCluster, TestCerts};

/// Enqueues a job and reads it back: the whole path of a worker's reads and a client's writes.
async fn round_trip(broker: &Broker, queue: &str) {
    let q = broker.queue(queue, QueueConfig::default()).unwrap();
    q.ensure_group().await.unwrap();
    let job: Job = serde_json::from_str(r#"{"id":"tls-1","cmd":"true"}"#).unwrap();
    q.enqueue(&job).await.unwrap();
    let got = q.read("c1", 1, 1000).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, "tls-1");
}

#[tokio::test]
async fn rediss_with_the_ca_file_carries_the_queue() {
    let Some(certs) = TestCerts::or_skip() else {
        return;
    };
    let server = tls_server(&certs, false);
    assert!(server.url().starts_with("rediss://"), "{}", server.url());
    let tls = RedisTls {
        ca: Some(certs.ca()),
        ..RedisTls::default()
    };
    let broker = Broker::connect_with(&server.url(), &tls).await.unwrap();
    round_trip(&broker, "tls-ca").await;

    // The same server is not reachable in clear text, and its certificate does not chain to
    // the system's roots.
    let plain = server.url().replacen("rediss://", "redis://", 1);
    assert!(Broker::connect(&plain).await.is_err());
    let e = Broker::connect(&server.url()).await.unwrap_err();
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
}

#[tokio::test]
async fn a_wrong_ca_is_refused_naming_the_certificate() {
    let Some(certs) = TestCerts::or_skip() else {
        return;
    };
    let server = tls_server(&certs, false);
    let tls = RedisTls {
        ca: Some(certs.other_ca()),
        ..RedisTls::default()
    };
    let e = Broker::connect_with(&server.url(), &tls).await.unwrap_err();
    let text = format!("{e:#}");
    assert!(
        text.contains("UnknownIssuer") || text.contains("certificate"),
        "{text}"
    );
    assert!(
        forkbox_queue::connect::is_tls_error(e.redis_error().unwrap()),
        "{text}"
    );
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let Some(certs) = TestCerts::or_skip() else {
        return;
    };
    let server = tls_server(&certs, true);
    let ca_only = RedisTls {
        ca: Some(certs.ca()),
        ..RedisTls::default()
    };
    // Without a client certificate the server drops the handshake (the error may surface on
    // the first command rather than at connect).
    let refused = async {
        let b = Broker::connect_with(&server.url(), &ca_only).await?;
        let q = b.queue("tls-mtls", QueueConfig::default())?;
        q.ensure_group().await
    };
    assert!(
        refused.await.is_err(),
        "a client without a certificate got in"
    );
    let mutual = RedisTls {
        ca: Some(certs.ca()),
        cert: Some(certs.client_cert()),
        key: Some(certs.client_key()),
    };
    let broker = Broker::connect_with(&server.url(), &mutual).await.unwrap();
    round_trip(&broker, "tls-mtls").await;
}

#[tokio::test]
async fn insecure_fragment_skips_verification() {
    let Some(certs) = TestCerts::or_skip() else {
        return;
    };
    let server = tls_server(&certs, false);
    let url = format!("{}#insecure", server.url());
    let broker = Broker::connect(&url).await.unwrap();
    round_trip(&broker, "tls-insecure").await;
}

#[tokio::test]
async fn a_cluster_speaks_tls_on_its_bus_and_to_clients() {
    let Some(certs) = TestCerts::or_skip() else {
        return;
    };
    let cluster = match RedisCluster::start_tls(3, 0, certs.server_tls(false)) {
        Ok(c) => c,
        Err(e) => panic!("a TLS cluster: {e}"),
    };
    let seeds = cluster.urls();
    assert!(
        seeds.iter().all(|u| u.starts_with("rediss://")),
        "{seeds:?}"
    );
    let client_tls = RedisTls {
        ca: Some(certs.ca()),
        ..RedisTls::default()
    };
    let broker = Broker::connect_to_with(&Endpoint::Cluster(seeds), &client_tls)
        .await
        .unwrap();
    assert!(broker.is_cluster());
    round_trip(&broker, "tls-cluster").await;
    // Cancellations follow over TLS too: the watcher subscribes through a seed.
    let q = broker.queue("tls-cluster", QueueConfig::default()).unwrap();
    let mut watcher = q.watch_cancellations();
    tokio::time::sleep(Duration::from_millis(300)).await;
    q.cancel("tls-1").await.unwrap();
    let heard = async {
        loop {
            match watcher.next().await {
                Ok(forkbox_queue::CancelEvent::Cancelled(id)) => return id,
                Ok(forkbox_queue::CancelEvent::Resynced(ids)) if ids.contains(&"tls-1".into()) => {
                    return "tls-1".to_owned()
                }
                Ok(_) => {}
                Err(e) => panic!("following cancellations over TLS: {e}"),
            }
        }
    };
    let id = tokio::time::timeout(Duration::from_secs(10), heard)
        .await
        .expect("a cancellation within 10 s");
    assert_eq!(id, "tls-1");
}
