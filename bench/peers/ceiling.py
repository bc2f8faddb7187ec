"""The unsandboxed ceiling: W plain processes looping spawn+wait of /bin/true, no queue, no
isolation. Spawning is posix_spawn (vfork+exec), the cheapest way to run a program, so nothing
that runs each job in its own process should beat it on this machine."""

import argparse
import json
import multiprocessing
import os
import time


def loop(n):
    for _ in range(n):
        pid = os.posix_spawn("/bin/true", ["/bin/true"], {})
        os.waitpid(pid, 0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    per = a.jobs // a.workers
    procs = [multiprocessing.Process(target=loop, args=(per,)) for _ in range(a.workers)]
    t0 = time.time()
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join()
    dt = time.time() - t0
    print(json.dumps({"system": "posix_spawn", "workers": a.workers, "jobs": per * a.workers,
                      "seconds": dt, "jobs_per_s": per * a.workers / dt}))


if __name__ == "__main__":
    main()
