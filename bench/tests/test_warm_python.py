"""bench/warm_python.py: reading a process tree's CPU survives processes that exit while it is
read (a sandbox's init is reaped at any moment)."""

import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import warm_python  # noqa: E402


def own_cpu_s() -> float:
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / warm_python.CLK_TCK


def test_a_process_gone_between_its_stat_and_its_tasks_is_counted_and_skipped(monkeypatch):
    real = Path.iterdir

    def gone(self):
        if self.name == "task":
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return real(self)

    before = own_cpu_s()
    monkeypatch.setattr(Path, "iterdir", gone)
    assert warm_python.tree_cpu_s(os.getpid()) >= before


def test_a_process_already_gone_counts_nothing():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    assert warm_python.tree_cpu_s(pid) == 0.0


def test_the_lean_harness_starts_a_problem_as_soon_as_any_slot_is_free(tmp_path):
    """A slow problem must not hold the other slot idle: while it waits, the short ones after
    it all run in the other slot (a harness that waited for the oldest would run one)."""
    import threading
    import time

    release = tmp_path / "release"
    slow = ("import os, time\n"
            f"for _ in range(1000):\n    if os.path.exists({str(release)!r}): break\n    time.sleep(0.01)\n")
    shorts = [f"open({str(tmp_path / f'short{i}')!r}, 'w').close()\n" for i in range(6)]
    done = []
    t = threading.Thread(target=lambda: done.append(warm_python.lean_harness([slow] + shorts, 2)))
    t.start()
    try:
        for _ in range(500):
            if all((tmp_path / f"short{i}").exists() for i in range(6)):
                break
            time.sleep(0.01)
        ran = sorted(p.name for p in tmp_path.glob("short*"))
    finally:
        release.touch()
        t.join(timeout=30)
    assert ran == [f"short{i}" for i in range(6)], f"only {ran} ran while the slow problem waited"
    assert done, "the harness finished"
