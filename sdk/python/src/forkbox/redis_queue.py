"""Client of the Redis job queue (the cluster), with redis-py.

Key layout (``Q`` is the queue name; the braces are literal, a Redis Cluster hash tag, so every
key of one queue lives in one slot and multi-key commands work):

- ``forkbox:{Q}:jobs``            stream; ``XADD ... * job <job JSON>`` submits a job
- ``forkbox:{Q}:result:<id>``     string; the result JSON once the job finished
- ``forkbox:{Q}:done:<id>``       list; receives one element at completion (``BLMOVE`` wakes on it)
- ``forkbox:{Q}:results``         stream of every result (field ``result``)
- ``forkbox:{Q}:batch:<batch>``   hash; ``total`` (the client's), ``done`` and one field per status
- ``forkbox:{Q}:cancelled``       sorted set id -> cancel time (ms); ``forkbox:{Q}:cancel`` channel

docs/protocol.md is the contract; this module follows it.
"""

from __future__ import annotations

import importlib
import json
import time
import uuid
import warnings
from typing import (
    Any,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
)

from .errors import JobRejected, ProtocolError, Timeout
from .job import Data, build_job, normalize_job
from .result import Result

__all__ = ["Queue", "Batch", "JobSpec"]

#: The queue's result lifetime when a job sets no ``result_ttl_s`` (docs/protocol.md).
DEFAULT_RESULT_TTL_S = 86_400

#: What ``Queue.map`` and ``Queue.batch`` accept per job: a v1 job object, or a shell string.
JobSpec = Union[Mapping[str, Any], str]

try:  # redis is the one runtime dependency, but keep `import forkbox` working without it.
    import redis as _redis
except ImportError:  # pragma: no cover
    _redis = None  # type: ignore[assignment]


def _as_job(spec: JobSpec) -> Dict[str, Any]:
    if isinstance(spec, str):
        return normalize_job({"cmd": spec})
    return normalize_job(spec)


