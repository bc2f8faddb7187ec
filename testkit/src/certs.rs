//! A certificate authority and the certificates a TLS test needs, made on the spot.
//!
//! Tests of `rediss://` run a [`RedisServer`] that speaks TLS only ([`tls_server`]), with a
//! server certificate for `127.0.0.1` and `localhost` signed by a fresh CA, a client
//! certificate signed by the same CA (mutual TLS), and a second, unrelated CA (the wrong one).
//! They are made with the `openssl` command-line tool, so nothing in the build links OpenSSL;
//! [`TestCerts::make`] fails with [`TestCertsError::Openssl`] naming the step when the tool is
//! missing, and [`TestCerts::or_skip`] reports the test skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use forkbox_private_redis::{RedisServer, RedisServerOptions, ServerTls};

use crate::skip::skipped;

/// Why the certificates could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TestCertsError {
    #[error("creating the certificate directory: {0}")]
    Dir(#[source] std::io::Error),
    #[error("running openssl ({step}): {source} (is the openssl tool installed?)")]
    Spawn {
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("openssl failed ({step}): {stderr}")]
    Openssl { step: &'static str, stderr: String },
}

/// PEM files in a temporary directory that lives as long as this value.
#[derive(Debug)]
pub struct TestCerts {
    dir: tempfile::TempDir,
}

impl TestCerts {
    /// Makes the CA, the server and client certificates, and an unrelated CA.
    pub fn make() -> Result<TestCerts, TestCertsError> {
        let dir = tempfile::Builder::new()
            .prefix("forkbox-certs-")
            .tempdir()
            .map_err(TestCertsError::Dir)?;
        let certs = TestCerts { dir };
        certs.make_ca("ca", "forkbox test CA")?;
        certs.make_ca("other-ca", "an unrelated CA")?;
        certs.make_leaf(
            "server",
            "127.0.0.1",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        )?;
        certs.make_leaf("client", "forkbox client", "extendedKeyUsage=clientAuth")?;
        Ok(certs)
    }

    /// The certificates, or `None` after reporting the test skipped (no `openssl` tool).
    pub fn or_skip() -> Option<TestCerts> {
        TestCerts::make()
            .map_err(|e| skipped(format!("TLS tests: {e}")))
            .ok()
    }

    /// A server's TLS side with these certificates, requiring client certificates or not.
    pub fn server_tls(&self, require_client_cert: bool) -> ServerTls {
        ServerTls {
            cert: self.server_cert(),
            key: self.server_key(),
            ca: self.ca(),
            require_client_cert,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA that signed the server and client certificates.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// A CA that signed neither.
    pub fn other_ca(&self) -> PathBuf {
        self.path("other-ca.pem")
    }

    pub fn server_cert(&self) -> PathBuf {
        self.path("server.pem")
    }

    pub fn server_key(&self) -> PathBuf {
        self.path("server.key")
    }

    pub fn client_cert(&self) -> PathBuf {
        self.path("client.pem")
    }

    pub fn client_key(&self) -> PathBuf {
        self.path("client.key")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn make_ca(&self, name: &str, subject: &str) -> Result<(), TestCertsError> {
        openssl(
            "making a CA",
            self.dir(),
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={subject}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.pem"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        )
    }

    fn make_leaf(&self, name: &str, cn: &str, ext: &str) -> Result<(), TestCertsError> {
        openssl(
            "making a certificate request",
            self.dir(),
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ],
        )?;
        std::fs::write(self.path(&format!("{name}.ext")), format!("{ext}\n"))
            .map_err(TestCertsError::Dir)?;
        openssl(
            "signing a certificate",
            self.dir(),
            &[
                "x509",
                "-req",
                "-days",
                "2",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ],
        )
    }
}

/// A `redis-server` that speaks TLS only, with `certs`' server certificate.
pub fn tls_server(certs: &TestCerts, require_client_cert: bool) -> RedisServer {
    RedisServer::start_with(RedisServerOptions {
        tls: Some(certs.server_tls(require_client_cert)),
        ..RedisServerOptions::default()
    })
    .expect("start a TLS redis-server")
}

fn openssl(step: &'static str, dir: &Path, args: &[&str]) -> Result<(), TestCertsError> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|source| TestCertsError::Spawn { step, source })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(TestCertsError::Openssl {
            step,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}
