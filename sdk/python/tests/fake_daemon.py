"""An in-test stand-in for the daemon's *framing* (newline-delimited JSON over a Unix socket).

It runs no sandbox and checks no schema: it exists to exercise the clients' framing, id
matching, pipelining and error handling. The real behaviour is tested against the real
`forkbox daemon` in test_daemon.py.

What it answers, by the request's `cmd`:
  "reject"        -> status invalid with an error naming `cmd`
  "hang"          -> no answer
  "close"         -> closes the connection
  "stream"        -> two stdout events and one stderr event, then the result
  "wrong-id"      -> a result carrying another id
  "garbage"       -> a line that is not JSON
  anything else   -> status ok, stdout = the cmd, after env["DELAY"] seconds (threads, so
                     answers to pipelined requests come back out of order)
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any, Dict, List


def result_for(job: Dict[str, Any], **over: Any) -> Dict[str, Any]:
    r: Dict[str, Any] = {
        "id": job.get("id"),
        "status": "ok",
        "exit_code": 0,
        "signal": None,
        "timed_out": False,
        "stdout": "",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "duration_ms": 0.5,
        "spawn_us": 700,
        "cpu_ms": 0,
        "max_rss_kb": 1000,
        "files": {},
        "error": None,
        "attempt": 1,
        "worker": "fake",
    }
    r.update(over)
    return r


class FakeDaemon:
    def __init__(self, path: str) -> None:
        self.path = path
        self.requests: List[Dict[str, Any]] = []
        self.raw_lines: List[bytes] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(128)
        self._conns: List[socket.socket] = []
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for c in list(self._conns):
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass
        if os.path.exists(self.path):
            os.unlink(self.path)

    def drop_connections(self) -> None:
        """Closes every open connection, as a restarted daemon would."""
        for c in list(self._conns):
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass
        self._conns.clear()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        wlock = threading.Lock()
        buf = b""

        def send(obj: Any) -> None:
            data = obj if isinstance(obj, bytes) else json.dumps(obj).encode() + b"\n"
            with wlock:
                try:
                    conn.sendall(data)
                except OSError:
                    pass

        while True:
            try:
                chunk = conn.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                with self._lock:
                    self.raw_lines.append(line)
                try:
                    job = json.loads(line)
                except ValueError as e:
                    send(result_for({"id": None}, status="invalid", exit_code=125, error=f"job is not valid JSON: {e}"))
                    continue
                with self._lock:
                    self.requests.append(job)
                cmd = job.get("cmd")
                if cmd == "close":
                    conn.close()
                    return
                threading.Thread(target=self._answer, args=(job, send), daemon=True).start()

    def _answer(self, job: Dict[str, Any], send: Any) -> None:
        cmd = job.get("cmd")
        if cmd == "hang":
            return
        if cmd == "reject":
            send(result_for(job, status="invalid", exit_code=125, error="cmd: rejected by the fake daemon"))
        elif cmd == "garbage":
            send(b"this is not json\n")
        elif cmd == "wrong-id":
            send(result_for({"id": "someone-else"}))
        elif cmd == "stream":
            jid = job.get("id")
            if job.get("stream"):
                send({"id": jid, "event": "stdout", "data": "a"})
                send({"id": jid, "event": "stderr", "data": "oops"})
                send({"id": jid, "event": "stdout", "data": "b"})
            send(result_for(job, stdout="ab", stderr="oops"))
        else:
            delay = float((job.get("env") or {}).get("DELAY", "0"))
            if delay:
                time.sleep(delay)
            send(result_for(job, stdout=str(cmd if cmd is not None else job.get("argv"))))


def wait_for(pred: Any, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return False


def short_tmp_socket(tmp: str, name: str = "fake.sock") -> str:
    p = os.path.join(tmp, name)
    assert len(p) < 100, p
    return p

