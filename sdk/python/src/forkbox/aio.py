"""asyncio client of the local daemon.

One connection per client, opened on first use. Requests are pipelined on it; a reader task
matches each response line to its request by id, so any number of concurrent ``run`` calls
share the connection and results may arrive in any order.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Coroutine, Dict, Mapping, Optional, Tuple, Union

from ._wire import (
    DEFAULT_WAIT_SLACK_S,
    MAX_LINE_BYTES,
    OutputCallback,
    check_daemon_identity,
    decode_line,
    default_socket_path,
    encode_request,
    finish,
    wait_budget,
)
from .errors import ConnectionLost, DaemonNotRunning, ForkboxError, ProtocolError, Timeout
from .job import JobSpec, checked_keywords, normalize_job, spec_from_keywords
from .result import Result

__all__ = ["AsyncCheckpoint", "AsyncForkbox", "AsyncSession"]

_Pending = Tuple["asyncio.Future[Dict[str, Any]]", Optional[OutputCallback]]


class AsyncForkbox:
    """asyncio client: ``result = await AsyncForkbox().run("echo hi")``.

    Use one client per event loop; ``async with AsyncForkbox() as fb:`` closes it at the end.
    """

    def __init__(
        self,
        socket: Optional[Union[str, "os.PathLike[str]"]] = None,
        *,
        connect_timeout: float = 5.0,
        wait_slack_s: float = DEFAULT_WAIT_SLACK_S,
    ) -> None:
        self.socket_path: str = os.fspath(socket) if socket is not None else default_socket_path()
        self.connect_timeout = connect_timeout
        self.wait_slack_s = wait_slack_s
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._reader_task: Optional[asyncio.Task[None]] = None
        self._pending: Dict[str, _Pending] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._connect_lock: Optional[asyncio.Lock] = None
        self._write_lock: Optional[asyncio.Lock] = None
        self._closed = False

    def __repr__(self) -> str:
        return f"AsyncForkbox(socket={self.socket_path!r})"

    def run(
        self,
        cmd: Optional[str] = None,
        *,
        wait_timeout: Optional[float] = None,
        on_output: Optional[OutputCallback] = None,
        **spec: Any,
    ) -> Coroutine[Any, Any, Result]:
        """Runs one job; the arguments are those of :meth:`forkbox.Forkbox.run`.

        A wrong keyword raises ``TypeError`` at the call, before anything is awaited.
        """
        given = spec_from_keywords("AsyncForkbox.run", dict(spec, cmd=cmd), also=("wait_timeout", "on_output"))
        return self._run_spec(given, wait_timeout, on_output)

    async def _run_spec(self, spec: JobSpec, wait_timeout: Optional[float], on_output: Optional[OutputCallback]) -> Result:
        return await self._send(spec.to_job(), wait_timeout, on_output)

    @checked_keywords("AsyncForkbox.run_job")
    async def run_job(
        self,
        job: Union[JobSpec, Mapping[str, Any]],
        *,
        wait_timeout: Optional[float] = None,
        on_output: Optional[OutputCallback] = None,
    ) -> Result:
        """Runs a job given as a :class:`~forkbox.JobSpec` or a v1 job object."""
        return await self._send(normalize_job(job), wait_timeout, on_output)

    async def _send(
        self, job: Dict[str, Any], wait_timeout: Optional[float], on_output: Optional[OutputCallback]
    ) -> Result:
        job_id: str = job["id"]
        budget = wait_budget(job, wait_timeout, self.wait_slack_s)
        request = encode_request(job, stream=on_output is not None)
        loop = asyncio.get_running_loop()

        async def exchange() -> Dict[str, Any]:
            writer = await self._ensure_connected()
            if job_id in self._pending:
                raise ValueError(f"a job with id {job_id!r} is already running on this client")
            fut: asyncio.Future[Dict[str, Any]] = loop.create_future()
            self._pending[job_id] = (fut, on_output)
            try:
                assert self._write_lock is not None
                async with self._write_lock:
                    writer.write(request)
                    await writer.drain()
                return await fut
            finally:
                self._pending.pop(job_id, None)

        try:
            obj = await asyncio.wait_for(exchange(), budget)
        except asyncio.TimeoutError:
            raise Timeout(f"no answer from the daemon for job {job_id} within {budget:.1f}s") from None
        except (ConnectionResetError, BrokenPipeError) as e:
            raise ConnectionLost(f"lost the connection to the daemon: {e}") from None
        return finish(obj)

    async def _ensure_connected(self) -> asyncio.StreamWriter:
        if self._closed:
            raise ForkboxError("this AsyncForkbox client is closed")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # A new event loop (e.g. a second asyncio.run): the old connection cannot be used.
            self._reset(None)
            self._loop = loop
            self._connect_lock = asyncio.Lock()
            self._write_lock = asyncio.Lock()
        assert self._connect_lock is not None
        async with self._connect_lock:
            if self._writer is not None and self._reader_task is not None and not self._reader_task.done():
                return self._writer
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_unix_connection(self.socket_path, limit=MAX_LINE_BYTES),
                    self.connect_timeout,
                )
            except FileNotFoundError:
                raise DaemonNotRunning(self.socket_path, "the socket does not exist") from None
            except ConnectionRefusedError:
                raise DaemonNotRunning(self.socket_path, "connection refused: stale socket") from None
            except PermissionError:
                raise ForkboxError(
                    f"permission denied connecting to {self.socket_path}: the daemon's socket "
                    "belongs to another user"
                ) from None
            except asyncio.TimeoutError:
                raise Timeout(f"timed out connecting to {self.socket_path}") from None
            try:
                check_daemon_identity(writer.get_extra_info("socket"), self.socket_path)
            except BaseException:
                writer.close()
                raise
            self._reader, self._writer = reader, writer
            self._reader_task = loop.create_task(self._read_loop(reader))
            return writer

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        error: BaseException = ConnectionLost("the daemon closed the connection")
        try:
            while True:
                raw = await reader.readline()
                if not raw.endswith(b"\n"):
                    break  # end of file (a partial last line is not a response)
                line = decode_line(raw)
                pending = self._pending.get(line.id) if line.id is not None else None
                if pending is None:
                    if line.id is None and line.result is not None:
                        # A rejection whose id the daemon could not read; we always send ids,
                        # so this is a protocol violation worth surfacing to every waiter.
                        error = ProtocolError(f"daemon rejected a request without an id: {line.result.get('error')}")
                        break
                    continue  # an answer to a request whose caller gave up (timeout/cancel)
                fut, on_output = pending
                if line.result is not None:
                    if not fut.done():
                        fut.set_result(line.result)
                elif on_output is not None and line.event is not None:
                    try:
                        on_output(line.event, line.data)
                    except Exception as e:  # a failing callback fails its own call only
                        if not fut.done():
                            fut.set_exception(e)
        except (ValueError, asyncio.LimitOverrunError) as e:
            error = ProtocolError(f"daemon sent an oversized or malformed line: {e}")
        except ProtocolError as e:
            error = e
        except (ConnectionError, OSError) as e:
            error = ConnectionLost(f"lost the connection to the daemon: {e}")
        if self._reader is reader:
            self._reset(error)

    def _reset(self, error: Optional[BaseException]) -> None:
        pending, self._pending = self._pending, {}
        for fut, _ in pending.values():
            if not fut.done():
                fut.set_exception(error or ConnectionLost("the connection was closed"))
        writer, self._writer, self._reader = self._writer, None, None
        task, self._reader_task = self._reader_task, None
        if task is not None and task is not _current_task() and not task.done():
            task.cancel()
        if writer is not None:
            try:
                writer.close()
            except RuntimeError:  # its loop is already closed
                pass

    async def aclose(self) -> None:
        """Closes the connection; calls still waiting fail with ConnectionLost."""
        self._closed = True
        writer = self._writer
        self._reset(ConnectionLost("the client was closed"))
        if writer is not None:
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError, RuntimeError):
                pass

    async def __aenter__(self) -> AsyncForkbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _current_task() -> Optional[asyncio.Task[Any]]:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


from ._session_aio import AsyncCheckpoint, AsyncSession  # noqa: E402  (the session twin; it needs nothing above)
