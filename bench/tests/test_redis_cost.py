"""bench/redis_cost.py: the per-job figures from Redis' counters, and the section it writes for
bench/report.py, on readings in the format Redis gives."""

import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import redis_cost  # noqa: E402


def run(system, cpu_us, rate, calls):
    return {"system": system, "cpu_us_per_job": cpu_us, "commands_per_job": sum(calls.values()) / 100,
            "reads_per_job": 1.0, "jobs_per_s": rate, "completed": 100,
            "by_command": {k: {"per_job": v / 100, "usec_per_call": 1.0} for k, v in calls.items()}}


def meta(systems):
    return {"date": "2026-12-02", "machine": "a shared 2-core VM", "jobs": 100, "slots": 2, "rounds": 2,
            "systems": systems, "redis": "Redis server v=7.0.15"}


def test_medians_take_each_systems_rounds_apart():
    runs = [run("forkbox", 100, 300, {"evalsha": 200}), run("bullmq", 50, 2000, {"evalsha": 200}),
            run("forkbox", 140, 280, {"evalsha": 200}), {"system": "bullmq", "error": "exit 1"},
            run("forkbox", 120, 290, {"evalsha": 200})]
    med = {m["system"]: m for m in redis_cost.medians(runs, ["forkbox", "bullmq"])}
    assert med["forkbox"]["cpu_us_per_job"] == 120
    assert med["forkbox"]["all_cpu_us_per_job"] == [100, 140, 120]
    assert med["bullmq"]["rounds"] == 1, "a failed round is left out, not counted as zero"


def test_the_section_says_which_target_is_met():
    runs = [run("forkbox-before", 200, 280, {"evalsha": 250}), run("forkbox", 90, 300, {"evalsha": 200}),
            run("bullmq", 150, 2500, {"evalsha": 200}), run("bullmq-true", 290, 270, {"evalsha": 200})]
    systems = ["forkbox-before", "forkbox", "bullmq", "bullmq-true"]
    s = redis_cost.section(meta(systems), redis_cost.medians(runs, systems))
    assert s["section"] == "redis-cost" and s["order"] > 40
    rows = s["tables"][0]["rows"]
    assert [r[1] for r in rows] == ["200", "90", "150", "290"]
    assert rows[1][5] == "300", "each system's job rate is shown"
    target = s["notes"][-1]
    assert "half the earlier build's Redis CPU per job (100 µs): met" in target
    assert "no more than BullMQ's (150 µs, no-op run): met" in target
    assert "same job rate (290 µs): met" in target


def test_a_missed_target_is_said_so():
    runs = [run("forkbox-before", 200, 280, {}), run("forkbox", 170, 300, {}), run("bullmq", 150, 2500, {})]
    systems = ["forkbox-before", "forkbox", "bullmq"]
    target = redis_cost.section(meta(systems), redis_cost.medians(runs, systems))["notes"][-1]
    assert "(100 µs): not met" in target and "no-op run): not met" in target


def test_a_fresh_redis_counts_commands_and_cpu_and_is_removed():
    r = redis_cost.Redis()
    try:
        assert r.port != 6379
        r.cli("config", "resetstat")
        before = r.snapshot()
        for i in range(5):
            r.cli("set", f"k{i}", "v")
        after = r.snapshot()
        stats = r.commandstats()
    finally:
        r.stop()
    assert stats["set"]["calls"] == 5
    assert after["reads"] - before["reads"] >= 5, "one socket read per request at least"
    assert after["cpu_s"] >= before["cpu_s"]
    assert not os.path.exists(r.dir)
    assert r.proc.poll() is not None


