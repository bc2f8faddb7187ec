"""What a session client decides alone: argument checks, the create job, event parsing and
the errors the node's answers map to (no node, no Redis)."""

from __future__ import annotations

import json
from typing import Any, List, Tuple

import pytest

import forkbox
from forkbox import (
    ForkboxError,
    JobRejected,
    Limits,
    SessionBusy,
    SessionCallError,
    SessionCapacity,
    SessionEnded,
    SessionLost,
    SessionNotFound,
)
from forkbox.session import CallState, check_ok, check_path, create_job, exec_fields, opened, session_error, state_of


def job(**kw: Any) -> dict:
    base: dict = dict(ttl_s=None, idle_s=None, limits=None, flat_limits={}, env=None, files=None, network=None, runtime="python", result_ttl_s=None)
    base.update(kw)
    return create_job("s1", **base)


def test_create_job_carries_the_session_object_and_the_job_fields() -> None:
    j = job(ttl_s=600, idle_s=120, limits=Limits(memory_mb=256), flat_limits={"pids": 32}, env={"A": "1"},
            files={"a.bin": b"\xff", "b.txt": "hi"}, network="loopback")  # fmt: skip
    assert j == {
        "id": "s1",
        "session": {"ttl_s": 600, "idle_s": 120},
        "limits": {"memory_mb": 256, "pids": 32},
        "env": {"A": "1"},
        "files": {"a.bin": {"b64": "/w=="}, "b.txt": "hi"},
        "network": "loopback",
        "runtime": "python",
    }
    assert "cmd" not in j and "argv" not in j and "timeout_ms" not in j


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(ttl_s=0), "ttl_s must be a positive whole number"),
        (dict(idle_s=1.5), "idle_s must be a positive whole number"),
        (dict(limits={"memory_mb": 0}), "limits.memory_mb: must be between"),
        (dict(network="internet"), "network: unknown variant `internet`"),
        (dict(files={"../x": "a"}), "files.../x: '..' is not allowed"),
    ],
)
def test_create_job_refuses_bad_arguments_naming_them(kw: dict, message: str) -> None:
    with pytest.raises((ValueError, JobRejected), match=message.replace(".", r"\.").replace("(", r"\(")):
        job(**kw)


def test_an_unknown_limit_keyword_is_a_type_error_naming_the_limits() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'memory'.*memory_mb"):
        job(flat_limits={"memory": 5})


def test_session_id_must_follow_the_job_id_rule() -> None:
    with pytest.raises(ValueError, match="printable ASCII"):
        create_job("has space", ttl_s=None, idle_s=None, limits=None, flat_limits={}, env=None, files=None,
                   network=None, runtime=None, result_ttl_s=None)  # fmt: skip


def test_session_keywords_are_checked_before_anything_is_sent() -> None:
    with pytest.raises(TypeError, match="memory_mb"):
        forkbox.Session("q", redis="redis://127.0.0.1:1", memory=5)  # no server there: refused first


@pytest.mark.parametrize("path", ["a.txt", "d/e/f", "/work", "/work/x", "./x"])
def test_paths_under_work_pass(path: str) -> None:
    assert check_path(path, "t") == path


