"""Sessions: a long-lived sandbox on one node, called again and again (docs/protocol.md,
"Sessions").

A session keeps its Python interpreter's state and its disk (``/work``) between calls, until
its lifetime (``ttl_s``) or idle timeout (``idle_s``) ends it, or :meth:`Session.kill`. It is
created by an ordinary job carrying a ``session`` object; each call then goes to the node that
holds it through Redis (``forkbox:{Q}:calls:<node>``) and its events come back on a stream of
its own (``forkbox:{Q}:call:<cid>``): output chunks as they come, then one terminal event.

A wait never hangs on a dead node: it blocks at most one second at a time and checks the
node's heartbeat in between, so a node that died is reported as :class:`SessionLost` within
its heartbeat's lifetime.

This module holds the sync :class:`Session` and what the async twin
(:class:`forkbox.aio.AsyncSession`) shares with it: the call and event shapes, their parsing
and the errors they map to. The key names and the call script come from ``schema.json``.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from ._schema import SCHEMA
from .errors import (
    ForkboxError,
    JobRejected,
    ProtocolError,
    SessionBusy,
    SessionCallError,
    SessionCapacity,
    SessionEnded,
    SessionError,
    SessionForkError,
    SessionLost,
    SessionNotFound,
    Timeout,
)
from .job import LIMIT_FIELDS, Data, Limits, encode_data, validate_job
from .redis_queue import Queue
from .result import decode_data

__all__ = [
    "CommandResult",
    "Execution",
    "ExecutionError",
    "FileEntry",
    "Session",
    "SessionFiles",
    "SessionInfo",
]

#: Called with one chunk of text, as the session's program writes it.
TextCallback = Callable[[str], None]

#: The contract's session settings (``schema.json`` ``sessions``).
_SESSIONS: Dict[str, Any] = SCHEMA.get("sessions") or {}
_DEFAULTS: Dict[str, Any] = _SESSIONS.get("defaults") or {}

#: How long one blocking read of a call's events lasts at most, before the heartbeat check.
SLICE_S = min(1.0, _DEFAULTS.get("wait_slice_ms", 1000) / 1000)

#: A call's own timeout when none is given (the node's default too).
DEFAULT_CALL_TIMEOUT_S = _DEFAULTS.get("call_timeout_ms", 30000) / 1000

#: Past a call's timeout, how long the client waits for the node's answer before it gives up
#: with :class:`Timeout` (the node itself ends an unresponsive session after its backstop).
CALL_SLACK_S = 30.0 + _DEFAULTS.get("backstop_grace_ms", 5000) / 1000

#: The calls stream's approximate cap (``XADD ... MAXLEN ~``).
CALLS_MAXLEN: int = _DEFAULTS.get("calls_maxlen", 10000)

#: The runtime a session gets when none is named: the warm interpreter serves ``run_code``.
DEFAULT_SESSION_RUNTIME = "python"

_OPS = ("run_code", "exec", "files_write", "files_read", "files_list", "files_remove", "interrupt", "set_timeout", "kill", "info", "fork", "checkpoint", "restore", "drop_checkpoint")


# -- the contract's names ---------------------------------------------------------------------


def _schema_key(which: str, tag: str, **parts: str) -> str:
    template = SCHEMA["keys"].get(which) or (_SESSIONS.get("keys") or {}).get(which)
    if not isinstance(template, str):
        raise ForkboxError(
            f"this forkbox package's schema.json has no `{which}` key: it predates sessions; "
            "install a forkbox SDK built with session support"
        )
    out = template.replace("{Q}", "{" + tag + "}", 1)
    for part, value in parts.items():
        out = out.replace(f"<{part}>", value)
    return out


def call_keys(tag: str, sid: str, node: str, cid: str) -> List[str]:
    """KEYS of the call script: the session's hash, its node's calls stream and heartbeat, the
    call's event stream, the live sessions."""
    return [
        _schema_key("session", tag, sid=sid),
        _schema_key("calls", tag, node=node),
        _schema_key("worker", tag, name=node),
        _schema_key("call", tag, cid=cid),
        _schema_key("sessions", tag),
    ]


def call_args(call_json: str, node: str, sid: str) -> List[Any]:
    """ARGV of the call script: the call JSON (``""`` checks the session alone), the node read
    from the session's hash, the calls stream's cap, now (ms), the session id, and how long an
    ended session's record lives when it does not say."""
    return [call_json, node, CALLS_MAXLEN, int(time.time() * 1000), sid, SCHEMA["defaults"]["result_ttl_s"]]


def _session_call_lua() -> str:
    script = SCHEMA["scripts"].get("session_call")
    if not isinstance(script, str):
        raise ForkboxError(
            "this forkbox package's schema.json has no session_call script: it predates "
            "sessions; install a forkbox SDK built with session support"
        )
    return script


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _check_id(what: str, value: Any) -> str:
    limit = SCHEMA["defaults"]["max_id_len"]
    if not isinstance(value, str) or not 1 <= len(value) <= limit or not all(33 <= ord(c) <= 126 for c in value):
        raise ValueError(f"{what} {value!r:.60}: must be 1 to {limit} printable ASCII characters without spaces")
    return value


def _seconds_to_ms(what: str, seconds: Optional[float]) -> Optional[int]:
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, got {seconds!r:.40}")
    ms = max(1, int(round(seconds * 1000)))
    top = SCHEMA["defaults"]["max_timeout_ms"]
    if ms > top:
        raise ValueError(f"{what} must be at most {top // 1000} s, got {seconds}")
    return ms


