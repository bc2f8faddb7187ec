"""An AutoGen-style function map, written without importing AutoGen.

AutoGen agents execute tool calls through `function_map={"name": callable}`; with AutoGen
installed, pass the same dict: `UserProxyAgent(..., function_map=FUNCTION_MAP)`.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict

import forkbox
from forkbox.tools import code_interpreter


def run_shell(command: str) -> str:
    """Run a shell command in a sandbox; returns stdout, stderr and the exit status."""
    res = forkbox.run(command, timeout_ms=5000)
    return f"{res.stdout}{res.stderr}[exit code {res.exit_code}]"


FUNCTION_MAP: Dict[str, Callable[..., str]] = {
    "python": code_interpreter(timeout_ms=5000),
    "sh": run_shell,
}


def execute_function_call(call: Dict[str, Any]) -> Dict[str, str]:
    """What a user-proxy agent does with a model's `function_call` message."""
    func = FUNCTION_MAP[call["name"]]
    return {"role": "function", "name": call["name"], "content": func(**json.loads(call["arguments"]))}


def main() -> None:
    calls = [
        {"name": "python", "arguments": json.dumps({"code": "print('hello from python')"})},
        {"name": "sh", "arguments": json.dumps({"command": "echo hello from sh; uname -s"})},
    ]
    for call in calls:
        reply = execute_function_call(call)
        print(f"{reply['name']}: {reply['content']!r}")
        assert "hello from" in reply["content"]


if __name__ == "__main__":
    main()
