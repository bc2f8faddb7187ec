"""Protocol-level tests of the clients against an in-test fake server (tests/fake_daemon.py).

These check request building, result parsing, framing and id matching only; they are not a
substitute for test_daemon.py and test_queue.py, which run the real daemon and worker.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import threading
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from fake_daemon import FakeDaemon, result_for, wait_for
from forkbox import (
    AsyncForkbox,
    ConnectionLost,
    DaemonNotRunning,
    Forkbox,
    JobRejected,
    ProtocolError,
    Result,
    Timeout,
    build_job,
)
from forkbox.tools import code_interpreter, format_result


@pytest.fixture
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDaemon]:
    import tempfile

    d = tempfile.mkdtemp(prefix="fbf-", dir="/tmp")
    srv = FakeDaemon(os.path.join(d, "fake.sock"))
    yield srv
    srv.close()
    os.rmdir(d)


# -- request building ------------------------------------------------------------------------


def test_build_job_shell_and_limits() -> None:
    job = build_job("echo hi", timeout_ms=500, memory_mb=64, pids=8, limits={"pids": 4, "cpu_ms": 100})
    assert job["cmd"] == "echo hi"
    assert job["timeout_ms"] == 500
    assert job["limits"] == {"memory_mb": 64, "pids": 8, "cpu_ms": 100}  # keywords win
    assert len(job["id"]) == 32 and int(job["id"], 16) >= 0
    assert "argv" not in job and "env" not in job and "files" not in job  # None means absent


def test_build_job_encodes_bytes() -> None:
    job = build_job(argv=["cat"], stdin=b"\x00\xffbin", files={"a.txt": "text", "b.txt": b"utf8 ok", "c.bin": b"\xff\x00"})
    assert job["stdin"] == {"b64": base64.b64encode(b"\x00\xffbin").decode()}
    assert job["files"] == {"a.txt": "text", "b.txt": "utf8 ok", "c.bin": {"b64": "/wA="}}
    assert job["argv"] == ["cat"]


def test_build_job_rejects_misuse() -> None:
    with pytest.raises(ValueError, match="cmd"):
        build_job()
    with pytest.raises(ValueError, match="not both"):
        build_job("x", argv=["y"])
    with pytest.raises(TypeError, match="argv"):
        build_job(argv="ls -l")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="argv"):
        build_job(["ls"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="files"):
        build_job("x", files={"a": 5})  # type: ignore[dict-item]


# -- result parsing --------------------------------------------------------------------------


def test_result_parsing() -> None:
    raw = result_for(
        {"id": "j1"},
        status="output_limit",
        exit_code=137,
        signal=9,
        stdout="x" * 10,
        stdout_truncated=True,
        files={"out/a.txt": "hello", "out/b.bin": {"b64": "/wA="}},
        watchdog_overshoot_us=12,
        batch="b1",
    )
    r = Result.from_dict(raw)
    assert r.id == "j1" and r.status == "output_limit" and r.exit_code == 137 and r.signal == 9
    assert r.truncated and r.stdout_truncated and not r.stderr_truncated
    assert r.files == {"out/a.txt": b"hello", "out/b.bin": b"\xff\x00"}
    assert r.raw == raw and r.batch == "b1" and r.watchdog_overshoot_us == 12
    assert not r.ok and "output_limit" in r.describe()


def test_result_parsing_is_strict() -> None:
    with pytest.raises(ProtocolError, match="status"):
        Result.from_dict({"id": "x", "exit_code": 0})
    with pytest.raises(ProtocolError, match="exit_code"):
        Result.from_dict({"id": "x", "status": "ok"})
    with pytest.raises(ProtocolError, match="exit_code"):
        Result.from_dict({"id": "x", "status": "ok", "exit_code": True})
    with pytest.raises(ProtocolError, match="base64"):
        Result.from_dict(result_for({"id": "x"}, files={"a": {"b64": "!!"}}))
    with pytest.raises(ProtocolError, match="JSON"):
        Result.from_json("{nope")


def test_format_result() -> None:
    ok = Result.from_dict(result_for({"id": "a"}, stdout="42\n"))
    assert format_result(ok) == "42"
    bad = Result.from_dict(result_for({"id": "a"}, status="failed", exit_code=1, stderr="Traceback...\nValueError\n"))
    assert format_result(bad) == "Traceback...\nValueError\n[status: failed, exit code 1]"
    to = Result.from_dict(result_for({"id": "a"}, status="timeout", exit_code=124, timed_out=True))
    assert format_result(to, timeout_ms=500) == "[status: timeout after 500 ms, exit code 124]"
    assert format_result(Result.from_dict(result_for({"id": "a"}))) == "[no output]"


# -- the sync client over the fake server ----------------------------------------------------


def test_sync_framing_and_reuse(fake: FakeDaemon) -> None:
    fb = Forkbox(socket=fake.path)
    r1 = fb.run("first", env={"A": "1"})
    r2 = fb.run(argv=["x", "y"])
    assert r1.stdout == "first" and r2.stdout == "['x', 'y']"
    assert fake.connections == 1  # the connection was reused
    line = fake.raw_lines[0]
    assert b"\n" not in line and json.loads(line)["env"] == {"A": "1"}
    assert "stream" not in fake.requests[0]
    assert fake.requests[0]["id"] == r1.id and r1.id != r2.id
    fb.close()


def test_sync_rejection_carries_reason(fake: FakeDaemon) -> None:
    fb = Forkbox(socket=fake.path)
    with pytest.raises(JobRejected) as e:
        fb.run("reject")
    assert e.value.reason == "cmd: rejected by the fake daemon"
    assert e.value.result is not None and e.value.result.exit_code == 125
    assert fb.run("after").stdout == "after"  # the connection stays usable
    assert fake.connections == 1


def test_sync_streaming_events(fake: FakeDaemon) -> None:
    events: List[Tuple[str, str]] = []
    r = Forkbox(socket=fake.path).run("stream", on_output=lambda s, d: events.append((s, d)))
    assert events == [("stdout", "a"), ("stderr", "oops"), ("stdout", "b")]
    assert r.stdout == "ab" and fake.requests[0]["stream"] is True


def test_sync_client_timeout_and_recovery(fake: FakeDaemon) -> None:
    fb = Forkbox(socket=fake.path)
    with pytest.raises(Timeout):
        fb.run("hang", wait_timeout=0.2)
    # The timed-out connection was dropped; the next call opens a fresh one.
    assert fb.run("next").stdout == "next"
    assert fake.connections == 2


def test_sync_protocol_violations(fake: FakeDaemon) -> None:
    fb = Forkbox(socket=fake.path)
    with pytest.raises(ProtocolError, match="someone-else"):
        fb.run("wrong-id")
    with pytest.raises(ProtocolError, match="not JSON"):
        fb.run("garbage")
    with pytest.raises(ConnectionLost):
        fb.run("close")
    assert fb.run("fine").stdout == "fine"


def test_sync_reconnects_after_daemon_drops_idle_connections(fake: FakeDaemon) -> None:
    fb = Forkbox(socket=fake.path)
    assert fb.run("one").stdout == "one"
    fake.drop_connections()
    assert wait_for(lambda: True)
    assert fb.run("two").stdout == "two"
    assert fake.connections == 2


def test_sync_threads_get_their_own_answers(fake: FakeDaemon) -> None:
    fb = Forkbox(socket=fake.path, max_connections=8)
    out: dict = {}

    def work(i: int) -> None:
        out[i] = fb.run(f"job-{i}", env={"DELAY": "0.01"}).stdout

    threads = [threading.Thread(target=work, args=(i,)) for i in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == {i: f"job-{i}" for i in range(100)}
    assert fake.connections <= 8


def test_daemon_not_running_names_the_command(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.sock")
    with pytest.raises(DaemonNotRunning) as e:
        Forkbox(socket=path).run("true")
    assert f"forkbox daemon --socket {path}" in str(e.value)
    # A stale socket file (nobody listening) is reported the same way.
    stale = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)
    s.close()
    with pytest.raises(DaemonNotRunning, match="stale"):
        Forkbox(socket=stale).run("true")


def test_module_run_uses_the_shared_instance(fake: FakeDaemon) -> None:
    import forkbox

    Forkbox.set_default(Forkbox(socket=fake.path))
    try:
        assert forkbox.run("shared").stdout == "shared"
        assert Forkbox.default().socket_path == fake.path
        assert forkbox.run_job({"cmd": "raw", "stdin": b"\xff"}).stdout == "raw"
        assert fake.requests[-1]["stdin"] == {"b64": "/w=="}
        # The class-level spelling still works, on the same shared client, and says it is old.
        with pytest.warns(DeprecationWarning, match=r"Forkbox\.run\(\.\.\.\) on the class .* forkbox\.run\("):
            assert Forkbox.run("class-level").stdout == "class-level"
        with pytest.warns(DeprecationWarning, match="forkbox.run_job"):
            assert Forkbox.run_job({"cmd": "class-raw"}).stdout == "class-raw"
        assert fake.connections == 1
    finally:
        Forkbox.set_default(None)


def test_code_interpreter_builds_a_python_job(fake: FakeDaemon) -> None:
    run = code_interpreter(timeout_ms=1500, client=Forkbox(socket=fake.path))
    assert run.__name__ == "python" and run.__doc__
    run("print(1)")
    job = fake.requests[-1]
    assert job["argv"] == ["python3", "main.py"] and job["files"] == {"main.py": "print(1)"}
    assert job["timeout_ms"] == 1500


# -- the asyncio client over the fake server -------------------------------------------------


def test_async_pipelined_out_of_order(fake: FakeDaemon) -> None:
    async def main() -> List[str]:
        async with AsyncForkbox(socket=fake.path) as fb:
            # Earlier requests sleep longer, so the answers come back in reverse order.
            coros = [fb.run(f"job-{i}", env={"DELAY": str((100 - i) / 2000)}) for i in range(100)]
            return [r.stdout for r in await asyncio.gather(*coros)]

    assert asyncio.run(main()) == [f"job-{i}" for i in range(100)]
    assert fake.connections == 1


def test_async_errors(fake: FakeDaemon, tmp_path: Path) -> None:
    async def main() -> None:
        fb = AsyncForkbox(socket=fake.path)
        with pytest.raises(JobRejected, match="rejected by the fake daemon"):
            await fb.run("reject")
        with pytest.raises(Timeout):
            await fb.run("hang", wait_timeout=0.2)
        events: List[Tuple[str, str]] = []
        r = await fb.run("stream", on_output=lambda s, d: events.append((s, d)))
        assert r.stdout == "ab" and len(events) == 3
        # A dropped connection fails the waiting call and the next one reconnects.
        waiting = asyncio.ensure_future(fb.run("hang", wait_timeout=5))
        await asyncio.sleep(0.1)
        fake.drop_connections()
        with pytest.raises(ConnectionLost):
            await waiting
        assert (await fb.run("again")).stdout == "again"
        await fb.aclose()
        with pytest.raises(DaemonNotRunning, match="forkbox daemon --socket"):
            await AsyncForkbox(socket=str(tmp_path / "none.sock")).run("true")

    asyncio.run(main())


def test_async_client_survives_a_new_event_loop(fake: FakeDaemon) -> None:
    fb = AsyncForkbox(socket=fake.path)
    assert asyncio.run(fb.run("a")).stdout == "a"
    assert asyncio.run(fb.run("b")).stdout == "b"
