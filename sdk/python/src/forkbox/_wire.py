"""Framing shared by the sync and async daemon clients."""

from __future__ import annotations

import json
import os
import socket as _socket
import struct
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Set, Union

from .errors import ForkboxError, JobRejected, ProtocolError, UntrustedDaemon
from .job import DEFAULT_TIMEOUT_MS
from .result import Result

#: Called with ("stdout" | "stderr", text chunk) as a streamed job writes output.
OutputCallback = Callable[[str, str], None]

#: Longest response line the clients accept (a result carries up to the output cap plus files).
MAX_LINE_BYTES = 256 * 1024 * 1024

#: Extra time a client waits beyond a job's own timeout_ms for the daemon to answer.
DEFAULT_WAIT_SLACK_S = 60.0


def default_socket_path() -> str:
    """``$FORKBOX_SOCKET``, else ``$XDG_RUNTIME_DIR/forkbox.sock``, else
    ``${TMPDIR:-/tmp}/forkbox-<uid>/forkbox.sock`` (the daemon makes that directory 0700), as
    ``forkbox daemon`` chooses."""
    explicit = os.environ.get("FORKBOX_SOCKET")
    if explicit:
        return explicit
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "forkbox.sock")
    tmp = os.environ.get("TMPDIR") or "/tmp"
    return os.path.join(tmp, f"forkbox-{os.geteuid()}", "forkbox.sock")


def trusted_daemon_uids() -> Set[int]:
    """This user, root, and the user ``$FORKBOX_DAEMON_USER`` names (a name or a uid: the owner
    of a daemon shared with ``forkbox daemon --group``)."""
    uids = {os.geteuid(), 0}
    named = os.environ.get("FORKBOX_DAEMON_USER")
    if named:
        if named.isdigit():
            uids.add(int(named))
        else:
            import pwd

            try:
                uids.add(pwd.getpwnam(named).pw_uid)
            except KeyError:
                raise ForkboxError(f"FORKBOX_DAEMON_USER={named}: no such user") from None
    return uids


def check_daemon_identity(sock: _socket.socket, socket_path: str) -> None:
    """Refuses a server run by an untrusted user (see :func:`trusted_daemon_uids`), before a
    byte is sent to it.

    The socket's path proves nothing (another user may have bound it first); the kernel's
    record of who listens (``SO_PEERCRED``) does.
    """
    peercred = getattr(_socket, "SO_PEERCRED", None)
    if peercred is None:
        raise ForkboxError(f"cannot check who serves {socket_path}: no SO_PEERCRED on this system")
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(_socket.SOL_SOCKET, peercred, struct.calcsize("3i")))
    if uid not in trusted_daemon_uids():
        raise UntrustedDaemon(socket_path, uid, pid)


def encode_request(job: Mapping[str, Any], stream: bool) -> bytes:
    """One request line: the job, plus ``"stream": true`` when output events are wanted."""
    body = dict(job)
    if stream:
        body["stream"] = True
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def wait_budget(job: Mapping[str, Any], wait_timeout: Optional[float], slack: float) -> Optional[float]:
    """Seconds to wait for an answer: explicit, or the job's timeout plus slack."""
    if wait_timeout is not None:
        return wait_timeout
    t = job.get("timeout_ms", DEFAULT_TIMEOUT_MS)
    if not isinstance(t, int) or isinstance(t, bool) or t <= 0:
        t = DEFAULT_TIMEOUT_MS  # the server will reject it; do not fail here for the wrong reason
    return t / 1000.0 + slack


@dataclass
class Line:
    """One decoded response line: an output event or a final result."""

    id: Optional[str]
    event: Optional[str] = None
    data: str = ""
    result: Optional[Dict[str, Any]] = None


def decode_line(raw: Union[bytes, bytearray]) -> Line:
    try:
        obj = json.loads(raw)
    except ValueError as e:
        raise ProtocolError(f"daemon sent a line that is not JSON ({e}): {bytes(raw[:200])!r}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"daemon sent a line that is not an object: {bytes(raw[:200])!r}")
    rid = obj.get("id")
    if rid is not None and not isinstance(rid, str):
        raise ProtocolError(f"daemon sent a non-string id: {rid!r:.80}")
    if "status" in obj:
        return Line(id=rid, result=obj)
    event = obj.get("event")
    if isinstance(event, str):
        data = obj.get("data", "")
        if not isinstance(data, str):
            raise ProtocolError(f"event data should be a string, got {data!r:.80}")
        return Line(id=rid, event=event, data=data)
    raise ProtocolError(f"daemon sent a line with neither `status` nor `event`: {bytes(raw[:200])!r}")


def finish(result_obj: Dict[str, Any]) -> Result:
    """Turns a final line into a Result; a rejected job raises JobRejected."""
    res = Result.from_dict(result_obj)
    if res.status == "invalid":
        raise JobRejected(res.error or "the server gave no reason", res)
    return res
