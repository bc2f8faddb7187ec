"""Synchronous client of the local daemon (``forkbox daemon``).

Each call takes a connection from a small pool, sends one request line and reads lines until
the result with its id arrives. Connections are reused, so a call costs one round trip on an
open socket; threads never share a connection at the same time, so the client is thread-safe.
"""

from __future__ import annotations

import errno
import os
import socket as _socket
import threading
import time
import types
import warnings
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Tuple,
    Union,
)

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

__all__ = ["Forkbox", "default_socket_path", "run", "run_job"]

PathLike = Union[str, "os.PathLike[str]"]


class _OnInstance:
    """A method that, called on the class (``Forkbox.run(...)``, the older spelling of
    ``forkbox.run(...)``), still runs on the shared client, with a ``DeprecationWarning``."""

    def __init__(self, func: Callable[..., Any], name: str) -> None:
        self._func = func
        self._name = name
        self.__doc__ = func.__doc__
        self.__name__ = func.__name__
        self.__wrapped__ = func

    def __get__(self, obj: Any, owner: Optional[type] = None) -> Callable[..., Any]:
        if obj is None:
            warnings.warn(
                f"Forkbox.{self._name}(...) on the class is deprecated: call forkbox.{self._name}(...) "
                f"for the shared client, or Forkbox(socket=...).{self._name}(...)",
                DeprecationWarning,
                stacklevel=2,
            )
            obj = (owner or Forkbox).default()  # type: ignore[attr-defined]
        return types.MethodType(self._func, obj)


class _Conn:
    """One Unix-socket connection with its read buffer."""

    __slots__ = ("sock", "buf", "pid")

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.pid = os.getpid()

    def usable(self) -> bool:
        """False when the daemon has closed this idle connection (or sent unrequested bytes)."""
        if self.buf:
            return False
        try:
            self.sock.setblocking(False)
            try:
                self.sock.recv(1, _socket.MSG_PEEK)
            finally:
                self.sock.setblocking(True)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return False  # b"" is end of file; anything else is bytes nobody asked for

    def send(self, data: bytes, deadline: Optional[float]) -> None:
        self.sock.settimeout(_remaining(deadline))
        try:
            self.sock.sendall(data)
        except _socket.timeout:
            raise Timeout("timed out sending the request to the daemon") from None

    def read_line(self, deadline: Optional[float]) -> bytearray:
        start = 0
        while True:
            i = self.buf.find(b"\n", start)
            if i >= 0:
                line = self.buf[:i]
                del self.buf[: i + 1]
                return line
            start = len(self.buf)
            if start > MAX_LINE_BYTES:
                raise ProtocolError(f"daemon sent a line longer than {MAX_LINE_BYTES} bytes")
            self.sock.settimeout(_remaining(deadline))
            try:
                chunk = self.sock.recv(1 << 18)
            except _socket.timeout:
                raise Timeout("timed out waiting for the daemon's answer") from None
            if not chunk:
                raise ConnectionLost("the daemon closed the connection before answering")
            self.buf += chunk

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _remaining(deadline: Optional[float]) -> Optional[float]:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise Timeout("timed out waiting for the daemon")
    return left


#: The keywords of ``run`` beside the job's.
_CALL_KEYWORDS = ("wait_timeout", "on_output")

_defaults: Dict[type, "Forkbox"] = {}
_defaults_lock = threading.Lock()


