"""The ``runtime`` job field and the result's ``runtime`` report."""

from forkbox.job import JOB_FIELDS, build_job
from forkbox.result import Result


def test_runtime_is_a_job_field_sent_only_when_given():
    assert "runtime" in JOB_FIELDS
    job = build_job(argv=["python3", "-c", "print(1)"], runtime="python")
    assert job["runtime"] == "python"
    assert "runtime" not in build_job(argv=["python3", "-c", "print(1)"])


def test_result_reports_how_the_runtime_ran():
    base = {"id": "j", "status": "ok", "exit_code": 0}
    warm = Result.from_dict({**base, "runtime": {"name": "python", "warm": True}})
    assert warm.runtime == {"name": "python", "warm": True}
    cold = Result.from_dict({**base, "runtime": {"name": "python", "warm": False, "note": "-O"}})
    assert cold.runtime["note"] == "-O"
    assert Result.from_dict(base).runtime is None