def _positive_int(what: str, value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive whole number of seconds, got {value!r:.40}")
    return value


# -- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecutionError:
    """The exception a ``run_code`` cell raised: its class name, its ``str`` and the traceback
    lines (naming ``<cell N>`` and the cell's own lines)."""

    name: str
    value: str
    traceback: List[str] = field(default_factory=list)

    def __str__(self) -> str:
        tb = "".join(line if line.endswith("\n") else line + "\n" for line in self.traceback)
        return tb.rstrip("\n") if tb else f"{self.name}: {self.value}"


@dataclass(frozen=True)
class Execution:
    """What one ``run_code`` call did. ``text`` is the ``repr`` of the cell's last expression
    (None without one); ``data`` its rich forms by MIME type (``text/plain``, ``text/html``,
    ``image/png`` base64). ``exception`` is set when the cell raised. ``state_lost`` says the
    interpreter died during the call (``os._exit``, a crash, out of memory): a fresh one now
    serves the session and ``execution_count`` starts again at 1."""

    text: Optional[str]
    data: Dict[str, str]
    exception: Optional[ExecutionError]
    stdout: str
    stderr: str
    execution_count: int
    state_lost: bool = False
    timed_out: bool = False
    interrupted: bool = False
    ok: bool = True
    error: Optional[str] = None
    wall_ms: Optional[float] = None
    cpu_ms: Optional[float] = None
    session_memory_kb: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def error_text(self) -> Optional[str]:
        """The exception as a model reads it (traceback, or ``Name: value``), else None."""
        return None if self.exception is None else str(self.exception)


@dataclass(frozen=True)
class CommandResult:
    """What one ``exec`` call did: exit code (or the signal that ended it) and its output."""

    exit_code: Optional[int]
    signal: Optional[int]
    stdout: str
    stderr: str
    timed_out: bool = False
    wall_ms: Optional[float] = None
    cpu_ms: Optional[float] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class FileEntry:
    """One entry of a directory listing: ``type`` is ``file``, ``dir`` or ``link``."""

    name: str
    type: str
    size: int


@dataclass(frozen=True)
class SessionInfo:
    """A session's record: its node, state (``starting``, ``live``, ``ended``), why it ended,
    its deadlines (Unix ms), and from :meth:`Session.info` the node's live figures: the bytes
    its disk (``/work``, ``/tmp``) holds, ``disk_bytes``, beside the disk's size in MiB,
    ``disk_mb``; memory, CPU, calls served and ``execution_count`` in ``raw``."""

    id: str
    node: str
    state: str
    reason: Optional[str]
    created_ms: Optional[int]
    expires_ms: Optional[int]
    idle_s: Optional[int]
    last_call_ms: Optional[int]
    runtime: Any
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    disk_bytes: Optional[int] = None
    disk_mb: Optional[int] = None

    @classmethod
    def from_fields(cls, sid: str, d: Mapping[str, Any]) -> SessionInfo:
        def num(name: str) -> Optional[int]:
            v = d.get(name)
            if v is None or v == "":
                return None
            try:
                return int(float(_text(v)))
            except ValueError:
                raise ProtocolError(f"session {sid}: field `{name}` is not a number: {v!r:.40}") from None

        def opt(name: str) -> Optional[str]:
            v = d.get(name)
            return None if v is None or v == "" else _text(v)

        runtime: Any = d.get("runtime")
        if isinstance(runtime, (bytes, str)):
            text = _text(runtime)
            try:
                runtime = json.loads(text) if text[:1] in "{[" else text
            except ValueError:
                runtime = text
        return cls(
            id=opt("id") or sid,
            node=opt("node") or "",
            state=opt("state") or "unknown",
            reason=opt("reason"),
            created_ms=num("created_ms"),
            expires_ms=num("expires_ms"),
            idle_s=num("idle_s"),
            last_call_ms=num("last_call_ms"),
            runtime=runtime,
            raw={_text(k): v if not isinstance(v, bytes) else _text(v) for k, v in d.items()},
            disk_bytes=num("disk_bytes"),
            disk_mb=num("disk_mb"),
        )


def _num(d: Mapping[str, Any], name: str) -> Optional[float]:
    v = d.get(name)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _execution(r: Mapping[str, Any]) -> Execution:
    exc = r.get("exception")
    error: Optional[ExecutionError] = None
    if isinstance(exc, Mapping):
        tb = exc.get("traceback") or []
        if isinstance(tb, str):
            tb = tb.splitlines()
        error = ExecutionError(name=str(exc.get("name", "")), value=str(exc.get("value", "")), traceback=[str(x) for x in tb])
    data = r.get("data") or {}
    if not isinstance(data, Mapping):
        raise ProtocolError(f"run_code result: `data` should be an object, got {data!r:.80}")
    count = r.get("execution_count")
    mem = r.get("session_memory_kb")
    return Execution(
        text=r.get("text") if isinstance(r.get("text"), str) else None,
        data={str(k): v if isinstance(v, str) else json.dumps(v) for k, v in data.items()},
        exception=error,
        stdout=str(r.get("stdout") or ""),
        stderr=str(r.get("stderr") or ""),
        execution_count=count if isinstance(count, int) else 0,
        state_lost=bool(r.get("state_lost")),
        timed_out=bool(r.get("timed_out")),
        interrupted=bool(r.get("interrupted")),
        ok=bool(r.get("ok", True)),
        error=r.get("error") if isinstance(r.get("error"), str) else None,
        wall_ms=_num(r, "wall_ms"),
        cpu_ms=_num(r, "cpu_ms"),
        session_memory_kb=mem if isinstance(mem, int) else None,
        raw=dict(r),
    )


def _command_result(r: Mapping[str, Any]) -> CommandResult:
    code = r.get("exit_code")
    sig = r.get("signal")
    return CommandResult(
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        signal=sig if isinstance(sig, int) and not isinstance(sig, bool) else None,
        stdout=str(r.get("stdout") or ""),
        stderr=str(r.get("stderr") or ""),
        timed_out=bool(r.get("timed_out")),
        wall_ms=_num(r, "wall_ms"),
        cpu_ms=_num(r, "cpu_ms"),
        raw=dict(r),
    )


def _entries(sid: str, r: Mapping[str, Any]) -> List[FileEntry]:
    raw = r.get("entries")
    if not isinstance(raw, list):
        raise ProtocolError(f"session {sid}: files_list result has no `entries` list: {json.dumps(r)[:200]}")
    out = []
    for e in raw:
        if not isinstance(e, Mapping) or not isinstance(e.get("name"), str):
            raise ProtocolError(f"session {sid}: malformed directory entry {e!r:.80}")
        size = e.get("size")
        out.append(FileEntry(name=e["name"], type=str(e.get("type", "file")), size=size if isinstance(size, int) else 0))
    return out


# -- errors: what the node and the call script say, as exceptions ------------------------------


def _ended_reason(message: str) -> Tuple[str, str]:
    """``("killed", "session ended: killed")`` from the node's message."""
    text = message.strip()
    for prefix in ("session ended:", "session_ended:", "ended:"):
        if text.lower().startswith(prefix):
            rest = text[len(prefix):].strip()
            word = rest.split()[0].strip(",.;()") if rest else ""
            return (word if word in END_REASONS else "ended"), text
    return "ended", text


#: Why a session ends, as its record says (``schema.json`` ``sessions.end_reasons``).
END_REASONS = tuple(_SESSIONS.get("end_reasons") or ("ttl", "idle", "killed", "crashed", "node_stopped", "lost"))

#: How long a client waits for a session's record to say it ended, once the node said so.
END_RECORD_WAIT_S = 5.0


def ended_by_record(sid: str, state: Any, reason: Any, detail: str) -> Optional[SessionError]:
    """The error an ended record means (None while it is not ended)."""
    if state is None or _text(state) != "ended":
        return None
    why = _text(reason) if reason is not None else "ended"
    if why == "lost":
        return SessionLost(sid, detail or "its node stopped answering")
    return SessionEnded(sid, why, detail)


def session_error(sid: str, message: str, reason: Optional[str] = None) -> SessionError:
    """The exception for a refusal of the call script or a terminal ``error`` event."""
    text = message.strip()
    low = text.lower()
    if reason == "session_lost" or low.startswith("session lost") or reason == "lost":
        detail = text.split(":", 1)[1].strip() if low.startswith("session lost") and ":" in text else text
        return SessionLost(sid, detail or "its node stopped answering")
    if reason == "session_ended" or low.startswith("session ended"):
        why, detail = _ended_reason(text)
        if why == "lost":
            return SessionLost(sid, detail)
        return SessionEnded(sid, why, detail)
    if reason == "busy" or low.startswith("session busy"):
        return SessionBusy(sid, "busy", f"session {sid} busy: {text}")
    if low.startswith("unknown session"):
        return SessionNotFound(sid, "unknown", f"session {sid}: unknown session (never created, or its record expired)")
    if "capacity" in low:
        return SessionCapacity(sid, text, f"session {sid} refused: {text}")
    return SessionCallError(sid, text, f"session {sid}: {text}")


def script_reply(sid: str, reply: Any) -> Optional[str]:
    """Accepts the call script's ``{'ok', entry}``; returns the node named by ``{'moved',
    ...}`` (the caller reads the hash again); raises what a refusal means."""
    if not isinstance(reply, (list, tuple)) or not reply:
        raise ProtocolError(f"session {sid}: the call script answered {reply!r:.80}")
    code = _text(reply[0])
    message = _text(reply[1]) if len(reply) > 1 else ""
    if code == "ok":
        return None
    if code == "moved":
        return message.rsplit(" ", 1)[-1]
    if code == "lost":
        raise session_error(sid, message or "session lost", "session_lost")
    if code == "ended":
        raise session_error(sid, message or "session ended: unknown", "session_ended")
    if code == "unknown":
        raise session_error(sid, "unknown session")
    raise session_error(sid, f"{code}: {message}")


# -- one call's wire form and its events --------------------------------------------------------


class CallState:
    """One call in flight: its JSON, then the events read for it (sans I/O: the sync and the
    async session feed it what they read)."""

    def __init__(
        self,
        sid: str,
        op: str,
        fields: Mapping[str, Any],
        timeout_ms: Optional[int],
        on_stdout: Optional[TextCallback] = None,
        on_stderr: Optional[TextCallback] = None,
    ) -> None:
        assert op in _OPS, op
        self.sid = sid
        self.op = op
        self.id = uuid.uuid4().hex
        body: Dict[str, Any] = {"id": self.id, "session": sid, "op": op}
        body.update({k: v for k, v in fields.items() if v is not None})
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        self.body = body
        self.json = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
        self.wait_s = (timeout_ms / 1000 if timeout_ms is not None else DEFAULT_CALL_TIMEOUT_S) + CALL_SLACK_S
        self.after: Union[bytes, str] = "0-0"
        self.on_stdout = on_stdout
        self.on_stderr = on_stderr
        self.terminal: Optional[Dict[str, Any]] = None
        self.ended_seen = False

    def feed(self, entries: Iterable[Tuple[Any, Mapping[Any, Any]]]) -> Optional[Dict[str, Any]]:
        """Takes stream entries, calls the output callbacks in order, and returns the terminal
        event once seen."""
        for entry_id, fields in entries:
            self.after = entry_id
            if self.terminal is not None:
                continue
            raw = fields.get(b"event", fields.get("event"))
            if raw is None:
                raise ProtocolError(f"session {self.sid}: call {self.id}: an event entry without `event`: {fields!r:.120}")
            try:
                ev = json.loads(raw)
            except ValueError as e:
                raise ProtocolError(f"session {self.sid}: call {self.id}: event is not JSON: {e}") from None
            if not isinstance(ev, dict):
                raise ProtocolError(f"session {self.sid}: call {self.id}: event is not an object: {ev!r:.80}")
            kind = ev.get("kind")
            if kind in ("stdout", "stderr"):
                cb = self.on_stdout if kind == "stdout" else self.on_stderr
                if cb is not None:
                    cb(str(ev.get("data", "")))
            elif kind in ("result", "error"):
                self.terminal = ev
            else:
                raise ProtocolError(f"session {self.sid}: call {self.id}: unknown event kind {kind!r:.40}")
        return self.terminal

    def outcome(self) -> Dict[str, Any]:
        """The terminal ``result`` event, or the exception its ``error`` event means."""
        ev = self.terminal
        assert ev is not None
        if ev.get("kind") == "error":
            raise session_error(self.sid, str(ev.get("error") or ""), ev.get("reason"))
        return ev

    def ended_without_answer(self, state: Any, reason: Any) -> bool:
        """True when the session's record said it ended at two checks in a row and no
        terminal event came in between: the node ended it and will not answer this call."""
        ended = state is not None and _text(state) == "ended"
        seen, self.ended_seen = self.ended_seen, ended
        return ended and seen

    def ended_error(self, state: Any, reason: Any) -> SessionError:
        detail = f"the session ended while {self.op} call {self.id} waited"
        return ended_by_record(self.sid, state, reason, detail) or SessionEnded(self.sid, "ended", detail)

    def lost(self, node: str) -> SessionLost:
        return SessionLost(self.sid, f"node {node} stopped answering (no heartbeat) during {self.op} call {self.id}")

    def too_long(self, node: str) -> Timeout:
        return Timeout(
            f"session {self.sid}: no answer to {self.op} call {self.id} from node {node} within "
            f"{self.wait_s:.0f}s, though the node is alive"
        )


def _failed(sid: str, op: str, r: Mapping[str, Any]) -> SessionCallError:
    err = r.get("error") or "failed without a reason"
    return SessionCallError(sid, str(err), f"session {sid}: {op} failed: {err}")


def check_ok(sid: str, op: str, r: Mapping[str, Any]) -> Mapping[str, Any]:
    """Raises :class:`SessionCallError` when an operation failed as such (``ok`` false with an
    ``error``); ``run_code``/``exec`` results that carry their own outcome pass through."""
    if r.get("ok", True) is False or (r.get("error") and op not in ("run_code", "exec")):
        if op == "run_code" and "execution_count" in r:
            return r
        if op == "exec" and ("exit_code" in r or r.get("timed_out")):
            return r
        raise _failed(sid, op, r)
    return r


def fork_fields(n: Any) -> Dict[str, Any]:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"fork: n must be an integer >= 1, got {n!r}")
    return {"n": n}


