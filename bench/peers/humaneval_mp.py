"""HumanEval without isolation, one multiprocessing.Process per problem, W problems at a time:
the reference harness's approach, reimplemented here from its idea, not vendored.

--style lean (the default): each problem's program (prompt, canonical solution, tests, check
call) is exec'd in a fresh Process that reports through a shared Value. This is the least a
process-per-problem runner can do, so it is the strictest baseline.

--style reference: also the other steps the reference harness takes for every problem. It
starts a multiprocessing.Manager (a server process) whose list carries the verdict. The child
runs in a temporary working directory with its output swallowed, under a SIGALRM time limit,
with the functions that could harm the host disabled. A pool of W threads fans the problems
out.
"""

import argparse
import builtins
import concurrent.futures
import contextlib
import faulthandler
import gzip
import io
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import tempfile
import time


def run_program(program, ok):
    try:
        exec(compile(program, "main.py", "exec"), {"__name__": "__main__"})
        ok.value = 1
    except BaseException:
        ok.value = 0


def lean(programs, workers, timeout):
    """Returns the task ids that did not pass."""
    failed = []
    running = []
    queue = list(programs)
    while queue or running:
        while queue and len(running) < workers:
            task, program = queue.pop(0)
            ok = multiprocessing.Value("i", 0)
            proc = multiprocessing.Process(target=run_program, args=(program, ok))
            proc.start()
            running.append((task, proc, ok, time.time()))
        still = []
        for task, proc, ok, started in running:
            if proc.is_alive() and time.time() - started < timeout:
                still.append((task, proc, ok, started))
                continue
            if proc.is_alive():
                proc.kill()
            proc.join()
            if not (ok.value == 1 and proc.exitcode == 0):
                failed.append(task)
        running = still
        time.sleep(0.001)
    return failed


class TimedOut(Exception):
    pass


# What a program could use to damage the host or the run; the reference harness sets these to
# None in the child before exec'ing the program (its "reliability guard", not a sandbox).
DISABLED = {
    os: ["kill", "killpg", "system", "putenv", "remove", "removedirs", "rmdir", "unlink",
         "rename", "renames", "replace", "truncate", "fork", "forkpty", "setuid", "chmod",
         "fchmod", "chown", "fchown", "lchown", "chroot", "fchdir", "getcwd", "chdir"],
    shutil: ["rmtree", "move", "chown"],
    subprocess: ["Popen"],
    builtins: ["exit", "quit"],
}


def guarded_run(program, timeout, verdict):
    with tempfile.TemporaryDirectory() as workdir:
        os.chdir(workdir)
        # The temporary directory's clean-up needs some of what is disabled: keep them.
        kept = {(mod, name): getattr(mod, name) for mod, names in DISABLED.items()
                for name in names if hasattr(mod, name)}
        faulthandler.disable()
        for mod, name in kept:
            setattr(mod, name, None)

        def expire(signum, frame):
            raise TimedOut()

        signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        sink = io.StringIO()
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                exec(program, {})
            verdict.append("passed")
        except TimedOut:
            verdict.append("timed out")
        except BaseException as e:
            verdict.append(f"failed: {e}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for (mod, name), value in kept.items():
            setattr(mod, name, value)


def check(program, timeout):
    with multiprocessing.Manager() as manager:
        verdict = manager.list()
        proc = multiprocessing.Process(target=guarded_run, args=(program, timeout, verdict))
        proc.start()
        proc.join(timeout + 1)
        if proc.is_alive():
            proc.terminate()
            proc.join()
        return len(verdict) > 0 and verdict[0] == "passed"


def reference(programs, workers, timeout):
    """Returns the task ids that did not pass."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        verdicts = list(pool.map(lambda tp: (tp[0], check(tp[1], timeout)), programs))
    return [task for task, passed in verdicts if not passed]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--style", choices=["lean", "reference"], default="lean")
    a = p.parse_args()
    with gzip.open(a.data, "rt") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    programs = [
        (pr["task_id"], pr["prompt"] + pr["canonical_solution"] + "\n" + pr["test"] + "\n"
         + "check(" + pr["entry_point"] + ")\n")
        for pr in problems
    ]
    t0 = time.time()
    failed = (lean if a.style == "lean" else reference)(programs, a.workers, a.timeout)
    dt = time.time() - t0
    print(json.dumps({"system": "multiprocessing.Process", "style": a.style, "workers": a.workers,
                      "problems": len(programs), "passed": len(programs) - len(failed),
                      "not_passed": failed, "seconds": dt}))


if __name__ == "__main__":
    main()