class Queue:
    """A job queue on Redis: ``Queue("redis://host:6379", queue="default")``.

    ``redis`` may also be a ``redis.Redis`` client (it must not decode responses). ``block_s``
    bounds each blocking Redis call, so waits re-check for results whose wake-up another client
    consumed, and stay interruptible.
    """

    def __init__(self, redis: Union[str, Any] = "redis://127.0.0.1:6379", queue: str = "default", *, block_s: float = 1.0) -> None:
        if not (1 <= len(queue) <= 64) or not all(33 <= ord(c) <= 126 and c not in "{}:" for c in queue):
            raise ValueError(
                f"queue name {queue!r} is invalid: 1 to 64 printable ASCII characters without "
                "spaces, braces or colons"
            )
        if isinstance(redis, str):
            if _redis is None:  # pragma: no cover
                raise ImportError("forkbox.Queue needs redis-py: pip install redis")
            self.redis: Any = _redis.Redis.from_url(redis)
        else:
            self.redis = redis
        self.name = queue
        self.block_s = block_s
        self._prefix = f"forkbox:{{{queue}}}"

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    # -- keys ----------------------------------------------------------------------------

    @property
    def jobs_key(self) -> str:
        return f"{self._prefix}:jobs"

    @property
    def results_key(self) -> str:
        return f"{self._prefix}:results"

    def result_key(self, job_id: str) -> str:
        return f"{self._prefix}:result:{job_id}"

    def done_key(self, job_id: str) -> str:
        return f"{self._prefix}:done:{job_id}"

    def batch_key(self, batch_id: str) -> str:
        return f"{self._prefix}:batch:{batch_id}"

    # -- submitting ----------------------------------------------------------------------

    def submit(
        self,
        job: Optional[JobSpec] = None,
        *,
        cmd: Optional[str] = None,
        argv: Optional[Sequence[str]] = None,
        timeout_ms: Optional[int] = None,
        stdin: Optional[Data] = None,
        env: Optional[Mapping[str, str]] = None,
        files: Optional[Mapping[str, Data]] = None,
        cwd: Optional[str] = None,
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
    ) -> str:
        """Enqueues one job and returns its id.

        Pass a v1 job object (``{"cmd": ..., "limits": {...}}``) or a shell string as ``job``,
        or the keywords of :meth:`forkbox.Forkbox.run` (plus ``batch``, ``result_ttl_s``,
        ``max_attempts``, ``reply_to``).
        """
        if job is not None:
            kw = dict(
                cmd=cmd, argv=argv, timeout_ms=timeout_ms, stdin=stdin, env=env, files=files,
                cwd=cwd, collect=collect, memory_mb=memory_mb, pids=pids, cpu_ms=cpu_ms,
                output_bytes=output_bytes, disk_mb=disk_mb, file_size_mb=file_size_mb,
                open_files=open_files, limits=limits, batch=batch, result_ttl_s=result_ttl_s,
                max_attempts=max_attempts, reply_to=reply_to, id=id,
            )  # fmt: skip
            extra = sorted(k for k, v in kw.items() if v is not None)
            if extra:
                raise TypeError(f"give a job object or keywords, not both (got {', '.join(extra)})")
            wire = _as_job(job)
        else:
            wire = build_job(
                cmd, argv=argv, timeout_ms=timeout_ms, stdin=stdin, env=env, files=files,
                cwd=cwd, collect=collect, memory_mb=memory_mb, pids=pids, cpu_ms=cpu_ms,
                output_bytes=output_bytes, disk_mb=disk_mb, file_size_mb=file_size_mb,
                open_files=open_files, limits=limits, batch=batch, result_ttl_s=result_ttl_s,
                max_attempts=max_attempts, reply_to=reply_to, id=id,
            )  # fmt: skip
        return self._enqueue([wire])[0]

    def _enqueue(self, jobs: Sequence[Dict[str, Any]]) -> List[str]:
        """XADDs the jobs in one transaction; batch totals are counted before the jobs land."""
        if not jobs:
            return []
        pipe = self.redis.pipeline(transaction=True)
        totals: Dict[str, int] = {}
        ttls: Dict[str, int] = {}
        for j in jobs:
            b = j.get("batch")
            if isinstance(b, str):
                totals[b] = totals.get(b, 0) + 1
                ttl = j.get("result_ttl_s")
                ttls[b] = max(ttls.get(b, 0), ttl if isinstance(ttl, int) and ttl > 0 else DEFAULT_RESULT_TTL_S)
        for b, n in totals.items():
            pipe.hincrby(self.batch_key(b), "total", n)
            # Workers renew this TTL at each result; set it here too, so a batch whose jobs
            # never run does not stay forever.
            pipe.expire(self.batch_key(b), ttls[b])
        for j in jobs:
            pipe.xadd(self.jobs_key, {"job": json.dumps(j, ensure_ascii=False, separators=(",", ":"))})
        pipe.execute()
        return [j["id"] for j in jobs]

    # -- results -------------------------------------------------------------------------

    def _get(self, job_id: str) -> Optional[Result]:
        raw = self.redis.get(self.result_key(job_id))
        return None if raw is None else _parse_stored(raw, job_id)

    def result(self, job_id: str, timeout: Optional[float] = None) -> Result:
        """Waits for a job's result (``timeout`` seconds; ``None`` waits as long as it takes).

        Raises :class:`Timeout` when the wait runs out, and :class:`JobRejected` when the
        worker refused the job as malformed. Several clients may wait on one id: the wait uses
        ``BLMOVE done done``, which leaves the wake-up element in place (docs/protocol.md).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        done = self.done_key(job_id)
        while True:
            res = self._get(job_id)
            if res is not None:
                return _check(res)
            wait = self.block_s
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(f"no result for job {job_id} within {timeout}s (queue {self.name!r})")
                wait = min(wait, left)
            woke = self.redis.blmove(done, done, max(round(wait, 3), 0.01), "RIGHT", "LEFT")
            if woke is not None and self.redis.exists(self.result_key(job_id)) == 0:
                time.sleep(0.05)  # a wake-up without a result (it expired): do not spin

    def map(
        self,
        jobs: Iterable[JobSpec],
        *,
        concurrency: int = 64,
        progress: bool = False,
        timeout: Optional[float] = None,
    ) -> Iterator[Result]:
        """Runs many jobs, keeping ``concurrency`` of them submitted but unfinished, and yields
        each result as it finishes (not in submission order; match them by ``Result.id``).

        Every job yields a result, a rejected one too (``status == "invalid"``, reason in
        ``error``). ``timeout`` bounds the wait for each next result (:class:`Timeout`).
        ``progress=True`` shows a tqdm bar when tqdm is installed.
        """
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        total = len(jobs) if hasattr(jobs, "__len__") else None  # type: ignore[arg-type]
        bar = _progress_bar(total, self.name) if progress else None
        source = iter(jobs)
        inflight: Dict[str, None] = {}  # ids submitted, not yet yielded (insertion-ordered)
        exhausted = False

        def top_up() -> None:
            nonlocal exhausted
            fresh: List[Dict[str, Any]] = []
            while not exhausted and len(inflight) + len(fresh) < concurrency:
                try:
                    fresh.append(_as_job(next(source)))
                except StopIteration:
                    exhausted = True
            for j in fresh:
                if j["id"] in inflight:
                    raise ValueError(f"job id {j['id']!r} appears twice among unfinished jobs")
            self._enqueue(fresh)
            for j in fresh:
                inflight[j["id"]] = None

        try:
            # Results are read from the results stream (every result, in completion order),
            # starting after its newest entry at the time of the first submission. That stream
            # is capped, and a reader may fall behind, so results are also swept with MGET when
            # the stream is idle and every few seconds.
            cursor = self._stream_tail()
            top_up()
            last_progress = last_sweep = time.monotonic()
            while inflight:
                finished: List[Result] = []
                got = self.redis.xread({self.results_key: cursor}, count=1000, block=max(1, int(self.block_s * 1000)))
                for _stream, entries in got or []:
                    for entry_id, fields in entries:
                        cursor = entry_id
                        raw = fields.get(b"result")
                        if raw is None or not _mentions_any(raw, inflight):
                            continue
                        res = _parse_stored(raw, "(results stream)")
                        if res.id in inflight:
                            finished.append(res)
                now = time.monotonic()
                if not got or now - last_sweep > 5 * self.block_s:
                    last_sweep = now
                    ids = [i for i in inflight if i not in {r.id for r in finished}]
                    if ids:
                        raws = self.redis.mget([self.result_key(i) for i in ids])
                        finished.extend(_parse_stored(r, i) for r, i in zip(raws, ids) if r is not None)
                for res in finished:
                    if res.id not in inflight:
                        continue  # seen twice (stream and sweep)
                    del inflight[res.id]
                    if bar is not None:
                        bar.update(1)
                    yield res
                if finished:
                    last_progress = time.monotonic()
                    top_up()
                elif timeout is not None and time.monotonic() - last_progress > timeout:
                    raise Timeout(f"no result within {timeout}s; {len(inflight)} jobs still unfinished")
        finally:
            if bar is not None:
                bar.close()

    def _stream_tail(self) -> Union[bytes, str]:
        newest = self.redis.xrevrange(self.results_key, count=1)
        return newest[0][0] if newest else b"0-0"

    # -- batches and cancellation ----------------------------------------------------------

    def batch(self, jobs: Iterable[JobSpec], *, batch_id: Optional[str] = None, chunk: int = 500) -> Batch:
        """Submits jobs as one batch (counted in ``forkbox:{Q}:batch:<id>``) and returns it."""
        bid = batch_id or uuid.uuid4().hex
        ids: List[str] = []
        buf: List[Dict[str, Any]] = []
        for spec in jobs:
            j = _as_job(spec)
            if j.get("batch") not in (None, bid):
                raise ValueError(f"job {j['id']} already belongs to batch {j['batch']!r}")
            j["batch"] = bid
            buf.append(j)
            if len(buf) >= chunk:
                ids += self._enqueue(buf)
                buf = []
        ids += self._enqueue(buf)
        return Batch(self, bid, ids)

    def cancel(self, job_id: str) -> None:
        """Cancels a job: a queued job will not run, a running one is killed (``cancelled``)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.zadd(f"{self._prefix}:cancelled", {job_id: int(time.time() * 1000)})
        pipe.publish(f"{self._prefix}:cancel", job_id)
        pipe.execute()


