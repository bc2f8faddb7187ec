"""Forkbox: run untrusted code in millisecond sandboxes.

- :class:`Forkbox` / :class:`AsyncForkbox`: the local daemon (``forkbox daemon``).
- :class:`Queue`: the Redis job queue served by ``forkbox worker`` nodes.
- :mod:`forkbox.tools`: ready-made tools for agents.
"""

from .aio import AsyncForkbox
from .client import Forkbox, default_socket_path
from .errors import (
    ConnectionLost,
    DaemonNotRunning,
    ForkboxError,
    JobRejected,
    PartitionsMismatch,
    ProtocolError,
    Timeout,
    UntrustedDaemon,
)
from .job import build_job
from .redis_queue import Batch, Queue
from .result import STATUSES, Result

__version__ = "0.1.0"

__all__ = [
    "AsyncForkbox",
    "Batch",
    "ConnectionLost",
    "DaemonNotRunning",
    "Forkbox",
    "ForkboxError",
    "JobRejected",
    "PartitionsMismatch",
    "ProtocolError",
    "Queue",
    "Result",
    "STATUSES",
    "Timeout",
    "UntrustedDaemon",
    "build_job",
    "default_socket_path",
]