class Forkbox:
    """Client of the local daemon.

    ``forkbox.run("echo hi")`` runs on a shared client for the default socket
    (``$FORKBOX_SOCKET``, else ``$XDG_RUNTIME_DIR/forkbox.sock``, else
    ``${TMPDIR:-/tmp}/forkbox-<uid>/forkbox.sock``);
    ``Forkbox(socket="/path/fb.sock").run(...)`` on a client of its own.

    The client keeps up to ``max_connections`` open connections; more concurrent calls wait for
    one to come free. ``wait_slack_s`` is how long past a job's ``timeout_ms`` the client waits
    for an answer before raising :class:`Timeout` (``wait_timeout=`` overrides it per call).
    """

    def __init__(
        self,
        socket: Optional[PathLike] = None,
        *,
        max_connections: int = 16,
        connect_timeout: float = 5.0,
        wait_slack_s: float = DEFAULT_WAIT_SLACK_S,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.socket_path: str = os.fspath(socket) if socket is not None else default_socket_path()
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.wait_slack_s = wait_slack_s
        self._cond = threading.Condition()
        self._idle: List[_Conn] = []
        self._open = 0
        self._pid = os.getpid()
        self._closed = False

    def __repr__(self) -> str:
        return f"Forkbox(socket={self.socket_path!r})"

    # -- the shared instance -------------------------------------------------------------

    @classmethod
    def default(cls) -> Forkbox:
        """The shared client used by ``forkbox.run(...)``; created on first use."""
        inst = _defaults.get(cls)
        if inst is None:
            with _defaults_lock:
                inst = _defaults.get(cls)
                if inst is None:
                    inst = _defaults[cls] = cls()
        return inst

    @classmethod
    def set_default(cls, client: Optional[Forkbox]) -> None:
        """Replaces the shared client (``None``: make a new one from the environment on next use)."""
        with _defaults_lock:
            old = _defaults.pop(cls, None)
            if client is not None:
                _defaults[cls] = client
        if old is not None and old is not client:
            old.close()

    # -- running jobs --------------------------------------------------------------------

    def run(
        self,
        cmd: Optional[str] = None,
        *,
        wait_timeout: Optional[float] = None,
        on_output: Optional[OutputCallback] = None,
        **spec: Any,
    ) -> Result:
        """Runs one job in a sandbox and returns its :class:`Result`.

        ``cmd`` is a shell string (``/bin/sh -c``); or pass ``argv=[...]``. The other keywords
        are the fields of :class:`~forkbox.JobSpec` (``timeout_ms``, ``stdin``, ``env``,
        ``files``, ``cwd``, ``collect``, ``network``, ``output_mode``, ...) and of
        :class:`~forkbox.Limits` (``memory_mb``, ``pids``, ...). ``stdin`` and the values of
        ``files`` may be ``str`` or ``bytes``; ``collect`` lists globs (relative to the working
        directory) of files to return in ``Result.files``. ``on_output(stream, text)`` receives
        stdout/stderr chunks live. A non-zero exit, a timeout or a limit is a result (see
        ``Result.status``); a malformed job raises :class:`JobRejected`, and an unreachable
        daemon :class:`DaemonNotRunning`.
        """
        return self._run_spec("Forkbox.run", cmd, spec, wait_timeout, on_output)

    @checked_keywords("Forkbox.run_job")
    def run_job(
        self,
        job: Union[JobSpec, Mapping[str, Any]],
        *,
        wait_timeout: Optional[float] = None,
        on_output: Optional[OutputCallback] = None,
    ) -> Result:
        """Runs a job given as a :class:`~forkbox.JobSpec` or a v1 job object
        (``{"cmd": ..., "limits": {...}}``)."""
        return self._send(normalize_job(job), wait_timeout, on_output)

    run = _OnInstance(run, "run")  # type: ignore[assignment]
    run_job = _OnInstance(run_job, "run_job")  # type: ignore[assignment]

    def _run_spec(
        self,
        public: str,
        cmd: Optional[str],
        spec: Mapping[str, Any],
        wait_timeout: Optional[float],
        on_output: Optional[OutputCallback],
    ) -> Result:
        job = spec_from_keywords(public, dict(spec, cmd=cmd), also=_CALL_KEYWORDS).to_job()
        return self._send(job, wait_timeout, on_output)

    def _send(self, job: Dict[str, Any], wait_timeout: Optional[float], on_output: Optional[OutputCallback]) -> Result:
        budget = wait_budget(job, wait_timeout, self.wait_slack_s)
        deadline = None if budget is None else time.monotonic() + budget
        request = encode_request(job, stream=on_output is not None)
        job_id = job["id"]
        for attempt in (0, 1):
            conn, reused = self._acquire(deadline)
            keep = False
            try:
                try:
                    conn.send(request, deadline)
                except (BrokenPipeError, ConnectionResetError) as e:
                    if reused and attempt == 0:
                        continue  # the daemon dropped an idle connection: nothing was sent
                    raise ConnectionLost(f"lost the connection to the daemon: {e}") from None
                obj = self._await(conn, job_id, deadline, on_output)
                keep = True
            except OSError as e:
                if isinstance(e, ForkboxError):
                    raise
                raise ConnectionLost(f"lost the connection to the daemon: {e}") from None
            finally:
                self._release(conn, keep)
            return finish(obj)
        raise ConnectionLost("the daemon closed the connection twice in a row")  # pragma: no cover

    @staticmethod
    def _await(
        conn: _Conn, job_id: str, deadline: Optional[float], on_output: Optional[OutputCallback]
    ) -> Dict[str, Any]:
        """Reads lines up to the final result of ``job_id`` (one request in flight per connection)."""
        while True:
            line = decode_line(conn.read_line(deadline))
            if line.id != job_id:
                if line.result is not None and line.id is None and line.result.get("status") == "invalid":
                    return line.result  # the daemon could not read our id back out of the request
                raise ProtocolError(f"daemon answered id {line.id!r} to a request with id {job_id!r}")
            if line.result is not None:
                return line.result
            if on_output is not None and line.event is not None:
                on_output(line.event, line.data)

    # -- the connection pool -------------------------------------------------------------

    def _connect(self, deadline: Optional[float]) -> _Conn:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            t = self.connect_timeout
            left = _remaining(deadline)
            sock.settimeout(t if left is None else min(t, left))
            sock.connect(self.socket_path)
        except FileNotFoundError:
            sock.close()
            raise DaemonNotRunning(self.socket_path, "the socket does not exist") from None
        except ConnectionRefusedError:
            sock.close()
            raise DaemonNotRunning(self.socket_path, "connection refused: stale socket") from None
        except PermissionError:
            sock.close()
            raise ForkboxError(
                f"permission denied connecting to {self.socket_path}: the daemon's socket belongs "
                "to another user (it is mode 0600, or 0660 with `forkbox daemon --group`)"
            ) from None
        except _socket.timeout:
            sock.close()
            raise Timeout(f"timed out connecting to {self.socket_path}") from None
        except OSError as e:
            sock.close()
            if e.errno in (errno.ENOTSOCK, errno.ENOENT, errno.ECONNREFUSED):
                raise DaemonNotRunning(self.socket_path, os.strerror(e.errno)) from None
            raise
        try:
            check_daemon_identity(sock, self.socket_path)
        except BaseException:
            sock.close()
            raise
        return _Conn(sock)

    def _acquire(self, deadline: Optional[float]) -> Tuple[_Conn, bool]:
        with self._cond:
            if self._closed:
                raise ForkboxError("this Forkbox client is closed")
            if self._pid != os.getpid():
                # After fork() the parent's connections belong to the parent.
                self._idle.clear()
                self._open = 0
                self._pid = os.getpid()
            while True:
                while self._idle:
                    conn = self._idle.pop()
                    if conn.usable():
                        return conn, True
                    conn.close()
                    self._open -= 1
                if self._open < self.max_connections:
                    self._open += 1
                    break
                if not self._cond.wait(_remaining(deadline)):
                    raise Timeout("timed out waiting for a free connection to the daemon")
        try:
            return self._connect(deadline), False
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def _release(self, conn: _Conn, reusable: bool) -> None:
        with self._cond:
            if conn.pid != os.getpid():
                return
            if reusable and not self._closed:
                self._idle.append(conn)
            else:
                conn.close()
                self._open -= 1
            self._cond.notify()

    def close(self) -> None:
        """Closes idle connections; calls still running finish and close theirs."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for c in idle:
            c.close()

    def __enter__(self) -> Forkbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run(
    cmd: Optional[str] = None,
    *,
    wait_timeout: Optional[float] = None,
    on_output: Optional[OutputCallback] = None,
    **spec: Any,
) -> Result:
    """Runs one job on the shared client of the default socket (:meth:`Forkbox.default`); the
    arguments are those of :meth:`Forkbox.run`."""
    return Forkbox.default()._run_spec("forkbox.run", cmd, spec, wait_timeout, on_output)


@checked_keywords("forkbox.run_job")
def run_job(
    job: Union[JobSpec, Mapping[str, Any]],
    *,
    wait_timeout: Optional[float] = None,
    on_output: Optional[OutputCallback] = None,
) -> Result:
    """Runs a :class:`~forkbox.JobSpec` or a v1 job object on the shared client."""
    return Forkbox.default()._send(normalize_job(job), wait_timeout, on_output)
