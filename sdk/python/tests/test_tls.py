"""The SDK over ``rediss://`` against a real TLS-only redis-server and a real ``forkbox worker``,
with certificates made here by the ``openssl`` tool: a CA file, mutual TLS, a wrong CA."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator, Tuple

import pytest

from conftest import Proc, free_port, short_tmpdir, tail


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_certs(d: Path) -> None:
    for name, subject in (("ca", "forkbox test CA"), ("other-ca", "an unrelated CA")):
        _openssl(d, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={subject}",
                 "-keyout", f"{name}.key", "-out", f"{name}.pem",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    for name, cn, ext in (
        ("server", "127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "forkbox client", "extendedKeyUsage=clientAuth"),
    ):
        _openssl(d, "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr")  # fmt: skip
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl(d, "x509", "-req", "-days", "2", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-extfile", f"{name}.ext", "-out", f"{name}.pem")  # fmt: skip


@pytest.fixture(scope="module")
def tls_redis() -> Iterator[Tuple[str, Path]]:
    """A redis-server that speaks TLS only and wants a client certificate signed by the CA."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl tool is not installed (apt-get install openssl)", pytrace=False)
    d = short_tmpdir("fbtls")
    _make_certs(d)
    port = free_port()
    proc = Proc(
        "redis-server",
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(d), "--tls-cert-file", str(d / "server.pem"),
         "--tls-key-file", str(d / "server.key"), "--tls-ca-cert-file", str(d / "ca.pem"),
         "--tls-auth-clients", "yes"],
        d / "redis.log",
    )  # fmt: skip
    import socket

    end = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if time.monotonic() > end or not proc.alive():
                proc.fail("did not listen on its TLS port")
            time.sleep(0.05)
    yield f"rediss://127.0.0.1:{port}", d
    proc.stop()
    shutil.rmtree(d, ignore_errors=True)


def test_queue_and_worker_over_mutual_tls(forkbox_bin: Path, tls_redis: Tuple[str, Path]) -> None:
    from forkbox import Queue

    url, d = tls_redis
    tls = ["--redis-ca", str(d / "ca.pem"), "--redis-cert", str(d / "client.pem"), "--redis-key", str(d / "client.key")]
    worker = Proc(
        "forkbox worker",
        [str(forkbox_bin), "worker", "--redis", url, *tls, "--queues", "sdk-tls", "--slots", "1"],
        d / "worker.log",
    )
    try:
        q = Queue(
            url,
            queue="sdk-tls",
            ssl_ca_certs=str(d / "ca.pem"),
            ssl_certfile=str(d / "client.pem"),
            ssl_keyfile=str(d / "client.key"),
        )
        job = q.submit(cmd="echo over tls", id="sdk-tls-" + os.urandom(4).hex())
        res = q.result(job, timeout=60)
        assert res.stdout == "over tls\n", res
        assert worker.alive(), tail(worker.log)
    finally:
        worker.stop()


def test_a_wrong_ca_or_no_client_certificate_is_refused(tls_redis: Tuple[str, Path]) -> None:
    import redis

    from forkbox import Queue

    url, d = tls_redis
    with pytest.raises(redis.ConnectionError, match="(?i)certificate"):
        Queue(
            url,
            queue="sdk-tls",
            ssl_ca_certs=str(d / "other-ca.pem"),
            ssl_certfile=str(d / "client.pem"),
            ssl_keyfile=str(d / "client.key"),
        ).submit(cmd="true")
    with pytest.raises(redis.ConnectionError):
        Queue(url, queue="sdk-tls", ssl_ca_certs=str(d / "ca.pem")).submit(cmd="true")


def test_tls_settings_need_a_rediss_url() -> None:
    from forkbox import Queue

    with pytest.raises(ValueError, match="not rediss://"):
        Queue("redis://127.0.0.1:1", ssl_ca_certs="/ca.pem")