def test_the_no_op_rows_are_compared_like_for_like():
    runs = [run("forkbox-before-noop", 100, 6000, {"evalsha": 200}), run("forkbox-noop", 45, 9000, {"evalsha": 200}),
            run("bullmq", 70, 7000, {"evalsha": 200})]
    systems = ["forkbox-before-noop", "forkbox-noop", "bullmq"]
    notes = redis_cost.section(meta(systems), redis_cost.medians(runs, systems))["notes"]
    assert "forkbox's queue with a no-op processor: 45 µs of Redis CPU per job at 9,000 jobs/s" in notes[-2]
    assert "0.45× the earlier build's queue with the same processor (100 µs, 6,000 jobs/s)" in notes[-2]
    assert "0.64× BullMQ's no-op run (70 µs, 7,000 jobs/s)" in notes[-2]
    assert notes[-1] == ("Target, like for like (no-op processors on both sides): at most half the earlier "
                         "build's (50 µs): met; no more than BullMQ's (70 µs): met.")
    runs[1] = run("forkbox-noop", 80, 9000, {"evalsha": 200})
    notes = redis_cost.section(meta(systems), redis_cost.medians(runs, systems))["notes"]
    assert notes[-1].endswith("(50 µs): not met; no more than BullMQ's (70 µs): not met.")


def test_the_no_op_worker_drains_the_cli_pipeline_on_a_real_redis(tmp_path):
    """The forkbox-noop system end to end: every job submitted comes back `ok` through the
    same client commands as the forkbox row, and the worker stops on SIGTERM."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    forkbox = os.path.join(root, "target", "debug", "forkbox")
    noop = os.path.join(root, "target", "debug", "examples", "noop_worker")
    for path in (forkbox, noop):
        assert os.access(path, os.X_OK), f"build it first (make test-python does): {path}"
    r = redis_cost.Redis()
    try:
        extra = redis_cost.forkbox_cli(forkbox, r, 60, str(tmp_path), [noop, r.url, "bench", "2"], wait_s=60)
        pending = r.cli("xpending", "forkbox:{bench}:jobs", "workers").split()
        left = int(r.cli("xlen", "forkbox:{bench}:jobs").strip())
    finally:
        r.stop()
    assert extra["completed"] == 60
    assert pending[0] == "0" and left == 0, "every entry acknowledged and deleted"
    with open(tmp_path / "forkbox.log") as log:
        assert "noop_worker: 60 completed" in log.read()


def _resp(*args):
    out = f"*{len(args)}\r\n"
    for a in args:
        out += f"${len(a.encode())}\r\n{a}\r\n"
    return out


def test_the_no_op_worker_stops_on_sigterm_with_what_it_holds_completed(tmp_path):
    """Sent SIGTERM in the middle of a backlog, it stops reading, completes what it holds and
    exits: nothing is left pending, and every entry gone from the stream was completed."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    noop = os.path.join(root, "target", "debug", "examples", "noop_worker")
    assert os.access(noop, os.X_OK), f"build it first (make test-python does): {noop}"
    jobs = 50_000
    r = redis_cost.Redis()
    try:
        stream = "forkbox:{bench}:jobs"
        feed = "".join(_resp("XADD", stream, "*", "job", f'{{"id": "j{i}", "argv": ["/bin/true"]}}')
                       for i in range(jobs))
        subprocess.run(["redis-cli", "-p", str(r.port), "--pipe"], input=feed.encode(), check=True,
                       capture_output=True)
        assert int(r.cli("xlen", stream)) == jobs
        worker = subprocess.Popen([noop, r.url, "bench", "1"], stderr=subprocess.PIPE, text=True)
        try:
            for _ in range(600):
                if int(r.cli("xlen", stream)) <= jobs - 100:
                    break
                time.sleep(0.05)
            worker.send_signal(signal.SIGTERM)
            _, err = worker.communicate(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        left = int(r.cli("xlen", stream))
        pending = r.cli("xpending", stream, "workers").split()
    finally:
        r.stop()
    assert worker.returncode == 0, err
    assert left > 0, "it stopped before the backlog was drained"
    assert pending[0] == "0", "what it held was completed"
    assert f"noop_worker: {jobs - left} completed" in err
