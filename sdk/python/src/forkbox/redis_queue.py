"""Client of the Redis job queue (the cluster), with redis-py.

Key layout (``Q`` is the queue name; the braces are literal, a Redis Cluster hash tag, so every
key of one queue lives in one slot and multi-key commands work):

- ``forkbox:{Q}:jobs``            stream; ``XADD ... * job <job JSON>`` submits a job
- ``forkbox:{Q}:result:<id>``     string; the result JSON once the job finished
- ``forkbox:{Q}:done:<id>``       list; receives one element at completion (for ``BLPOP``)
- ``forkbox:{Q}:wake:<id>``       stream; one entry at completion, for a few seconds (``XREAD`` wakes on it)
- ``forkbox:{Q}:results``         stream of every result (field ``result``)
- ``forkbox:{Q}:batch:<batch>``   hash; ``total`` (the client's), ``done`` and one field per status
- ``forkbox:{Q}:cancelled``       sorted set id -> cancel time (ms); ``forkbox:{Q}:cancel`` channel
- ``forkbox:{Q}:idem:<id>``       string; the idempotency marker the enqueue script sets

A queue may be split into ``N`` partitions (``partitions=N``, docs/protocol.md "Partitioned
queues"): partition 0 keeps the tag ``{Q}``, partition ``p >= 1`` has ``{Q:p:k}``, and a job
lives on partition ``crc16(id) mod N``. ``N`` is recorded in ``forkbox:{Q}:meta``; a client
with another ``N`` is refused with :class:`PartitionsMismatch`.

docs/protocol.md is the contract; the names come from ``schema.json`` (generated from the Rust
``forkbox-queue`` crate), and jobs are added by the same enqueue script the Rust clients run.
"""

from __future__ import annotations

import binascii
import importlib
import json
import os
import urllib.parse
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
    Tuple,
    Union,
)

from ._schema import ENQUEUE_LUA, JOB_STATE_LUA, SCHEMA, key
from .errors import JobRejected, PartitionsMismatch, ProtocolError, Timeout
from .job import JobSpec, normalize_job, spec_from_keywords, validate_job
from .result import Result

__all__ = ["Queue", "Batch", "JobLike", "JobSpec", "DEFAULT_REDIS_URL", "redis_url_from_env"]

#: The queue's result lifetime when a job sets no ``result_ttl_s`` (docs/protocol.md).
DEFAULT_RESULT_TTL_S: int = SCHEMA["defaults"]["result_ttl_s"]

#: Largest job payload a worker accepts by default.
DEFAULT_MAX_JOB_BYTES: int = SCHEMA["defaults"]["max_job_bytes"]

#: Where ``Queue()`` connects when neither an argument nor ``$FORKBOX_REDIS_URL`` says.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"


def redis_url_from_env() -> str:
    """``$FORKBOX_REDIS_URL``, the setting every Forkbox command reads, else the default.

    ``$FORKBOX_REDIS`` (an older name) is still read, with a warning.
    """
    url = os.environ.get("FORKBOX_REDIS_URL")
    if url:
        return url
    old = os.environ.get("FORKBOX_REDIS")
    if old:
        warnings.warn("FORKBOX_REDIS is deprecated; set FORKBOX_REDIS_URL instead", DeprecationWarning, stacklevel=3)
        return old
    return DEFAULT_REDIS_URL

#: What ``Queue.map`` and ``Queue.batch`` accept per job: a :class:`JobSpec`, a v1 job object,
#: or a shell string.
JobLike = Union[JobSpec, Mapping[str, Any], str]

try:  # redis is the one runtime dependency, but keep `import forkbox` working without it.
    import redis as _redis
except ImportError:  # pragma: no cover
    _redis = None  # type: ignore[assignment]


#: Hash slots of a Redis Cluster, and the most partitions a queue may have.
CLUSTER_SLOTS: int = SCHEMA["partitions"]["slots"]
MAX_PARTITIONS: int = SCHEMA["partitions"]["max"]


def tag_slot(tag: str) -> int:
    """The cluster slot of hash tag ``tag``: CRC16-CCITT (XMODEM) mod 16384, as Redis computes."""
    return binascii.crc_hqx(tag.encode(), 0) % CLUSTER_SLOTS


