"""A session's fork against a real `forkbox worker`: the branches are Session objects with
the parent's state, each its own; the async twin; per-branch errors surfaced; and the
best-of-n example."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from conftest import SDK_DIR
from forkbox import Queue, Session, SessionCallError, SessionForkError
from forkbox.aio import AsyncSession
from forkbox.session import fork_outcome


@pytest.mark.real
def test_fork_gives_sessions_with_the_parents_state_each_its_own(worker: str) -> None:
    q = Queue(worker)
    with Session(q, ttl_s=300) as s:
        s.files.write("notes.txt", "parent\n")
        s.run_code("x = 41\nimport socket\npair = socket.socketpair()")
        kids = s.fork(2)
        try:
            assert len(kids) == 2 and len({k.id for k in kids} | {s.id}) == 3
            for k in kids:
                assert k.parent == s.id and k.node == s.node
                assert any("socket:[" in n for n in k.not_carried), k.not_carried
                assert k.run_code("x + 1").text == "42"
                assert k.files.read("notes.txt") == b"parent\n"
            kids[0].run_code("x = 0")
            kids[0].files.write("notes.txt", "kid\n")
            assert kids[1].run_code("x").text == "41" and s.run_code("x").text == "41"
            assert s.files.read("notes.txt") == b"parent\n"
            assert kids[1].info().raw.get("parent") == s.id
            assert s.info().raw.get("children") == [k.id for k in kids]
        finally:
            for k in kids:
                k.kill()


@pytest.mark.real
def test_a_fork_past_the_nodes_capacity_says_how_many_it_could_make(worker: str) -> None:
    with Session(Queue(worker), ttl_s=120) as s:
        with pytest.raises(SessionCallError, match=r"can make \d+ of the 16 branches"):
            s.fork(16)
        assert s.run_code("1 + 1").text == "2"


@pytest.mark.real
def test_the_async_twin_forks_too(worker: str) -> None:
    async def go() -> None:
        async with AsyncSession.create("default", redis=worker, ttl_s=120) as s:
            await s.run_code("y = 6 * 7")
            kids = await s.fork(1)
            assert [k.parent for k in kids] == [s.id]
            assert (await kids[0].run_code("y")).text == "42"
            await kids[0].kill()
            await kids[0].close()
        await s.close()

    asyncio.run(go())


def test_a_branch_that_failed_is_surfaced_with_the_ones_made() -> None:
    r = {
        "ok": True,
        "branches": [
            {"ok": True, "id": "k1", "not_carried": ["fd 7: socket:[1]"]},
            {"ok": False, "error": "the twin copy: over the twin's limit"},
        ],
    }
    made, errors = fork_outcome("p", r)
    assert made == [("k1", ["fd 7: socket:[1]"])]
    assert errors == ["the twin copy: over the twin's limit"]
    e = SessionForkError("p", ["k1"], errors)
    assert "1 of 2 branches not made" in str(e) and e.sessions == ["k1"]


@pytest.mark.real
def test_the_best_of_n_example_keeps_the_fix_that_passes(worker: str) -> None:
    env = dict(os.environ, FORKBOX_REDIS_URL=worker)
    p = subprocess.run(
        [sys.executable, str(SDK_DIR / "examples" / "session_best_of_n.py")], env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    assert "kept: average the middle two (199/199)" in p.stdout, p.stdout
    assert "parent still: " in p.stdout and "parent still: 199/" not in p.stdout, p.stdout
