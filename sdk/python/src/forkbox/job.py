"""Building v1 job objects (the JSON sent to the daemon and to the queue)."""

from __future__ import annotations

import base64
import difflib
import functools
import inspect
import json
import uuid
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from ._schema import LIMIT_RANGES, SCHEMA
from .errors import JobRejected

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "Data",
    "JOB_FIELDS",
    "LIMIT_FIELDS",
    "JobSpec",
    "Limits",
    "NETWORKS",
    "build_job",
    "checked_keywords",
    "encode_data",
    "new_id",
    "normalize_job",
    "spec_from_keywords",
    "validate_job",
]

#: File contents and stdin: text, or bytes (sent as text when they are UTF-8, else base64).
Data = Union[str, bytes, bytearray, memoryview]

#: The server's wall-clock limit when a job sets no ``timeout_ms``.
DEFAULT_TIMEOUT_MS = 10_000

#: What a job's ``network`` may be: ``"none"`` (Unix sockets only; the node's default unless it
#: says otherwise) or ``"loopback"`` (a network namespace of its own with ``lo`` up).
NETWORKS = tuple(SCHEMA["networks"])

#: Keywords people reach for, and the one they mean.
_KEYWORD_HINTS = {
    "memory": "memory_mb",
    "mem": "memory_mb",
    "memory_limit": "memory_mb",
    "timeout": "timeout_ms",
    "timeout_s": "timeout_ms",
    "cpu": "cpu_ms",
    "cpu_time": "cpu_ms",
    "disk": "disk_mb",
    "processes": "pids",
    "max_pids": "pids",
    "input": "stdin",
    "environment": "env",
    "args": "argv",
    "command": "cmd",
    "workdir": "cwd",
    "wait": "wait_timeout",
}

F = TypeVar("F", bound=Callable[..., Any])


