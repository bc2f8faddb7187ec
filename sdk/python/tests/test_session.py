"""Sessions against a real `forkbox worker` and a real Redis: state, streaming, exec, files,
timeouts, interrupts, ends, the async twin, a node that dies, and the framework examples."""

from __future__ import annotations

import asyncio
import json
import importlib.util
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import pytest

from conftest import REPO_ROOT, SDK_DIR, Proc, tail
from forkbox import (
    CommandResult,
    Execution,
    Queue,
    Session,
    SessionCallError,
    SessionCapacity,
    SessionBusy,
    SessionEnded,
    SessionLost,
    SessionNotFound,
)
from forkbox.aio import AsyncSession
from forkbox.session import call_args, call_keys

pytestmark = pytest.mark.real


@pytest.fixture
def q(worker: str) -> Queue:
    return Queue(worker)


@pytest.fixture
def s(q: Queue) -> Iterator[Session]:
    with Session(q, ttl_s=300, idle_s=120) as session:
        yield session


def test_state_persists_between_calls(s: Session) -> None:
    first = s.run_code("x = 41\nimport sys")
    assert first.text is None and first.exception is None and first.execution_count == 1
    second = s.run_code("x + 1")
    assert (second.text, second.data.get("text/plain"), second.execution_count) == ("42", "42", 2)


def test_an_exception_names_the_cell_and_the_session_stays(s: Session) -> None:
    ex = s.run_code("def f(v):\n    return 1 / v\n\nf(0)")
    assert ex.exception is not None
    assert (ex.exception.name, ex.exception.value) == ("ZeroDivisionError", "division by zero")
    tb = "".join(ex.exception.traceback)
    assert "<cell 1>" in tb and "return 1 / v" in tb, tb
    assert s.run_code("f(2)").text == "0.5"


def test_output_streams_to_the_callbacks_in_order(s: Session) -> None:
    seen: List[Tuple[str, Any]] = []
    code = (
        "import sys, time\n"
        "for i in range(3):\n"
        "    print('out', i, flush=True)\n"
        "    print('err', i, file=sys.stderr, flush=True)\n"
        "    time.sleep(0.3)\n"
    )
    ex = s.run_code(
        code,
        on_stdout=lambda d: seen.append(("out", d)),
        on_stderr=lambda d: seen.append(("err", d)),
        on_result=lambda e: seen.append(("result", e)),
    )
    outs = [d for k, d in seen if k == "out"]
    assert len(outs) >= 2, seen  # streamed as it came, not in one piece at the end
    assert "".join(outs) == "out 0\nout 1\nout 2\n" == ex.stdout
    assert "".join(d for k, d in seen if k == "err") == "err 0\nerr 1\nerr 2\n" == ex.stderr
    assert seen[-1] == ("result", ex) and isinstance(ex, Execution)


