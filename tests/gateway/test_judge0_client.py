"""The official `judge0` Python client (PyPI 0.0.8), unchanged, against a real gateway.

Its constructor reads /languages and /config_info; it submits with base64_encoded=true and
wait=false (several at once through /submissions/batch) and polls with fields=*.
"""

from __future__ import annotations

import pytest

from conftest import missing_reason

judge0 = pytest.importorskip("judge0", reason=missing_reason("judge0"))

CPP_SUM = "#include <cstdio>\nint main(){long a,b;scanf(\"%ld %ld\",&a,&b);printf(\"%ld\\n\",a+b);}\n"


@pytest.fixture(scope="module")
def client(gateway: str):
    c = judge0.Client(gateway)
    assert c.version == "1.13.1"
    return c


def run(client, *subs):
    done = judge0.run(client=client, submissions=list(subs))
    return done if isinstance(done, list) else [done]


def test_the_client_sees_judge0_ce_languages(client) -> None:
    ids = {lang.id for lang in client.languages}
    assert {71, 54, 50}.issubset(ids), ids
    assert client.is_language_supported(judge0.PYTHON)
    assert client.config.max_submission_batch_size == 20


def test_verdicts_across_languages(client) -> None:
    cases = [
        ("python accepted", judge0.Submission(source_code="print(int(input()) * 2)", language=71, stdin="21", expected_output="42"), judge0.Status.ACCEPTED),
        ("python wrong answer", judge0.Submission(source_code="print(int(input()) * 3)", language=71, stdin="21", expected_output="42"), judge0.Status.WRONG_ANSWER),
        ("c++ accepted", judge0.Submission(source_code=CPP_SUM, language=54, stdin="40 2", expected_output="42  \n\n"), judge0.Status.ACCEPTED),
        ("c++ compile error", judge0.Submission(source_code="int main() { return missing; }", language=54), judge0.Status.COMPILATION_ERROR),
        ("python time limit", judge0.Submission(source_code="while True:\n    pass", language=71, cpu_time_limit=1, wall_time_limit=3), judge0.Status.TIME_LIMIT_EXCEEDED),
        ("c segfault", judge0.Submission(source_code="int main(){ volatile int *p = 0; return *p; }", language=50), judge0.Status.RUNTIME_ERROR_SIGSEGV),
        ("python exception", judge0.Submission(source_code="raise SystemExit(3)", language=71), judge0.Status.RUNTIME_ERROR_NZEC),
        ("javascript accepted", judge0.Submission(source_code="console.log(6 * 7)", language=63, expected_output="42"), judge0.Status.ACCEPTED),
    ]
    done = run(client, *(s for _, s, _ in cases))
    for (name, _, want), sub in zip(cases, done):
        assert sub.status == want, f"{name}: {sub.status} stdout={sub.stdout!r} stderr={sub.stderr!r} compile={sub.compile_output!r} message={sub.message!r}"
    by_name = {name: sub for (name, _, _), sub in zip(cases, done)}
    ok = by_name["python accepted"]
    assert ok.stdout == "42\n" and ok.stderr is None
    assert isinstance(ok.time, float) and ok.memory and ok.memory > 0
    assert "missing" in by_name["c++ compile error"].compile_output
    assert by_name["c++ compile error"].stdout is None
    assert by_name["python exception"].exit_code == 3
    assert by_name["c segfault"].exit_signal == 11


def test_memory_limit_decides_the_verdict(client) -> None:
    # The same program: over its memory limit it fails at run time; under it, it passes.
    prog = "x = bytearray(200 * 1024 * 1024)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\nprint('ok')"
    tight, roomy = run(
        client,
        judge0.Submission(source_code=prog, language=71, memory_limit=64000, expected_output="ok"),
        judge0.Submission(source_code=prog, language=71, memory_limit=512000, expected_output="ok"),
    )
    assert tight.status in (judge0.Status.RUNTIME_ERROR_NZEC, judge0.Status.RUNTIME_ERROR_OTHER), (tight.status, tight.stderr, tight.message)
    assert roomy.status == judge0.Status.ACCEPTED, (roomy.status, roomy.stderr, roomy.message)
    assert roomy.memory > 200 * 1024


def test_one_submission_waits_alone(client) -> None:
    sub = judge0.Submission(source_code="import sys\nprint(sys.argv[1:])", language=71, command_line_arguments="a 'b c'")
    (done,) = run(client, sub)
    assert done.status == judge0.Status.ACCEPTED
    assert done.stdout == "['a', 'b c']\n"
