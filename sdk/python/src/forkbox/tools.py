"""Ready-made tools for agent frameworks: plain callables, no framework imports."""

from __future__ import annotations

from typing import Callable, Optional

from .client import Forkbox
from .result import Result

__all__ = ["code_interpreter", "format_result"]


def format_result(res: Result, *, timeout_ms: Optional[int] = None) -> str:
    """Renders a result as the text a model reads: stdout, stderr, then a status line if the
    program did not succeed."""
    parts = []
    if res.stdout:
        parts.append(res.stdout.rstrip("\n"))
    if res.stderr:
        parts.append(res.stderr.rstrip("\n"))
    if res.truncated:
        parts.append("[output truncated]")
    if res.status != "ok":
        if res.timed_out or res.status == "timeout":
            limit = f" after {timeout_ms} ms" if timeout_ms else ""
            parts.append(f"[status: timeout{limit}, exit code {res.exit_code}]")
        else:
            detail = f", {res.error}" if res.error else ""
            parts.append(f"[status: {res.status}, exit code {res.exit_code}{detail}]")
    return "\n".join(parts) if parts else "[no output]"


def code_interpreter(
    timeout_ms: int = 10_000,
    *,
    memory_mb: Optional[int] = None,
    client: Optional[Forkbox] = None,
    python: str = "python3",
) -> Callable[[str], str]:
    """Returns ``run(code) -> text``: runs Python code in a fresh sandbox with ``python3``.

    The text holds stdout and stderr, and a status line when the program failed, timed out or
    hit a limit, so a model can read what went wrong. Each call is a new sandbox: no state is
    kept between calls. Errors of the service itself (no daemon, rejected job) raise.
    """

    def python_exec(code: str) -> str:
        """Run Python 3 code in an isolated sandbox and return what it printed (stdout, then
        stderr, then a status line if it failed). Print the values you need to see; nothing
        persists between calls, and there is no network."""
        fb = client if client is not None else Forkbox.default()
        res = fb.run(argv=[python, "main.py"], files={"main.py": code}, timeout_ms=timeout_ms, memory_mb=memory_mb)
        return format_result(res, timeout_ms=timeout_ms)

    python_exec.__name__ = "python"
    python_exec.__qualname__ = "python"
    return python_exec
