"""The npm `piston-client`, unchanged, against a real gateway: it reads /api/v2/runtimes to
pick the latest version, and sends default args ["1", "2", "3"]."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import CLIENTS_DIR, missing_reason

CLIENT = CLIENTS_DIR / "node_modules" / "piston-client" / "index.js"
HERE = Path(__file__).resolve().parent

if shutil.which("node") is None:
    pytest.skip("node is not installed (apt-get install nodejs)", allow_module_level=True)
if not CLIENT.is_file():
    pytest.skip(missing_reason("piston-client"), allow_module_level=True)


@pytest.fixture(scope="module")
def results(gateway: str) -> dict:
    p = subprocess.run(["node", str(HERE / "piston_cases.mjs"), str(CLIENT), gateway],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_runtimes_list_piston_names_and_versions(results: dict) -> None:
    langs = {r["language"]: r for r in results["runtimes"]}
    assert {"python", "c++", "c", "javascript"}.issubset(langs), langs
    assert all(r["version"][0].isdigit() for r in langs.values())
    assert "cpp" in langs["c++"]["aliases"]


def test_accepted_programs_see_stdin_and_default_args(results: dict) -> None:
    r = results["python_args"]
    assert r["run"]["stdout"] == "['1', '2', '3'] hi\n", r
    assert (r["run"]["code"], r["run"]["signal"]) == (0, None)
    assert "compile" not in r
    r = results["cpp_sum"]
    assert r["compile"]["code"] == 0, r
    assert r["run"]["stdout"] == "42 3\n", r
    assert results["javascript"]["run"]["stdout"] == "42\n"
    java = results["java"]
    assert (java["compile"]["code"], java["run"]["stdout"]) == (0, "42\n"), java
    # A wrong answer is one whose output differs: the same program, other input.
    assert r["run"]["stdout"] != "43 3\n"


def test_compile_error_sets_run_to_the_compile_stage(results: dict) -> None:
    r = results["compile_error"]
    assert r["compile"]["code"] != 0 and "missing" in r["compile"]["stderr"], r
    assert r["run"] == r["compile"]


def test_time_limit_is_sigkill(results: dict) -> None:
    r = results["time_limit"]["run"]
    assert (r["signal"], r["code"]) == ("SIGKILL", None), r


def test_runtime_errors(results: dict) -> None:
    assert results["segfault"].get("run", {}).get("signal") == "SIGSEGV", results["segfault"]
    assert results["exit_code"].get("run", {}).get("code") == 3, results["exit_code"]


def test_memory_limit(results: dict) -> None:
    assert "run" in results["memory"] and "run" in results["memory_roomy"], (results["memory"], results["memory_roomy"])
    tight, roomy = results["memory"]["run"], results["memory_roomy"]["run"]
    assert tight["stdout"] == "" and (tight["code"] not in (0, None) or tight["signal"] == "SIGKILL"), tight
    assert roomy["stdout"] == "ok\n", roomy


def test_an_unknown_version_is_piston_s_400(results: dict) -> None:
    assert results["unknown_version"] == {"message": "python-0.0.1 runtime is unknown"}
