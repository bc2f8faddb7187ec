"""The SDK against a real `forkbox daemon` (started by the `daemon` fixture in conftest.py)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import forkbox
from conftest import SDK_DIR, Daemon, Proc, short_tmpdir, start_daemon, tail, wait_for_socket
from forkbox import AsyncForkbox, DaemonNotRunning, Forkbox, JobRejected

pytestmark = pytest.mark.real

FACTORIAL = "python3 -c 'import math; print(math.factorial(20))'"


# -- the three calls of the issue ------------------------------------------------------------


def test_factorial(daemon: Daemon) -> None:
    res = forkbox.run(FACTORIAL)
    assert res.status == "ok", res
    assert res.exit_code == 0 and not res.timed_out
    assert res.stdout == "2432902008176640000\n"
    assert res.duration_ms > 0 and res.spawn_us > 0
    assert res.files == {} and not res.truncated


def test_infinite_loop_times_out(daemon: Daemon) -> None:
    res_loop = forkbox.run("while true; do :; done", timeout_ms=500)
    assert res_loop.timed_out is True
    assert res_loop.exit_code == 124
    assert res_loop.status == "timeout"
    assert 450 <= res_loop.duration_ms < 5000, res_loop.duration_ms


def test_host_etc_hosts_is_untouched(daemon: Daemon) -> None:
    hosts = Path("/etc/hosts")
    before = hosts.read_bytes()
    st_before = hosts.stat()
    res = forkbox.run("echo 'payload' >> /etc/hosts; cat /etc/hosts")
    assert hosts.read_bytes() == before
    st_after = hosts.stat()
    assert (st_after.st_mtime_ns, st_after.st_size, st_after.st_ino) == (
        st_before.st_mtime_ns,
        st_before.st_size,
        st_before.st_ino,
    )
    # Either the write failed inside the sandbox or it landed in the sandbox's own copy.
    assert res.status in ("ok", "failed"), res


# -- job features ----------------------------------------------------------------------------


def test_files_in_and_collected_out(daemon: Daemon) -> None:
    res = forkbox.run(
        "mkdir -p out && tr a-z A-Z < in.txt > out/upper.txt && cp data.bin out/copy.bin && "
        "echo skip > not-collected.txt && cat sub/dir/note.txt",
        files={"in.txt": "hello files\n", "data.bin": b"\x00\xff\x10binary", "sub/dir/note.txt": "nested"},
        collect=["out/*"],
    )
    assert res.status == "ok", res
    assert res.stdout == "nested"
    assert res.files == {"out/upper.txt": b"HELLO FILES\n", "out/copy.bin": b"\x00\xff\x10binary"}


def test_stdin_text_and_bytes(daemon: Daemon) -> None:
    assert forkbox.run("tr a-z A-Z", stdin="shout\n").stdout == "SHOUT\n"
    res = forkbox.run("od -An -tx1 | tr -s ' '", stdin=b"\x00\xff\x7f")
    assert res.stdout.split() == ["00", "ff", "7f"]


def test_env(daemon: Daemon) -> None:
    res = forkbox.run('printf "%s|%s" "$GREETING" "$HOME"', env={"GREETING": "hi there"})
    assert res.stdout.split("|")[0] == "hi there"


def test_argv_is_not_shell_parsed(daemon: Daemon) -> None:
    res = forkbox.run(argv=["/bin/echo", "a  b", "$HOME", ";", "c"])
    assert res.stdout == "a  b $HOME ; c\n"


def test_nonzero_exit_is_a_result(daemon: Daemon) -> None:
    res = forkbox.run("echo out; echo err >&2; exit 3")
    assert res.status == "failed"
    assert res.exit_code == 3 and not res.timed_out
    assert res.stdout == "out\n" and res.stderr == "err\n"


def test_killed_by_signal(daemon: Daemon) -> None:
    res = forkbox.run("kill -9 $$")
    assert res.status == "signaled", res
    assert res.exit_code == 137 and res.signal == 9


def test_output_truncation(daemon: Daemon) -> None:
    res = forkbox.run("head -c 200000 /dev/zero | tr '\\0' x", output_bytes=1000)
    assert res.truncated and res.stdout_truncated
    assert 0 < len(res.stdout) <= 1000 and set(res.stdout) == {"x"}
    assert res.status in ("ok", "output_limit"), res


def test_output_mode_truncate_keeps_the_exit_code(daemon: Daemon) -> None:
    flood = "head -c 200000 /dev/zero >&2; echo 42; exit 3"
    r = forkbox.run(flood, output_bytes=1000, output_mode="truncate")
    assert (r.status, r.exit_code, r.stdout) == ("failed", 3, "42\n"), r
    assert r.stderr_truncated and not r.stdout_truncated and len(r.stderr) == 1000
    assert forkbox.run(flood, output_bytes=1000).status == "output_limit"
    with pytest.raises(JobRejected, match="output_mode"):
        forkbox.run("true", output_mode="cut")


def test_streaming_output(daemon: Daemon) -> None:
    chunks: List[Tuple[str, str]] = []
    res = forkbox.run(
        "echo one; echo two >&2; echo three", on_output=lambda stream, data: chunks.append((stream, data))
    )
    assert res.status == "ok"
    assert "".join(d for s, d in chunks if s == "stdout") == res.stdout == "one\nthree\n"
    assert "".join(d for s, d in chunks if s == "stderr") == res.stderr == "two\n"


def test_rejected_jobs_carry_the_reason(daemon: Daemon) -> None:
    with pytest.raises(JobRejected) as e:
        forkbox.run("true", timeout_ms=0)
    assert "timeout_ms" in e.value.reason
    assert e.value.result is not None and e.value.result.exit_code == 125
    with pytest.raises(JobRejected, match="files"):
        forkbox.run("true", files={"../escape.txt": "x"})
    with pytest.raises(JobRejected, match="bogus"):
        forkbox.run_job({"cmd": "true", "bogus": 1})
    # Jobs that could never start are rejected with the reason, not reported as sandbox errors.
    with pytest.raises(JobRejected, match=r"do not fit the job's disk of 1 MiB \(limits.disk_mb\)"):
        forkbox.run("true", files={"big.bin": "x" * (2 << 20)}, disk_mb=1)
    with pytest.raises(JobRejected, match="its directory a is also a file"):
        forkbox.run("true", files={"a": "1", "a/b": "2"})
    with pytest.raises(JobRejected, match="cwd /nonexistent"):
        forkbox.run("true", cwd="/nonexistent")
    assert forkbox.run("echo still fine").stdout == "still fine\n"


def test_memory_and_pid_limits_are_accepted(daemon: Daemon) -> None:
    res = forkbox.run("echo ok", memory_mb=128, pids=16)
    assert res.status == "ok" and res.stdout == "ok\n"


# -- concurrency -----------------------------------------------------------------------------


def _job(i: int) -> str:
    return f"echo out-{i}; echo err-{i} >&2; printf '%s' {i} > n.txt; cat n.txt"


def _check(i: int, res: Any) -> None:
    assert res.status == "ok", (i, res)
    assert res.stdout == f"out-{i}\n{i}", (i, res.stdout)
    assert res.stderr == f"err-{i}\n", (i, res.stderr)


def test_100_concurrent_calls_from_threads(daemon: Daemon) -> None:
    results: Dict[int, Any] = {}
    errors: List[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = forkbox.run(_job(i))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert sorted(results) == list(range(100))
    for i, res in results.items():
        _check(i, res)


def test_100_concurrent_calls_from_asyncio(daemon: Daemon) -> None:
    async def main() -> List[Any]:
        async with AsyncForkbox(socket=daemon.socket) as fb:
            return await asyncio.gather(*(fb.run(_job(i)) for i in range(100)))

    for i, res in enumerate(asyncio.run(main())):
        _check(i, res)


# -- the daemon's socket and protocol --------------------------------------------------------


def test_daemon_not_running(tmp_path: Path) -> None:
    path = tmp_path / "nobody.sock"
    with pytest.raises(DaemonNotRunning) as e:
        Forkbox(socket=path).run("true")
    assert f"forkbox daemon --socket {path}" in str(e.value)


def test_socket_mode_is_0600(daemon: Daemon) -> None:
    st = os.stat(daemon.socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600, oct(stat.S_IMODE(st.st_mode))


class RawConn:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(path))
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> Dict[str, Any]:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, "the daemon closed the connection"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        obj: Dict[str, Any] = json.loads(line)
        return obj

    def close(self) -> None:
        self.sock.close()


def test_malformed_request_then_a_good_one_on_the_same_connection(daemon: Daemon) -> None:
    c = RawConn(daemon.socket)
    try:
        c.send(b"this is not json\n")
        bad = c.line()
        assert bad["status"] == "invalid" and bad["exit_code"] == 125
        assert bad["id"] is None and bad["error"]
        c.send(json.dumps({"id": "bad-field", "cmd": "true", "bogus": 1}).encode() + b"\n")
        bad2 = c.line()
        assert bad2["id"] == "bad-field" and bad2["status"] == "invalid" and "bogus" in bad2["error"]
        c.send(json.dumps({"id": "good", "cmd": "echo fine"}).encode() + b"\n")
        good = c.line()
        assert good["id"] == "good" and good["status"] == "ok" and good["stdout"] == "fine\n"
    finally:
        c.close()


def test_pipelined_requests_on_one_raw_connection(daemon: Daemon) -> None:
    c = RawConn(daemon.socket)
    try:
        c.send(
            b"".join(
                json.dumps({"id": f"p{i}", "cmd": f"sleep 0.{3 - i}; echo {i}"}).encode() + b"\n" for i in range(3)
            )
        )
        got = {}
        for _ in range(3):
            r = c.line()
            got[r["id"]] = r["stdout"]
        assert got == {"p0": "0\n", "p1": "1\n", "p2": "2\n"}
    finally:
        c.close()


def test_oversized_request_is_rejected(daemon: Daemon) -> None:
    c = RawConn(daemon.socket)
    try:
        big = b'{"id":"big","cmd":"true","env":{"X":"' + b"a" * (11 * 1024 * 1024) + b'"}}\n'
        try:
            c.send(big)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon may stop reading early; its answer is still in the socket
        r = c.line()
        assert r["status"] == "invalid" and r["exit_code"] == 125, r
        assert r["error"]
    finally:
        c.close()
    # The daemon still serves new connections.
    assert Forkbox(socket=daemon.socket).run("echo after").stdout == "after\n"


def test_refuses_a_path_that_is_not_its_socket(forkbox_bin: Path) -> None:
    d = short_tmpdir("fbr-")
    target = d / "fb.sock"
    target.write_text("precious")
    proc = start_daemon(forkbox_bin, target, d / "daemon.log", slots=1)
    try:
        code = proc.popen.wait(15)
    except subprocess.TimeoutExpired:
        proc.stop()
        pytest.fail(f"the daemon started over a regular file:\n{tail(proc.log)}")
    proc.stop()
    assert code != 0, tail(proc.log)
    assert target.read_text() == "precious"
    shutil.rmtree(d, ignore_errors=True)


def test_sigterm_removes_the_socket(forkbox_bin: Path) -> None:
    d = short_tmpdir("fbs-")
    sock = d / "fb.sock"
    proc = start_daemon(forkbox_bin, sock, d / "daemon.log", slots=1)
    wait_for_socket(proc, sock)
    assert Forkbox(socket=sock).run("echo up").stdout == "up\n"
    proc.popen.send_signal(signal.SIGTERM)
    code = proc.popen.wait(15)
    proc.stop()
    assert code == 0, tail(proc.log)
    assert not sock.exists()
    shutil.rmtree(d, ignore_errors=True)


# -- examples and tools ----------------------------------------------------------------------


@pytest.mark.parametrize("script", sorted(p.name for p in (SDK_DIR / "examples").glob("*.py") if "queue" not in p.name and not p.name.startswith("session_")))
def test_examples_run(daemon: Daemon, script: str) -> None:
    env = dict(os.environ, FORKBOX_SOCKET=str(daemon.socket))
    out = subprocess.run(
        [sys.executable, str(SDK_DIR / "examples" / script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_code_interpreter(daemon: Daemon) -> None:
    from forkbox.tools import code_interpreter

    python = code_interpreter(timeout_ms=2000)
    assert python("import math\nprint(math.factorial(20))") == "2432902008176640000"
    err = python("raise ValueError('boom')")
    assert "ValueError: boom" in err and err.endswith("[status: failed, exit code 1]")
    assert python("while True: pass").endswith("[status: timeout after 2000 ms, exit code 124]")


# -- another local user ------------------------------------------------------------------------

# Listens where the daemon would, as another user, and counts what clients send it.
SQUATTER = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
s.listen(8)
print("listening", flush=True)
s.settimeout(60)
conns = total = 0
try:
    while conns < 2:
        c, _ = s.accept()
        conns += 1
        c.settimeout(10)
        while True:
            try:
                b = c.recv(65536)
            except socket.timeout:
                break
            if not b:
                break
            total += len(b)
        c.close()
except socket.timeout:
    pass
print(f"conns={conns} bytes={total}", flush=True)
"""