def fork_outcome(sid: str, r: Mapping[str, Any]) -> Tuple[List[Tuple[str, List[str]]], List[str]]:
    """A fork's result: the branches made (id, what each does not have of the parent's) and
    why each other one failed."""
    made: List[Tuple[str, List[str]]] = []
    errors: List[str] = []
    branches = r.get("branches")
    if not isinstance(branches, list):
        raise ProtocolError(f"session {sid}: a fork's result without its branches")
    for b in branches:
        kid = b.get("id") if isinstance(b, Mapping) else None
        if isinstance(b, Mapping) and b.get("ok") is True and isinstance(kid, str):
            made.append((kid, [str(x) for x in b.get("not_carried") or []]))
        else:
            why = b.get("error") if isinstance(b, Mapping) else None
            errors.append(str(why or "failed without a reason"))
    return made, errors


def checkpoint_fields(ttl_s: Optional[int]) -> Dict[str, Any]:
    return {} if ttl_s is None else {"ttl_s": _positive_int("ttl_s", ttl_s)}


def checkpoint_made(sid: str, r: Mapping[str, Any]) -> Tuple[str, Optional[int], Optional[int]]:
    """A ``checkpoint`` call's result: the checkpoint's id, created and expires (Unix ms)."""
    cp = r.get("checkpoint")
    if not isinstance(cp, Mapping) or not isinstance(cp.get("id"), str):
        raise ProtocolError(f"session {sid}: a checkpoint's result without its id")
    created, expires = cp.get("created_ms"), cp.get("expires_ms")
    return cp["id"], created if isinstance(created, int) else None, expires if isinstance(expires, int) else None


