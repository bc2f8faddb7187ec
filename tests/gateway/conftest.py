"""Fixtures for the gateway's client suites: a REAL redis-server, `forkbox worker` and
`forkbox gateway`, which the unchanged client libraries (judge0, sandbox-fusion,
piston-client) talk to over HTTP.

The binary is $FORKBOX_BIN, else target/debug/forkbox. A client library that could not be
installed makes its tests skip with the reason the installer left in
target/gateway-clients/<name>.missing (the Makefile's `gateway-clients` target).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator, List

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CLIENTS_DIR = Path(os.environ.get("FORKBOX_GATEWAY_CLIENTS", REPO_ROOT / "target" / "gateway-clients"))


def missing_reason(name: str) -> str:
    note = CLIENTS_DIR / f"{name}.missing"
    if note.is_file():
        return note.read_text(errors="replace").strip()[-400:]
    return f"{name} is not installed (run `make gateway-clients`)"


def locate_binary() -> Path:
    env = os.environ.get("FORKBOX_BIN")
    p = Path(env) if env else REPO_ROOT / "target" / "debug" / "forkbox"
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.fail(f"the forkbox binary is not at {p}: build it with `cargo build -p forkbox`", pytrace=False)
    return p


class Proc:
    """A child process with its log; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, name: str, argv: List[str], log: Path) -> None:
        self.name, self.argv, self.log = name, argv, log
        self._logf = open(log, "wb")
        self.popen = subprocess.Popen(argv, stdout=self._logf, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def fail(self, what: str) -> None:
        text = self.log.read_text(errors="replace")[-4000:]
        pytest.fail(f"{self.name} {what}.\ncommand: {' '.join(self.argv)}\nlog:\n{text}", pytrace=False)

    def stop(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._logf.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def tmp_root() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="fbgw-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Fleet:
    """A private redis-server with a worker on queue `gw`, and the gateways started on it."""

    def __init__(self, binary: Path, redis_url: str, tmp_root: Path) -> None:
        self.binary, self.redis_url, self.tmp_root = binary, redis_url, tmp_root
        self.procs: List[Proc] = []

    def start_gateway(self, *extra: str) -> str:
        """Starts `forkbox gateway` with `extra` options; returns its base URL."""
        n = len(self.procs)
        gw = Proc("forkbox gateway", [str(self.binary), "gateway", "--redis", self.redis_url, "--queue", "gw",
                                      "--listen", "127.0.0.1:0", *extra], self.tmp_root / f"gateway-{n}.log")
        self.procs.append(gw)
        end = time.monotonic() + 60
        while True:
            m = re.search(r"forkbox gateway: (http://127\.0\.0\.1:\d+)", gw.log.read_text(errors="replace"))
            if m:
                return m.group(1)
            if time.monotonic() > end or not gw.alive():
                gw.fail("did not print its address within 60 s")
            time.sleep(0.1)

    def queued(self) -> int:
        """Entries ever added to the job stream (XINFO's entries-added counter)."""
        with socket.create_connection(("127.0.0.1", int(self.redis_url.rsplit(":", 1)[1])), timeout=5) as s:
            key = b"forkbox:{gw}:jobs"
            s.sendall(b"*3\r\n$5\r\nXINFO\r\n$6\r\nSTREAM\r\n$%d\r\n%s\r\n" % (len(key), key))
            data = b""
            while b"entries-added" not in data or not data.endswith(b"\r\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        m = re.search(rb"entries-added\r\n:(\d+)", data)
        return int(m.group(1)) if m else 0


@pytest.fixture(scope="session")
def fleet(gateway: str) -> "Fleet":
    return FLEET[0]


FLEET: List[Fleet] = []


@pytest.fixture(scope="session")
def gateway(tmp_root: Path) -> Iterator[str]:
    """The base URL of a gateway in front of a worker, both on a private redis-server."""
    binary = locate_binary()
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server)", pytrace=False)
    port = free_port()
    redis = Proc("redis-server", [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", str(tmp_root)], tmp_root / "redis.log")
    url = f"redis://127.0.0.1:{port}"
    end = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            pass
        if time.monotonic() > end or not redis.alive():
            redis.fail("did not answer PING within 10 s")
        time.sleep(0.05)
    worker = Proc("forkbox worker", [str(binary), "worker", "--redis", url, "--queues", "gw", "--slots", "2"],
                  tmp_root / "worker.log")
    fleet = Fleet(binary, url, tmp_root)
    FLEET.append(fleet)
    base = fleet.start_gateway()
    gw = fleet.procs[0]
    end = time.monotonic() + 60
    # Ready when the worker's runtimes are offered and a program has run through it end to end.
    while True:
        try:
            with urllib.request.urlopen(base + "/api/v2/runtimes", timeout=10) as r:
                if '"python"' in r.read().decode():
                    break
        except OSError:
            pass
        if time.monotonic() > end or not gw.alive():
            gw.fail("offered no python runtime within 60 s")
        time.sleep(0.2)
    body = b'{"code": "print(7*6)", "language": "python"}'
    while True:
        if not worker.alive():
            worker.fail("exited")
        try:
            req = urllib.request.Request(base + "/run_code", data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                text = r.read().decode()
            if '"42\\n"' in text:
                break
            gw.fail(f"ran the probe program wrong: {text}")
        except OSError:
            if time.monotonic() > end:
                gw.fail("did not run a probe program within 60 s")
            time.sleep(0.2)
    yield base
    for p in fleet.procs:
        p.stop()
    worker.stop()
    redis.stop()