class Batch:
    """Jobs submitted together; their progress is counted by the workers in Redis."""

    def __init__(self, queue: Queue, batch_id: str, ids: Sequence[str]) -> None:
        self.queue = queue
        self.id = batch_id
        self.ids: List[str] = list(ids)

    def __repr__(self) -> str:
        return f"Batch({self.id!r}, jobs={len(self.ids)})"

    def __len__(self) -> int:
        return len(self.ids)

    def counts(self) -> Dict[str, int]:
        """The batch hash as integers: ``total``, ``done`` and one count per status."""
        raw = self.queue.redis.hgetall(self.queue.batch_key(self.id))
        out: Dict[str, int] = {}
        for k, v in raw.items():
            key = k.decode() if isinstance(k, bytes) else str(k)
            try:
                out[key] = int(v)
            except ValueError:
                raise ProtocolError(f"batch field {key} is not an integer: {v!r}") from None
        return out

    def summary(self) -> Dict[str, int]:
        """Finished jobs per status, e.g. ``{"ok": 160, "failed": 4}``."""
        return {k: v for k, v in self.counts().items() if k not in ("total", "done") and v}

    @property
    def done(self) -> int:
        return self.counts().get("done", 0)

    def wait(self, timeout: Optional[float] = None) -> Dict[str, int]:
        """Blocks until every job of the batch has finished; returns :meth:`summary`.

        Wakes on each new entry of the results stream rather than polling.
        """
        q = self.queue
        deadline = None if timeout is None else time.monotonic() + timeout
        last_id = q._stream_tail()
        while True:
            c = self.counts()
            if c.get("done", 0) >= max(c.get("total", 0), len(self.ids)):
                return {k: v for k, v in c.items() if k not in ("total", "done") and v}
            wait = q.block_s
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(
                        f"batch {self.id}: {c.get('done', 0)} of {len(self.ids)} jobs done after {timeout}s"
                    )
                wait = min(wait, left)
            got = q.redis.xread({q.results_key: last_id}, count=1000, block=max(1, int(wait * 1000)))
            for _stream, entries in got or []:
                if entries:
                    last_id = entries[-1][0]

    def results(self, timeout: Optional[float] = None) -> Iterator[Result]:
        """Each job's result, in submission order (waiting for those not finished yet).

        Rejected jobs yield their ``invalid`` result rather than raising.
        """
        for job_id in self.ids:
            try:
                yield self.queue.result(job_id, timeout=timeout)
            except JobRejected as e:
                assert e.result is not None
                yield e.result


def _parse_stored(raw: Union[bytes, str], job_id: str) -> Result:
    try:
        return Result.from_json(raw)
    except ProtocolError as e:
        raise ProtocolError(f"stored result of job {job_id}: {e}") from None


def _mentions_any(raw: bytes, ids: Mapping[str, None]) -> bool:
    """Cheap pre-filter before parsing a result from the shared stream: does it name one of ids?"""
    if len(ids) > 64 or any('"' in i or "\\" in i for i in ids):
        return True  # ids that JSON escapes are not found verbatim; parse everything
    return any(i.encode() in raw for i in ids)


def _check(res: Result) -> Result:
    if res.status == "invalid":
        raise JobRejected(res.error or "the worker gave no reason", res)
    return res


def _progress_bar(total: Optional[int], name: str) -> Any:
    try:
        tqdm = importlib.import_module("tqdm").tqdm
    except ImportError:
        warnings.warn("progress=True needs tqdm (pip install 'forkbox[progress]'); no bar shown", stacklevel=3)
        return None
    return tqdm(total=total, desc=f"forkbox:{name}", unit="job")
