"""An AutoGen code executor backed by a Forkbox session.

`ForkboxCodeExecutor` implements autogen-core's `CodeExecutor` (`execute_code_blocks ->
CodeResult(exit_code, output)`, `start`/`stop`/`restart`), so it plugs in where AutoGen takes
one (`CodeExecutorAgent(code_executor=...)`, `PythonCodeExecutionTool`). Python blocks run in
the session's interpreter (their variables stay for the next block), shell blocks as commands
in the same sandbox and disk. A cancelled token interrupts the running block. A scripted
"model" writes the code blocks, so the loop runs without network:

    FORKBOX_REDIS_URL=redis://127.0.0.1:PORT python examples/session_autogen.py

Needs `pip install 'forkbox[agents]'` (autogen-core) and a `forkbox worker` on the queue.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, List, Optional

from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock, CodeExecutor, CodeResult

from forkbox.aio import AsyncSession

SHELLS = ("sh", "bash", "shell")


class ForkboxCodeExecutor(CodeExecutor):
    """Runs code blocks in one Forkbox session; `restart` replaces it with a fresh one."""

    def __init__(self, timeout: float = 30.0, **session_args: Any) -> None:
        self.timeout = timeout
        self.session_args = session_args
        self.session: Optional[AsyncSession] = None

    async def start(self) -> None:
        if self.session is None:
            self.session = await AsyncSession.create(**self.session_args)

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.kill()
            await self.session.close()
            self.session = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def execute_code_blocks(self, code_blocks: List[CodeBlock], cancellation_token: CancellationToken) -> CodeResult:
        await self.start()
        assert self.session is not None
        outputs: List[str] = []
        for block in code_blocks:
            lang = block.language.lower()
            if lang in ("python", "py", "python3"):
                task = asyncio.ensure_future(self.session.run_code(block.code, timeout=self.timeout))
                cancellation_token.add_callback(lambda: asyncio.ensure_future(self._interrupt()))
                ex = await task
                outputs.append(ex.stdout + ex.stderr + (f"{ex.exception}\n" if ex.exception else ""))
                if ex.exception is not None or ex.timed_out or ex.state_lost:
                    return CodeResult(exit_code=1, output="".join(outputs))
            elif lang in SHELLS:
                res = await self.session.exec(block.code, timeout=self.timeout)
                outputs.append(res.stdout + res.stderr)
                if res.exit_code != 0:
                    return CodeResult(exit_code=res.exit_code if res.exit_code is not None else 1, output="".join(outputs))
            else:
                return CodeResult(exit_code=1, output="".join(outputs) + f"unsupported language {block.language!r}\n")
        return CodeResult(exit_code=0, output="".join(outputs))

    async def _interrupt(self) -> None:
        if self.session is not None:
            await self.session.interrupt()


FENCE = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)

SCRIPT = [
    "Let me load the data.\n```python\nrows = [3, 1, 4, 1, 5, 9, 2, 6]\nprint(len(rows))\n```",
    "Now sort it on disk, then read it back.\n```sh\nprintf '%s\\n' 3 1 4 1 5 9 2 6 | sort -n > sorted.txt && wc -l < sorted.txt\n```\n"
    "```python\nprint(open('sorted.txt').read().split() == sorted(map(str, rows)))\n```",
    "A mistake, to see the error come back:\n```python\nrows[100]\n```",
    "The answer is ready. TERMINATE",
]


async def main() -> None:
    transcript: List[str] = []
    async with ForkboxCodeExecutor(ttl_s=300, idle_s=120) as executor:
        for reply in SCRIPT:  # the scripted model's turns
            blocks = [CodeBlock(code=code, language=lang) for lang, code in FENCE.findall(reply)]
            if not blocks:
                break
            result = await executor.execute_code_blocks(blocks, CancellationToken())
            transcript.append(f"exit code {result.exit_code}: {result.output.strip()}")
        first_session = executor.session
        await executor.restart()
        fresh = await executor.execute_code_blocks([CodeBlock(code="print('rows' in globals())", language="python")], CancellationToken())
        assert executor.session is not first_session
    for line in transcript:
        print(line)
    assert transcript[0] == "exit code 0: 8", transcript
    assert transcript[1] == "exit code 0: 8\nTrue", transcript
    assert transcript[2].startswith("exit code 1:") and "IndexError" in transcript[2], transcript
    assert fresh.output.strip() == "False", fresh  # restart gives a fresh interpreter


if __name__ == "__main__":
    asyncio.run(main())
