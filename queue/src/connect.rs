//! How a Redis URL and the TLS settings become a redis-rs client.
//!
//! Every connection the project opens (a broker's, the cancellation follower's, the command
//! line's probes, the load generator's) is built here, so that `rediss://`, a CA file, a client
//! certificate and a password in the URL mean the same thing everywhere. A `rediss://` URL
//! verifies the server against the system's roots, or against [`RedisTls::ca`] alone when it
//! is set; `rediss://HOST:PORT/#insecure` skips verification and is for tests only.
//! [`RedisTls::cert`] and [`RedisTls::key`] add a client certificate (mutual TLS). TLS
//! settings given with a `redis://` URL are refused rather than ignored: whoever set them
//! meant the traffic to be encrypted.

use std::path::{Path, PathBuf};

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::{Client, ClientTlsConfig, ConnectionAddr, IntoConnectionInfo, TlsCertificates};

/// The TLS settings of a `rediss://` connection; all empty: the system's roots, no client
/// certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// PEM file of the certificate authorities that sign the server's certificate, trusted
    /// instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// PEM file of the client certificate chain (mutual TLS); needs [`RedisTls::key`].
    pub cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key; needs [`RedisTls::cert`].
    pub key: Option<PathBuf>,
}

impl RedisTls {
    /// Whether any setting is given.
    pub fn is_set(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }

    /// The certificates to hand redis-rs, read from their files.
    fn certificates(&self) -> Result<TlsCertificates, ConnectError> {
        let client_tls = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some(ClientTlsConfig {
                client_cert: read("--redis-cert", cert)?,
                client_key: read("--redis-key", key)?,
            }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConnectError::HalfClientCert {
                    missing: "--redis-key",
                })
            }
            (None, Some(_)) => {
                return Err(ConnectError::HalfClientCert {
                    missing: "--redis-cert",
                })
            }
        };
        let root_cert = match &self.ca {
            Some(ca) => Some(read("--redis-ca", ca)?),
            None => None,
        };
        Ok(TlsCertificates {
            client_tls,
            root_cert,
        })
    }
}

fn read(setting: &'static str, path: &Path) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path).map_err(|source| ConnectError::ReadFile {
        setting,
        path: path.to_owned(),
        source,
    })
}

/// Why no client could be made of a URL and TLS settings.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{url} is not a valid Redis URL ({source}){hint}")]
    BadUrl {
        url: String,
        /// Said when the URL holds a password: characters such as `@ : / # ?` in it must be
        /// %-encoded.
        hint: &'static str,
        #[source]
        source: redis::RedisError,
    },
    #[error(
        "{url}: TLS settings (--redis-ca, --redis-cert, --redis-key) are given but the URL is \
         not rediss://; use rediss://HOST:PORT for TLS, or drop the settings"
    )]
    TlsWithoutRediss { url: String },
    #[error("reading {setting} {path}: {source}")]
    ReadFile {
        setting: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("a client certificate needs both --redis-cert and --redis-key; {missing} is missing")]
    HalfClientCert { missing: &'static str },
    #[error("the TLS settings for {url} cannot be used (are they PEM files?): {source}")]
    Certificates {
        url: String,
        #[source]
        source: redis::RedisError,
    },
}

const PASSWORD_HINT: &str = "; a password with any of @ : / # ? % in it must be %-encoded \
                             (@ as %40, : as %3A, / as %2F, # as %23, ? as %3F, % as %25)";

/// A client for `url` (`redis://[USER:PASSWORD@]HOST:PORT[/DB]`, `rediss://...` for TLS,
/// `redis+unix:///PATH`) with the TLS settings `tls`.
pub fn redis_client(url: &str, tls: &RedisTls) -> Result<Client, ConnectError> {
    let info = url
        .into_connection_info()
        .map_err(|source| bad_url(url, source))?;
    match &info.addr {
        ConnectionAddr::TcpTls { .. } => {}
        _ if tls.is_set() => {
            return Err(ConnectError::TlsWithoutRediss {
                url: without_password(url),
            })
        }
        _ => return Client::open(info).map_err(|source| bad_url(url, source)),
    }
    Client::build_with_tls(info, tls.certificates()?).map_err(|source| ConnectError::Certificates {
        url: without_password(url),
        source,
    })
}

/// A cluster client for `seeds`, with the TLS settings `tls` for `rediss://` seeds (every
/// seed must then be one: a cluster speaks TLS on all its nodes or on none).
pub fn cluster_client(
    seeds: &[String],
    tls: &RedisTls,
    configure: impl FnOnce(ClusterClientBuilder) -> ClusterClientBuilder,
) -> Result<ClusterClient, ConnectError> {
    let mut secure = None;
    for seed in seeds {
        let info = seed
            .as_str()
            .into_connection_info()
            .map_err(|source| bad_url(seed, source))?;
        let this = match info.addr {
            ConnectionAddr::TcpTls { insecure, .. } => Some(insecure),
            _ => None,
        };
        if this.is_none() && tls.is_set() {
            return Err(ConnectError::TlsWithoutRediss {
                url: without_password(seed),
            });
        }
        secure = secure.or(this);
    }
    let mut builder = configure(ClusterClient::builder(seeds.to_vec()));
    if let Some(insecure) = secure {
        builder = builder.tls(if insecure {
            redis::TlsMode::Insecure
        } else {
            redis::TlsMode::Secure
        });
        if tls.is_set() {
            builder = builder.certs(tls.certificates()?);
        }
    }
    let shown = seeds
        .iter()
        .map(|s| without_password(s))
        .collect::<Vec<_>>();
    builder
        .build()
        .map_err(|source| ConnectError::Certificates {
            url: shown.join(","),
            source,
        })
}