def checked_keywords(public: str) -> Callable[[F], F]:
    """Makes an unknown keyword a ``TypeError`` that names ``public`` (the call as users write
    it, e.g. ``Forkbox.run``) and suggests the keyword that was probably meant."""

    def wrap(func: F) -> F:
        params = inspect.signature(func).parameters.values()
        names = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"]
        known = set(names)

        @functools.wraps(func)
        def checked(*args: Any, **kwargs: Any) -> Any:
            for k in kwargs:
                if k not in known:
                    raise TypeError(f"{public}() got an unexpected keyword argument {k!r}{_suggest(k, names)}")
            return func(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return wrap


def _suggest(word: str, names: Sequence[str]) -> str:
    hint = _KEYWORD_HINTS.get(word)
    if hint not in names:
        close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
        hint = close[0] if close else None
    return f"; did you mean {hint!r}?" if hint else f"; it takes {', '.join(names)}"


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


def normalize_job(job: Union[JobSpec, Mapping[str, Any]], *, with_id: bool = True) -> Dict[str, Any]:
    """Copies a job object into its wire form.

    ``stdin`` and ``files`` values may be ``bytes``; they are encoded. An ``id`` is added when
    absent (and ``with_id`` is true), so the caller can match the answer. Everything else is
    passed through for the server to validate: its rejection names the field at fault.
    """
    if isinstance(job, JobSpec):
        return job.to_job(with_id=with_id)
    if not isinstance(job, Mapping):
        raise TypeError(f"a job must be a mapping, got {type(job).__name__}")
    out: Dict[str, Any] = dict(job)
    if out.get("cmd") is None and out.get("argv") is None and out.get("session") is None:
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


@dataclass(frozen=True)
class Limits:
    """A job's resource limits (its ``limits`` object); ``None`` leaves the node's default.

    The ranges are the contract's (``schema.json`` ``limits``); :func:`validate_job` and the
    worker check them.
    """

    memory_mb: Optional[int] = None
    pids: Optional[int] = None
    cpu_ms: Optional[int] = None
    output_bytes: Optional[int] = None
    disk_mb: Optional[int] = None
    file_size_mb: Optional[int] = None
    open_files: Optional[int] = None

    def to_wire(self) -> Dict[str, int]:
        """The ``limits`` object: the limits that are set."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class JobSpec:
    """One v1 job, field for field (``schema.json`` ``job_fields``); ``None`` means absent.

    ``cmd`` is a shell string (run by ``/bin/sh -c``); ``argv`` a program and its arguments.
    ``stdin`` and the values of ``files`` may be ``str`` or ``bytes``. ``limits`` is a
    :class:`Limits` (or a ``limits`` mapping, passed through for the worker to check).
    ``runtime="python"`` runs a ``python3 ...`` command line in the node's warm interpreter (the
    result's ``runtime`` says whether it did). ``output_mode="truncate"`` cuts output past
    ``output_bytes`` and lets the job run on (its exit code decides its status;
    ``stdout_truncated``/``stderr_truncated`` say what was cut); the default, ``"kill"``, stops
    it (``output_limit``). ``network="loopback"`` gives the job a network namespace of its own
    with ``lo`` up; absent, it gets the node's default, ``"none"`` unless the node says
    otherwise (Unix sockets only).
    ``compile={"argv": ["g++", "-o", "main", "main.cpp"], "timeout_ms": 10000}`` runs a
    compile stage first in the same sandbox, with its own timeout and ``limits``; the program
    runs only if it exits 0 (else the status is ``compile_error``), and the result's
    ``compile`` says how the stage ended. ``session={"ttl_s": 600, "idle_s": 120}`` (with no
    ``cmd``/``argv``) opens a session instead; :class:`forkbox.Session` builds that job.

    The clients take the same names as keywords (``Forkbox.run(cmd, timeout_ms=...,
    memory_mb=...)``), the limits flattened beside the rest; see :func:`spec_from_keywords`.
    """

    cmd: Optional[str] = None
    argv: Optional[Sequence[str]] = None
    stdin: Optional[Data] = None
    env: Optional[Mapping[str, str]] = None
    files: Optional[Mapping[str, Data]] = None
    cwd: Optional[str] = None
    timeout_ms: Optional[int] = None
    limits: Union[Limits, Mapping[str, int], None] = None
    collect: Optional[Sequence[str]] = None
    batch: Optional[str] = None
    result_ttl_s: Optional[int] = None
    max_attempts: Optional[int] = None
    reply_to: Optional[str] = None
    runtime: Optional[str] = None
    output_mode: Optional[str] = None
    network: Optional[str] = None
    compile: Optional[Mapping[str, Any]] = None
    session: Optional[Mapping[str, Any]] = None
    id: Optional[str] = None

    def __post_init__(self) -> None:
        if self.cmd is not None and not isinstance(self.cmd, str):
            raise TypeError(f"cmd must be a shell string, got {type(self.cmd).__name__}; use argv=[...] for a list")

    def to_job(self, *, with_id: bool = True) -> Dict[str, Any]:
        """The job object in its wire form (see :func:`normalize_job`)."""
        job: Dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        lim = self.limits
        if lim is not None:
            job["limits"] = (lim.to_wire() if isinstance(lim, Limits) else dict(lim)) or None
        return normalize_job(job, with_id=with_id)


#: Top-level fields of a v1 job: the fields of :class:`JobSpec`.
JOB_FIELDS = frozenset(f.name for f in fields(JobSpec))

#: Fields of a job's ``limits`` object: the fields of :class:`Limits`; each is also a keyword.
LIMIT_FIELDS: Tuple[str, ...] = tuple(f.name for f in fields(Limits))

#: The keywords that describe a job: the fields of :class:`JobSpec` and, flattened, of
#: :class:`Limits`.
SPEC_KEYWORDS: Tuple[str, ...] = tuple(f.name for f in fields(JobSpec)) + LIMIT_FIELDS


def spec_from_keywords(public: str, keywords: Mapping[str, Any], also: Sequence[str] = ()) -> JobSpec:
    """Builds a :class:`JobSpec` from the keywords of a call such as ``Forkbox.run``.

    The limit keywords (``memory_mb``, ``pids``, ...) fill the job's ``limits`` and take
    precedence over the same keys in ``limits=``. An unknown keyword is a ``TypeError`` that
    names ``public`` (the call as users write it) and suggests the keyword that was probably
    meant among the job's and ``also`` (the call's own keywords, e.g. ``wait_timeout``).
    """
    for k in keywords:
        if k not in SPEC_KEYWORDS:
            names = list(SPEC_KEYWORDS) + list(also)
            raise TypeError(f"{public}() got an unexpected keyword argument {k!r}{_suggest(k, names)}")
    job = {k: v for k, v in keywords.items() if k not in LIMIT_FIELDS}
    flat = {k: v for k, v in keywords.items() if k in LIMIT_FIELDS and v is not None}
    if flat:
        base = job.get("limits")
        merged: Dict[str, Any] = base.to_wire() if isinstance(base, Limits) else dict(base or {})
        merged.update(flat)
        job["limits"] = merged
    return JobSpec(**job)


def build_job(cmd: Optional[str] = None, **keywords: Any) -> Dict[str, Any]:
    """Builds a v1 job's wire form from the keywords of :class:`JobSpec` (the limits may be
    given flat: ``memory_mb=...``)."""
    return spec_from_keywords("build_job", dict(keywords, cmd=cmd)).to_job()


def _int(job: Mapping[str, Any], field: str, lo: int, hi: int) -> None:
    v = job.get(field)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int):
        raise JobRejected(f"{field}: invalid type: expected an integer, got {v!r:.40}")
    if not lo <= v <= hi:
        raise JobRejected(f"{field}: must be between {lo} and {hi}, got {v}")


def _relative(field: str, path: Any) -> None:
    if not isinstance(path, str):
        raise JobRejected(f"{field}: invalid type: expected a string, got {path!r:.40}")
    if "\0" in path:
        raise JobRejected(f"{field}: contains a NUL byte")
    if path == "":
        raise JobRejected(f"{field}: path is empty")
    if path.startswith("/"):
        raise JobRejected(f"{field}: absolute paths are not allowed; paths are relative to the working directory")
    if ".." in path.split("/"):
        raise JobRejected(f"{field}: '..' is not allowed; paths must stay inside the working directory")


def _check_session(job: Mapping[str, Any]) -> None:
    """A session's create job: no program of its own, ``ttl_s``/``idle_s`` in range."""
    spec = job.get("session")
    if spec is None:
        return
    rules = SCHEMA["sessions"]
    if not isinstance(spec, Mapping):
        raise JobRejected(f"session: invalid type: expected an object, got {spec!r:.40}")
    for name in spec:
        if name not in rules["create_fields"]:
            raise JobRejected(f"session: unknown field `{name}`, expected one of {', '.join(rules['create_fields'])}")
    for name in sorted(set(job) - set(rules["create_allows"])):
        if job[name] is not None:
            raise JobRejected(
                f"{name}: a session's create job has no program of its own; each call gives its own command "
                f"and timeout_ms (allowed with `session`: {', '.join(x for x in rules['create_allows'] if x != 'session')})"
            )
    top = rules["defaults"]["max_s"]
    for name in rules["create_fields"]:
        v = spec.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top):
            raise JobRejected(f"session.{name}: must be between 1 and {top}, got {v!r:.40}")


