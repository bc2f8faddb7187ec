"""The README's spawn figures are the ones docs/benchmarks.md reports, on the machine it names."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _p50(bench: str, label: str) -> str:
    row = next(line for line in bench.splitlines() if line.startswith(f"| {label} |"))
    return row.split("|")[2].strip()


def test_readme_spawn_claims_match_the_benchmark_page() -> None:
    readme = (ROOT / "README.md").read_text()
    bench = (ROOT / "docs" / "benchmarks.md").read_text()
    forkbox, bare, bwrap = (_p50(bench, label) for label in ("forkbox sandbox", "bare fork+exec+wait", "bubblewrap"))
    claim = re.search(r"a spawn's median was ([\d,]+) µs\s+against ([\d,]+) µs for a bare fork\+exec\+wait \(([\d.]+)×", readme)
    assert claim, "README states the spawn median against bare fork+exec"
    assert claim.group(1) == forkbox and claim.group(2) == bare
    to_int = lambda s: int(s.replace(",", ""))  # noqa: E731
    assert claim.group(3) == f"{to_int(forkbox) / to_int(bare):.2f}"
    vs = re.search(r"and ([\d,]+) µs for\s+bubblewrap [\d.]+ \(forkbox ([\d.]+)× faster", readme)
    assert vs and vs.group(1) == bwrap
    assert vs.group(2) == f"{to_int(bwrap) / to_int(forkbox):.2f}"
    machine = re.search(r"\| cpu \| (.+?) \|", bench).group(1)
    cores = re.search(r"\| cores \| (\d+) \|", bench).group(1)
    kernel = re.search(r"\| kernel \| (\d+\.\d+\.\d+)", bench).group(1)
    assert f"{cores} cores of an {machine}, kernel {kernel}" in readme.replace("\n", " ")
