"""An in-test stand-in for a worker's *Redis protocol* (key layout, completion, batches,
cancellation), to exercise the Queue client's waiting logic against a real redis-server.

It runs nothing: `cmd` is interpreted as below. The real worker is tested in test_queue.py.
  "sleep:S"   -> waits S seconds (watching for cancellation), then ok
  "exit:N"    -> status failed (or ok for 0), exit_code N
  "reject"    -> status invalid, naming `cmd`
  otherwise   -> ok, stdout = cmd + "\n"
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Dict, Optional

import redis


class FakeWorker:
    def __init__(self, url: str, queue: str = "default", slots: int = 4) -> None:
        self.r = redis.Redis.from_url(url)
        self.queue = queue
        self.p = f"forkbox:{{{queue}}}"
        self.jobs = f"{self.p}:jobs"
        self.max_unfinished = 0
        self.write_results_stream = True
        self._stop = threading.Event()
        try:
            self.r.xgroup_create(self.jobs, "workers", id="0", mkstream=True)
        except redis.ResponseError:
            pass
        self._threads = [threading.Thread(target=self._loop, args=(f"fake-{i}",), daemon=True) for i in range(slots)]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)

    def _loop(self, name: str) -> None:
        r = redis.Redis(connection_pool=self.r.connection_pool)
        while not self._stop.is_set():
            got = r.xreadgroup("workers", name, {self.jobs: ">"}, count=1, block=100)
            for _stream, entries in got or []:
                for entry_id, fields in entries:
                    self.max_unfinished = max(self.max_unfinished, r.xlen(self.jobs))
                    self._run(r, entry_id, json.loads(fields[b"job"]), name)

    def _cancelled(self, r: redis.Redis, job_id: str) -> bool:
        return r.zscore(f"{self.p}:cancelled", job_id) is not None

    def _run(self, r: redis.Redis, entry_id: bytes, job: Dict[str, Any], name: str) -> None:
        job_id = job["id"]
        cmd: str = job.get("cmd") or ""
        res: Dict[str, Any] = {"status": "ok", "exit_code": 0, "stdout": "", "error": None}
        if self._cancelled(r, job_id):
            res.update(status="cancelled", exit_code=125)
        elif cmd.startswith("sleep:"):
            end = time.monotonic() + float(cmd[6:])
            while time.monotonic() < end:
                if self._cancelled(r, job_id):
                    res.update(status="cancelled", exit_code=137, signal=9)
                    break
                time.sleep(0.02)
        elif cmd.startswith("exit:"):
            code = int(cmd[5:])
            res.update(status="ok" if code == 0 else "failed", exit_code=code)
        elif cmd == "reject":
            res.update(status="invalid", exit_code=125, error="cmd: rejected by the fake worker")
        else:
            res["stdout"] = cmd + "\n"
        result = dict(
            id=job_id, signal=None, timed_out=False, stderr="", stdout_truncated=False,
            stderr_truncated=False, duration_ms=1.0, spawn_us=900, cpu_ms=0, max_rss_kb=0,
            files={}, attempt=1, worker=name,
        )  # fmt: skip
        result.update(res)
        batch: Optional[str] = job.get("batch")
        if batch:
            result["batch"] = batch
        text = json.dumps(result)
        pipe = r.pipeline(transaction=True)
        pipe.set(f"{self.p}:result:{job_id}", text, ex=600)
        pipe.rpush(f"{self.p}:done:{job_id}", result["status"])
        pipe.expire(f"{self.p}:done:{job_id}", 600)
        pipe.xadd(f"{self.p}:wake:{job_id}", {"status": result["status"]})
        pipe.pexpire(f"{self.p}:wake:{job_id}", 10_000)
        if self.write_results_stream:
            pipe.xadd(f"{self.p}:results", {"result": text}, maxlen=10000, approximate=True)
        if batch:
            pipe.hincrby(f"{self.p}:batch:{batch}", "done", 1)
            pipe.hincrby(f"{self.p}:batch:{batch}", result["status"], 1)
        pipe.xack(self.jobs, "workers", entry_id)
        pipe.xdel(self.jobs, entry_id)
        pipe.execute()
