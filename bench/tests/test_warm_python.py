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
