"""HumanEval the way the reference harness runs it: each problem's program (prompt, canonical
solution, tests, check call) executed in its own multiprocessing.Process, with a timeout and no
isolation, W at a time. Reimplemented here from the idea, not vendored."""

import argparse
import gzip
import json
import multiprocessing
import time


def run_program(program, ok):
    try:
        exec(compile(program, "main.py", "exec"), {"__name__": "__main__"})
        ok.value = 1
    except BaseException:
        ok.value = 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=30.0)
    a = p.parse_args()
    with gzip.open(a.data, "rt") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    programs = [
        (pr["task_id"], pr["prompt"] + pr["canonical_solution"] + "\n" + pr["test"] + "\n"
         + "check(" + pr["entry_point"] + ")\n")
        for pr in problems
    ]
    t0 = time.time()
    passed, failed = 0, []
    running = []
    queue = list(programs)
    while queue or running:
        while queue and len(running) < a.workers:
            task, program = queue.pop(0)
            ok = multiprocessing.Value("i", 0)
            proc = multiprocessing.Process(target=run_program, args=(program, ok))
            proc.start()
            running.append((task, proc, ok, time.time()))
        still = []
        for task, proc, ok, started in running:
            if proc.is_alive() and time.time() - started < a.timeout:
                still.append((task, proc, ok, started))
                continue
            if proc.is_alive():
                proc.kill()
            proc.join()
            if ok.value == 1 and proc.exitcode == 0:
                passed += 1
            else:
                failed.append(task)
        running = still
        time.sleep(0.001)
    dt = time.time() - t0
    print(json.dumps({"system": "multiprocessing.Process", "workers": a.workers,
                      "problems": len(programs), "passed": passed, "not_passed": failed,
                      "seconds": dt}))


if __name__ == "__main__":
    main()
