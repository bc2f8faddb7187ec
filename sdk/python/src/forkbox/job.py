"""Building v1 job objects (the JSON sent to the daemon and to the queue)."""

from __future__ import annotations

import base64
import uuid
from typing import Any, Dict, Mapping, Optional, Sequence, Union

__all__ = ["DEFAULT_TIMEOUT_MS", "Data", "JOB_FIELDS", "LIMIT_FIELDS", "build_job", "normalize_job", "new_id", "encode_data"]

#: File contents and stdin: text, or bytes (sent as text when they are UTF-8, else base64).
Data = Union[str, bytes, bytearray, memoryview]

#: The server's wall-clock limit when a job sets no ``timeout_ms``.
DEFAULT_TIMEOUT_MS = 10_000

#: Top-level fields of a v1 job.
JOB_FIELDS = frozenset(
    {
        "id",
        "cmd",
        "argv",
        "stdin",
        "env",
        "files",
        "cwd",
        "timeout_ms",
        "limits",
        "collect",
        "batch",
        "result_ttl_s",
        "max_attempts",
        "reply_to",
    }
)

#: Fields of a job's ``limits`` object; each is also a keyword of ``build_job``.
LIMIT_FIELDS = ("memory_mb", "pids", "cpu_ms", "output_bytes", "disk_mb", "file_size_mb", "open_files")


def new_id() -> str:
    """A fresh job id (32 hex digits)."""
    return uuid.uuid4().hex


def encode_data(value: Any, where: str) -> Any:
    """Turns ``str``/``bytes`` into the wire form: a string, or ``{"b64": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(raw).decode("ascii")}
    if isinstance(value, Mapping) and set(value) == {"b64"}:
        return dict(value)
    raise TypeError(f"{where}: expected str or bytes, got {type(value).__name__}")


def _check_str_list(name: str, value: Any) -> list[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list of strings, got {type(value).__name__}")
    out = list(value)
    for i, a in enumerate(out):
        if not isinstance(a, str):
            raise TypeError(f"{name}[{i}] must be a string, got {type(a).__name__}")
    return out


def normalize_job(job: Mapping[str, Any], *, with_id: bool = True) -> Dict[str, Any]:
    """Copies a job object into its wire form.

    ``stdin`` and ``files`` values may be ``bytes``; they are encoded. An ``id`` is added when
    absent (and ``with_id`` is true), so the caller can match the answer. Everything else is
    passed through for the server to validate: its rejection names the field at fault.
    """
    if not isinstance(job, Mapping):
        raise TypeError(f"a job must be a mapping, got {type(job).__name__}")
    out: Dict[str, Any] = dict(job)
    if out.get("cmd") is None and out.get("argv") is None:
        raise ValueError("a job needs `cmd` (a shell string) or `argv` (a list of strings)")
    if out.get("cmd") is not None and out.get("argv") is not None:
        raise ValueError("give `cmd` or `argv`, not both")
    if "argv" in out and out["argv"] is not None:
        out["argv"] = _check_str_list("argv", out["argv"])
    if out.get("stdin") is not None:
        out["stdin"] = encode_data(out["stdin"], "stdin")
    if out.get("files") is not None:
        files = out["files"]
        if not isinstance(files, Mapping):
            raise TypeError(f"files must be a mapping path -> str|bytes, got {type(files).__name__}")
        out["files"] = {str(p): encode_data(v, f"files[{p!r}]") for p, v in files.items()}
    if out.get("collect") is not None:
        out["collect"] = _check_str_list("collect", out["collect"])
    if out.get("env") is not None:
        out["env"] = dict(out["env"])
    # Drop explicit Nones: the wire format means "absent" by leaving the field out.
    out = {k: v for k, v in out.items() if v is not None}
    if with_id and "id" not in out:
        out["id"] = new_id()
    return out


def build_job(
    cmd: Optional[str] = None,
    *,
    argv: Optional[Sequence[str]] = None,
    stdin: Optional[Data] = None,
    env: Optional[Mapping[str, str]] = None,
    files: Optional[Mapping[str, Data]] = None,
    cwd: Optional[str] = None,
    timeout_ms: Optional[int] = None,
    collect: Optional[Sequence[str]] = None,
    memory_mb: Optional[int] = None,
    pids: Optional[int] = None,
    cpu_ms: Optional[int] = None,
    output_bytes: Optional[int] = None,
    disk_mb: Optional[int] = None,
    file_size_mb: Optional[int] = None,
    open_files: Optional[int] = None,
    limits: Optional[Mapping[str, int]] = None,
    batch: Optional[str] = None,
    result_ttl_s: Optional[int] = None,
    max_attempts: Optional[int] = None,
    reply_to: Optional[str] = None,
    id: Optional[str] = None,
) -> Dict[str, Any]:
    """Builds a v1 job from keyword arguments.

    ``cmd`` is a shell string (run by ``/bin/sh -c``); ``argv`` a program and its arguments.
    The limit keywords (``memory_mb``, ``pids``, ...) fill the job's ``limits`` object and take
    precedence over the same keys in ``limits``.
    """
    if cmd is not None and not isinstance(cmd, str):
        raise TypeError(f"cmd must be a shell string, got {type(cmd).__name__}; use argv=[...] for a list")
    lim: Dict[str, int] = dict(limits or {})
    given = {
        "memory_mb": memory_mb,
        "pids": pids,
        "cpu_ms": cpu_ms,
        "output_bytes": output_bytes,
        "disk_mb": disk_mb,
        "file_size_mb": file_size_mb,
        "open_files": open_files,
    }
    lim.update({k: v for k, v in given.items() if v is not None})
    job: Dict[str, Any] = {
        "id": id,
        "cmd": cmd,
        "argv": argv,
        "stdin": stdin,
        "env": env,
        "files": files,
        "cwd": cwd,
        "timeout_ms": timeout_ms,
        "limits": lim or None,
        "collect": collect,
        "batch": batch,
        "result_ttl_s": result_ttl_s,
        "max_attempts": max_attempts,
        "reply_to": reply_to,
    }
    return normalize_job(job)
