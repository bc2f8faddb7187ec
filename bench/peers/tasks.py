"""The job every peer runs: /bin/true in a subprocess, timed inside the worker."""

import subprocess
import time


def run_true():
    start = time.time()
    subprocess.run(["/bin/true"], check=True)
    return (start, time.time())
