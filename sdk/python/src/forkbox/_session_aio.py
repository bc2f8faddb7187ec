"""The asyncio twin of :class:`forkbox.Session` (exported as :class:`forkbox.aio.AsyncSession`).

It speaks the same protocol with ``redis.asyncio``: the call and event shapes, their parsing
and their errors are :mod:`forkbox.session`'s; only the waiting is async.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Awaitable, Callable, Dict, Generator, List, Mapping, Optional, Sequence, Union

from ._schema import ENQUEUE_LUA, SCHEMA
from .errors import PartitionsMismatch, ProtocolError, SessionEnded, SessionForkError, SessionLost, SessionNotFound, Timeout
from .job import Data, Limits, encode_data
from .redis_queue import MAX_PARTITIONS, enqueue_keys_args, partition_of, partition_tag, redis_url_from_env
from .result import decode_data
from .session import (
    DEFAULT_SESSION_RUNTIME,
    END_REASONS,
    END_RECORD_WAIT_S,
    SLICE_S,
    CallState,
    CommandResult,
    Execution,
    FileEntry,
    Opened,
    SessionInfo,
    TextCallback,
    _check_id,
    _command_result,
    _entries,
    _entries_of,
    _execution,
    _schema_key,
    _seconds_to_ms,
    _session_call_lua,
    _text,
    _timeout_fields,
    call_args,
    call_keys,
    check_ok,
    check_path,
    create_job,
    ended_by_record,
    checkpoint_fields,
    checkpoint_made,
    exec_fields,
    fork_fields,
    fork_outcome,
    opened,
    restored,
    script_reply,
    state_of,
)

__all__ = ["AsyncCheckpoint", "AsyncSession", "AsyncSessionFiles"]


class _Layout:
    """A queue's names and its async Redis client (the async side of :class:`forkbox.Queue`,
    for what sessions need)."""

    def __init__(self, redis: Any, queue: str, partitions: int) -> None:
        if not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"queue {queue}: {partitions!r} partitions is not 1 to {MAX_PARTITIONS}")
        if redis is None:
            redis = redis_url_from_env()
        if isinstance(redis, str):
            import redis.asyncio as aioredis

            redis = aioredis.Redis.from_url(redis)
        self.redis = redis
        self.name = queue
        self.partitions = partitions
        self.tags = [partition_tag(queue, p, partitions) for p in range(partitions)]
        self.cluster = type(redis).__name__ == "RedisCluster"
        self._enqueue = redis.register_script(ENQUEUE_LUA)
        self._checked = False

    def tag(self, sid: str) -> str:
        return self.tags[partition_of(sid, self.partitions)]

    async def enqueue(self, job: Dict[str, Any]) -> None:
        if not self._checked:
            meta = _schema_key("meta", self.name)
            field = SCHEMA["partitions"]["meta_field"]
            await self.redis.hsetnx(meta, field, self.partitions)
            live = _text(await self.redis.hget(meta, field))
            if live.strip() != str(self.partitions):
                raise PartitionsMismatch(self.name, self.partitions, live)
            self._checked = True
        keys, args = enqueue_keys_args(self.tag(job["id"]), job, int(time.time() * 1000), self.cluster)
        await self._enqueue(keys=keys, args=args)

    async def wait_create(self, sid: str, timeout: float) -> Opened:
        tag = self.tag(sid)
        deadline = time.monotonic() + timeout
        after: Union[bytes, str] = "0-0"
        while True:
            raw = await self.redis.get(_schema_key("result", tag, id=sid))
            if raw is not None:
                return opened(sid, raw)
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"session {sid}: no node opened it within {timeout}s (queue {self.name!r})")
            got = await self.redis.xread({_schema_key("wake", tag, id=sid): after}, count=1, block=max(1, int(min(SLICE_S, left) * 1000)))
            for _stream, entries in got or []:
                if entries:
                    after = entries[-1][0]


class AsyncSessionFiles:
    """The session's disk (``/work``): ``await session.files.write("a.txt", "hi")``."""

    def __init__(self, session: AsyncSession) -> None:
        self._s = session

    async def write(self, path: str, data: Data, *, timeout: Optional[float] = None) -> None:
        await self._s._op("files_write", {"path": check_path(path, "files.write"), "data": encode_data(data, f"files.write({path!r})")}, timeout)

    async def write_tree(self, files: Mapping[str, Data], *, timeout: Optional[float] = None) -> None:
        for path, data in files.items():
            await self.write(path, data, timeout=timeout)

    async def read(self, path: str, *, timeout: Optional[float] = None) -> bytes:
        r = await self._s._op("files_read", {"path": check_path(path, "files.read")}, timeout)
        return decode_data(r.get("data", ""), f"session {self._s.id}: files_read {path}")

    async def list(self, path: str = ".", *, timeout: Optional[float] = None) -> List[FileEntry]:
        return _entries(self._s.id, await self._s._op("files_list", {"path": check_path(path, "files.list")}, timeout))

    async def remove(self, path: str, *, timeout: Optional[float] = None) -> None:
        await self._s._op("files_remove", {"path": check_path(path, "files.remove")}, timeout)


