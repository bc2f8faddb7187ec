"""Exceptions raised by the Forkbox client.

Every failure is an exception: a call never returns ``None`` in place of a result.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, List, Optional

if TYPE_CHECKING:
    from .result import Result

__all__ = [
    "ForkboxError",
    "DaemonNotRunning",
    "UntrustedDaemon",
    "ConnectionLost",
    "JobRejected",
    "Timeout",
    "ProtocolError",
    "PartitionsMismatch",
    "SessionError",
    "SessionLost",
    "SessionEnded",
    "SessionBusy",
    "SessionCapacity",
    "SessionNotFound",
    "SessionCallError",
]


class ForkboxError(Exception):
    """Base class of every error raised by this package."""


class DaemonNotRunning(ForkboxError, ConnectionError):
    """No daemon listens on the socket. The message says how to start one."""

    def __init__(self, socket_path: str, reason: str = "") -> None:
        self.socket_path = socket_path
        self.reason = reason
        detail = f" ({reason})" if reason else ""
        super().__init__(
            f"no forkbox daemon is listening on {socket_path}{detail}; "
            f"start one with: forkbox daemon --socket {socket_path}"
        )


class UntrustedDaemon(ForkboxError, PermissionError):
    """The process serving the socket is another user's (neither ours nor root's): it may
    have taken the path to read jobs. Nothing was sent to it."""

    def __init__(self, socket_path: str, uid: int, pid: int) -> None:
        self.socket_path = socket_path
        self.uid = uid
        self.pid = pid
        try:
            import pwd

            owner = f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
        except (ImportError, KeyError):
            owner = f"uid {uid}"
        super().__init__(
            f"refusing to use {socket_path}: it is served by {owner}, pid {pid}, which is neither "
            f"this user (uid {os.geteuid()}) nor root; another user may have taken the path. "
            "Nothing was sent. Remove it, or start your own daemon on a path in a directory only "
            "you can write (for a daemon shared with --group, name its user in "
            "FORKBOX_DAEMON_USER)"
        )


class ConnectionLost(ForkboxError, ConnectionError):
    """The daemon closed the connection before answering a request."""


class JobRejected(ForkboxError, ValueError):
    """The server refused the job (status ``invalid``); ``reason`` is its explanation."""

    def __init__(self, reason: str, result: Optional[Result] = None) -> None:
        self.reason = reason
        self.result = result
        super().__init__(f"job rejected: {reason}")


class Timeout(ForkboxError, TimeoutError):
    """A client-side wait ran out (this is not a job's own ``timeout_ms``)."""


class ProtocolError(ForkboxError):
    """The server sent something that does not follow the v1 protocol."""


class PartitionsMismatch(ForkboxError, ValueError):
    """The queue was created with another partition count than this client's ``partitions``."""

    def __init__(self, queue: str, configured: int, live: str) -> None:
        self.queue = queue
        self.configured = configured
        self.live = live
        super().__init__(
            f"queue {queue} has {live} partition(s) in Redis (forkbox:{{{queue}}}:meta), but "
            f"{configured} were asked for (partitions={configured}); use partitions={live}, or "
            "drain and delete the queue to change it"
        )


class SessionError(ForkboxError):
    """Base of the errors of a :class:`forkbox.Session`; ``session_id`` names the session and
    ``reason`` says why, as the node said it."""

    def __init__(self, session_id: str, reason: str, message: Optional[str] = None) -> None:
        self.session_id = session_id
        self.reason = reason
        super().__init__(message or f"session {session_id}: {reason}")


class SessionLost(SessionError, ConnectionError):
    """The session's node stopped answering (its heartbeat is gone): the session and its state
    are gone with it."""

    def __init__(self, session_id: str, detail: str) -> None:
        super().__init__(session_id, "lost", f"session {session_id} lost: {detail}")
        self.detail = detail


class SessionEnded(SessionError):
    """The session has ended; ``reason`` is ``killed``, ``ttl``, ``idle``, ``crashed``,
    ``node_stopped`` or ``lost``, as the node recorded it."""

    def __init__(self, session_id: str, reason: str, detail: str = "") -> None:
        more = f" ({detail})" if detail and detail != reason else ""
        super().__init__(session_id, reason, f"session {session_id} ended: {reason}{more}")
        self.detail = detail


class SessionBusy(SessionError):
    """The session's call queue is full (calls of one session run one at a time): the call
    was not run; try again once earlier calls have finished."""


class SessionCapacity(SessionError):
    """The node refused to open the session: it is at one of its session limits (how many
    sessions, or their memory); the message names the limit. The create is not retried."""


class SessionNotFound(SessionError, LookupError):
    """No session has this id on the queue (never created, or ended long enough ago that its
    record expired)."""


class SessionCallError(SessionError, ValueError):
    """A call was refused as malformed, or its operation failed (a path outside ``/work``, a
    missing file); ``reason`` is the node's message."""


class SessionForkError(SessionError):
    """Some branches of a fork were not made. ``sessions`` holds those that were (live
    sessions: kill them once done), ``errors`` why each other one failed, as the node said."""

    def __init__(self, session_id: str, sessions: List[Any], errors: List[str]) -> None:
        why = "; ".join(errors)
        super().__init__(
            session_id,
            why,
            f"session {session_id}: {len(errors)} of {len(sessions) + len(errors)} branches not made: {why}",
        )
        self.sessions = sessions
        self.errors = errors
