"""The README's examples, run as written (doctest) against a real daemon and a real worker."""

from __future__ import annotations

import doctest
from pathlib import Path
from typing import List

import pytest

from conftest import SDK_DIR, Daemon

pytestmark = pytest.mark.real


def _sessions() -> List[str]:
    """The ```pycon blocks of the README, in order."""
    out, current = [], None
    for line in (SDK_DIR / "README.md").read_text().splitlines(keepends=True):
        if current is None and line.strip() == "```pycon":
            current = []
        elif current is not None and line.strip() == "```":
            out.append("".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return out


def test_the_readme_has_its_examples() -> None:
    assert len(_sessions()) == 2


def test_readme_examples_run_as_written(daemon: Daemon, worker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKBOX_REDIS_URL", worker)
    globs: dict = {}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    parser = doctest.DocTestParser()
    for i, text in enumerate(_sessions()):
        test = parser.get_doctest(text, globs, f"README.md block {i + 1}", str(SDK_DIR / "README.md"), 0)
        test.globs = globs  # one session across the blocks, as a reader runs them
        runner.run(test, out=_collect, clear_globs=False)
    assert runner.failures == 0, "".join(_report)


_report: List[str] = []


def _collect(s: str) -> None:
    _report.append(s)



def test_the_readmes_name_no_redis_port_for_the_sdk() -> None:
    """`forkbox up --own-redis` picks a free port: a snippet with 6379 in it would not reach it."""
    sdk = (SDK_DIR / "README.md").read_text()
    top = (SDK_DIR.parents[1] / "README.md").read_text()
    top_python = [block.split("```")[0] for block in top.split("```python")[1:]]
    for text in [sdk] + top_python:
        assert "6379" not in text, text