def restored(sid: str, r: Mapping[str, Any]) -> Tuple[str, List[str]]:
    """A ``restore`` call's result: the new session's id, and what it does not have."""
    new = r.get("id")
    if not isinstance(new, str):
        raise ProtocolError(f"session {sid}: a restore's result without the new session's id")
    return new, [str(x) for x in r.get("not_carried") or []]


class Checkpoint:
    """A checkpoint of a session (:meth:`Session.checkpoint`): a stopped copy of its
    interpreter, kept in the session's sandbox (its memory counts as the session's), and a copy
    of its files, both as they were when it was taken. :meth:`restore` makes a new session from
    it, as often as wanted; it ends at ``expires_ms``, on :meth:`delete`, or with its session.
    ``id`` is unguessable and names its session (``<session id>.<32 hex digits>``)."""

    def __init__(self, session: Any, id: str, created_ms: Optional[int], expires_ms: Optional[int]) -> None:
        self.session = session
        self.id = id
        self.created_ms = created_ms
        self.expires_ms = expires_ms

    def __repr__(self) -> str:
        return f"Checkpoint({self.id!r})"

    def restore(self, *, timeout: Optional[float] = None) -> Session:
        """A new session on the session's node whose interpreter state and files are the
        checkpoint's (``parent`` is the checkpointed session, ``not_carried`` names what it
        lacks, as for a fork's branch). Raises :class:`~forkbox.SessionCallError` naming why
        not: an unknown or expired checkpoint, the node's session capacity, a checkpoint
        whose stopped interpreter was continued or ended."""
        r = self.session._op("restore", {"checkpoint": self.id}, timeout)
        new, not_carried = restored(self.session.id, r)
        s = Session.__new__(Session)
        s._attach(self.session.queue, new, self.session.node)
        s.expires_ms, s.idle_s, s.runtime = None, self.session.idle_s, self.session.runtime
        s.parent, s.not_carried = self.session.id, not_carried
        return s

    def delete(self) -> None:
        """Ends the checkpoint now (its stopped interpreter and its files' copy)."""
        self.session._op("drop_checkpoint", {"checkpoint": self.id}, None)


