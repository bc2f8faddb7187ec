"""A plain function-calling loop: the model asks for a tool, we run it, we feed back the text.

The "model" here is scripted so the example runs offline; swap `scripted_model` for a call to
your chat API that returns either a tool call or a final answer.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

from forkbox.tools import code_interpreter

# The tool as a chat API would see it (the usual JSON-schema shape).
TOOLS = [
    {
        "name": "python",
        "description": "Run Python 3 code in a sandbox and return its stdout/stderr.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The program to run."}},
            "required": ["code"],
        },
    }
]
HANDLERS = {"python": code_interpreter(timeout_ms=5000)}


def scripted_model(messages: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Stands in for an LLM: first asks to compute, then answers from the tool's output."""
    tool_outputs = [m["content"] for m in messages if m["role"] == "tool"]
    if not tool_outputs:
        code = "import math\nprint(math.factorial(20))"
        return {"tool_call": {"name": "python", "arguments": json.dumps({"code": code})}}
    return {"content": f"20! is {tool_outputs[-1].strip()}."}


def main() -> None:
    messages: List[Dict[str, Any]] = [{"role": "user", "content": "What is 20 factorial?"}]
    for _ in range(5):  # bound the loop, as a real agent should
        reply = scripted_model(messages)
        call = reply.get("tool_call")
        if call is None:
            print(reply["content"])
            assert "2432902008176640000" in reply["content"]
            return
        output = HANDLERS[call["name"]](**json.loads(call["arguments"]))
        messages.append({"role": "assistant", "tool_call": call})
        messages.append({"role": "tool", "name": call["name"], "content": output})
    raise SystemExit("the model did not finish")


if __name__ == "__main__":
    main()
