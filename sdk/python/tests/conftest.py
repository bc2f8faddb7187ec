"""Fixtures that start REAL processes: `forkbox daemon`, `redis-server` and `forkbox worker`.

The binary is found through $FORKBOX_BIN, else target/debug/forkbox, else
target/release/forkbox (relative to this repository). If it is missing, the tests that need it
fail (they do not skip) and say how to build it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

TESTS_DIR = Path(__file__).resolve().parent
SDK_DIR = TESTS_DIR.parent
REPO_ROOT = TESTS_DIR.parents[2]

sys.path.insert(0, str(TESTS_DIR))  # fake_daemon, for the protocol-level tests

BUILD_HINT = "build it with `cargo build -p forkbox` in the repository root, or set FORKBOX_BIN to a built binary"


def locate_binary() -> Path:
    env = os.environ.get("FORKBOX_BIN")
    if env:
        p = Path(env)
        if not (p.is_file() and os.access(p, os.X_OK)):
            pytest.fail(f"FORKBOX_BIN={env} is not an executable file; {BUILD_HINT}", pytrace=False)
        return p
    candidates = [REPO_ROOT / "target" / "debug" / "forkbox", REPO_ROOT / "target" / "release" / "forkbox"]
    for p in candidates:
        if p.is_file() and os.access(p, os.X_OK):
            return p
    pytest.fail(
        "the forkbox binary was not found (looked at "
        + ", ".join(str(c) for c in candidates)
        + f"); {BUILD_HINT}",
        pytrace=False,
    )
    raise AssertionError("unreachable")


def tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


class Proc:
    """A child process with its log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, name: str, argv: List[str], log: Path, env: Optional[dict] = None) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self._logf = open(log, "wb")
        self.popen = subprocess.Popen(
            argv, stdout=self._logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )  # fmt: skip

    def alive(self) -> bool:
        return self.popen.poll() is None

    def fail(self, what: str) -> None:
        code = self.popen.poll()
        state = "still running" if code is None else f"exited with code {code}"
        pytest.fail(
            f"{self.name} {what} ({state}).\ncommand: {' '.join(self.argv)}\nlog {self.log}:\n{tail(self.log)}",
            pytrace=False,
        )

    def stop(self, timeout: float = 15.0) -> Optional[int]:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._logf.close()
        return self.popen.returncode


def short_tmpdir(prefix: str) -> Path:
    """A temp dir with a short path: Unix socket paths are limited to 107 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def start_daemon(binary: Path, sock: Path, log: Path, *extra: str, slots: int = 4) -> Proc:
    return Proc("forkbox daemon", [str(binary), "daemon", "--socket", str(sock), "--slots", str(slots), *extra], log)


def wait_for_socket(proc: Proc, sock: Path, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not proc.alive():
            proc.fail("exited before its socket appeared")
        if sock.exists():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(str(sock))
                return
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.02)
    proc.fail(f"did not listen on {sock} within {timeout:.0f}s")


@pytest.fixture(scope="session")
def forkbox_bin() -> Path:
    return locate_binary()


@pytest.fixture(scope="session")
def tmp_root() -> Iterator[Path]:
    d = short_tmpdir("fbt-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Daemon:
    def __init__(self, proc: Proc, socket_path: Path) -> None:
        self.proc = proc
        self.socket = socket_path


@pytest.fixture(scope="session")
def daemon(forkbox_bin: Path, tmp_root: Path) -> Iterator[Daemon]:
    """A real `forkbox daemon --socket <tmp>/fb.sock --slots 4`, shared by the session.

    It is also made the default of `forkbox.run(...)` and exported as FORKBOX_SOCKET (for the
    example scripts run as subprocesses).
    """
    from forkbox import Forkbox

    sock = tmp_root / "fb.sock"
    proc = start_daemon(forkbox_bin, sock, tmp_root / "daemon.log")
    wait_for_socket(proc, sock)
    old_env = os.environ.get("FORKBOX_SOCKET")
    os.environ["FORKBOX_SOCKET"] = str(sock)
    Forkbox.set_default(Forkbox(socket=sock))
    yield Daemon(proc, sock)
    Forkbox.set_default(None)
    if old_env is None:
        os.environ.pop("FORKBOX_SOCKET", None)
    else:
        os.environ["FORKBOX_SOCKET"] = old_env
    code = proc.stop()
    if code not in (0, None):
        print(f"forkbox daemon exited with code {code}; log:\n{tail(proc.log)}", file=sys.stderr)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture(scope="session")
def redis_url(tmp_root: Path) -> Iterator[str]:
    """A throwaway redis-server on a free port (never 6379), without persistence."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server)", pytrace=False)
    import redis

    data = tmp_root / "redis"
    data.mkdir()
    for _ in range(5):
        port = free_port()
        if port == 6379:
            continue
        proc = Proc(
            "redis-server",
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(data)],
            tmp_root / f"redis-{port}.log",
        )
        client = redis.Redis(host="127.0.0.1", port=port)
        end = time.monotonic() + 10
        while time.monotonic() < end and proc.alive():
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            proc.stop()
            continue  # the port was taken in the meantime, or redis failed: try another
        client.close()
        yield f"redis://127.0.0.1:{port}"
        proc.stop()
        return
    pytest.fail(f"could not start redis-server; last log:\n{tail(proc.log)}", pytrace=False)


@pytest.fixture(scope="session")
def worker(forkbox_bin: Path, redis_url: str, tmp_root: Path) -> Iterator[str]:
    """A real `forkbox worker` on the test Redis, checked with one probe job."""
    from forkbox import Queue

    proc = Proc(
        "forkbox worker",
        [str(forkbox_bin), "worker", "--redis", redis_url, "--slots", "2", "--metrics-addr", "127.0.0.1:0"],
        tmp_root / "worker.log",
    )
    q = Queue(redis_url)
    probe = q.submit(cmd="echo probe", id="probe-" + os.urandom(4).hex())
    end = time.monotonic() + 60
    while True:
        if not proc.alive():
            proc.fail("exited before running a probe job")
        try:
            res = q.result(probe, timeout=0.5)
            break
        except Exception as e:  # noqa: BLE001 - Timeout until it is up; anything else fails
            from forkbox import Timeout

            if not isinstance(e, Timeout):
                proc.fail(f"answered the probe job with an error: {e!r}")
            if time.monotonic() > end:
                proc.fail("did not run a probe job within 60s")
    if res.stdout != "probe\n":
        proc.fail(f"ran the probe job wrong: {res!r}")
    yield redis_url
    code = proc.stop()
    if code not in (0, None):
        print(f"forkbox worker exited with code {code}; log:\n{tail(proc.log)}", file=sys.stderr)


def humaneval_path() -> Path:
    env = os.environ.get("FORKBOX_HUMANEVAL")
    p = Path(env) if env else REPO_ROOT.parent / "shared" / "data" / "HumanEval.jsonl.gz"
    if not p.is_file():
        pytest.fail(
            f"HumanEval data not found at {p}: it is expected in the shared data directory beside the "
            "repository (../shared/data/HumanEval.jsonl.gz), or at $FORKBOX_HUMANEVAL",
            pytrace=False,
        )
    return p
