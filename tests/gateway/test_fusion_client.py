"""The `sandbox-fusion` client (PyPI), unchanged, against a real gateway: it reads
SANDBOX_FUSION_ENDPOINT and posts to /run_code, as verl's reward code does."""

from __future__ import annotations

import base64
import importlib
import os

import pytest

from conftest import missing_reason

pytest.importorskip("sandbox_fusion", reason=missing_reason("sandbox-fusion"))


@pytest.fixture(scope="module")
def sf(gateway: str):
    os.environ["SANDBOX_FUSION_ENDPOINT"] = gateway
    import sandbox_fusion
    import sandbox_fusion.config

    importlib.reload(sandbox_fusion.config)  # it reads the endpoint when imported
    return sandbox_fusion


def run(sf, **kw):
    return sf.run_code(sf.RunCodeRequest(**kw), max_attempts=1)


CPP = "#include <iostream>\nint main(){int a,b;std::cin>>a>>b;std::cout<<a+b<<std::endl;}\n"


def test_accepted_and_wrong_answer_in_several_languages(sf) -> None:
    for lang, code, stdin, want in [
        ("python", "print(sum(map(int, input().split())))", "40 2", "42"),
        ("cpp", CPP, "40 2", "42"),
        ("nodejs", "const l=require('fs').readFileSync(0,'utf8').split(' ').map(Number);console.log(l[0]+l[1])", "40 2", "42"),
        ("go", "package main\nimport \"fmt\"\nfunc main(){var a,b int;fmt.Scan(&a,&b);fmt.Println(a+b)}", "40 2", "42"),
    ]:
        r = run(sf, code=code, language=lang, stdin=stdin, compile_timeout=60, run_timeout=10)
        assert r.status == sf.RunStatus.Success, (lang, r)
        assert r.run_result.stdout.strip() == want, (lang, r)
        assert (r.compile_result is not None) == (lang in ("cpp", "go")), (lang, r)
        # A wrong answer is a program that succeeds with other output, as reward code sees it.
        assert r.run_result.stdout.strip() != "43"


def test_compile_error_time_limit_runtime_error(sf) -> None:
    ce = run(sf, code="int main() { return missing; }", language="cpp")
    assert ce.status == sf.RunStatus.Failed
    assert ce.run_result is None
    assert ce.compile_result.return_code != 0 and "missing" in ce.compile_result.stderr
    assert sf.summary_run_code_result(ce, sf.SummaryMapping(CompileFailed="CE")) == "CE"

    tle = run(sf, code="while True: pass", language="python", run_timeout=1)
    assert tle.status == sf.RunStatus.Failed
    assert tle.run_result.status == sf.CommandRunStatus.TimeLimitExceeded
    assert sf.summary_run_code_result(tle, sf.SummaryMapping(RunTimeout="TLE")) == "TLE"

    re_ = run(sf, code="import sys\nsys.exit(3)", language="python")
    assert (re_.status, re_.run_result.return_code) == (sf.RunStatus.Failed, 3)
    segv = run(sf, code="int main(){ volatile int *p = 0; return *p; }", language="cpp")
    assert segv.run_result.return_code == -11, segv


def test_memory_limit(sf) -> None:
    prog = "x = bytearray(200 * 1024 * 1024)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\nprint('ok')"
    tight = run(sf, code=prog, language="python", memory_limit_MB=64) if "memory_limit_MB" in sf.RunCodeRequest.__fields__ else None
    if tight is None:
        # The client's model has no memory_limit_MB: post it as verl does, in the JSON body.
        import requests

        body = {"code": prog, "language": "python", "memory_limit_MB": 64}
        tight_json = requests.post(os.environ["SANDBOX_FUSION_ENDPOINT"] + "/run_code", json=body, timeout=60).json()
        assert tight_json["status"] == "Failed", tight_json
        assert tight_json["run_result"]["return_code"] != 0
        body["memory_limit_MB"] = 512
        roomy_json = requests.post(os.environ["SANDBOX_FUSION_ENDPOINT"] + "/run_code", json=body, timeout=60).json()
        assert roomy_json["status"] == "Success", roomy_json
        return
    assert tight.status == sf.RunStatus.Failed


def test_files_in_and_out(sf) -> None:
    r = run(
        sf,
        code="open('out.txt', 'w').write(open('data/in.txt').read().upper())",
        language="python",
        files={"data/in.txt": base64.b64encode(b"hello").decode()},
        fetch_files=["out.txt"],
    )
    assert r.status == sf.RunStatus.Success, r
    assert base64.b64decode(r.files["out.txt"]) == b"HELLO"
