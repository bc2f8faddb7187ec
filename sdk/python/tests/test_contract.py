"""The SDK against the protocol contract generated from the Rust crate (``schema.json``):
job fields, limits, defaults, key layout, statuses and the enqueue script must agree, and the
SDK refuses locally what a worker would refuse, with the worker's message."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from forkbox import STATUSES, Forkbox, JobRejected, Queue
from forkbox._schema import ENQUEUE_LUA, LIMIT_RANGES, SCHEMA
from forkbox.job import DEFAULT_TIMEOUT_MS, JOB_FIELDS, LIMIT_FIELDS, NETWORKS, build_job, validate_job
from forkbox.redis_queue import DEFAULT_MAX_JOB_BYTES, DEFAULT_RESULT_TTL_S

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "src" / "forkbox" / "schema.json"


def test_the_shipped_schema_is_what_the_binary_prints(forkbox_bin: Path) -> None:
    out = subprocess.run([str(forkbox_bin), "schema"], check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == json.loads(SCHEMA_FILE.read_text()), (
        "sdk/python/src/forkbox/schema.json is stale: FORKBOX_REGENERATE=1 cargo test -p forkbox-queue contract"
    )


def test_job_fields_limits_defaults_and_statuses_match() -> None:
    assert JOB_FIELDS == frozenset(SCHEMA["job_fields"])
    assert LIMIT_FIELDS == tuple(x["name"] for x in SCHEMA["limits"])
    assert DEFAULT_TIMEOUT_MS == SCHEMA["defaults"]["timeout_ms"]
    assert DEFAULT_RESULT_TTL_S == SCHEMA["defaults"]["result_ttl_s"]
    assert DEFAULT_MAX_JOB_BYTES == SCHEMA["defaults"]["max_job_bytes"]
    assert STATUSES == tuple(SCHEMA["statuses"])


def test_key_layout_matches() -> None:
    q = Queue("redis://127.0.0.1:1", queue="q1")  # never connects: only names are built
    k = SCHEMA["keys"]
    sub = lambda name, **parts: k[name].replace("{Q}", "{q1}").replace("<id>", parts.get("id", "")).replace(  # noqa: E731
        "<batch>", parts.get("batch", "")
    )
    assert q.jobs_key == sub("jobs")
    assert q.results_key == sub("results")
    assert q.result_key("j") == sub("result", id="j")
    assert q.done_key("j") == sub("done", id="j")
    assert q.batch_key("b") == sub("batch", batch="b")
    assert q.idem_key("j") == sub("idem", id="j")
    assert SCHEMA["stream_fields"] == {"job": "job", "vetted": "vetted", "result": "result"}


def test_the_enqueue_script_is_the_crates() -> None:
    assert ENQUEUE_LUA == (REPO_ROOT / "queue" / "lua" / "enqueue.lua").read_text()


@pytest.mark.parametrize(
    "job, message",
    [
        ({"cmd": "true", "limits": {"pids": 0}}, "limits.pids: must be between 2 and"),
        ({"cmd": "true", "limits": {"memory": 5}}, "limits: unknown field `memory`"),
        ({"cmd": "true", "timeout_ms": 0}, "timeout_ms: must be between 1 and"),
        ({"cmd": "true", "max_attempts": 0}, "max_attempts: must be between 1 and"),
        ({"cmd": "true", "bogus": 1}, "job: unknown field `bogus`"),
        ({"cmd": "true", "files": {"../x": "y"}}, "files.../x: '..' is not allowed"),
        ({"cmd": "true", "collect": ["/etc/*"]}, "collect[0]: absolute paths are not allowed"),
        ({"cmd": "true", "id": "a b"}, "id: must be printable ASCII without spaces"),
        ({"cmd": "   "}, "cmd: is empty"),
        ({"cmd": "true", "network": "host"}, "network: unknown variant `host`"),
        ({"cmd": "true", "compile": {}}, "compile.cmd: a compile stage needs"),
        ({"cmd": "true", "compile": {"cmd": "a", "stdin": "x"}}, "compile.stdin: unknown field `stdin`"),
        ({"cmd": "true", "compile": {"cmd": "a", "limits": {"disk_mb": 1}}}, "compile.limits.disk_mb: unknown field"),
    ],
)
def test_jobs_a_worker_refuses_are_refused_locally(job: dict, message: str) -> None:
    with pytest.raises(JobRejected, match="^job rejected: " + _re(message)):
        validate_job(job)


def test_networks_follow_the_schema_and_reach_the_job() -> None:
    assert NETWORKS == tuple(SCHEMA["networks"]) == ("none", "loopback")
    for network in NETWORKS:
        job = build_job("true", network=network)
        assert job["network"] == network
        validate_job(job)
    assert "network" not in build_job("true")


def test_limit_ranges_follow_the_schema() -> None:
    for name, (lo, hi) in LIMIT_RANGES.items():
        validate_job({"cmd": "x", "limits": {name: lo}})
        validate_job({"cmd": "x", "limits": {name: hi}})
        with pytest.raises(JobRejected, match=f"limits.{name}"):
            validate_job({"cmd": "x", "limits": {name: hi + 1}})


def test_wrong_keywords_name_the_public_call_and_the_right_keyword() -> None:
    with pytest.raises(TypeError) as e:
        Forkbox(socket="/nonexistent").run("echo", memory=5)
    assert str(e.value) == "Forkbox.run() got an unexpected keyword argument 'memory'; did you mean 'memory_mb'?"
    assert "_run" not in str(e.value)
    with pytest.raises(TypeError, match=r"^Forkbox\.run_job\(\) .* 'wait'; did you mean 'wait_timeout'\?"):
        Forkbox(socket="/nonexistent").run_job({"cmd": "x"}, wait=1)  # type: ignore[call-arg]
    q = Queue("redis://127.0.0.1:1")
    with pytest.raises(TypeError, match=r"^Queue\.submit\(\) .* 'timeout'; did you mean 'timeout_ms'\?"):
        q.submit(cmd="x", timeout=5)  # type: ignore[call-arg]


def test_async_run_names_itself_too() -> None:
    from forkbox import AsyncForkbox

    with pytest.raises(TypeError, match=r"^AsyncForkbox\.run\(\) .* 'cpu'; did you mean 'cpu_ms'\?"):
        AsyncForkbox(socket="/nonexistent").run("x", cpu=1)  # type: ignore[call-arg]


def _re(s: str) -> str:
    import re

    return re.escape(s)


def test_reply_to_must_be_one_of_the_queues_replies_streams() -> None:
    q = Queue("redis://127.0.0.1:1", queue="q1")
    assert q.replies_key("r1") == SCHEMA["keys"]["replies"].replace("{Q}", "{q1}").replace("<name>", "r1")
    for bad in ["forkbox:{q1}:results", "forkbox:{other}:replies:r1", "mystream", "forkbox:{q1}:replies:"]:
        with pytest.raises(JobRejected, match="reply_to: a job of queue q1 may reply only to"):
            q.submit(cmd="true", reply_to=bad)


def test_the_partition_rule_matches_the_crate() -> None:
    """The SDK's tags and id placement are the Rust crate's, by its worked examples."""
    from forkbox._schema import SCHEMA
    from forkbox.redis_queue import partition_of, partition_tag, tag_slot

    rule = SCHEMA["partitions"]
    for ex in rule["tag_examples"]:
        for t in ex["tags"]:
            assert partition_tag(ex["queue"], t["partition"], ex["partitions"]) == t["tag"]
            assert tag_slot(t["tag"]) == t["slot"]
    for ex in rule["id_examples"]:
        assert partition_of(ex["id"], ex["partitions"]) == ex["partition"], ex


def test_a_compile_stage_reaches_the_job() -> None:
    stage = {"argv": ["cc", "-o", "main", "main.c"], "timeout_ms": 20000, "limits": {"memory_mb": 512}}
    job = build_job(None, argv=["./main"], compile=stage)
    assert job["compile"] == stage
    validate_job(job)
    assert "compile" in JOB_FIELDS and "compile_error" in SCHEMA["statuses"]