def partition_tag(queue: str, partition: int, partitions: int) -> str:
    """The hash tag of partition ``partition`` of ``queue`` split into ``partitions``
    (docs/protocol.md "Partitioned queues")."""
    if partition == 0:
        return queue

    def band(slot: int) -> int:
        return slot * partitions // CLUSTER_SLOTS

    want = (band(tag_slot(queue)) + partition) % partitions
    k = 0
    while band(tag_slot(f"{queue}:{partition}:{k}")) != want:
        k += 1
    return f"{queue}:{partition}:{k}"


def partition_of(job_id: str, partitions: int) -> int:
    """The partition job ``job_id`` lives on: ``crc16(id) mod N``."""
    return binascii.crc_hqx(job_id.encode(), 0) % max(partitions, 1)


def enqueue_keys_args(tag: str, job: Mapping[str, Any], now_ms: int, cluster: bool) -> Tuple[List[str], List[Any]]:
    """The KEYS and ARGV of the enqueue script adding ``job`` (with its ``id``) on the
    partition whose hash tag is ``tag``."""
    batch = job.get("batch")
    keys = [
        key("jobs", tag),
        key("idem", tag, id=job["id"]),
        key("batch", tag, batch=batch if isinstance(batch, str) else ""),
        key("cancel_ahead", tag),
        key("cancelled", tag),
    ]
    args = [
        json.dumps(job, ensure_ascii=False, separators=(",", ":")),
        job.get("result_ttl_s") or DEFAULT_RESULT_TTL_S,
        "1" if isinstance(batch, str) else "0",
        job["id"],
        now_ms,
        "SPUBLISH" if cluster else "PUBLISH",
        key("cancel_channel", tag),
    ]
    return keys, args


def _as_job(spec: JobLike) -> Dict[str, Any]:
    if isinstance(spec, str):
        return normalize_job({"cmd": spec})
    return normalize_job(spec)


def _tls_options(url: str, ca: Optional[str], cert: Optional[str], key: Optional[str]) -> Dict[str, Any]:
    """redis-py's TLS arguments for ``url``, as the ``forkbox`` commands read ``--redis-ca``,
    ``--redis-cert`` and ``--redis-key``: the system's roots unless ``ca`` is given, a client
    certificate when ``cert`` and ``key`` are, no verification with ``rediss://...#insecure``
    (for tests only). TLS settings with a ``redis://`` URL are refused rather than ignored."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "rediss":
        if ca or cert or key:
            raise ValueError(
                f"{_redacted(url)}: TLS settings (ssl_ca_certs, ssl_certfile, ssl_keyfile) are given but "
                "the URL is not rediss://; use rediss://HOST:PORT for TLS, or drop the settings"
            )
        return {}
    if bool(cert) != bool(key):
        raise ValueError("a client certificate needs both ssl_certfile and ssl_keyfile")
    options: Dict[str, Any] = {}
    if parts.fragment == "insecure":
        options.update(ssl_cert_reqs="none", ssl_check_hostname=False)
    elif parts.fragment:
        raise ValueError(f"{_redacted(url)}: only #insecure is understood after a rediss:// URL")
    if ca:
        options["ssl_ca_certs"] = ca
    if cert:
        options.update(ssl_certfile=cert, ssl_keyfile=key)
    return options


def _redacted(url: str) -> str:
    """``url`` without its user and password."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url


