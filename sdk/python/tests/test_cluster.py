"""The Queue client on a real Redis Cluster (3 primaries, 3 replicas on free ports, started and
removed here) with a real `forkbox worker --cluster`: submit, results, batches and cancellation
through redis-py's RedisCluster, and clear errors for seeds that are not a cluster."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from conftest import Proc, free_port, tail
from forkbox import Queue

pytestmark = pytest.mark.real

NODES = 6


def _cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["redis-cli", *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _cluster_ok(ports: List[int]) -> bool:
    for p in ports:
        info = _cli("-p", str(p), "cluster", "info", timeout=5).stdout
        if "cluster_state:ok" not in info or "cluster_slots_ok:16384" not in info:
            return False
        repl = _cli("-p", str(p), "info", "replication", timeout=5).stdout
        if "role:master" not in repl and "master_link_status:up" not in repl:
            return False
    return True


@pytest.fixture(scope="module")
def cluster_seeds(tmp_root: Path) -> Iterator[str]:
    """Six cluster-enabled redis-servers joined with `redis-cli --cluster create --cluster-replicas 1`."""
    exe = shutil.which("redis-server")
    if exe is None or shutil.which("redis-cli") is None:
        pytest.fail("redis-server and redis-cli are needed (apt-get install redis-server redis-tools)", pytrace=False)
    procs: List[Proc] = []
    ports: List[int] = []
    try:
        for i in range(NODES):
            port, bus = free_port(), free_port()
            while 6379 in (port, bus) or port == bus or port in ports:
                port, bus = free_port(), free_port()
            d = tmp_root / f"cluster-{i}"
            d.mkdir()
            procs.append(Proc(
                f"redis-server {port}",
                [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(d), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-port", str(bus), "--cluster-node-timeout", "1000"],
                d / "redis.log",
            ))  # fmt: skip
            ports.append(port)
        end = time.monotonic() + 20
        while not all(_cli("-p", str(p), "ping", timeout=5).stdout.strip() == "PONG" for p in ports):
            assert time.monotonic() < end, "cluster nodes did not start: " + tail(tmp_root / "cluster-0" / "redis.log")
            time.sleep(0.1)
        made = _cli("--cluster", "create", *[f"127.0.0.1:{p}" for p in ports], "--cluster-replicas", "1", "--cluster-yes", timeout=60)
        assert made.returncode == 0, made.stdout + made.stderr
        end = time.monotonic() + 60
        while not _cluster_ok(ports):
            assert time.monotonic() < end, "the cluster did not reach cluster_state:ok"
            time.sleep(0.2)
        yield ",".join(f"redis://127.0.0.1:{p}" for p in ports)
    finally:
        for p in procs:
            p.stop()


@pytest.fixture(scope="module")
def cluster_worker(forkbox_bin: Path, cluster_seeds: str, tmp_root: Path) -> Iterator[str]:
    proc = Proc(
        "forkbox worker --cluster",
        [str(forkbox_bin), "worker", "--cluster", "--redis", cluster_seeds, "--slots", "2",
         "--queues", "py-a,py-b", "--metrics-addr", "127.0.0.1:0"],
        tmp_root / "cluster-worker.log",
    )  # fmt: skip
    end = time.monotonic() + 60
    while " reading " not in (tmp_root / "cluster-worker.log").read_text(errors="replace"):
        if not proc.alive():
            proc.fail("exited before reading its queues")
        if time.monotonic() > end:
            proc.fail("did not start reading within 60s")
        time.sleep(0.05)
    yield cluster_seeds
    proc.stop()


def test_submit_result_batch_and_cancel_through_the_cluster(cluster_worker: str) -> None:
    a = Queue(cluster_worker, queue="py-a", cluster=True)
    b = Queue(cluster_worker.split(",")[3], queue="py-b", cluster=True)  # one seed is enough
    assert a.cluster and b.cluster
    ja = a.submit(cmd="echo on a")
    jb = b.submit(cmd="echo on b")
    assert a.result(ja, timeout=60).stdout == "on a\n"
    assert b.result(jb, timeout=60).stdout == "on b\n"
    batch = b.batch([f"echo {i}" for i in range(20)])
    results = list(batch.results(timeout=120))
    assert sorted(r.stdout for r in results) == sorted(f"{i}\n" for i in range(20))
    assert len({r.id for r in results}) == 20
    # Cancelling a job no worker reads: it is recorded in the queue's slot.
    assert a.cancel("py-never-ran", ahead=True) == "ahead"
    assert a.redis.zscore("forkbox:{py-a}:cancel-ahead", "py-never-ran") is not None


def test_a_running_job_is_cancelled_over_sharded_pub_sub(cluster_worker: str) -> None:
    q = Queue(cluster_worker, queue="py-b", cluster=True)
    job = q.submit(cmd="sleep 60")
    end = time.monotonic() + 60
    # Running: its entry is pending in the group.
    while q.redis.xpending("forkbox:{py-b}:jobs", "workers")["pending"] == 0:
        assert time.monotonic() < end, "the job never started"
        time.sleep(0.05)
    time.sleep(0.3)
    q.cancel(job)
    res = q.result(job, timeout=60)
    assert res.status == "cancelled", res


def test_seeds_that_are_not_a_cluster_are_refused_clearly(redis_url: str) -> None:
    with pytest.raises(ConnectionError) as e:
        Queue(redis_url, cluster=True)
    assert "Redis Cluster" in str(e.value) and redis_url.split("//")[1] in str(e.value)
    with pytest.raises(ValueError) as e2:
        Queue(f"{redis_url},{redis_url}")
    assert "cluster=True" in str(e2.value)


@pytest.fixture(scope="module")
def partitioned_worker(forkbox_bin: Path, cluster_seeds: str, tmp_root: Path) -> Iterator[str]:
    """A worker reading queue py-p split into 3 partitions (one per primary)."""
    log = tmp_root / "partitioned-worker.log"
    proc = Proc(
        "forkbox worker --cluster --partitions 3",
        [str(forkbox_bin), "worker", "--cluster", "--redis", cluster_seeds, "--slots", "2",
         "--queues", "py-p", "--partitions", "3"],
        log,
    )  # fmt: skip
    end = time.monotonic() + 60
    while " reading " not in log.read_text(errors="replace"):
        if not proc.alive():
            proc.fail("exited before reading its queues")
        if time.monotonic() > end:
            proc.fail("did not start reading within 60s")
        time.sleep(0.05)
    yield cluster_seeds
    proc.stop()


def test_a_partitioned_queue_spreads_jobs_over_the_primaries(partitioned_worker: str) -> None:
    q = Queue(partitioned_worker, queue="py-p", cluster=True, partitions=3)
    assert q.tags[0] == "py-p" and len(set(q.tags)) == 3
    # Each partition's slot is served by a different primary.
    owners = {q.redis.get_node_from_key(q.jobs_key_of(p)).name for p in range(3)}
    assert len(owners) == 3, owners
    one = q.submit(cmd="echo one", id="py-p-one")
    assert q.result(one, timeout=60).stdout == "one\n"
    batch = q.batch([{"id": f"py-p-{i}", "cmd": f"echo {i}"} for i in range(60)])
    assert batch.wait(timeout=120) == {"ok": 60}
    assert batch.counts()["total"] == 60 and batch.counts()["done"] == 60
    # Every partition got jobs of the batch, and counted them on its own shard.
    per = [int(q.redis.hget(q.batch_key(batch.id, p), "total") or 0) for p in range(3)]
    assert sum(per) == 60 and all(n > 0 for n in per), per
    results = list(batch.results(timeout=60))
    assert sorted(r.stdout for r in results) == sorted(f"{i}\n" for i in range(60))
    # The same id again is idempotent: it lands on the partition of its first copy.
    assert q._enqueue_entries([{"id": "py-p-7", "cmd": "echo 7"}]) == [("py-p-7", False)]
    # map() reads every partition's results stream.
    got = {r.id: r.stdout for r in q.map([{"id": f"py-m-{i}", "cmd": f"echo m{i}"} for i in range(12)], timeout=60)}
    assert got == {f"py-m-{i}": f"m{i}\n" for i in range(12)}
    # Cancelling records the id on its own partition.
    assert q.cancel("py-p-never", ahead=True) == "ahead"
    tag = q.tags[q.partition_of("py-p-never")]
    assert q.redis.zscore(f"forkbox:{{{tag}}}:cancel-ahead", "py-p-never") is not None


def test_another_partition_count_is_refused_naming_both(partitioned_worker: str) -> None:
    from forkbox import PartitionsMismatch

    q = Queue(partitioned_worker, queue="py-p", cluster=True, partitions=2)
    with pytest.raises(PartitionsMismatch) as e:
        q.submit(cmd="true")
    assert "3 partition(s)" in str(e.value) and "partitions=2" in str(e.value)
    assert (e.value.configured, e.value.live) == (2, "3")


def test_sessions_open_and_answer_on_every_partition_through_the_cluster(partitioned_worker: str) -> None:
    from forkbox import Session

    q = Queue(partitioned_worker, queue="py-p", cluster=True, partitions=3)
    for p in range(3):
        sid = next(f"py-s-{p}-{k}" for k in range(1000) if q.partition_of(f"py-s-{p}-{k}") == p)
        with Session(q, id=sid, ttl_s=120, idle_s=60) as s:
            assert s.run_code("v = 20").exception is None
            assert s.run_code("v + 1").text == "21"
            assert s.exec("echo partition").stdout == "partition\n"
            assert s.info().state == "live"
            assert sid in [i.id for i in Session.list(q)]
            # Another client attaches to it by its id alone, on its partition's shard.
            assert Session.connect(sid, q).run_code("v * 2").text == "40"
        tag = q.tags[p]
        assert q.redis.hget(f"forkbox:{{{tag}}}:session:{sid}", "state") in (b"ended", "ended")