def validate_job(job: Mapping[str, Any], max_job_bytes: Optional[int] = None) -> None:
    """Refuses, with the worker's message (``field: reason``), what a worker would refuse.

    The rules and ranges come from the protocol contract (``schema.json``); the worker checks
    again, so this is an early, local answer, not the authority.
    """
    defaults = SCHEMA["defaults"]
    unknown = sorted(set(job) - JOB_FIELDS)
    if unknown:
        raise JobRejected(f"job: unknown field `{unknown[0]}`, expected one of {', '.join(sorted(JOB_FIELDS))}")
    jid = job.get("id")
    if jid is not None:
        if not isinstance(jid, str) or not 1 <= len(jid) <= defaults["max_id_len"]:
            raise JobRejected(f"id: must be 1 to {defaults['max_id_len']} characters")
        if not all(33 <= ord(c) <= 126 for c in jid):
            raise JobRejected("id: must be printable ASCII without spaces")
    cmd = job.get("cmd")
    if cmd is not None and (not isinstance(cmd, str) or not cmd.strip()):
        raise JobRejected("cmd: is empty" if isinstance(cmd, str) else "cmd: invalid type: expected a string")
    argv = job.get("argv")
    if argv is not None and (not argv or argv[0] == ""):
        raise JobRejected("argv: is empty" if not argv else "argv[0]: is empty")
    _int(job, "timeout_ms", 1, defaults["max_timeout_ms"])
    _int(job, "max_attempts", 1, defaults["max_max_attempts"])
    _int(job, "result_ttl_s", 1, defaults["max_result_ttl_s"])
    mode = job.get("output_mode")
    if mode is not None and mode not in SCHEMA["output_modes"]:
        raise JobRejected(f"output_mode: unknown variant {mode!r:.40}, expected one of {', '.join(SCHEMA['output_modes'])}")
    batch = job.get("batch")
    if batch is not None and (not isinstance(batch, str) or not 1 <= len(batch.encode()) <= defaults["max_batch_len"]):
        raise JobRejected(f"batch: must be 1 to {defaults['max_batch_len']} bytes")
    limits = job.get("limits")
    if limits is not None:
        if not isinstance(limits, Mapping):
            raise JobRejected(f"limits: invalid type: expected an object, got {limits!r:.40}")
        for name in limits:
            if name not in LIMIT_RANGES:
                raise JobRejected(f"limits: unknown field `{name}`, expected one of {', '.join(LIMIT_RANGES)}")
        for name, (lo, hi) in LIMIT_RANGES.items():
            v = limits.get(name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                raise JobRejected(f"limits.{name}: invalid type: expected an integer, got {v!r:.40}")
            if not lo <= v <= hi:
                raise JobRejected(f"limits.{name}: must be between {lo} and {hi}, got {v}")
    env = job.get("env")
    if env is not None:
        for k in env:
            if not isinstance(k, str) or k == "" or "=" in k or "\0" in k:
                raise JobRejected(f"env.{k}: names must be non-empty, without '=' or NUL")
    for path in job.get("files") or {}:
        _relative(f"files.{path}", path)
    for i, pattern in enumerate(job.get("collect") or []):
        _relative(f"collect[{i}]", pattern)
    stage = job.get("compile")
    if stage is not None:
        if not isinstance(stage, Mapping):
            raise JobRejected(f"compile: invalid type: expected an object, got {stage!r:.40}")
        known = SCHEMA["compile"]["fields"]
        for name in stage:
            if name not in known:
                raise JobRejected(f"compile.{name}: unknown field `{name}`, expected one of {', '.join(known)}")
        if stage.get("cmd") is None and stage.get("argv") is None:
            raise JobRejected("compile.cmd: a compile stage needs `cmd` (a shell string) or `argv` (an array)")
        if stage.get("cmd") is not None and stage.get("argv") is not None:
            raise JobRejected("compile.cmd: give `cmd` or `argv`, not both")
        _int(stage, "timeout_ms", 1, defaults["max_timeout_ms"])
        for name, v in (stage.get("limits") or {}).items():
            if name not in SCHEMA["compile"]["limits"]:
                raise JobRejected(f"compile.limits.{name}: unknown field `{name}`, expected one of {', '.join(SCHEMA['compile']['limits'])}")
            lo, hi = LIMIT_RANGES[name]
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise JobRejected(f"compile.limits.{name}: must be between {lo} and {hi}, got {v!r:.40}")
    _check_session(job)
    network = job.get("network")
    if network is not None and network not in NETWORKS:
        raise JobRejected(f"network: unknown variant `{network}`, expected one of {', '.join(NETWORKS)}")
    cwd = job.get("cwd")
    if isinstance(cwd, str) and ".." in cwd.split("/"):
        raise JobRejected("cwd: must not contain '..'")
    if max_job_bytes is not None:
        size = len(json.dumps(job, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        if size > max_job_bytes:
            raise JobRejected(f"job payload is {size} bytes, over the limit of {max_job_bytes} bytes")