def _connect(
    url: str, cluster: bool, ca: Optional[str] = None, cert: Optional[str] = None, key: Optional[str] = None
) -> Any:
    """A redis-py client for ``url``: one server, or with ``cluster`` a ``RedisCluster`` reached
    through one or more comma-separated seed URLs (``redis://h1:7000,redis://h2:7000``), with
    the TLS settings of :func:`_tls_options` for ``rediss://``."""
    if _redis is None:  # pragma: no cover
        raise ImportError("forkbox.Queue needs redis-py: pip install redis")
    seeds = [u.strip() for u in url.split(",")]
    if any(not u for u in seeds):
        raise ValueError(f"redis {url!r}: an empty URL in the list")
    tls = [_tls_options(seed, ca, cert, key) for seed in seeds]
    seeds = [seed.split("#", 1)[0] for seed in seeds]
    if not cluster:
        if len(seeds) > 1:
            raise ValueError(f"redis {url!r}: several URLs name a Redis Cluster's seed nodes; pass cluster=True")
        return _redis.Redis.from_url(seeds[0], **tls[0])
    from redis.cluster import ClusterNode, RedisCluster

    nodes = []
    auth: Dict[str, Any] = dict(tls[0])
    for seed in seeds:
        parts = urllib.parse.urlsplit(seed)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise ValueError(f"cluster seed {_redacted(seed)!r}: expected redis://host:port")
        nodes.append(ClusterNode(parts.hostname, parts.port or 6379))
        if parts.password and "password" not in auth:
            auth["password"] = urllib.parse.unquote(parts.password)
            if parts.username:
                auth["username"] = urllib.parse.unquote(parts.username)
        if parts.scheme == "rediss":
            auth["ssl"] = True
    try:
        return RedisCluster(startup_nodes=nodes, **auth)
    except (_redis.exceptions.RedisError, _redis.exceptions.RedisClusterException) as e:
        shown = ",".join(f"{n.host}:{n.port}" for n in nodes)
        raise ConnectionError(
            f"cannot use {shown} as Redis Cluster seeds: {e} (are they nodes of a cluster with "
            "every slot served? a single server is used without cluster=True)"
        ) from e


