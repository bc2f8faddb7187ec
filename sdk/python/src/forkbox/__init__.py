"""Forkbox: run untrusted code in millisecond sandboxes.

- :func:`run`: one job on the local daemon (``forkbox daemon``), through a shared client;
  :class:`Forkbox` / :class:`AsyncForkbox`: clients of the daemon of their own.
- :class:`JobSpec` / :class:`Limits`: a job, field for field (the keywords of every call).
- :class:`Queue`: the Redis job queue served by ``forkbox worker`` nodes.
- :class:`Session`: a long-lived sandbox on one node of a queue (state and disk kept between
  calls); :class:`forkbox.aio.AsyncSession` is its asyncio twin.
- :mod:`forkbox.tools`: ready-made tools for agents.
"""

from .aio import AsyncForkbox
from .client import Forkbox, default_socket_path, run, run_job
from .errors import (
    ConnectionLost,
    DaemonNotRunning,
    ForkboxError,
    JobRejected,
    PartitionsMismatch,
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
    UntrustedDaemon,
)
from .job import JobSpec, Limits, build_job
from .redis_queue import Batch, Queue
from .result import STATUSES, Result
from .session import Checkpoint, CommandResult, Execution, ExecutionError, FileEntry, Session, SessionInfo

__version__ = "0.1.0"

__all__ = [
    "Checkpoint",
    "AsyncForkbox",
    "Batch",
    "CommandResult",
    "ConnectionLost",
    "DaemonNotRunning",
    "Execution",
    "ExecutionError",
    "FileEntry",
    "Forkbox",
    "ForkboxError",
    "JobRejected",
    "JobSpec",
    "Limits",
    "PartitionsMismatch",
    "ProtocolError",
    "Queue",
    "Result",
    "STATUSES",
    "Session",
    "SessionBusy",
    "SessionCallError",
    "SessionCapacity",
    "SessionEnded",
    "SessionError",
    "SessionForkError",
    "SessionInfo",
    "SessionLost",
    "SessionNotFound",
    "Timeout",
    "UntrustedDaemon",
    "build_job",
    "default_socket_path",
    "run",
    "run_job",
]