/// `info` pointed at `host:port`, with the same TLS settings (a `MOVED` reply names a node by
/// address alone).
pub(crate) fn redirect(
    info: &redis::ConnectionInfo,
    host: String,
    port: u16,
) -> redis::ConnectionInfo {
    let mut info = info.clone();
    info.addr = match &info.addr {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    };
    info
}

fn bad_url(url: &str, source: redis::RedisError) -> ConnectError {
    ConnectError::BadUrl {
        url: without_password(url),
        hint: if has_password(url) { PASSWORD_HINT } else { "" },
        source,
    }
}

/// Whether `url` carries user information before its host (`scheme://[user]:password@`).
fn has_password(url: &str) -> bool {
    match url.split_once("://") {
        Some((_, rest)) => rest.contains('@'),
        None => false,
    }
}

/// `url` with whatever stands between `://` and the last `@` (user and password) masked.
pub fn without_password(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_owned(),
    }
}

/// Whether `e` says Redis refused this client's credentials (`WRONGPASS`, a failed `AUTH`),
/// or that it wants some (`NOAUTH`): a wrong or missing password, not an unreachable Redis.
pub fn is_auth_error(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
}

/// Whether `e` is Redis refusing a command or key to this client's ACL user (`NOPERM`).
pub fn is_permission_error(e: &redis::RedisError) -> bool {
    e.code() == Some("NOPERM")
}

/// Whether `e` comes from the TLS handshake (an unknown CA, a name mismatch, a client
/// certificate the server refused).
pub fn is_tls_error(e: &redis::RedisError) -> bool {
    let text = e.to_string();
    [
        "certificate",
        "Certificate",
        "TLS",
        "tls handshake",
        "HandshakeFailure",
        "UnknownIssuer",
    ]
    .iter()
    .any(|w| text.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_that_breaks_the_url_gets_the_encoding_hint() {
        let e = redis_client("redis://user:p@ss/w#rd@h:1", &RedisTls::default()).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("%-encoded") && text.contains("%40"), "{text}");
        assert!(!text.contains("ss/w"), "the password is shown: {text}");
        let e = redis_client("redis://h:notaport", &RedisTls::default()).unwrap_err();
        assert!(!e.to_string().contains("%-encoded"), "{e}");
    }

    #[test]
    fn an_encoded_password_and_user_are_decoded() {
        let c = redis_client("redis://app%40x:p%40ss%3Aw@h:1/2", &RedisTls::default()).unwrap();
        let info = c.get_connection_info();
        assert_eq!(info.redis.username.as_deref(), Some("app@x"));
        assert_eq!(info.redis.password.as_deref(), Some("p@ss:w"));
        assert_eq!(info.redis.db, 2);
    }

    #[test]
    fn tls_settings_need_a_rediss_url() {
        let tls = RedisTls {
            ca: Some("/nonexistent/ca.pem".into()),
            ..RedisTls::default()
        };
        let e = redis_client("redis://h:1", &tls).unwrap_err();
        assert!(matches!(e, ConnectError::TlsWithoutRediss { .. }), "{e}");
        let e = redis_client("rediss://h:1", &tls).unwrap_err();
        assert!(
            e.to_string().contains("--redis-ca /nonexistent/ca.pem"),
            "{e}"
        );
        let Err(e) = cluster_client(&["redis://h:1".into()], &tls, |b| b) else {
            panic!("TLS settings with a redis:// seed were accepted");
        };
        assert!(matches!(e, ConnectError::TlsWithoutRediss { .. }), "{e}");
    }

    #[test]
    fn a_client_certificate_needs_its_key() {
        let tls = RedisTls {
            cert: Some("/c.pem".into()),
            ..RedisTls::default()
        };
        let e = redis_client("rediss://h:1", &tls).unwrap_err();
        assert!(e.to_string().contains("--redis-key is missing"), "{e}");
    }

    #[test]
    fn rediss_with_and_without_insecure_builds() {
        for url in [
            "rediss://h:1",
            "rediss://h:1/#insecure",
            "rediss://u:p@h:1/0",
        ] {
            let c = redis_client(url, &RedisTls::default()).unwrap();
            assert!(
                matches!(c.get_connection_info().addr, ConnectionAddr::TcpTls { .. }),
                "{url}"
            );
        }
        cluster_client(&["rediss://h:1".into()], &RedisTls::default(), |b| b).unwrap();
    }
}