class Queue:
    """A job queue on Redis: ``Queue("redis://host:6379", queue="default")``, or on a Redis
    Cluster: ``Queue("redis://h1:7000,redis://h2:7000", cluster=True)``.

    Without ``redis``, the URL is ``$FORKBOX_REDIS_URL`` (as for the ``forkbox`` commands),
    else ``redis://127.0.0.1:6379``. ``redis`` may also be a ``redis.Redis`` or
    ``redis.cluster.RedisCluster`` client (it must not decode responses). Every key of a queue
    carries its ``{Q}`` hash tag, so each call touches one slot and works the same on a
    cluster. ``max_job_bytes`` is the workers' payload limit, checked before a job is sent.
    ``partitions`` is the queue's partition count (docs/protocol.md "Partitioned queues"): jobs
    spread over the partitions by id, and it must match the count the queue was created with
    (recorded in ``forkbox:{Q}:meta`` by its first user), else :class:`PartitionsMismatch`.
    ``block_s``
    bounds each blocking Redis call, so waits re-check for results whose wake-up another client
    consumed, and stay interruptible.

    A ``rediss://`` URL speaks TLS and verifies the server against the system's roots, or
    against ``ssl_ca_certs`` (a PEM file; default ``$FORKBOX_REDIS_CA``); ``ssl_certfile`` and
    ``ssl_keyfile`` (default ``$FORKBOX_REDIS_CERT`` and ``$FORKBOX_REDIS_KEY``) add a client
    certificate. ``redis://USER:PASSWORD@HOST:PORT`` logs in as an ACL user; %-encode
    ``@ : / # ? %`` in the password.
    """

    def __init__(
        self,
        redis: Union[str, Any, None] = None,
        queue: str = "default",
        *,
        block_s: float = 1.0,
        max_job_bytes: int = DEFAULT_MAX_JOB_BYTES,
        cluster: bool = False,
        partitions: int = 1,
        ssl_ca_certs: Optional[str] = None,
        ssl_certfile: Optional[str] = None,
        ssl_keyfile: Optional[str] = None,
    ) -> None:
        if redis is None:
            redis = redis_url_from_env()
        if not (1 <= len(queue) <= 64) or not all(33 <= ord(c) <= 126 and c not in "{}:" for c in queue):
            raise ValueError(
                f"queue name {queue!r} is invalid: 1 to 64 printable ASCII characters without "
                "spaces, braces or colons"
            )
        if not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"queue {queue}: {partitions!r} partitions is not 1 to {MAX_PARTITIONS}")
        #: Hash tags of the partitions, partition 0 (``Q``) first.
        self.tags: List[str] = [partition_tag(queue, p, partitions) for p in range(partitions)]
        self.partitions = partitions
        self._layout_checked = False
        if isinstance(redis, str):
            self.redis: Any = _connect(
                redis,
                cluster,
                ssl_ca_certs or os.environ.get("FORKBOX_REDIS_CA") or None,
                ssl_certfile or os.environ.get("FORKBOX_REDIS_CERT") or None,
                ssl_keyfile or os.environ.get("FORKBOX_REDIS_KEY") or None,
            )
        else:
            self.redis = redis
        #: Whether the client talks to a Redis Cluster (sharded pub/sub for cancellation).
        self.cluster = type(self.redis).__name__ == "RedisCluster"
        self.name = queue
        self.block_s = block_s
        self.max_job_bytes = max_job_bytes
        self._enqueue_script = self.redis.register_script(ENQUEUE_LUA)
        self._job_state_script = self.redis.register_script(JOB_STATE_LUA)
        self._warned_unserved = False

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    # -- keys ----------------------------------------------------------------------------

    def partition_of(self, job_id: str) -> int:
        """The partition job ``job_id`` lives on."""
        return partition_of(job_id, self.partitions)

    def _tag(self, job_id: str) -> str:
        return self.tags[self.partition_of(job_id)]

    @property
    def jobs_key(self) -> str:
        """Partition 0's job stream (the queue's only one when unpartitioned)."""
        return key("jobs", self.name)

    def jobs_key_of(self, partition: int) -> str:
        return key("jobs", self.tags[partition])

    @property
    def results_key(self) -> str:
        """Partition 0's results stream (the queue's only one when unpartitioned)."""
        return key("results", self.name)

    def results_key_of(self, partition: int) -> str:
        return key("results", self.tags[partition])

    @property
    def meta_key(self) -> str:
        return key("meta", self.name)

    def result_key(self, job_id: str) -> str:
        return key("result", self._tag(job_id), id=job_id)

    def done_key(self, job_id: str) -> str:
        return key("done", self._tag(job_id), id=job_id)

    def wake_key(self, job_id: str) -> str:
        return key("wake", self._tag(job_id), id=job_id)

    def batch_key(self, batch_id: str, partition: int = 0) -> str:
        """A batch's counters on ``partition`` (each partition counts its own jobs)."""
        return key("batch", self.tags[partition], batch=batch_id)

    def idem_key(self, job_id: str) -> str:
        return key("idem", self._tag(job_id), id=job_id)

    def replies_key(self, name: str, job_id: Optional[str] = None) -> str:
        """``forkbox:{Q}:replies:<name>``: a stream this queue's jobs may name as ``reply_to``.
        On a partitioned queue a job replies on its own partition: pass its ``job_id``."""
        tag = self.name if job_id is None else self._tag(job_id)
        return key("replies", tag, name=name)

    def _check_reply_to(self, reply_to: Any, job_id: str) -> None:
        """A worker makes a job ``invalid`` whose ``reply_to`` is not one of its partition's
        replies streams; say so before sending it."""
        if reply_to is None:
            return
        prefix = self.replies_key("", job_id)
        name = reply_to[len(prefix) :] if isinstance(reply_to, str) and reply_to.startswith(prefix) else None
        if name is None or not 1 <= len(name) <= 128 or not all(33 <= ord(c) <= 126 for c in name):
            which = f"queue {self.name}" if self.partitions == 1 else f"partition {self.partition_of(job_id)} of queue {self.name}"
            raise JobRejected(
                f"reply_to: a job of {which} may reply only to {prefix}<name> "
                f"(1 to 128 printable ASCII characters), got {reply_to!r:.80}"
            )

    def check_layout(self, record: bool = True) -> None:
        """Checks ``partitions`` against the queue's recorded count (``forkbox:{Q}:meta``),
        recording it first when the queue has none and ``record`` is true. Raises
        :class:`PartitionsMismatch` naming both counts. Enqueueing does this once by itself."""
        field = SCHEMA["partitions"]["meta_field"]
        if record:
            self.redis.hsetnx(self.meta_key, field, self.partitions)
        live = self.redis.hget(self.meta_key, field)
        if live is None and not record:
            return
        live_s = live.decode() if isinstance(live, bytes) else str(live)
        if live_s.strip() != str(self.partitions):
            raise PartitionsMismatch(self.name, self.partitions, live_s)
        self._layout_checked = True

    def _layout(self) -> None:
        if not self._layout_checked:
            self.check_layout(record=True)

    def live_workers(self) -> int:
        """How many workers have a live heartbeat on this queue (their keys expire when they stop)."""
        pattern = _glob_escape(key("worker", self.name, name="")) + "*"
        return sum(1 for _ in self.redis.scan_iter(match=pattern, count=1000))

    def _timeout_hint(self) -> str:
        """Why a wait may never end, when that is why: nothing serves the queue."""
        try:
            if self.live_workers() == 0:
                return (
                    f"; no worker is serving queue {self.name!r} (no live heartbeat): start one "
                    f"with `forkbox worker --queues {self.name}`, or check the queue name"
                )
        except Exception:  # the hint is best effort; the Timeout is the news
            pass
        return ""

    def _warn_if_unserved(self) -> None:
        """Warns, once per queue object, when a wait starts on a queue no worker serves: it
        would otherwise wait forever without a word (the CLI warns the same way)."""
        if self._warned_unserved:
            return
        try:
            unserved = self.live_workers() == 0
        except Exception:  # best effort: the wait itself reports a broken connection
            return
        if unserved:
            self._warned_unserved = True
            warnings.warn(
                f"no worker is serving queue {self.name!r} (no live heartbeat): the wait ends only "
                f"when one starts (`forkbox worker --queues {self.name}`); check the queue name and "
                "the Redis URL",
                RuntimeWarning,
                stacklevel=3,
            )

    # -- submitting ----------------------------------------------------------------------

    def submit(self, job: Optional[JobLike] = None, **spec: Any) -> str:
        """Enqueues one job and returns its id.

        Pass a :class:`~forkbox.JobSpec`, a v1 job object (``{"cmd": ..., "limits": {...}}``) or
        a shell string as ``job``, or the keywords of :meth:`forkbox.Forkbox.run` (the fields of
        :class:`~forkbox.JobSpec`, with ``batch``, ``result_ttl_s``, ``max_attempts``,
        ``reply_to``, and of :class:`~forkbox.Limits`).
        """
        given = spec_from_keywords("Queue.submit", spec)
        if job is None:
            return self._enqueue([given.to_job()])[0]
        extra = sorted(k for k, v in spec.items() if v is not None)
        if extra:
            raise TypeError(f"give a job object or keywords, not both (got {', '.join(extra)})")
        return self._enqueue([_as_job(job)])[0]

    def _enqueue(self, jobs: Sequence[Dict[str, Any]]) -> List[str]:
        """Runs the enqueue script for each job, pipelined (see :meth:`_enqueue_entries`)."""
        return [job_id for job_id, _new in self._enqueue_entries(jobs)]

    def _enqueue_entries(self, jobs: Sequence[Dict[str, Any]]) -> List[Tuple[str, bool]]:
        """Adds each job with the protocol's enqueue script, as every Forkbox client does: an
        id still pending or with a live result is not added again (``new`` is False), the
        entry is marked ``vetted``, and a batch's ``total`` counts each id once."""
        if not jobs:
            return []
        for j in jobs:
            validate_job(j, self.max_job_bytes)
            self._check_reply_to(j.get("reply_to"), j["id"])
        self._layout()
        if self.partitions == 1:
            groups = {0: list(jobs)}
        else:
            groups = {}
            for j in jobs:
                groups.setdefault(self.partition_of(j["id"]), []).append(j)
        added: Dict[str, bool] = {}
        for p, part in groups.items():
            if self.cluster:
                got = self._on_queue_node(lambda client: self._enqueue_pipelined(client, part, p), self.jobs_key_of(p))
            else:
                got = self._enqueue_pipelined(self.redis, part, p)
            for job_id, new in got:
                added[job_id] = added.get(job_id, False) or new
        return [(j["id"], added[j["id"]]) for j in jobs]

    def _on_queue_node(self, run: Any, slot_key: Optional[str] = None) -> Any:
        """Runs ``run(client)`` with a plain client of the cluster node serving the queue's slot:
        redis-py's cluster pipelines refuse scripts, a node's own pipeline does not. A slot that
        moved (``MOVED``, a failover) refreshes the slot map and tries again; the enqueue script
        is idempotent per id, so a repeat adds nothing twice."""
        last: Optional[Exception] = None
        for attempt in range(5):
            node = self.redis.get_node_from_key(slot_key or self.jobs_key)
            try:
                return run(self.redis.get_redis_connection(node))
            except (_redis.exceptions.ResponseError, _redis.exceptions.ConnectionError, _redis.exceptions.TimeoutError) as e:
                ex = _redis.exceptions
                transient = tuple(
                    getattr(ex, n) for n in ("AskError", "MovedError", "ClusterDownError", "TryAgainError", "MasterDownError")
                    if hasattr(ex, n)
                )
                if not isinstance(e, (ex.ConnectionError, ex.TimeoutError) + transient) and not str(e).startswith(("MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN")):
                    raise
                last = e
                time.sleep(0.1 * 2**attempt)
                self.redis.nodes_manager.initialize()
        assert last is not None
        raise last

    def _enqueue_pipelined(self, client: Any, jobs: Sequence[Dict[str, Any]], partition: int = 0) -> List[Tuple[str, bool]]:
        pipe = client.pipeline(transaction=False)
        now_ms = int(time.time() * 1000)
        for j in jobs:
            keys, args = enqueue_keys_args(self.tags[partition], j, now_ms, self.cluster)
            self._enqueue_script(keys=keys, args=args, client=pipe)
        replies = pipe.execute()
        return [(j["id"], int(r[0]) == 1) for j, r in zip(jobs, replies)]

    # -- results -------------------------------------------------------------------------

    def _get(self, job_id: str) -> Optional[Result]:
        raw = self.redis.get(self.result_key(job_id))
        return None if raw is None else _parse_stored(raw, job_id)

    def result(self, job_id: str, timeout: Optional[float] = None) -> Result:
        """Waits for a job's result (``timeout`` seconds; ``None`` waits as long as it takes).

        Raises :class:`Timeout` when the wait runs out, and :class:`JobRejected` when the
        worker refused the job as malformed. Several clients may wait on one id: the wait is a
        blocking ``XREAD`` of the job's ``wake:<id>`` stream, which takes nothing from the other
        waiters and needs no write right (docs/protocol.md, "Waiting for a result").
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        wake = self.wake_key(job_id)
        after: Union[bytes, str] = "0-0"  # past an entry that woke us without a result
        while True:
            res = self._get(job_id)
            if res is not None:
                return _check(res)
            self._warn_if_unserved()
            wait = self.block_s
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(f"no result for job {job_id} within {timeout}s (queue {self.name!r}){self._timeout_hint()}")
                wait = min(wait, left)
            got = self.redis.xread({wake: after}, count=1, block=max(1, int(wait * 1000)))
            for _stream, entries in got or []:
                if entries:
                    after = entries[-1][0]

    def map(
        self,
        jobs: Iterable[JobLike],
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
            cursors = self._stream_tails()
            top_up()
            if inflight:
                self._warn_if_unserved()
            last_progress = last_sweep = time.monotonic()
            while inflight:
                finished: List[Result] = []
                got = self._read_results(cursors)
                for _stream, entries in got:
                    for entry_id, fields in entries:
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
                        finished.extend(self._results_of(ids))
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
                    raise Timeout(
                        f"no result within {timeout}s; {len(inflight)} jobs still unfinished{self._timeout_hint()}"
                    )
        finally:
            if bar is not None:
                bar.close()

    def _stream_tails(self) -> Dict[int, Union[bytes, str]]:
        """The newest entry id of each partition's results stream."""
        out: Dict[int, Union[bytes, str]] = {}
        for p in range(self.partitions):
            newest = self.redis.xrevrange(self.results_key_of(p), count=1)
            out[p] = newest[0][0] if newest else b"0-0"
        return out

    def _read_results(self, cursors: Dict[int, Union[bytes, str]], block_s: Optional[float] = None) -> List[Any]:
        """New entries of every partition's results stream after ``cursors`` (advanced in place).
        Blocks up to ``block_s`` in all, one stream at a time: in a cluster the streams are in
        different slots, which one XREAD cannot span."""
        block_ms = max(1, int((self.block_s if block_s is None else block_s) * 1000))
        per = max(1, block_ms // self.partitions)
        out: List[Any] = []
        for p in range(self.partitions):
            # Block only while nothing came: what another stream holds is not kept waiting.
            got = self.redis.xread({self.results_key_of(p): cursors[p]}, count=1000, block=None if out else per)
            for stream, entries in got or []:
                if entries:
                    cursors[p] = entries[-1][0]
                    out.append((stream, entries))
        return out

    def _results_of(self, ids: Sequence[str]) -> List[Result]:
        """The stored results of ``ids`` (those that have one), one MGET per partition."""
        by_part: Dict[int, List[str]] = {}
        for i in ids:
            by_part.setdefault(self.partition_of(i), []).append(i)
        out: List[Result] = []
        for part_ids in by_part.values():
            raws = self.redis.mget([self.result_key(i) for i in part_ids])
            out.extend(_parse_stored(r, i) for r, i in zip(raws, part_ids) if r is not None)
        return out

    # -- batches and cancellation ----------------------------------------------------------

    def batch(self, jobs: Iterable[JobLike], *, batch_id: Optional[str] = None, chunk: int = 500) -> Batch:
        """Submits jobs as one batch (counted in ``forkbox:{Q}:batch:<id>``, on each partition
        for its jobs) and returns it."""
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

    def job_state(self, job_id: str) -> str:
        """Where a job is: ``"queued"``, ``"running"``, ``"finished"`` or ``"unknown"`` (never
        submitted, its result expired, or added by a raw ``XADD`` under an id of its own)."""
        # The result key and the done list are read, not written, so they go as arguments (see
        # job_state.lua).
        keys = [self.idem_key(job_id), self.jobs_key_of(self.partition_of(job_id))]
        args = [job_id, SCHEMA["group"], self.result_key(job_id), self.done_key(job_id)]
        if self.cluster:
            reply = self._on_queue_node(lambda c: self._job_state_script(keys=keys, args=args, client=c), keys[0])
        else:
            reply = self._job_state_script(keys=keys, args=args)
        state = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        return state if state in ("queued", "running", "finished") else "unknown"

    def cancel(self, job_id: str, ahead: bool = False, lifetime_s: int = 3600) -> str:
        """Cancels a job and returns where it was, as :meth:`job_state` says: ``"queued"`` (it
        will not run) or ``"running"`` (it is killed); its result then has status
        ``cancelled``. A ``"finished"`` or ``"unknown"`` job is left alone, so a mistyped id
        cancels nothing. With ``ahead=True`` an unknown id is cancelled ahead of its job: a
        job enqueued with that id within ``lifetime_s`` seconds is cancelled as it is added
        (``"ahead"`` is returned); after that the cancel lapses."""
        state = self.job_state(job_id)
        if state in ("queued", "running"):
            self._cancel_now(job_id)
        elif state == "unknown" and ahead:
            now_ms = int(time.time() * 1000)
            lifetime_s = max(0, min(int(lifetime_s), SCHEMA["defaults"]["max_result_ttl_s"]))
            ahead_key = key("cancel_ahead", self._tag(job_id))
            pipe = self.redis.pipeline(transaction=True)
            pipe.zremrangebyscore(ahead_key, "-inf", now_ms)
            pipe.zadd(ahead_key, {job_id: now_ms + lifetime_s * 1000})
            pipe.execute()
            return "ahead"
        return state

    def _cancel_now(self, job_id: str) -> None:
        tag = self._tag(job_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.zadd(key("cancelled", tag), {job_id: int(time.time() * 1000)})
        if self.cluster:
            # A sharded channel, in the job's partition's slot: workers SSUBSCRIBE on its shard.
            pipe.execute_command("SPUBLISH", key("cancel_channel", tag), job_id)
        else:
            pipe.publish(key("cancel_channel", tag), job_id)
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
        """The batch hash as integers: ``total``, ``done`` and one count per status, summed
        over the queue's partitions."""
        out: Dict[str, int] = {}
        for p in range(self.queue.partitions):
            raw = self.queue.redis.hgetall(self.queue.batch_key(self.id, p))
            for k, v in raw.items():
                key = k.decode() if isinstance(k, bytes) else str(k)
                try:
                    out[key] = out.get(key, 0) + int(v)
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
        cursors = q._stream_tails()
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
                        f"{q._timeout_hint()}"
                    )
                wait = min(wait, left)
            q._read_results(cursors, wait)

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


def _glob_escape(s: str) -> str:
    """``s`` matched literally by a Redis glob pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


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
