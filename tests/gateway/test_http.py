"""What the gateway's HTTP layer promises, seen from outside: every bad request is a 4xx
naming the field with nothing enqueued, the API key, the body and per-client limits,
Judge0's in-flight statuses, /healthz and /metrics."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional, Tuple

import pytest


def call(base: str, path: str, body: Optional[object] = None, headers: Optional[dict] = None,
         raw: Optional[bytes] = None) -> Tuple[int, object]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(base + path, data=data, headers=h, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


BAD = [
    ("/api/v2/execute", {"language": "python", "version": "*"}, 400, "files"),
    ("/api/v2/execute", {"language": "cobol", "version": "*", "files": [{"content": ""}]}, 400, "cobol-* runtime is unknown"),
    ("/api/v2/execute", {"language": "python", "version": "*", "files": [{"content": ""}], "run_timeout": 10**9}, 400, "run_timeout"),
    ("/submissions", {"source_code": "x", "language_id": 9999}, 422, "language_id"),
    ("/submissions", {"language_id": 71}, 422, "source_code"),
    ("/submissions?wait=true", {"source_code": "x", "language_id": 71, "memory_limit": 10**9}, 422, "memory_limit"),
    ("/submissions/batch", {"submissions": [{"source_code": "x", "language_id": 71}, {"source_code": "x", "language_id": 1}]}, 422, "language_id"),
    ("/submissions/batch", {"submissions": [{"source_code": "x", "language_id": 71}] * 21}, 422, "20"),
    ("/run_code", {"code": "x", "language": "cobol"}, 422, "language"),
    ("/run_code", {"code": "x", "language": "python", "fetch_files": ["/etc/passwd"]}, 422, "fetch_files"),
]


@pytest.mark.parametrize("path,body,status,names", BAD, ids=[f"{p} {n}" for p, _, _, n in BAD])
def test_a_bad_request_is_a_4xx_naming_the_field_and_enqueues_nothing(gateway, fleet, path, body, status, names) -> None:
    before = fleet.queued()
    got, answer = call(gateway, path, body)
    assert got == status, answer
    assert names in json.dumps(answer), answer
    assert fleet.queued() == before


def test_a_body_that_is_not_json(gateway, fleet) -> None:
    before = fleet.queued()
    assert call(gateway, "/api/v2/execute", raw=b"language=python", headers={"Content-Type": "text/plain"})[0] == 415
    assert call(gateway, "/submissions", raw=b"{nope")[0] == 400
    assert call(gateway, "/run_code", raw=b"{nope")[0] == 422
    assert fleet.queued() == before


def test_judge0_reports_queued_then_done(gateway, fleet) -> None:
    before = fleet.queued()
    status, answer = call(gateway, "/submissions", {"source_code": "import time\ntime.sleep(1.5)\nprint(5)", "language_id": 71, "expected_output": "5"})
    assert status == 201, answer
    token = answer["token"]
    assert fleet.queued() == before + 1  # the count the bad-request tests rely on moves
    status, first = call(gateway, f"/submissions/{token}?fields=status,stdout")
    assert status == 200 and first["status"]["id"] in (1, 2), first
    end = time.monotonic() + 60
    while True:
        _, sub = call(gateway, f"/submissions/{token}?fields=*")
        if sub["status"]["id"] > 2 or time.monotonic() > end:
            break
        time.sleep(0.2)
    assert sub["status"] == {"id": 3, "description": "Accepted"}, sub
    assert sub["stdout"] == "5\n" and sub["source_code"].startswith("import time")
    assert isinstance(sub["time"], str) and isinstance(sub["memory"], int)
    status, batch = call(gateway, f"/submissions/batch?tokens={token},00000000-0000-4000-8000-000000000000&base64_encoded=true")
    assert status == 200 and batch["submissions"][0]["stdout"] == "NQo=\n" and batch["submissions"][1] is None, batch
    assert call(gateway, "/submissions/00000000-0000-4000-8000-000000000000")[0] == 404


def test_api_key_body_limit_and_per_client_limit(fleet, tmp_root: Path) -> None:
    key = tmp_root / "api-key"
    key.write_text("s3cret\n")
    key.chmod(0o600)
    base = fleet.start_gateway("--api-key-file", str(key), "--max-body-bytes", "4096", "--per-client", "1")
    before = fleet.queued()
    assert call(base, "/languages")[0] == 401
    assert call(base, "/languages", headers={"X-Auth-Token": "wrong"})[0] == 401
    assert call(base, "/healthz")[0] == 200  # open for probes
    auth = {"X-Auth-Token": "s3cret"}
    assert call(base, "/languages", headers=auth)[0] == 200
    big = {"code": "#" * 8192, "language": "python"}
    assert call(base, "/run_code", big, headers=auth)[0] == 413
    assert fleet.queued() == before
    # One request in flight from this address: a second one is refused meanwhile.
    slow = threading.Thread(target=call, args=(base, "/run_code", {"code": "import time; time.sleep(3)", "language": "python"}, auth))
    slow.start()
    time.sleep(1.0)
    status, answer = call(base, "/v1/ping", headers=auth)
    slow.join()
    assert status == 429, answer
    assert call(base, "/v1/ping", headers=auth) == (200, "pong")


def test_metrics_count_requests_and_errors_per_endpoint(gateway) -> None:
    call(gateway, "/run_code", {"code": "print(1)", "language": "python"})
    call(gateway, "/run_code", {"code": "x", "language": "cobol"})
    status, text = call(gateway, "/metrics")
    assert status == 200
    assert 'forkbox_gateway_requests_total{endpoint="/run_code",code="200"}' in text
    assert 'forkbox_gateway_errors_total{endpoint="/run_code",kind="client"}' in text
    assert 'forkbox_gateway_request_duration_seconds_bucket{endpoint="/run_code",le="+Inf"}' in text
    line = next(l for l in text.splitlines() if l.startswith('forkbox_gateway_errors_total{endpoint="/run_code",kind="client"}'))
    assert float(line.split()[-1]) >= 1