def test_exec_runs_commands_in_the_session(s: Session) -> None:
    r = s.exec("echo hi; echo oops >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "hi\n", "oops\n", False)
    assert s.exec(["sh", "-c", "cat; echo $K"], stdin=b"in\n", env={"K": "v"}).stdout == "in\nv\n"
    s.exec("mkdir -p sub && echo there > sub/f")
    assert s.exec("cat f", cwd="sub").stdout == "there\n"
    killed = s.exec("kill -9 $$")
    assert killed.signal == signal.SIGKILL and not killed.ok, killed
    chunks: List[str] = []
    s.exec("echo a; sleep 0.3; echo b", on_stdout=chunks.append)
    assert "".join(chunks) == "a\nb\n"


def test_exec_timeout(s: Session) -> None:
    r = s.exec("echo started; sleep 30", timeout=1)
    assert isinstance(r, CommandResult) and r.timed_out and r.stdout == "started\n", r
    assert s.exec("echo still here").stdout == "still here\n"


def test_files(s: Session) -> None:
    s.files.write("a.txt", "hello")
    s.files.write("deep/er/b.bin", b"\xff\x00\x01")
    s.files.write_tree({"t/one.txt": "1", "t/two.txt": b"2"})
    assert s.files.read("a.txt") == b"hello"
    assert s.files.read("/work/deep/er/b.bin") == b"\xff\x00\x01"
    assert s.run_code("open('t/one.txt').read() + open('t/two.txt').read()").text == "'12'"
    listing = {e.name: e for e in s.files.list("t")}
    assert set(listing) == {"one.txt", "two.txt"} and listing["one.txt"].type == "file" and listing["one.txt"].size == 1
    assert {e.name: e.type for e in s.files.list()}["deep"] == "dir"
    s.files.remove("t")
    assert "t" not in {e.name for e in s.files.list()}
    with pytest.raises(SessionCallError, match="a-missing-file") as info:
        s.files.read("a-missing-file")
    assert s.id in str(info.value)


def test_a_timeout_leaves_the_session_usable(s: Session) -> None:
    ex = s.run_code("y = 5\nimport time\ntime.sleep(60)", timeout=1)
    assert ex.timed_out and not ex.state_lost, ex
    assert s.run_code("y").text == "5"


def test_interrupt_from_another_thread_keeps_the_state(s: Session) -> None:
    started = threading.Event()

    def on_stdout(data: str) -> None:
        if "looping" in data:
            started.set()

    def interrupter() -> None:
        if started.wait(60):
            s.interrupt()

    t = threading.Thread(target=interrupter)
    t.start()
    ex = s.run_code("z = 7\nimport time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.05)", timeout=120, on_stdout=on_stdout)
    t.join()
    assert ex.interrupted and ex.exception is not None and ex.exception.name == "KeyboardInterrupt", ex
    assert s.run_code("z * 6").text == "42"


def test_a_dead_interpreter_is_replaced_and_said_so(s: Session) -> None:
    s.run_code("w = 1")
    ex = s.run_code("import os\nos._exit(3)")
    assert ex.state_lost, ex
    fresh = s.run_code("'w' in globals()")
    assert (fresh.text, fresh.execution_count) == ("False", 1)


def test_kill_then_a_call_raises_session_ended(q: Queue) -> None:
    s = Session(q, ttl_s=60)
    s.kill()
    with pytest.raises(SessionEnded) as info:
        s.run_code("1")
    assert info.value.reason == "killed" and s.id in str(info.value)
    with pytest.raises(SessionEnded):
        Session.connect(s.id, q)
    s.kill()  # ending an ended session is no error


def test_connect_list_info_and_set_timeout(s: Session, q: Queue) -> None:
    s.run_code("shared = 'yes'")
    other = Session.connect(s.id, q)
    assert other.node == s.node and other.run_code("shared").text == "'yes'"
    assert s.id in [i.id for i in Session.list(q)]
    info = s.info()
    assert (info.id, info.node, info.state) == (s.id, s.node, "live"), info
    before = info.expires_ms
    s.set_timeout(ttl_s=30, idle_s=20)
    after = s.info()
    assert after.idle_s == 20 and after.expires_ms is not None and before is not None and after.expires_ms < before
    with pytest.raises(SessionNotFound):
        Session.connect("no-such-session", q)


def test_info_reports_the_disk_used_beside_its_size(q: Queue) -> None:
    with Session(q, ttl_s=120, idle_s=60, disk_mb=24) as s:
        before = s.info()
        assert before.disk_mb == 24 and before.disk_bytes is not None, before.raw
        assert s.exec("head -c 3145728 /dev/zero > big.bin").exit_code == 0
        after = s.info()
        assert after.disk_mb == 24
        assert after.disk_bytes is not None and 3 << 20 <= after.disk_bytes - before.disk_bytes < 4 << 20, (before.raw, after.raw)


def test_a_call_past_the_waiting_ones_raises_session_busy(q: Queue) -> None:
    with Session(q, ttl_s=120, idle_s=60) as s:
        started = threading.Event()
        first: List[Execution] = []
        code = "import time\nprint('started', flush=True)\ntime.sleep(10)\n'done'"

        def run_first() -> None:
            first.append(s.run_code(code, timeout=60, on_stdout=lambda _: started.set()))

        runner = threading.Thread(target=run_first)
        runner.start()
        assert started.wait(30), "the first call never wrote its output"
        # 64 calls wait behind it, sent without waiting for their events.
        for i in range(64):
            cid = f"{s.id}-wait-{i}"
            call = json.dumps({"id": cid, "session": s.id, "op": "run_code", "code": str(i)})
            s._script(keys=call_keys(s._tag, s.id, s.node, cid), args=call_args(call, s.node, s.id))
        with pytest.raises(SessionBusy) as busy:
            s.run_code("'never runs'")
        assert busy.value.reason == "busy" and s.id in str(busy.value), busy.value
        runner.join(60)
        assert len(first) == 1 and (first[0].text, first[0].stdout, first[0].execution_count) == ("'done'", "started\n", 1), first
        # The waiting calls ran; the refused one did not.
        assert s.run_code("'after'").execution_count == 66


def test_the_async_twin(worker: str) -> None:
    async def go() -> None:
        async with AsyncSession.create(redis=worker, ttl_s=120) as s:
            assert (await s.run_code("a = [1, 2]")).exception is None
            chunks: List[str] = []
            ex = await s.run_code("a.append(3)\nprint(a, flush=True)\nsum(a)", on_stdout=chunks.append)
            assert (ex.text, "".join(chunks)) == ("6", "[1, 2, 3]\n")
            assert (await s.exec("echo $((6 * 7))")).stdout == "42\n"
            await s.files.write("n.txt", "9")
            assert await s.files.read("n.txt") == b"9"
            assert [e.name for e in await s.files.list()] == ["n.txt"]
            other = await AsyncSession.connect(s.id, redis=worker)
            assert (await other.run_code("len(a)")).text == "3"
            await other.close()
            sid = s.id
        with pytest.raises(SessionEnded):
            await AsyncSession.connect(sid, redis=worker)
        with pytest.raises(SessionEnded):
            await s.run_code("1")
        await s.close()

    asyncio.run(go())


def test_a_call_to_a_dead_node_raises_session_lost(forkbox_bin: Path, redis_url: str, tmp_root: Path) -> None:
    """The node is killed (no clean stop) during a call: the wait ends with SessionLost once
    its heartbeat expires, rather than hanging."""
    proc = Proc(
        "forkbox worker (to kill)",
        [str(forkbox_bin), "worker", "--redis", redis_url, "--queues", "doomed", "--slots", "1",
         "--visibility-timeout-ms", "3000", "--metrics-addr", "127.0.0.1:0"],
        tmp_root / "doomed-worker.log",
    )  # fmt: skip
    try:
        q = Queue(redis_url, "doomed")
        try:
            s = Session(q, ttl_s=120, create_timeout=60)
        except Exception:
            proc.fail("did not open a session")
            raise
        started = threading.Event()
        threading.Timer(0.0, lambda: started.wait(60) and os.killpg(proc.popen.pid, signal.SIGKILL)).start()
        with pytest.raises(SessionLost) as info:
            s.run_code("print('go', flush=True)\nimport time\ntime.sleep(600)", timeout=900,
                       on_stdout=lambda d: started.set())  # fmt: skip
        assert s.id in str(info.value) and s.node in str(info.value)
        with pytest.raises((SessionLost, SessionEnded)):
            s.run_code("1")
    finally:
        proc.stop()
        if proc.popen.returncode not in (None, 0, -9, 137):
            print(tail(proc.log), file=sys.stderr)


def test_a_node_at_its_session_limit_refuses_with_session_capacity(forkbox_bin: Path, redis_url: str, tmp_root: Path) -> None:
    proc = Proc(
        "forkbox worker (one session)",
        [str(forkbox_bin), "worker", "--redis", redis_url, "--queues", "onesession", "--slots", "1",
         "--max-sessions", "1", "--metrics-addr", "127.0.0.1:0"],
        tmp_root / "onesession-worker.log",
    )  # fmt: skip
    try:
        q = Queue(redis_url, "onesession")
        with Session(q, ttl_s=60, create_timeout=60):
            with pytest.raises(SessionCapacity) as info:
                Session(q, ttl_s=60, create_timeout=60)
            assert "1 of 1 sessions" in str(info.value) and "--max-sessions" in str(info.value), info.value
        with Session(q, ttl_s=60) as again:  # the slot is free once the first one ended
            assert again.run_code("2 + 2").text == "4"
    finally:
        proc.stop()


# -- the framework examples, each running its agent loop against the worker ------------------

AGENT_CLIENTS = REPO_ROOT / "target" / "agent-clients"


def missing_reason(package: str) -> str:
    note = AGENT_CLIENTS / f"{package}.missing"
    if note.is_file():
        return f"SKIPPED: {note.read_text().strip()}"
    return f"SKIPPED: {package} is not installed (make agent-clients, or pip install 'forkbox[agents]')"


@pytest.mark.parametrize(
    "script, module, package",
    [
        ("session_smolagents.py", "smolagents", "smolagents"),
        ("session_autogen.py", "autogen_core", "autogen-core"),
        ("session_langchain.py", "langchain_core", "langchain-core"),
    ],
)
def test_session_examples_run_their_agent_loop(worker: str, script: str, module: str, package: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(missing_reason(package))
    env = dict(os.environ, FORKBOX_REDIS_URL=worker)
    p = subprocess.run([sys.executable, str(SDK_DIR / "examples" / script)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{script} failed:\n{p.stdout}\n{p.stderr}"


def test_the_readme_sessions_example_runs_as_written(worker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (SDK_DIR / "README.md").read_text()
    section = text.split("## Sessions", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("FORKBOX_REDIS_URL", worker)
    exec(compile(code, "README.md (Sessions)", "exec"), {})
