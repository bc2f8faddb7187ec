"""The client's side of the session protocol on a real Redis with the contract's call script,
the session's record written as a node writes it, and no node behind it: what a client does
when the node is gone, or the session unknown or ended."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Iterator

import pytest

from forkbox import Queue, Session, SessionEnded, SessionLost, SessionNotFound
from forkbox.session import _schema_key

pytestmark = pytest.mark.real


@pytest.fixture
def q(redis_url: str) -> Iterator[Queue]:
    yield Queue(redis_url, "sess-" + uuid.uuid4().hex[:8])


def record(q: Queue, node: str, **fields: str) -> str:
    """A live session's record, as session_open.lua leaves it."""
    sid = "s-" + uuid.uuid4().hex[:8]
    now = int(time.time() * 1000)
    q.redis.hset(_schema_key("session", q.name, sid=sid), mapping={
        "node": node, "state": "live", "created_ms": now, "expires_ms": now + 60_000, "idle_s": 60,
        "last_call_ms": now, "runtime": json.dumps({"name": "python", "warm": True}), **fields,
    })  # fmt: skip
    q.redis.zadd(_schema_key("sessions", q.name), {sid: now + 60_000})
    return sid


def test_a_wait_ends_with_session_lost_when_the_heartbeat_expires(q: Queue) -> None:
    """The call is sent while the node's heartbeat is alive; nothing answers it, and the
    heartbeat expires: the wait ends with SessionLost instead of waiting out the call."""
    node = "ghost-" + uuid.uuid4().hex[:6]
    sid = record(q, node)
    s = Session.connect(sid, q)
    heartbeat = _schema_key("worker", q.name, name=node)
    q.redis.set(heartbeat, "1", px=1500)
    # Without the heartbeat check this wait would end with Timeout, after 60 s and the slack.
    with pytest.raises(SessionLost) as info:
        s.run_code("1", timeout=60)
    assert sid in str(info.value) and node in str(info.value)
    # The call did reach the node's calls stream, and the session is now marked lost.
    calls = q.redis.xrange(_schema_key("calls", q.name, node=node))
    assert [json.loads(f[b"call"])["op"] for _, f in calls] == ["run_code"]
    fields = q.redis.hgetall(_schema_key("session", q.name, sid=sid))
    assert (fields[b"state"], fields[b"reason"]) == (b"ended", b"lost")
    assert q.redis.zscore(_schema_key("sessions", q.name), sid) is None
    with pytest.raises(SessionLost):
        Session.connect(sid, q)


def test_a_call_to_a_node_without_heartbeat_is_refused_as_lost(q: Queue) -> None:
    sid = record(q, "never-alive")
    s = Session.connect(sid, q)
    with pytest.raises(SessionLost, match="never-alive stopped answering"):
        s.exec("true")
    assert q.redis.xlen(_schema_key("calls", q.name, node="never-alive")) == 0


def test_unknown_and_ended_sessions(q: Queue) -> None:
    with pytest.raises(SessionNotFound):
        Session.connect("nobody", q)
    sid = record(q, "n1")
    s = Session.connect(sid, q)
    q.redis.hset(_schema_key("session", q.name, sid=sid), mapping={"state": "ended", "reason": "idle"})
    with pytest.raises(SessionEnded) as info:
        s.run_code("1")
    assert info.value.reason == "idle"
    s.kill()  # an ended session: nothing to do, no error
    q.redis.delete(_schema_key("session", q.name, sid=sid))
    with pytest.raises(SessionNotFound):
        s.files.read("a")


def test_a_moved_session_is_followed(q: Queue) -> None:
    """The record names another node than the client read: the client reads it again and
    sends there."""
    sid = record(q, "old-node")
    s = Session.connect(sid, q)
    q.redis.hset(_schema_key("session", q.name, sid=sid), "node", "new-node")
    with pytest.raises(SessionLost, match="new-node"):
        s.run_code("1")
    assert s.node == "new-node"


def test_list_reads_the_live_sessions(q: Queue) -> None:
    a, b = record(q, "n1"), record(q, "n2")
    got = {i.id: i for i in Session.list(q)}
    assert set(got) == {a, b}
    assert got[a].node == "n1" and got[a].state == "live" and got[a].runtime == {"name": "python", "warm": True}



def test_a_call_the_node_never_answers_ends_when_the_record_says_ended(q: Queue) -> None:
    """The node ends the session (its record says so) without answering a call sent just
    before: the wait ends with SessionEnded and the record's reason."""
    node = "n-" + uuid.uuid4().hex[:6]
    sid = record(q, node)
    q.redis.set(_schema_key("worker", q.name, name=node), "1", ex=120)
    s = Session.connect(sid, q)
    ender = threading.Timer(0.5, lambda: q.redis.hset(_schema_key("session", q.name, sid=sid), mapping={"state": "ended", "reason": "ttl"}))
    ender.start()
    # Without the record check this wait would end with Timeout after 30 s and the slack.
    with pytest.raises(SessionEnded) as info:
        s.run_code("1", timeout=30)
    ender.join()
    assert info.value.reason == "ttl" and sid in str(info.value)
    q.redis.delete(_schema_key("worker", q.name, name=node))
