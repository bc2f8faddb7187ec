"""`JobSpec` and `Limits`: the one description of a job behind every call that takes one.

The dataclasses must match the contract (`schema.json`) field for field, and `forkbox.run`,
`Forkbox.run`, `AsyncForkbox.run`, `Queue.submit` and `build_job` must take exactly their
fields as keywords and send the same job for the same keywords.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import tempfile
from typing import Any, Dict, Iterator

import pytest

import forkbox
from fake_daemon import FakeDaemon
from forkbox import AsyncForkbox, Forkbox, JobRejected, JobSpec, Limits, Queue, build_job
from forkbox._schema import SCHEMA
from forkbox.job import SPEC_KEYWORDS, spec_from_keywords, validate_job

#: One valid value for every keyword of a job, and where it lands in the wire form.
SAMPLES: Dict[str, Any] = {
    "cmd": "echo hi",
    "argv": ["/bin/echo", "hi"],
    "stdin": "in",
    "env": {"A": "1"},
    "files": {"a.txt": "x"},
    "cwd": "work",
    "timeout_ms": 500,
    "limits": {"cpu_ms": 100},
    "collect": ["out/*"],
    "batch": "b1",
    "result_ttl_s": 60,
    "max_attempts": 2,
    "reply_to": "forkbox:{q}:replies:r1",
    "runtime": "python",
    "output_mode": "truncate",
    "network": "loopback",
    "compile": {"argv": ["cc", "-o", "main", "main.c"], "timeout_ms": 20000},
    "session": {"ttl_s": 60, "idle_s": 30},
    "id": "job-1",
    "memory_mb": 64,
    "pids": 8,
    "cpu_ms": 1000,
    "output_bytes": 4096,
    "disk_mb": 16,
    "file_size_mb": 4,
    "open_files": 32,
}


@pytest.fixture
def fake() -> Iterator[FakeDaemon]:
    d = tempfile.mkdtemp(prefix="fbs-", dir="/tmp")
    srv = FakeDaemon(os.path.join(d, "fake.sock"))
    yield srv
    srv.close()
    os.rmdir(d)


def test_jobspec_and_limits_are_the_contracts_fields() -> None:
    # A field the contract adds and JobSpec lacks (or one JobSpec keeps after the contract drops
    # it) fails here.
    assert {f.name for f in dataclasses.fields(JobSpec)} == set(SCHEMA["job_fields"])
    assert [f.name for f in dataclasses.fields(Limits)] == [x["name"] for x in SCHEMA["limits"]]
    assert set(SCHEMA["defaults"]["limits"]) == {f.name for f in dataclasses.fields(Limits)}
    # None is "absent": the node's default applies, so the SDK sets no default of its own.
    assert all(f.default is None for f in dataclasses.fields(JobSpec))
    assert all(f.default is None for f in dataclasses.fields(Limits))


def test_the_keywords_are_the_fields_of_jobspec_and_limits() -> None:
    assert set(SPEC_KEYWORDS) == set(SAMPLES)
    assert len(SPEC_KEYWORDS) == len(set(SPEC_KEYWORDS)), "a limit shares a name with a job field"


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_keyword_lands_in_its_field(name: str) -> None:
    kw = {name: SAMPLES[name]}
    if name not in ("argv", "session"):
        kw.setdefault("cmd", "true")
    job = build_job(**kw)
    if name in SCHEMA["defaults"]["limits"]:
        assert job["limits"] == {name: SAMPLES[name]}
    else:
        assert job[name] == SAMPLES[name]
    validate_job(job)


def test_limits_to_wire_keeps_only_what_is_set() -> None:
    assert Limits().to_wire() == {}
    assert Limits(pids=4, output_bytes=0).to_wire() == {"pids": 4, "output_bytes": 0}
    assert "limits" not in JobSpec(cmd="x", limits=Limits()).to_job()


def test_jobspec_to_job_is_build_job() -> None:
    spec = JobSpec(cmd="echo", timeout_ms=5, limits=Limits(memory_mb=64, pids=8), network="none", id="j")
    assert spec.to_job() == build_job("echo", timeout_ms=5, memory_mb=64, pids=8, network="none", id="j")
    assert spec.to_job() == {"cmd": "echo", "timeout_ms": 5, "limits": {"memory_mb": 64, "pids": 8}, "network": "none", "id": "j"}
    assert "id" not in spec_from_keywords("x", {"cmd": "echo"}).to_job(with_id=False)
    assert len(JobSpec(cmd="echo").to_job()["id"]) == 32


def test_flat_limit_keywords_win_over_limits() -> None:
    for base in ({"pids": 4, "cpu_ms": 100}, Limits(pids=4, cpu_ms=100)):
        spec = spec_from_keywords("t", {"cmd": "x", "limits": base, "pids": 8, "memory_mb": None})
        assert spec.to_job()["limits"] == {"pids": 8, "cpu_ms": 100}


def test_a_limits_mapping_is_passed_through_for_the_worker_to_check() -> None:
    job = build_job("x", limits={"gpus": 1})
    assert job["limits"] == {"gpus": 1}
    with pytest.raises(JobRejected, match="limits: unknown field `gpus`"):
        validate_job(job)


def test_a_jobspec_refuses_a_list_as_cmd() -> None:
    with pytest.raises(TypeError, match=r"cmd must be a shell string, got list; use argv=\[\.\.\.\]"):
        JobSpec(cmd=["ls"])  # type: ignore[arg-type]


def test_an_unknown_keyword_is_named_by_every_call() -> None:
    q = Queue("redis://127.0.0.1:1")  # never connects: the keyword is refused first
    calls = {
        "forkbox.run": lambda **kw: forkbox.run("x", **kw),
        "Forkbox.run": lambda **kw: Forkbox(socket="/nonexistent").run("x", **kw),
        "AsyncForkbox.run": lambda **kw: asyncio.run(AsyncForkbox(socket="/nonexistent").run("x", **kw)),
        "Queue.submit": lambda **kw: q.submit(cmd="x", **kw),
        "build_job": lambda **kw: build_job("x", **kw),
    }
    for public, call in calls.items():
        with pytest.raises(TypeError) as e:
            call(memory_limit=5)
        assert str(e.value) == f"{public}() got an unexpected keyword argument 'memory_limit'; did you mean 'memory_mb'?"
        with pytest.raises(TypeError, match=rf"^{public.replace('.', '[.]')}\(\) .* 'netwrok'; did you mean 'network'\?"):
            call(netwrok="none")
    with pytest.raises(TypeError, match="'wait'; did you mean 'wait_timeout'"):
        Forkbox(socket="/nonexistent").run("x", wait=1)
    with pytest.raises(TypeError, match="'wait'; did you mean 'wait_timeout'"):
        asyncio.run(AsyncForkbox(socket="/nonexistent").run("x", wait=1))


def test_the_clients_send_what_jobspec_builds(fake: FakeDaemon) -> None:
    kw: Dict[str, Any] = {
        "timeout_ms": 500,
        "stdin": b"\xff",
        "files": {"a": b"bytes"},
        "limits": {"cpu_ms": 100},
        "memory_mb": 64,
        "output_mode": "truncate",
        "network": "loopback",
        "id": "same",
    }
    want = build_job("echo", **kw)
    fb = Forkbox(socket=fake.path)
    fb.run("echo", **kw)
    fb.run_job(spec_from_keywords("t", dict(kw, cmd="echo")))

    async def via_async() -> None:
        async with AsyncForkbox(socket=fake.path) as afb:
            await afb.run("echo", **kw)
            await afb.run_job(JobSpec(cmd="echo", limits=Limits(cpu_ms=100, memory_mb=64), **{
                k: v for k, v in kw.items() if k not in ("limits", "memory_mb")
            }))

    asyncio.run(via_async())
    Forkbox.set_default(fb)
    try:
        forkbox.run("echo", **kw)
    finally:
        Forkbox.set_default(None)
    assert len(fake.requests) == 5
    for sent in fake.requests:
        assert sent == want


@pytest.mark.real
def test_queue_submit_takes_a_jobspec_or_its_keywords(redis_url: str) -> None:
    import redis
    import json
    import uuid

    q = Queue(redis_url, f"spec-{uuid.uuid4().hex[:8]}")
    spec = JobSpec(cmd="true", limits=Limits(pids=8), network="loopback", output_mode="truncate", id="s1")
    assert q.submit(spec) == "s1"
    assert q.submit(cmd="true", pids=8, network="loopback", output_mode="truncate", id="s2") == "s2"
    assert q.batch([JobSpec(cmd="true", id="s3")], batch_id="b").ids == ["s3"]
    r = redis.Redis.from_url(redis_url)
    sent = [json.loads(fields[b"job"]) for _id, fields in r.xrange(q.jobs_key)]
    assert sent[0] == dict(spec.to_job(), id="s1")
    assert {k: v for k, v in sent[1].items() if k != "id"} == {k: v for k, v in sent[0].items() if k != "id"}
    assert sent[2] == {"cmd": "true", "id": "s3", "batch": "b"}
    with pytest.raises(TypeError, match=r"not both \(got timeout_ms\)"):
        q.submit(spec, timeout_ms=5)
    with pytest.raises(JobRejected, match="network: unknown variant `wide`"):
        q.submit(JobSpec(cmd="true", network="wide"))
    r.delete(q.jobs_key)


def test_a_session_create_job_has_no_program() -> None:
    validate_job({"id": "s", "session": {"ttl_s": 60}, "limits": {"memory_mb": 64}, "runtime": "python"})
    with pytest.raises(JobRejected, match="^job rejected: cmd: a session's create job has no program of its own"):
        validate_job({"id": "s", "session": {}, "cmd": "true"})
    with pytest.raises(JobRejected, match=r"^job rejected: session\.idle_s: must be between 1 and \d+, got 0"):
        validate_job({"id": "s", "session": {"idle_s": 0}})
    with pytest.raises(JobRejected, match="^job rejected: session: unknown field `ttl`"):
        validate_job({"id": "s", "session": {"ttl": 5}})