@pytest.mark.parametrize("path, why", [("", "empty"), ("/etc/passwd", "outside /work"), ("a/../../b", "'..'"), ("/workx", "outside")])
def test_paths_elsewhere_are_refused_naming_the_path(path: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_path(path, "files.read")


def test_exec_fields() -> None:
    assert exec_fields("echo hi", None, None, None) == {"cmd": "echo hi"}
    assert exec_fields(["ls", "-l"], b"\xff", {"K": "v"}, "sub") == {"argv": ["ls", "-l"], "stdin": {"b64": "/w=="}, "env": {"K": "v"}, "cwd": "sub"}
    with pytest.raises(ValueError, match="empty"):
        exec_fields("  ", None, None, None)
    with pytest.raises(ValueError, match="argv"):
        exec_fields([], None, None, None)
    with pytest.raises(ValueError, match="env"):
        exec_fields("true", None, {"A=B": "x"}, None)
    with pytest.raises(TypeError, match="shell string or an argv list"):
        exec_fields(b"ls", None, None, None)  # type: ignore[arg-type]


def entries(*events: dict) -> List[Tuple[bytes, dict]]:
    return [(f"{i}-0".encode(), {b"event": json.dumps(e).encode()}) for i, e in enumerate(events, 1)]


def test_events_stream_to_the_callbacks_in_order_then_the_result() -> None:
    seen: List[Tuple[str, str]] = []
    call = CallState("s1", "run_code", {"code": "print(1)"}, 5000, lambda d: seen.append(("out", d)), lambda d: seen.append(("err", d)))
    body = json.loads(call.json)
    assert body == {"id": call.id, "session": "s1", "op": "run_code", "code": "print(1)", "timeout_ms": 5000}
    assert call.feed(entries({"kind": "stdout", "data": "a"}, {"kind": "stderr", "data": "b"})) is None
    assert call.after == b"2-0"
    done = call.feed(entries({"kind": "stdout", "data": "c"}, {"kind": "result", "ok": True, "execution_count": 3, "text": "1"}))
    assert seen == [("out", "a"), ("err", "b"), ("out", "c")]
    assert done is not None and call.outcome()["execution_count"] == 3


@pytest.mark.parametrize(
    "event, exc, reason",
    [
        ({"kind": "error", "error": "session ended: killed", "reason": "session_ended"}, SessionEnded, "killed"),
        ({"kind": "error", "error": "session ended: idle (no call for 120 s)", "reason": "session_ended"}, SessionEnded, "idle"),
        ({"kind": "error", "error": "session lost: node n1 stopped answering", "reason": "session_lost"}, SessionLost, "lost"),
        ({"kind": "error", "error": "session busy: 64 calls queued", "reason": "busy"}, SessionBusy, "busy"),
        ({"kind": "error", "error": "op: unknown variant", "reason": "invalid"}, SessionCallError, "op: unknown variant"),
    ],
)
def test_terminal_errors_map_to_exceptions_naming_the_session(event: dict, exc: type, reason: str) -> None:
    call = CallState("s1", "exec", {"cmd": "true"}, None)
    call.feed(entries(event))
    with pytest.raises(exc) as info:
        call.outcome()
    assert info.value.reason == reason
    assert "s1" in str(info.value)
    assert isinstance(info.value, ForkboxError)


def test_script_refusals_map_to_exceptions() -> None:
    assert isinstance(session_error("s", "unknown session"), SessionNotFound)
    e = session_error("s", "session ended: ttl")
    assert isinstance(e, SessionEnded) and e.reason == "ttl" and str(e) == "session s ended: ttl (session ended: ttl)"
    lost = session_error("s", "session lost: node N stopped answering")
    assert isinstance(lost, SessionLost) and "node N stopped answering" in str(lost)


def test_a_malformed_event_is_a_protocol_error() -> None:
    call = CallState("s1", "info", {}, None)
    with pytest.raises(forkbox.ProtocolError, match="unknown event kind"):
        call.feed(entries({"kind": "weird"}))
    with pytest.raises(forkbox.ProtocolError, match="not JSON"):
        call.feed([(b"9-0", {b"event": b"{"})])


def test_operation_failures_raise_but_run_code_and_exec_outcomes_return() -> None:
    with pytest.raises(SessionCallError, match="files_read failed: no such file: a.txt"):
        check_ok("s", "files_read", {"ok": False, "error": "no such file: a.txt"})
    r = {"ok": False, "error": None, "execution_count": 2, "exception": {"name": "ValueError", "value": "x", "traceback": []}}
    assert check_ok("s", "run_code", r) is r
    e = {"ok": False, "exit_code": 3, "error": None}
    assert check_ok("s", "exec", e) is e
    with pytest.raises(SessionCallError, match="cwd"):
        check_ok("s", "exec", {"ok": False, "error": "cwd: /etc is outside /work"})


def test_the_create_result() -> None:
    ok = {"id": "s", "status": "ok", "session": {"id": "s", "node": "n1", "expires_ms": 5, "idle_s": 60, "runtime": {"name": "python", "warm": True}}}
    got = opened("s", json.dumps(ok))
    assert (got.node, got.expires_ms, got.idle_s, got.runtime["warm"]) == ("n1", 5, 60, True)
    full = {"id": "s", "status": "error", "error": "session capacity: 8 of 8 sessions live on node N (--max-sessions)"}
    with pytest.raises(SessionCapacity, match="8 of 8 sessions"):
        opened("s", json.dumps(full))
    with pytest.raises(JobRejected, match="cmd"):
        opened("s", json.dumps({"id": "s", "status": "invalid", "error": "cmd: a session has no program"}))


def test_connect_reads_the_hash_state() -> None:
    info = state_of("s", {b"node": b"n1", b"state": b"live", b"expires_ms": b"123", b"runtime": b"python"})
    assert (info.node, info.expires_ms, info.runtime) == ("n1", 123, "python")
    with pytest.raises(SessionEnded, match="killed"):
        state_of("s", {b"node": b"n1", b"state": b"ended", b"reason": b"killed"})
    with pytest.raises(SessionNotFound):
        state_of("s", {})


def test_timeouts_are_checked() -> None:
    from forkbox.session import _seconds_to_ms, _timeout_fields

    assert _seconds_to_ms("timeout", 1.5) == 1500
    with pytest.raises(ValueError, match="positive"):
        _seconds_to_ms("timeout", 0)
    with pytest.raises(ValueError, match="ttl_s and/or idle_s"):
        _timeout_fields(None, None)


def test_the_call_scripts_answers() -> None:
    from forkbox.session import call_args, call_keys, script_reply

    assert script_reply("s", [b"ok", b"1-0"]) is None
    assert script_reply("s", [b"moved", b"the session is on node n2"]) == "n2"
    with pytest.raises(SessionNotFound):
        script_reply("s", [b"unknown", b"unknown session"])
    with pytest.raises(SessionEnded) as ended:
        script_reply("s", [b"ended", b"session ended: idle"])
    assert ended.value.reason == "idle"
    with pytest.raises(SessionLost, match="node n1 stopped answering"):
        script_reply("s", [b"lost", b"session lost: node n1 stopped answering"])
    with pytest.raises(forkbox.ProtocolError):
        script_reply("s", b"OK")
    keys = call_keys("q", "s1", "n1", "c1")
    assert all("{q}" in k for k in keys) and keys[0].endswith(":s1") and keys[3].endswith(":c1")
    assert call_args("{}", "n1", "s1")[:3] == ["{}", "n1", forkbox.session.CALLS_MAXLEN]


def test_an_ended_event_without_a_known_reason_says_ended() -> None:
    e = session_error("s", "session ended: session s is not live on node n", "session_ended")
    assert isinstance(e, SessionEnded) and e.reason == "ended" and "not live on node n" in str(e)
