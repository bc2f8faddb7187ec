"""A session's checkpoint and restore against a real `forkbox worker`: an agent breaks its
environment and undoes it with a restore; the checkpoint restores more than once and is listed
in the session's info; a dropped or unknown checkpoint is refused by name; the async twin."""

from __future__ import annotations

import asyncio

import pytest

from forkbox import Checkpoint, Queue, Session, SessionCallError
from forkbox.aio import AsyncSession
from forkbox.session import checkpoint_made, restored


@pytest.mark.real
def test_an_agent_that_breaks_its_environment_undoes_it_with_a_restore(worker: str) -> None:
    q = Queue(worker)
    with Session(q, ttl_s=300) as s:
        s.files.write("app/config.json", '{"debug": false}\n')
        s.run_code("import json\nconfig = json.load(open('app/config.json'))\nsteps = ['setup']")
        cp = s.checkpoint()
        assert isinstance(cp, Checkpoint) and cp.id.startswith(s.id + ".")
        assert cp.expires_ms is not None and cp.created_ms is not None and cp.expires_ms > cp.created_ms
        assert [c["id"] for c in s.info().raw["checkpoints"]] == [cp.id]
        # The agent breaks things: its variables, a file, an import.
        s.run_code("del config\nsteps.append('broken')\nimport sys\nsys.modules['json'] = None")
        s.exec("rm -rf app && echo junk > junk.txt")
        assert s.run_code("import json").exception is not None
        # Undo: a new session from the checkpoint.
        undo = cp.restore()
        again = cp.restore()
        try:
            assert undo.parent == s.id and undo.id not in (s.id, again.id)
            assert undo.run_code("config['debug'], steps").text == "(False, ['setup'])"
            assert undo.run_code("import json; json.dumps(1)").text == "'1'"
            assert undo.files.read("app/config.json") == b'{"debug": false}\n'
            assert [e.name for e in undo.files.list()].count("junk.txt") == 0
            info = undo.info().raw
            assert info["parent"] == s.id and info["made_by"] == "restore" and info["checkpoint"] == cp.id
            # Each restore is its own.
            undo.run_code("steps.append('undo')")
            assert again.run_code("steps").text == "['setup']"
        finally:
            undo.kill()
            again.kill()
        cp.delete()
        assert s.info().raw.get("checkpoints", []) == []
        with pytest.raises(SessionCallError, match=r"is unknown"):
            cp.restore()
        # The broken session itself is as it was left.
        assert s.run_code("steps").text == "['setup', 'broken']"


@pytest.mark.real
def test_a_checkpoint_of_a_session_without_the_warm_runtime_is_refused(worker: str) -> None:
    with Session(Queue(worker), ttl_s=120, runtime=None) as s:
        with pytest.raises(SessionCallError, match=r"warm python runtime"):
            s.checkpoint()


@pytest.mark.real
def test_the_async_twin_checkpoints_and_restores(worker: str) -> None:
    async def go() -> None:
        async with AsyncSession.create("default", redis=worker, ttl_s=120) as s:
            await s.run_code("y = 6 * 7")
            cp = await s.checkpoint(ttl_s=60)
            await s.run_code("y = 0")
            back = await cp.restore()
            assert back.parent == s.id
            assert (await back.run_code("y")).text == "42"
            await back.kill()
            await back.close()
            await cp.delete()
        await s.close()

    asyncio.run(go())


def test_the_results_are_read_and_checked() -> None:
    r = {"ok": True, "checkpoint": {"id": "s.ab", "created_ms": 1, "expires_ms": 2}}
    assert checkpoint_made("s", r) == ("s.ab", 1, 2)
    assert restored("s", {"ok": True, "id": "n", "not_carried": ["fd 7: socket:[1]"]}) == ("n", ["fd 7: socket:[1]"])
    from forkbox import ProtocolError

    with pytest.raises(ProtocolError):
        checkpoint_made("s", {"ok": True})
    with pytest.raises(ProtocolError):
        restored("s", {"ok": True})
