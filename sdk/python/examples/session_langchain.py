"""A LangChain tool over a Forkbox session: a stateful Python interpreter for an agent.

`python_session_tool(session)` is a langchain-core tool (`@tool`): its input is code, its
output what the code printed, its last expression's value and any traceback, as text a model
reads. The interpreter keeps its variables between calls, so an agent can build on earlier
steps. A scripted "model" makes the tool calls here, so the loop runs without network:

    FORKBOX_REDIS_URL=redis://127.0.0.1:PORT python examples/session_langchain.py

Needs `pip install 'forkbox[agents]'` (langchain-core) and a `forkbox worker` on the queue.
"""

from __future__ import annotations

from typing import Any, Dict, List

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool

import forkbox


def python_session_tool(session: forkbox.Session, timeout: float = 30.0) -> BaseTool:
    """A LangChain tool running code in ``session``."""

    @tool("python")
    def python(code: str) -> str:
        """Runs Python code in a persistent, isolated interpreter (variables stay between calls;
        no network) and returns its output, the value of its last expression and any error."""
        ex = session.run_code(code, timeout=timeout)
        parts = [ex.stdout.rstrip("\n"), ex.stderr.rstrip("\n")]
        if ex.text is not None:
            parts.append(f"Out[{ex.execution_count}]: {ex.text}")
        if ex.exception is not None:
            parts.append(str(ex.exception))
        if ex.timed_out:
            parts.append(f"[timed out after {timeout} s; the interpreter's state is kept]")
        if ex.state_lost:
            parts.append("[the interpreter died; its state is gone]")
        return "\n".join(p for p in parts if p) or "[no output]"

    return python


CALLS: List[Dict[str, Any]] = [
    {"code": "import statistics\nxs = [2, 4, 4, 4, 5, 5, 7, 9]\nlen(xs)"},
    {"code": "statistics.pstdev(xs)"},
    {"code": "print(undefined_name)"},
]


def main() -> None:
    with forkbox.Session(ttl_s=300, idle_s=120) as session:
        python = python_session_tool(session)
        messages: List[Any] = [HumanMessage("What is the population standard deviation of the data?")]
        for i, args in enumerate(CALLS):  # the scripted model's tool calls, one per turn
            call = {"name": "python", "args": args, "id": f"call-{i}", "type": "tool_call"}
            messages.append(AIMessage(content="", tool_calls=[call]))
            reply = python.invoke(call)
            assert isinstance(reply, ToolMessage)
            messages.append(reply)
        for m in messages[1:]:
            if isinstance(m, ToolMessage):
                print(f"{m.tool_call_id}: {m.content!r}")
    outputs = [m.content for m in messages if isinstance(m, ToolMessage)]
    assert outputs[0] == "Out[1]: 8", outputs
    assert outputs[1] == "Out[2]: 2.0", outputs  # uses the state of the call before
    assert "NameError" in outputs[2] and "undefined_name" in outputs[2], outputs


if __name__ == "__main__":
    main()
