"""The v1 result, as a typed object."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Union

from .errors import ProtocolError

__all__ = ["Result", "STATUSES"]

#: Every status a v1 result can carry.
STATUSES = (
    "ok",
    "failed",
    "timeout",
    "cpu_limit",
    "memory_limit",
    "output_limit",
    "signaled",
    "cancelled",
    "invalid",
    "error",
    "compile_error",
)


def decode_data(value: Any, where: str) -> bytes:
    """Decodes a wire data value: a UTF-8 string, or ``{"b64": "..."}``."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, Mapping) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError) as e:
            raise ProtocolError(f"{where}: invalid base64: {e}") from None
    raise ProtocolError(f"{where}: expected a string or {{\"b64\": ...}}, got {value!r:.80}")


def _get(d: Mapping[str, Any], key: str, kind: Any, default: Any = ...) -> Any:
    if key not in d or (d[key] is None and default is not ...):
        if default is ...:
            raise ProtocolError(f"result is missing `{key}`: {json.dumps(d)[:200]}")
        return default
    v = d[key]
    # bool is an int subclass: do not accept it where a number is expected, and vice versa.
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise ProtocolError(f"result field `{key}` should be an integer, got {v!r:.80}")
    if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise ProtocolError(f"result field `{key}` should be a number, got {v!r:.80}")
    if kind in (str, bool) and not isinstance(v, kind):
        raise ProtocolError(f"result field `{key}` should be {kind.__name__}, got {v!r:.80}")
    return float(v) if kind is float else v


@dataclass(frozen=True)
class Result:
    """What a job produced.

    ``stdout``/``stderr`` are text (invalid UTF-8 was replaced by the server); collected
    ``files`` are bytes. ``raw`` is the result object exactly as received.
    """

    id: str
    status: str
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    duration_ms: float
    spawn_us: int
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    signal: Optional[int] = None
    cpu_ms: int = 0
    max_rss_kb: int = 0
    #: What bounded the job's memory: ``"cgroup"`` or ``"sandbox_budget"`` (None if it never ran).
    memory_bound_by: Optional[str] = None
    files: Dict[str, bytes] = field(default_factory=dict)
    error: Optional[str] = None
    attempt: Optional[int] = None
    worker: Optional[str] = None
    batch: Optional[str] = None
    watchdog_overshoot_us: Optional[int] = None
    #: For a job that asked for a runtime: ``{"name": "python", "warm": bool, "note": ...}``.
    runtime: Optional[Dict[str, Any]] = None
    #: For a staged job: how its compile stage ended (``status``, ``exit_code``, ``stdout``,
    #: ``stderr``, ``duration_ms``, ``cpu_ms``, ``max_rss_kb``, ...), as the worker sent it.
    compile: Optional[Dict[str, Any]] = None
    #: When the job was put on the stream, started, finished (Unix ms; None when not known).
    enqueued_at_ms: Optional[int] = None
    started_at_ms: Optional[int] = None
    finished_at_ms: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def truncated(self) -> bool:
        """True when stdout or stderr was cut at the output limit."""
        return self.stdout_truncated or self.stderr_truncated

    @property
    def queue_wait_ms(self) -> Optional[int]:
        """Time in queue, from enqueue to start, when both are known."""
        if self.enqueued_at_ms is None or self.started_at_ms is None:
            return None
        return max(0, self.started_at_ms - self.enqueued_at_ms)

    @property
    def ok(self) -> bool:
        """True when the program exited with code 0."""
        return self.status == "ok"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Result:
        """Parses a v1 result object; raises :class:`ProtocolError` when it is malformed."""
        if not isinstance(d, Mapping):
            raise ProtocolError(f"a result must be a JSON object, got {d!r:.80}")
        # A status outside STATUSES (from a newer server) is kept as it is.
        status = _get(d, "status", str)
        raw_files = d.get("files") or {}
        if not isinstance(raw_files, Mapping):
            raise ProtocolError(f"result field `files` should be an object, got {raw_files!r:.80}")
        files = {str(k): decode_data(v, f"files.{k}") for k, v in raw_files.items()}
        rid = d.get("id")
        if rid is not None and not isinstance(rid, str):
            raise ProtocolError(f"result field `id` should be a string, got {rid!r:.80}")
        error = d.get("error")
        if error is not None and not isinstance(error, str):
            error = json.dumps(error)
        return cls(
            id=rid if rid is not None else "",
            status=status,
            exit_code=_get(d, "exit_code", int),
            stdout=_get(d, "stdout", str, ""),
            stderr=_get(d, "stderr", str, ""),
            timed_out=_get(d, "timed_out", bool, status == "timeout"),
            duration_ms=_get(d, "duration_ms", float, 0.0),
            spawn_us=_get(d, "spawn_us", int, 0),
            stdout_truncated=_get(d, "stdout_truncated", bool, False),
            stderr_truncated=_get(d, "stderr_truncated", bool, False),
            signal=_get(d, "signal", int, None),
            cpu_ms=_get(d, "cpu_ms", int, 0),
            max_rss_kb=_get(d, "max_rss_kb", int, 0),
            memory_bound_by=_get(d, "memory_bound_by", str, None),
            files=files,
            error=error,
            attempt=_get(d, "attempt", int, None),
            worker=_get(d, "worker", str, None),
            batch=_get(d, "batch", str, None),
            watchdog_overshoot_us=_get(d, "watchdog_overshoot_us", int, None),
            runtime=dict(d["runtime"]) if isinstance(d.get("runtime"), Mapping) else None,
            compile=dict(d["compile"]) if isinstance(d.get("compile"), Mapping) else None,
            enqueued_at_ms=_get(d, "enqueued_at_ms", int, None),
            started_at_ms=_get(d, "started_at_ms", int, None),
            finished_at_ms=_get(d, "finished_at_ms", int, None),
            raw=dict(d),
        )

    @classmethod
    def from_json(cls, text: Union[str, bytes]) -> Result:
        try:
            d = json.loads(text)
        except ValueError as e:
            raise ProtocolError(f"result is not valid JSON: {e}") from None
        return cls.from_dict(d)

    def describe(self) -> str:
        """A one-line summary, e.g. ``failed (exit code 1)``."""
        if self.status == "ok":
            return "ok"
        if self.timed_out or self.status == "timeout":
            return f"timeout (exit code {self.exit_code})"
        parts = [f"exit code {self.exit_code}"]
        if self.signal is not None:
            parts.append(f"signal {self.signal}")
        if self.error:
            parts.append(self.error)
        return f"{self.status} ({', '.join(parts)})"
