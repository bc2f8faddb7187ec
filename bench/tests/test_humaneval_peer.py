"""The HumanEval baselines of bench/peers/humaneval_mp.py, both styles, on three small problems
(one passes, one fails its test, one never ends), and the report section built from their
numbers."""

import gzip
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)
PEER = os.path.join(HERE, "..", "peers", "humaneval_mp.py")
sys.path.insert(0, os.path.join(HERE, ".."))

import sections  # noqa: E402


def problem(task, body, test):
    return {"task_id": task, "prompt": "def f(x):\n", "canonical_solution": body,
            "test": test, "entry_point": "f"}


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "problems.jsonl.gz"
    problems = [
        problem("T/0", "    return x + 1\n", "def check(f):\n    assert f(1) == 2\n"),
        problem("T/1", "    return x\n", "def check(f):\n    assert f(1) == 2\n"),
        problem("T/2", "    while True:\n        pass\n", "def check(f):\n    f(1)\n"),
    ]
    with gzip.open(path, "wt") as f:
        for p in problems:
            f.write(json.dumps(p) + "\n")
    return path


@pytest.mark.parametrize("style", ["lean", "reference"])
def test_each_style_counts_passes_failures_and_timeouts(data, style):
    out = subprocess.run(
        [sys.executable, PEER, "--data", str(data), "--workers", "2", "--timeout", "1", "--style", style],
        capture_output=True, text=True, timeout=60, check=True,
    )
    report = json.loads(out.stdout)
    assert report["style"] == style
    assert report["problems"] == 3
    assert report["passed"] == 1
    assert sorted(report["not_passed"]) == ["T/1", "T/2"]


def test_reference_style_leaves_the_host_untouched(tmp_path):
    # The program deletes a file and writes one in its working directory; the disabled
    # functions and the temporary directory keep both away from the host.
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    body = (f"    import os\n    open('written.txt', 'w').write('x')\n"
            f"    os.remove({str(victim)!r})\n    return x\n")
    path = tmp_path / "p.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(problem("T/0", body, "def check(f):\n    assert f(1) == 1\n")) + "\n")
    out = subprocess.run(
        [sys.executable, PEER, "--data", str(path), "--workers", "1", "--timeout", "5", "--style", "reference"],
        capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path,
    )
    assert json.loads(out.stdout)["not_passed"] == ["T/0"]  # os.remove is None: TypeError
    assert victim.read_text() == "keep"
    assert not (tmp_path / "written.txt").exists()


def write(raw, name, value):
    path = raw / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def test_section_judges_forkbox_against_each_baseline(tmp_path):
    raw = tmp_path
    write(raw, "forkbox-humaneval/report.json", {"elapsed_s": 2.0, "humaneval": {"passed": 164, "sent": 164}})
    write(raw, "humaneval-reference.json", {"passed": 164, "problems": 164, "seconds": 4.0})
    write(raw, "humaneval-mp.json", {"passed": 164, "problems": 164, "seconds": 1.0})
    s = sections.humaneval(str(raw))
    rows = s["tables"][0]["rows"]
    assert rows[0][0].startswith("forkbox") and rows[0][3:] == ["0.50×", "2.00×"]
    assert rows[1][3] == "1.00×" and rows[2][4] == "1.00×"
    assert "reference harness's steps: 0.50× (met)" in s["notes"][-1]
    assert "lean variant: 2.00× (not met)" in s["notes"][-1]

    # A baseline that did not run is said so, and no verdict is made up for it.
    write(raw, "humaneval-reference.json", {"error": "exit 1: boom"})
    s = sections.humaneval(str(raw))
    assert any("not measured" in n and "boom" in n for n in s["notes"])
    assert not any(n.startswith("Target") for n in s["notes"])


def test_queue_section_judges_the_backlog_row_and_shows_both(tmp_path):
    raw = tmp_path
    done = {"completed": 100, "lost": 0, "duplicated": 0}
    write(raw, "forkbox-backlog/report.json", {**done, "throughput_jobs_per_s": 600.0,
                                               "parameters": {"slots": 2, "backlog": True}})
    write(raw, "forkbox-noop/report.json", {**done, "throughput_jobs_per_s": 500.0,
                                            "parameters": {"slots": 2, "concurrency": 32}})
    write(raw, "celery.json", {"jobs_per_s": 200.0, "completed": 100, "failed": 0})
    write(raw, "rq-fork.json", {"jobs_per_s": 100.0, "completed": 100, "failed": 0})
    write(raw, "rq-simple.json", {"error": "exit 1: boom"})
    write(raw, "ceiling.json", {"jobs_per_s": 1000.0})
    s = sections.queue(str(raw))
    rows = s["tables"][0]["rows"]
    assert rows[0][:4] == ["forkbox (full sandbox), backlog drained", "600", "3.00×", "0.60×"]
    assert rows[1][:4] == ["forkbox (full sandbox), closed loop", "500", "2.50×", "0.50×"]
    assert [r[0] for r in rows[2:]] == ["RQ, forking worker", "Celery, prefork",
                                        "no queue, no isolation: processes spawning /bin/true"]
    target = next(n for n in s["notes"] if n.startswith("Targets"))
    assert "3.00× (met)" in target and "60% (met)" in target
    assert any("boom" in n for n in s["notes"])

    write(raw, "forkbox-backlog/report.json", {**done, "throughput_jobs_per_s": 300.0})
    target = next(n for n in sections.queue(str(raw))["notes"] if n.startswith("Targets"))
    assert "1.50× (not met)" in target and "30% (not met)" in target