def _as_root_with_runuser() -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("SKIPPED: needs root and runuser to act as another user (nobody)")


def test_a_squatter_on_the_socket_gets_nothing_and_the_clients_name_it() -> None:
    _as_root_with_runuser()
    from forkbox import UntrustedDaemon

    d = short_tmpdir("fbq-")
    os.chmod(d, 0o1777)  # a shared directory, as /tmp is
    path = d / "forkbox.sock"
    squatter = subprocess.Popen(
        ["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", SQUATTER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert squatter.stdout is not None
        assert squatter.stdout.readline().strip() == "listening"
        secret = {"API_TOKEN": "tok-4242"}
        with pytest.raises(UntrustedDaemon) as sync_err:
            Forkbox(socket=path).run("echo hi", env=secret, files={"key.pem": "private"})

        async def main() -> None:
            async with AsyncForkbox(socket=path) as fb:
                await fb.run("echo hi", env=secret)

        with pytest.raises(UntrustedDaemon) as async_err:
            asyncio.run(main())
        out, _ = squatter.communicate(timeout=60)
    finally:
        if squatter.poll() is None:
            squatter.kill()
    assert out.strip() == "conns=2 bytes=0", out
    for e in (sync_err.value, async_err.value):
        assert str(path) in str(e) and "uid 65534 (nobody)" in str(e), str(e)
        assert e.uid == 65534
    shutil.rmtree(d, ignore_errors=True)


def test_a_daemon_user_named_in_the_environment_is_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon shared with --group runs as its own user: the clients talk to it when
    FORKBOX_DAEMON_USER names that user, and only then."""
    _as_root_with_runuser()
    from forkbox import ConnectionLost, UntrustedDaemon

    d = short_tmpdir("fbu-")
    os.chmod(d, 0o1777)
    path = d / "forkbox.sock"
    listener = subprocess.Popen(
        ["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", SQUATTER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert listener.stdout is not None
        assert listener.stdout.readline().strip() == "listening"
        monkeypatch.setenv("FORKBOX_DAEMON_USER", "root")
        with pytest.raises(UntrustedDaemon):
            Forkbox(socket=path).run("echo hi", wait_timeout=5)
        monkeypatch.setenv("FORKBOX_DAEMON_USER", "nobody")
        # Trusted, so the request goes out; this listener never answers.
        with pytest.raises((ConnectionLost, TimeoutError)):
            Forkbox(socket=path).run("echo hi", wait_timeout=15)
        out, _ = listener.communicate(timeout=60)
    finally:
        if listener.poll() is None:
            listener.kill()
    conns, sent = out.strip().split()
    assert conns == "conns=2" and sent != "bytes=0", out
    shutil.rmtree(d, ignore_errors=True)


def test_the_default_socket_is_in_a_directory_only_its_user_can_write(forkbox_bin: Path) -> None:
    _as_root_with_runuser()
    import forkbox._wire as wire

    tmp = short_tmpdir("fbt-")
    os.chmod(tmp, 0o1777)
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "FORKBOX_SOCKET")}
    env["TMPDIR"] = str(tmp)
    private = tmp / f"forkbox-{os.geteuid()}"
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        assert wire.default_socket_path() == str(private / "forkbox.sock")
    finally:
        os.environ.clear()
        os.environ.update(old)

    # Another user made the directory first: the daemon refuses it, naming its owner.
    subprocess.run(["runuser", "-u", "nobody", "--", "mkdir", "-m", "0777", str(private)], check=True)
    proc = Proc("forkbox daemon", [str(forkbox_bin), "daemon", "--slots", "1"], tmp / "squatted.log", env=env)
    code = proc.popen.wait(30)
    assert code != 0, tail(proc.log)
    assert f"{private} is owned by uid 65534" in tail(proc.log), tail(proc.log)
    shutil.rmtree(private)

    # Free: the daemon makes it 0700 and serves there.
    proc = Proc("forkbox daemon", [str(forkbox_bin), "daemon", "--slots", "1"], tmp / "daemon.log", env=env)
    try:
        wait_for_socket(proc, private / "forkbox.sock")
        st = os.lstat(private)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid(), st
        assert stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
        res = Forkbox(socket=private / "forkbox.sock").run("echo hi")
        assert res.stdout == "hi\n", res
    finally:
        proc.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def test_a_flood_of_connections_leaves_the_daemon_descriptors_for_jobs(forkbox_bin: Path) -> None:
    if shutil.which("prlimit") is None:
        pytest.skip("SKIPPED: no prlimit (util-linux) to give the daemon few descriptors")
    d = short_tmpdir("fbf-")
    sock = d / "fb.sock"
    limit = 128
    proc = Proc(
        "forkbox daemon",
        ["prlimit", f"--nofile={limit}:{limit}", "--", str(forkbox_bin), "daemon", "--socket", str(sock), "--slots", "1"],
        d / "daemon.log",
    )
    flood: List[socket.socket] = []
    fd_dir = f"/proc/{proc.popen.pid}/fd"
    try:
        wait_for_socket(proc, sock)
        first = RawConn(sock)
        idle = len(os.listdir(fd_dir))
        for _ in range(2 * limit):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(sock))
            flood.append(s)
        # A job on a connection made before the flood still runs.
        # (Its open files under the daemon's own hard limit, which a job cannot exceed.)
        job = {"id": "under-flood", "cmd": "echo ran", "limits": {"open_files": 32}}
        first.send(json.dumps(job).encode() + b"\n")
        res = first.line()
        assert (res["id"], res["status"], res["stdout"]) == ("under-flood", "ok", "ran\n"), res
        held = len(os.listdir(fd_dir))
        assert held < limit - 32, f"the daemon holds {held} of its {limit} descriptors"
        first.close()
    finally:
        for s in flood:
            s.close()
    # And once the flood is gone (the daemon has seen each of its connections close, which
    # takes it a moment: until then a new connection finds no place and is refused), a new
    # client is served.
    deadline = time.monotonic() + 30
    # (A few descriptors of margin: the engine's own, which a job may change, are not the point.)
    while len(os.listdir(fd_dir)) > idle + 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(os.listdir(fd_dir)) <= idle + 8, f"the daemon still holds {len(os.listdir(fd_dir))} descriptors"
    res2 = Forkbox(socket=sock).run("echo again", open_files=32)
    assert res2.stdout == "again\n", res2
    proc.stop()
    shutil.rmtree(d, ignore_errors=True)