def exec_fields(
    cmd: Union[str, Sequence[str]], stdin: Optional[Data], env: Optional[Mapping[str, str]], cwd: Optional[str]
) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    if isinstance(cmd, str):
        if not cmd.strip():
            raise ValueError("exec: the command is empty")
        out["cmd"] = cmd
    elif isinstance(cmd, Sequence) and not isinstance(cmd, (bytes, bytearray)):
        argv = list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv) or argv[0] == "":
            raise ValueError(f"exec: argv must be a non-empty list of strings, got {cmd!r:.80}")
        out["argv"] = argv
    else:
        raise TypeError(f"exec: give a shell string or an argv list, got {type(cmd).__name__}")
    if stdin is not None:
        out["stdin"] = encode_data(stdin, "exec stdin")
    if env is not None:
        for k, v in env.items():
            if not isinstance(k, str) or not k or "=" in k or "\0" in k or not isinstance(v, str):
                raise ValueError(f"exec: env {k!r:.40}: names must be non-empty strings without '=' or NUL, values strings")
        out["env"] = dict(env)
    if cwd is not None:
        out["cwd"] = check_path(cwd, "exec cwd")
    return out


def check_path(path: Any, what: str) -> str:
    """A session path: relative to ``/work`` or absolute under it, no ``..``."""
    if not isinstance(path, str):
        raise TypeError(f"{what}: a path must be a string, got {type(path).__name__}")
    if path == "" or "\0" in path:
        raise ValueError(f"{what}: path {path!r} is empty or holds a NUL byte")
    if ".." in path.split("/"):
        raise ValueError(f"{what}: path {path!r}: '..' is not allowed")
    if path.startswith("/") and not (path == "/work" or path.startswith("/work/")):
        raise ValueError(f"{what}: path {path!r} is outside /work (paths are relative to /work, or under it)")
    return path


def create_job(
    sid: str,
    *,
    ttl_s: Optional[int],
    idle_s: Optional[int],
    limits: Union[Limits, Mapping[str, int], None],
    flat_limits: Mapping[str, Any],
    env: Optional[Mapping[str, str]],
    files: Optional[Mapping[str, Data]],
    network: Optional[str],
    runtime: Optional[str],
    result_ttl_s: Optional[int],
) -> Dict[str, Any]:
    """The create job of a session (docs/protocol.md, "Sessions"), checked here as far as the
    contract allows."""
    for k in flat_limits:
        if k not in LIMIT_FIELDS:
            raise TypeError(f"Session() got an unexpected keyword argument {k!r}; it takes the limits {', '.join(LIMIT_FIELDS)}")
    merged: Dict[str, Any] = limits.to_wire() if isinstance(limits, Limits) else dict(limits or {})
    merged.update({k: v for k, v in flat_limits.items() if v is not None})
    session: Dict[str, Any] = {}
    if _positive_int("ttl_s", ttl_s) is not None:
        session["ttl_s"] = ttl_s
    if _positive_int("idle_s", idle_s) is not None:
        session["idle_s"] = idle_s
    job: Dict[str, Any] = {"id": _check_id("session id", sid), "session": session}
    if merged:
        job["limits"] = merged
    if env is not None:
        job["env"] = dict(env)
    if files is not None:
        if not isinstance(files, Mapping):
            raise TypeError(f"files must be a mapping path -> str|bytes, got {type(files).__name__}")
        job["files"] = {str(p): encode_data(v, f"files[{p!r}]") for p, v in files.items()}
    if network is not None:
        job["network"] = network
    if runtime is not None:
        job["runtime"] = runtime
    if result_ttl_s is not None:
        job["result_ttl_s"] = result_ttl_s
    validate_job(job)
    return job


