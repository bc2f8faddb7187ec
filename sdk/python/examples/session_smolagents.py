"""A smolagents CodeAgent whose code runs in a Forkbox session.

`ForkboxExecutor` is a smolagents `RemotePythonExecutor` (the interface of its E2B, Docker and
Modal executors): the agent's tools and variables are sent into the session once, then each
step's code runs there, and the state carries from step to step as it does in the local
executor. A scripted model stands in for the LLM, so the loop runs without network:

    FORKBOX_REDIS_URL=redis://127.0.0.1:PORT python examples/session_smolagents.py

Needs `pip install 'forkbox[agents]'` (smolagents) and a `forkbox worker` on the queue.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Dict, List, Optional

from smolagents import CodeAgent
from smolagents.local_python_executor import CodeOutput
from smolagents.models import ChatMessage, Model
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.tools import get_tools_definition_code
from smolagents.utils import AgentError

import forkbox


class ForkboxExecutor(RemotePythonExecutor):
    """Runs a CodeAgent's code in one Forkbox session (killed by `cleanup`)."""

    def __init__(self, additional_imports: List[str], logger: Any, session: Optional[forkbox.Session] = None,
                 timeout: float = 30.0, **session_args: Any) -> None:  # fmt: skip
        super().__init__(additional_imports, logger)
        if additional_imports:
            raise ValueError("the session has no network to install packages; use a runtime that has them")
        self.session = session if session is not None else forkbox.Session(**session_args)
        self.timeout = timeout

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        ex = self.session.run_code(code, timeout=self.timeout)
        logs = ex.stdout + ex.stderr
        if ex.exception is not None:
            if ex.exception.name == self.FINAL_ANSWER_EXCEPTION:
                answer = self._deserialize_final_answer(ex.exception.value, self.allow_pickle)
                return CodeOutput(output=answer, logs=logs, is_final_answer=True)
            raise AgentError(f"{logs}\nExecuting code yielded an error:\n{ex.exception}", self.logger)
        if ex.timed_out or ex.state_lost:
            why = "timed out" if ex.timed_out else "lost the interpreter (its state is gone)"
            raise AgentError(f"{logs}\nExecuting code {why}", self.logger)
        return CodeOutput(output=ex.text, logs=logs, is_final_answer=False)

    def send_tools(self, tools: Dict[str, Any]) -> None:
        """As the base class sends them, without installing packages (a session has no network
        to install from): a top-level import of a module the session's runtime lacks is left
        out (the tools import numpy and PIL only where they cope without them), and named."""
        if "final_answer" in tools:
            self._patch_final_answer_with_exception(tools["final_answer"])
        code = get_tools_definition_code(tools)
        top = sorted(set(re.findall(r"^import (\w+)$", code, flags=re.MULTILINE)))
        probe = f"import importlib.util as u; [m for m in {top!r} if u.find_spec(m) is None]"
        missing = ast.literal_eval(self.session.run_code(probe, timeout=self.timeout).text or "[]")
        for name in missing:
            code = re.sub(rf"^import {name}$", f"pass  # {name} is not in the session's runtime", code, flags=re.MULTILINE)
        if missing:
            self.logger.log(f"not in the session's runtime, left out: {', '.join(missing)}")
        self.logger.log(self.run_code_raise_errors(code).logs)

    def cleanup(self) -> None:
        self.session.kill()


class ScriptedModel(Model):
    """Answers each step with the next scripted reply: a model that always writes this code."""

    def __init__(self, replies: List[str]) -> None:
        super().__init__(model_id="scripted")
        self.replies = list(replies)
        self.prompts: List[Any] = []

    def generate(self, messages: List[Any], stop_sequences: Any = None, response_format: Any = None,
                 tools_to_call_from: Any = None, **kwargs: Any) -> ChatMessage:  # fmt: skip
        self.prompts.append(messages)
        return ChatMessage(role="assistant", content=self.replies.pop(0))


STEPS = [
    # Step 1 defines state from a sent variable; step 2 uses it (it would fail in a fresh sandbox); step 3 answers.
    "Thought: keep the squares.\n<code>\nsquares = [n * n for n in range(limit)]\nprint(len(squares))\n</code>",
    "Thought: sum them.\n<code>\ntotal = sum(squares)\nprint(total)\n</code>",
    "Thought: done.\n<code>\nfinal_answer(total)\n</code>",
]


def main() -> None:
    logger = AgentLogger(level=LogLevel.OFF)
    with forkbox.Session(ttl_s=300, idle_s=120) as session:
        executor = ForkboxExecutor([], logger, session=session)
        agent = CodeAgent(tools=[], model=ScriptedModel(STEPS), executor=executor, max_steps=5, verbosity_level=LogLevel.OFF)
        # `limit` reaches the session through the executor's send_variables.
        answer = agent.run("What is the sum of the squares below 100?", additional_args={"limit": 10})
        print(f"answer: {answer!r} in {len(agent.memory.steps) - 1} steps")
        assert answer == 285, answer
        # The observation of step 1 came back from the sandbox.
        assert "10" in agent.memory.steps[1].observations


if __name__ == "__main__":
    main()
