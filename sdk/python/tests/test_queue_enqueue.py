"""Jobs from Python go through the protocol's enqueue script, like jobs from the Rust clients:
idempotent ids, `vetted` entries, a resubmitted batch counted once (so `Batch.wait` ends), a
Redis URL from $FORKBOX_REDIS_URL, and a Timeout that says when no worker serves the queue."""

from __future__ import annotations

import uuid
import warnings

import pytest
import redis

from forkbox import JobRejected, Queue, Timeout

pytestmark = pytest.mark.real


def _unserved(redis_url: str) -> Queue:
    return Queue(redis_url, f"nobody-{uuid.uuid4().hex[:8]}")


def test_entries_are_vetted_and_ids_idempotent(redis_url: str) -> None:
    q = _unserved(redis_url)
    first = q.submit(cmd="true", id="same-id")
    second = q.submit(cmd="true", id="same-id")
    assert first == second == "same-id"
    r = redis.Redis.from_url(redis_url)
    entries = r.xrange(q.jobs_key)
    assert len(entries) == 1, "the second submission of a pending id adds nothing"
    assert entries[0][1][b"vetted"] == b"1"
    assert r.get(q.idem_key("same-id")) == entries[0][0]


def test_a_resubmitted_batch_counts_each_job_once_and_wait_finishes(worker: str) -> None:
    q = Queue(worker)
    bid = f"resub-{uuid.uuid4().hex[:8]}"
    jobs = [{"id": f"{bid}-{i}", "cmd": f"echo {i}"} for i in range(5)]
    q.batch(jobs, batch_id=bid)
    again = q.batch(jobs, batch_id=bid)  # e.g. a pipeline retried after a crash
    assert again.counts()["total"] == 5
    assert again.wait(timeout=60) == {"ok": 5}
    assert again.counts()["total"] == again.counts()["done"] == 5
    assert sorted(res.stdout for res in again.results(timeout=10)) == [f"{i}\n" for i in range(5)]


def test_the_local_refusal_says_what_the_worker_would(worker: str) -> None:
    q = Queue(worker)
    job = {"id": f"bad-{uuid.uuid4().hex[:8]}", "cmd": "true", "limits": {"pids": 0}}
    with pytest.raises(JobRejected) as local:
        q.submit(job)
    # The same job added by a raw XADD reaches a worker, which refuses it the same way.
    import json

    r = redis.Redis.from_url(worker)
    r.xadd(q.jobs_key, {"job": json.dumps(job)})
    with pytest.raises(JobRejected) as remote:
        q.result(job["id"], timeout=60)
    assert local.value.reason == remote.value.reason


def test_queue_reads_forkbox_redis_url(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKBOX_REDIS_URL", redis_url)
    monkeypatch.delenv("FORKBOX_REDIS", raising=False)
    name = f"env-{uuid.uuid4().hex[:8]}"
    Queue(queue=name).submit(cmd="true")
    assert redis.Redis.from_url(redis_url).xlen(f"forkbox:{{{name}}}:jobs") == 1
    monkeypatch.delenv("FORKBOX_REDIS_URL")
    monkeypatch.setenv("FORKBOX_REDIS", redis_url)
    with pytest.warns(DeprecationWarning, match="FORKBOX_REDIS_URL"):
        Queue(queue=name).submit(cmd="true")
    assert redis.Redis.from_url(redis_url).xlen(f"forkbox:{{{name}}}:jobs") == 2


def test_timeout_says_no_worker_serves_the_queue(redis_url: str) -> None:
    q = _unserved(redis_url)
    job_id = q.submit(cmd="true")
    with pytest.raises(Timeout, match=f"no worker is serving queue '{q.name}'"):
        q.result(job_id, timeout=0.3)
    with pytest.raises(Timeout, match="no worker is serving queue"):
        q.batch(["true"]).wait(timeout=0.3)


def test_timeout_on_a_served_queue_has_no_such_hint(worker: str) -> None:
    q = Queue(worker)
    with pytest.raises(Timeout) as e:
        q.result(f"never-{uuid.uuid4().hex}", timeout=0.3)
    assert "no worker" not in str(e.value)


def test_cancel_of_an_unknown_id_cancels_nothing_unless_ahead(redis_url: str) -> None:
    q = _unserved(redis_url)
    r = redis.Redis.from_url(redis_url)
    cancelled = f"forkbox:{{{q.name}}}:cancelled"
    # A mistyped id: nothing is written, so a job submitted later with it runs.
    assert q.cancel("future-1") == "unknown"
    assert r.zscore(cancelled, "future-1") is None
    q.submit(cmd="true", id="future-1")
    assert r.zscore(cancelled, "future-1") is None
    # A queued job is cancelled.
    assert q.job_state("future-1") == "queued"
    assert q.cancel("future-1") == "queued"
    assert r.zscore(cancelled, "future-1") is not None
    # Asked for: a job submitted with the id while the cancel lives is cancelled as it is added.
    assert q.cancel("future-2", ahead=True, lifetime_s=600) == "ahead"
    assert r.zscore(cancelled, "future-2") is None
    q.submit(cmd="true", id="future-2")
    assert r.zscore(cancelled, "future-2") is not None
    # A lapsed one cancels nothing.
    assert q.cancel("future-3", ahead=True, lifetime_s=0) == "ahead"
    q.submit(cmd="true", id="future-3")
    assert r.zscore(cancelled, "future-3") is None


def test_a_wait_on_an_unserved_queue_warns_once(redis_url: str) -> None:
    q = _unserved(redis_url)
    job_id = q.submit(cmd="true")
    with pytest.warns(RuntimeWarning, match=f"no worker is serving queue '{q.name}'"):
        with pytest.raises(Timeout):
            q.result(job_id, timeout=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(Timeout):
            q.result(job_id, timeout=0.2)  # said once per queue
    other = _unserved(redis_url)
    with pytest.warns(RuntimeWarning, match="no worker is serving queue"):
        with pytest.raises(Timeout):
            list(other.map(["true"], timeout=0.3))


def test_a_wait_on_a_served_queue_does_not_warn(worker: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Queue(worker).map(["echo hi"], timeout=60).__next__().stdout == "hi\n"