@dataclass(frozen=True)
class Opened:
    """What a create's result says of the session."""

    node: str
    expires_ms: Optional[int]
    idle_s: Optional[int]
    runtime: Any


def opened(sid: str, raw: Union[bytes, str]) -> Opened:
    """Reads a create's result; raises what a refusal means."""
    try:
        res = json.loads(raw)
    except ValueError as e:
        raise ProtocolError(f"session {sid}: its create result is not JSON: {e}") from None
    if not isinstance(res, dict):
        raise ProtocolError(f"session {sid}: its create result is not an object")
    status = res.get("status")
    error = str(res.get("error") or "")
    if status == "invalid":
        raise JobRejected(f"session {sid}: {error or 'the worker gave no reason'}")
    if status != "ok":
        if "capacity" in error.lower():
            raise SessionCapacity(sid, error, f"session {sid} refused: {error}")
        raise SessionError(sid, error or str(status), f"session {sid} could not be opened: {status}: {error or 'no reason given'}")
    info = res.get("session")
    if not isinstance(info, dict) or not isinstance(info.get("node"), str):
        raise ProtocolError(f"session {sid}: the create result has no `session` object with its node: {json.dumps(res)[:200]}")
    exp, idle = info.get("expires_ms"), info.get("idle_s")
    return Opened(
        node=info["node"],
        expires_ms=exp if isinstance(exp, int) else None,
        idle_s=idle if isinstance(idle, int) else None,
        runtime=info.get("runtime"),
    )


def state_of(sid: str, fields: Mapping[Any, Any]) -> SessionInfo:
    """A session's hash as it is read by ``connect``: it must be live (or starting)."""
    if not fields:
        raise SessionNotFound(sid, "unknown", f"session {sid}: unknown session (never created, or its record expired)")
    info = SessionInfo.from_fields(sid, {_text(k): v for k, v in fields.items()})
    if info.state == "ended":
        if info.reason == "lost":
            raise SessionLost(sid, "its node stopped answering")
        raise SessionEnded(sid, info.reason or "ended")
    if not info.node:
        raise ProtocolError(f"session {sid}: its record names no node")
    return info


# -- the sync session -------------------------------------------------------------------------


class SessionFiles:
    """The session's disk (``/work``): ``session.files.write("a.txt", "hi")``."""

    def __init__(self, session: Session) -> None:
        self._s = session

    def write(self, path: str, data: Data, *, timeout: Optional[float] = None) -> None:
        """Writes a file (creating its parent directories)."""
        self._s._op("files_write", {"path": check_path(path, "files.write"), "data": encode_data(data, f"files.write({path!r})")}, timeout)

    def write_tree(self, files: Mapping[str, Data], *, timeout: Optional[float] = None) -> None:
        """Writes every ``path -> data`` of ``files``, in order."""
        for path, data in files.items():
            self.write(path, data, timeout=timeout)

    def read(self, path: str, *, timeout: Optional[float] = None) -> bytes:
        r = self._s._op("files_read", {"path": check_path(path, "files.read")}, timeout)
        return decode_data(r.get("data", ""), f"session {self._s.id}: files_read {path}")

    def list(self, path: str = ".", *, timeout: Optional[float] = None) -> List[FileEntry]:
        return _entries(self._s.id, self._s._op("files_list", {"path": check_path(path, "files.list")}, timeout))

    def remove(self, path: str, *, timeout: Optional[float] = None) -> None:
        """Removes a file, or a directory with everything in it."""
        self._s._op("files_remove", {"path": check_path(path, "files.remove")}, timeout)


def _queue_of(queue: Union[Queue, str, None], redis: Any) -> Queue:
    if isinstance(queue, Queue):
        if redis is not None:
            raise TypeError("give a Queue, or a queue name with redis=..., not both")
        return queue
    return Queue(redis, queue or "default")


