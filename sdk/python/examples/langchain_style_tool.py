"""A LangChain-style tool, written without importing LangChain.

LangChain tools are objects with `name`, `description`, an argument schema and `invoke`/`run`.
With LangChain installed, the same callable plugs in directly:

    from langchain_core.tools import Tool
    tool = Tool.from_function(func=code_interpreter(timeout_ms=5000), name="python",
                              description=PythonSandboxTool.description)
"""

from __future__ import annotations

from typing import Any, Dict, Union

from forkbox.tools import code_interpreter


class PythonSandboxTool:
    name = "python"
    description = (
        "Runs Python 3 code in a fresh, isolated sandbox (no network, no state between calls) "
        "and returns what it printed. Input: the full program as a string."
    )
    args_schema = {"code": {"type": "string", "description": "Python 3 source to execute"}}

    def __init__(self, timeout_ms: int = 5000) -> None:
        self._run = code_interpreter(timeout_ms=timeout_ms)

    def invoke(self, tool_input: Union[str, Dict[str, Any]]) -> str:
        code = tool_input if isinstance(tool_input, str) else tool_input["code"]
        return self._run(code)

    run = invoke  # older LangChain spelling


def main() -> None:
    tool = PythonSandboxTool(timeout_ms=2000)
    print(tool.invoke({"code": "print(sum(range(101)))"}))
    # Errors come back as text the model can read, not as exceptions.
    print(tool.invoke("print(1/0)"))
    assert tool.invoke("print(sum(range(101)))") == "5050"
    assert "ZeroDivisionError" in tool.invoke("print(1/0)")


if __name__ == "__main__":
    main()
