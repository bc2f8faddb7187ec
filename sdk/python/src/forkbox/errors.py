"""Exceptions raised by the Forkbox client.

Every failure is an exception: a call never returns ``None`` in place of a result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .result import Result

__all__ = [
    "ForkboxError",
    "DaemonNotRunning",
    "ConnectionLost",
    "JobRejected",
    "Timeout",
    "ProtocolError",
    "PartitionsMismatch",
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