class Session:
    """A long-lived sandbox: ``with Session(queue) as s: s.run_code("x = 1"); s.run_code("x")``.

    ``queue`` is a :class:`~forkbox.Queue`, or a queue name with ``redis=`` a URL (default
    ``$FORKBOX_REDIS_URL``). The session runs on one node of the queue until ``ttl_s`` (its
    lifetime, seconds), ``idle_s`` without a call, or :meth:`kill`; the node's ceilings apply.
    ``limits`` (a :class:`~forkbox.Limits`, or the limit keywords flat, e.g. ``memory_mb=``),
    ``env``, ``files`` (written to ``/work``), ``network`` and ``runtime`` (``"python"``: the
    node's warm interpreter serves :meth:`run_code`) are the create job's. Creating waits up to
    ``create_timeout`` seconds for a node to open it; a node at its session limits refuses with
    :class:`~forkbox.SessionCapacity`. Used as a context manager, the session is killed at the
    end of the block.
    """

    def __init__(
        self,
        queue: Union[Queue, str, None] = None,
        *,
        redis: Any = None,
        ttl_s: Optional[int] = None,
        idle_s: Optional[int] = None,
        limits: Union[Limits, Mapping[str, int], None] = None,
        env: Optional[Mapping[str, str]] = None,
        files: Optional[Mapping[str, Data]] = None,
        network: Optional[str] = None,
        runtime: Optional[str] = DEFAULT_SESSION_RUNTIME,
        id: Optional[str] = None,
        result_ttl_s: Optional[int] = None,
        create_timeout: float = 120.0,
        **limit_keywords: Any,
    ) -> None:
        q = _queue_of(queue, redis)
        sid = id or uuid.uuid4().hex
        job = create_job(
            sid, ttl_s=ttl_s, idle_s=idle_s, limits=limits, flat_limits=limit_keywords, env=env, files=files,
            network=network, runtime=runtime, result_ttl_s=result_ttl_s,
        )  # fmt: skip
        q._enqueue([job])
        got = _wait_create(q, sid, create_timeout)
        self._attach(q, sid, got.node)
        self.expires_ms = got.expires_ms
        self.idle_s = got.idle_s
        self.runtime = got.runtime

    def _attach(self, q: Queue, sid: str, node: str) -> None:
        self.queue = q
        self.id = sid
        self.node = node
        self.files = SessionFiles(self)
        # A branch of a fork: its parent's id, and what it does not have of the parent's.
        self.parent: Optional[str] = None
        self.not_carried: List[str] = []
        self._tag = q._tag(sid)
        self._script = q.redis.register_script(_session_call_lua())

    @classmethod
    def connect(cls, session_id: str, queue: Union[Queue, str, None] = None, *, redis: Any = None) -> Session:
        """Attaches to a live session by its id (from another process, say)."""
        q = _queue_of(queue, redis)
        _check_id("session id", session_id)
        info = state_of(session_id, q.redis.hgetall(_schema_key("session", q._tag(session_id), sid=session_id)))
        s = cls.__new__(cls)
        s._attach(q, session_id, info.node)
        s.expires_ms = info.expires_ms
        s.idle_s = info.idle_s
        s.runtime = info.runtime
        return s

    @staticmethod
    def list(queue: Union[Queue, str, None] = None, *, redis: Any = None) -> List[SessionInfo]:
        """The queue's live sessions, soonest to expire first."""
        q = _queue_of(queue, redis)
        out = []
        for tag in q.tags:
            for raw in q.redis.zrange(_schema_key("sessions", tag), 0, -1):
                sid = _text(raw)
                fields = q.redis.hgetall(_schema_key("session", tag, sid=sid))
                if fields:
                    out.append(SessionInfo.from_fields(sid, {_text(k): v for k, v in fields.items()}))
        return out

    def __repr__(self) -> str:
        return f"Session({self.id!r}, node={self.node!r})"

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()

    # -- calls ---------------------------------------------------------------------------

    def run_code(
        self,
        code: str,
        *,
        timeout: Optional[float] = None,
        on_stdout: Optional[TextCallback] = None,
        on_stderr: Optional[TextCallback] = None,
        on_result: Optional[Callable[[Execution], None]] = None,
    ) -> Execution:
        """Runs Python ``code`` in the session's interpreter (its variables stay for the next
        call). A cell that raises returns with ``exception`` set; past ``timeout`` seconds
        (default 30) it is interrupted and ``timed_out`` is set, the session stays usable.
        ``on_stdout``/``on_stderr`` get the output as it comes; ``on_result`` the
        :class:`Execution` at the end."""
        if not isinstance(code, str):
            raise TypeError(f"run_code: code must be a string, got {type(code).__name__}")
        call = CallState(self.id, "run_code", {"code": code}, _seconds_to_ms("timeout", timeout), on_stdout, on_stderr)
        ex = _execution(check_ok(self.id, "run_code", self._call(call)))
        if on_result is not None:
            on_result(ex)
        return ex

    def exec(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        stdin: Optional[Data] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[TextCallback] = None,
        on_stderr: Optional[TextCallback] = None,
    ) -> CommandResult:
        """Runs a shell string (``/bin/sh -c``) or an argv list in the session, in ``/work``
        (or ``cwd`` under it)."""
        fields = exec_fields(cmd, stdin, env, cwd)
        call = CallState(self.id, "exec", fields, _seconds_to_ms("timeout", timeout), on_stdout, on_stderr)
        return _command_result(check_ok(self.id, "exec", self._call(call)))

    def fork(self, n: int = 1, *, timeout: Optional[float] = None) -> List[Session]:
        """Forks the session into ``n`` new sessions on its node, each starting with a copy
        of this one's interpreter state (variables, functions, open files at their offsets)
        and files, then going its own way; this session runs on. Needs ``runtime="python"``.
        Each branch's ``not_carried`` names what it does not have (sockets, threads,
        background processes); ``random`` and the like are reseeded in it. Raises
        :class:`~forkbox.SessionForkError` (with the branches made in ``sessions``) when some
        could not be made, :class:`~forkbox.SessionCallError` when none could (past the
        node's session capacity the message says how many could)."""
        r = self._op("fork", fork_fields(n), timeout)
        made, errors = fork_outcome(self.id, r)
        kids = []
        for kid, not_carried in made:
            s = Session.__new__(Session)
            s._attach(self.queue, kid, self.node)
            s.expires_ms, s.idle_s, s.runtime = None, self.idle_s, self.runtime
            s.parent, s.not_carried = self.id, not_carried
            kids.append(s)
        if errors:
            raise SessionForkError(self.id, kids, errors)
        return kids

    def checkpoint(self, ttl_s: Optional[int] = None, *, timeout: Optional[float] = None) -> Checkpoint:
        """Takes a :class:`Checkpoint` of the session: its interpreter state and files as they
        are now, to :meth:`Checkpoint.restore` later (an undo). It keeps no CPU; its memory
        counts against the session's ``memory_mb`` as the session diverges from it. It lives
        ``ttl_s`` seconds (default 600, within the node's ceiling) and at most as long as the
        session; a node holds a few per session (8 by default). Needs ``runtime="python"``."""
        r = self._op("checkpoint", checkpoint_fields(ttl_s), timeout)
        cid, created, expires = checkpoint_made(self.id, r)
        return Checkpoint(self, cid, created, expires)

    def info(self) -> SessionInfo:
        """The session's record and the node's live figures of it."""
        r = self._op("info", {}, None)
        body: Mapping[str, Any] = r["info"] if isinstance(r.get("info"), Mapping) else r
        return SessionInfo.from_fields(self.id, body)

    def set_timeout(self, ttl_s: Optional[int] = None, idle_s: Optional[int] = None) -> None:
        """Sets a new lifetime (``ttl_s`` from now) and/or idle timeout, within the node's
        ceilings."""
        fields = _timeout_fields(ttl_s, idle_s)
        r = self._op("set_timeout", fields, None)
        exp = r.get("expires_ms")
        if isinstance(exp, int):
            self.expires_ms = exp
        if idle_s is not None:
            self.idle_s = idle_s

    def interrupt(self) -> None:
        """Interrupts the running ``run_code`` (a ``KeyboardInterrupt`` in the cell; the state
        stays). Safe to call from another thread while ``run_code`` waits."""
        self._op("interrupt", {}, None)

    def kill(self) -> None:
        """Ends the session (reason ``killed``) and returns once its record says it ended. A
        session that already ended is left as it is."""
        try:
            self._op("kill", {}, None)
        except (SessionEnded, SessionLost, SessionNotFound):
            return
        key_ = _schema_key("session", self._tag, sid=self.id)
        deadline = time.monotonic() + END_RECORD_WAIT_S
        while time.monotonic() < deadline:
            state = self.queue.redis.hget(key_, "state")
            if state is None or _text(state) == "ended":
                return
            time.sleep(0.05)

    # -- the wire ------------------------------------------------------------------------

    def _op(self, op: str, fields: Mapping[str, Any], timeout: Optional[float]) -> Mapping[str, Any]:
        call = CallState(self.id, op, fields, _seconds_to_ms("timeout", timeout))
        return check_ok(self.id, op, self._call(call))

    def _call(self, call: CallState) -> Dict[str, Any]:
        r = self.queue.redis
        for _ in range(3):
            keys = call_keys(self._tag, self.id, self.node, call.id)
            moved = script_reply(self.id, self._script(keys=keys, args=call_args(call.json, self.node, self.id)))
            if moved is None:
                break
            self.node = moved
        else:
            raise ProtocolError(f"session {self.id}: its node keeps changing ({self.node})")
        deadline = time.monotonic() + call.wait_s
        while True:
            got = r.xread({keys[3]: call.after}, count=256, block=int(SLICE_S * 1000))
            for _stream, entries in got or []:
                if call.feed(entries) is not None:
                    return self._outcome(call)
            if not got:
                pipe = r.pipeline(transaction=False)
                pipe.exists(keys[2])
                pipe.hmget(keys[0], "state", "reason")
                alive, (state, reason) = pipe.execute()
                # One more read: the terminal event may have landed just before the check.
                if call.feed(_entries_of(r.xread({keys[3]: call.after}, count=256))) is not None:
                    return self._outcome(call)
                if not alive:
                    # Marks the session lost for everyone (the script's check of the node alone).
                    script_reply(self.id, self._script(keys=keys, args=call_args("", self.node, self.id)))
                    raise call.lost(self.node)
                if call.ended_without_answer(state, reason):
                    raise call.ended_error(state, reason)
            if time.monotonic() > deadline:
                raise call.too_long(self.node)

    def _outcome(self, call: CallState) -> Dict[str, Any]:
        """The call's outcome; a ``session_ended`` event that does not say why is completed
        from the session's record, which the node writes as it ends the session."""
        try:
            return call.outcome()
        except SessionEnded as e:
            if e.reason in END_REASONS:
                raise
            key_ = _schema_key("session", self._tag, sid=self.id)
            deadline = time.monotonic() + END_RECORD_WAIT_S
            while time.monotonic() < deadline:
                state, reason = self.queue.redis.hmget(key_, "state", "reason")
                better = ended_by_record(self.id, state, reason, e.detail)
                if better is not None:
                    raise better from None
                if state is None:
                    break
                time.sleep(0.05)
            raise