class _Opening:
    """``AsyncSession.create(...)``: awaited, the session; ``async with``, the session killed
    at the end of the block."""

    def __init__(self, make: Callable[[], Awaitable[AsyncSession]]) -> None:
        self._make = make
        self._session: Optional[AsyncSession] = None

    def __await__(self) -> Generator[Any, None, AsyncSession]:
        return self._make().__await__()

    async def __aenter__(self) -> AsyncSession:
        self._session = await self._make()
        return self._session

    async def __aexit__(self, *exc: Any) -> None:
        if self._session is not None:
            await self._session.kill()


class AsyncSession:
    """The asyncio twin of :class:`forkbox.Session`:

    ``async with AsyncSession.create("default", redis=url) as s: await s.run_code("1 + 1")``.

    ``redis`` is a URL (default ``$FORKBOX_REDIS_URL``) or a ``redis.asyncio`` client (not
    decoding responses). The arguments and calls are :class:`forkbox.Session`'s.
    """

    def __init__(self, layout: _Layout, sid: str, node: str, expires_ms: Optional[int], idle_s: Optional[int], runtime: Any) -> None:
        self._layout = layout
        self.redis = layout.redis
        self.id = sid
        self.node = node
        self.expires_ms = expires_ms
        self.idle_s = idle_s
        self.runtime = runtime
        self.files = AsyncSessionFiles(self)
        self.parent: Optional[str] = None
        self.not_carried: List[str] = []
        self._tag = layout.tag(sid)
        self._script = layout.redis.register_script(_session_call_lua())

    def __repr__(self) -> str:
        return f"AsyncSession({self.id!r}, node={self.node!r})"

    @classmethod
    def create(
        cls,
        queue: str = "default",
        *,
        redis: Any = None,
        partitions: int = 1,
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
    ) -> _Opening:
        """Opens a session; await it, or use it with ``async with``. Bad arguments raise here,
        before anything is awaited."""
        sid = id or uuid.uuid4().hex
        job = create_job(
            sid, ttl_s=ttl_s, idle_s=idle_s, limits=limits, flat_limits=limit_keywords, env=env, files=files,
            network=network, runtime=runtime, result_ttl_s=result_ttl_s,
        )  # fmt: skip
        layout = _Layout(redis, queue, partitions)

        async def make() -> AsyncSession:
            await layout.enqueue(job)
            got = await layout.wait_create(sid, create_timeout)
            return cls(layout, sid, got.node, got.expires_ms, got.idle_s, got.runtime)

        return _Opening(make)

    @classmethod
    async def connect(cls, session_id: str, queue: str = "default", *, redis: Any = None, partitions: int = 1) -> AsyncSession:
        """Attaches to a live session by its id."""
        _check_id("session id", session_id)
        layout = _Layout(redis, queue, partitions)
        fields = await layout.redis.hgetall(_schema_key("session", layout.tag(session_id), sid=session_id))
        info = state_of(session_id, fields)
        return cls(layout, session_id, info.node, info.expires_ms, info.idle_s, info.runtime)

    @staticmethod
    async def list(queue: str = "default", *, redis: Any = None, partitions: int = 1) -> List[SessionInfo]:
        """The queue's live sessions, soonest to expire first."""
        layout = _Layout(redis, queue, partitions)
        out = []
        for tag in layout.tags:
            for raw in await layout.redis.zrange(_schema_key("sessions", tag), 0, -1):
                sid = _text(raw)
                fields = await layout.redis.hgetall(_schema_key("session", tag, sid=sid))
                if fields:
                    out.append(SessionInfo.from_fields(sid, {_text(k): v for k, v in fields.items()}))
        return out

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.kill()

    async def run_code(
        self,
        code: str,
        *,
        timeout: Optional[float] = None,
        on_stdout: Optional[TextCallback] = None,
        on_stderr: Optional[TextCallback] = None,
        on_result: Optional[Callable[[Execution], None]] = None,
    ) -> Execution:
        """See :meth:`forkbox.Session.run_code`."""
        if not isinstance(code, str):
            raise TypeError(f"run_code: code must be a string, got {type(code).__name__}")
        call = CallState(self.id, "run_code", {"code": code}, _seconds_to_ms("timeout", timeout), on_stdout, on_stderr)
        ex = _execution(check_ok(self.id, "run_code", await self._call(call)))
        if on_result is not None:
            on_result(ex)
        return ex

    async def exec(
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
        """See :meth:`forkbox.Session.exec`."""
        fields = exec_fields(cmd, stdin, env, cwd)
        call = CallState(self.id, "exec", fields, _seconds_to_ms("timeout", timeout), on_stdout, on_stderr)
        return _command_result(check_ok(self.id, "exec", await self._call(call)))

    async def fork(self, n: int = 1, *, timeout: Optional[float] = None) -> List[AsyncSession]:
        """See :meth:`forkbox.Session.fork`."""
        r = await self._op("fork", fork_fields(n), timeout)
        made, errors = fork_outcome(self.id, r)
        kids = []
        for kid, not_carried in made:
            s = AsyncSession(self._layout, kid, self.node, None, self.idle_s, self.runtime)
            s.parent, s.not_carried = self.id, not_carried
            kids.append(s)
        if errors:
            raise SessionForkError(self.id, kids, errors)
        return kids

    async def checkpoint(self, ttl_s: Optional[int] = None, *, timeout: Optional[float] = None) -> AsyncCheckpoint:
        """See :meth:`forkbox.Session.checkpoint`."""
        r = await self._op("checkpoint", checkpoint_fields(ttl_s), timeout)
        cid, created, expires = checkpoint_made(self.id, r)
        return AsyncCheckpoint(self, cid, created, expires)

    async def info(self) -> SessionInfo:
        r = await self._op("info", {}, None)
        body: Mapping[str, Any] = r["info"] if isinstance(r.get("info"), Mapping) else r
        return SessionInfo.from_fields(self.id, body)

    async def set_timeout(self, ttl_s: Optional[int] = None, idle_s: Optional[int] = None) -> None:
        r = await self._op("set_timeout", _timeout_fields(ttl_s, idle_s), None)
        exp = r.get("expires_ms")
        if isinstance(exp, int):
            self.expires_ms = exp
        if idle_s is not None:
            self.idle_s = idle_s

    async def interrupt(self) -> None:
        await self._op("interrupt", {}, None)

    async def kill(self) -> None:
        """See :meth:`forkbox.Session.kill`."""
        try:
            await self._op("kill", {}, None)
        except (SessionEnded, SessionLost, SessionNotFound):
            return
        key_ = _schema_key("session", self._tag, sid=self.id)
        deadline = time.monotonic() + END_RECORD_WAIT_S
        while time.monotonic() < deadline:
            state = await self.redis.hget(key_, "state")
            if state is None or _text(state) == "ended":
                return
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        """Closes the Redis connections this session opened (the session itself lives on)."""
        close = getattr(self.redis, "aclose", None) or getattr(self.redis, "close")
        await close()

    async def _op(self, op: str, fields: Mapping[str, Any], timeout: Optional[float]) -> Mapping[str, Any]:
        call = CallState(self.id, op, fields, _seconds_to_ms("timeout", timeout))
        return check_ok(self.id, op, await self._call(call))

    async def _call(self, call: CallState) -> Dict[str, Any]:
        r = self.redis
        for _ in range(3):
            keys = call_keys(self._tag, self.id, self.node, call.id)
            moved = script_reply(self.id, await self._script(keys=keys, args=call_args(call.json, self.node, self.id)))
            if moved is None:
                break
            self.node = moved
        else:
            raise ProtocolError(f"session {self.id}: its node keeps changing ({self.node})")
        deadline = time.monotonic() + call.wait_s
        while True:
            got = await r.xread({keys[3]: call.after}, count=256, block=int(SLICE_S * 1000))
            for _stream, entries in got or []:
                if call.feed(entries) is not None:
                    return await self._outcome(call)
            if not got:
                alive = await r.exists(keys[2])
                state, reason = await r.hmget(keys[0], "state", "reason")
                if call.feed(_entries_of(await r.xread({keys[3]: call.after}, count=256))) is not None:
                    return await self._outcome(call)
                if not alive:
                    script_reply(self.id, await self._script(keys=keys, args=call_args("", self.node, self.id)))
                    raise call.lost(self.node)
                if call.ended_without_answer(state, reason):
                    raise call.ended_error(state, reason)
            if time.monotonic() > deadline:
                raise call.too_long(self.node)

    async def _outcome(self, call: CallState) -> Dict[str, Any]:
        """See :meth:`forkbox.Session._outcome`."""
        try:
            return call.outcome()
        except SessionEnded as e:
            if e.reason in END_REASONS:
                raise
            key_ = _schema_key("session", self._tag, sid=self.id)
            deadline = time.monotonic() + END_RECORD_WAIT_S
            while time.monotonic() < deadline:
                state, reason = await self.redis.hmget(key_, "state", "reason")
                better = ended_by_record(self.id, state, reason, e.detail)
                if better is not None:
                    raise better from None
                if state is None:
                    break
                await asyncio.sleep(0.05)
            raise


class AsyncCheckpoint:
    """The asyncio twin of :class:`forkbox.session.Checkpoint`."""

    def __init__(self, session: AsyncSession, id: str, created_ms: Optional[int], expires_ms: Optional[int]) -> None:
        self.session = session
        self.id = id
        self.created_ms = created_ms
        self.expires_ms = expires_ms

    def __repr__(self) -> str:
        return f"AsyncCheckpoint({self.id!r})"

    async def restore(self, *, timeout: Optional[float] = None) -> AsyncSession:
        """See :meth:`forkbox.session.Checkpoint.restore`."""
        p = self.session
        r = await p._op("restore", {"checkpoint": self.id}, timeout)
        new, not_carried = restored(p.id, r)
        s = AsyncSession(p._layout, new, p.node, None, p.idle_s, p.runtime)
        s.parent, s.not_carried = p.id, not_carried
        return s

    async def delete(self) -> None:
        """See :meth:`forkbox.session.Checkpoint.delete`."""
        await self.session._op("drop_checkpoint", {"checkpoint": self.id}, None)