def _entries_of(got: Any) -> List[Any]:
    out: List[Any] = []
    for _stream, entries in got or []:
        out.extend(entries)
    return out


def _timeout_fields(ttl_s: Optional[int], idle_s: Optional[int]) -> Dict[str, Any]:
    if ttl_s is None and idle_s is None:
        raise ValueError("set_timeout: give ttl_s and/or idle_s")
    return {"ttl_s": _positive_int("ttl_s", ttl_s), "idle_s": _positive_int("idle_s", idle_s)}


def _wait_create(q: Queue, sid: str, timeout: float) -> Opened:
    """Waits for a session's create job to finish, as :meth:`Queue.result` waits."""
    deadline = time.monotonic() + timeout
    after: Union[bytes, str] = "0-0"
    while True:
        raw = q.redis.get(q.result_key(sid))
        if raw is not None:
            return opened(sid, raw)
        q._warn_if_unserved()
        left = deadline - time.monotonic()
        if left <= 0:
            raise Timeout(f"session {sid}: no node opened it within {timeout}s (queue {q.name!r}){q._timeout_hint()}")
        got = q.redis.xread({q.wake_key(sid): after}, count=1, block=max(1, int(min(q.block_s, left) * 1000)))
        for _stream, entries in got or []:
            if entries:
                after = entries[-1][0]

