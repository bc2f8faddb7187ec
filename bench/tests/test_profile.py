"""bench/profile.py on a small `perf script --show-task-events` transcript in the format perf
prints: a load generator runs a node, the node exec's its zygote, the zygote forks a sandbox
init, the init forks a launcher that exec's the job's program."""

import json
import os
import subprocess
import sys

PROFILE = os.path.join(os.path.dirname(__file__), "..", "profile.py")

TRANSCRIPT = """\
forkbox-loadgen   100/100  PERF_RECORD_COMM exec: forkbox-loadgen:100/100
forkbox-loadgen   100/100  PERF_RECORD_FORK(101:101):(100:100)
forkbox   101/101  PERF_RECORD_COMM exec: forkbox:101/101
forkbox   101/101  PERF_RECORD_FORK(101:105):(101:101)
forkbox   101/101  PERF_RECORD_FORK(102:102):(101:101)
forkbox   102/102  PERF_RECORD_COMM exec: forkbox:102/102
forkbox   102/102  PERF_RECORD_FORK(103:103):(102:102)
forkbox   103/103  PERF_RECORD_FORK(104:104):(103:103)
true   104/104  PERF_RECORD_COMM exec: true:104/104
forkbox-loadgen   100/100     250000 
\tffffffff8100 do_syscall_64 ([kernel.kallsyms])
\t5555 forkbox_loadgen::run::drive (/usr/bin/forkbox-loadgen)

tokio-rt-worker   101/105     250000 
\t5555 forkbox::node::worker::Worker::run (/usr/bin/forkbox)

forkbox   102/102     500000 
\tffffffff8200 copy_process ([kernel.kallsyms])
\tffffffff8201 __do_sys_clone3 ([kernel.kallsyms])
\t5555 forkbox::sandbox::zygote::Zygote::replenish (/usr/bin/forkbox)

forkbox   103/103     250000 
\tffffffff8300 path_mount ([kernel.kallsyms])
\tffffffff8301 __x64_sys_mount ([kernel.kallsyms])
\t5555 forkbox::sandbox::rootfs::enter (/usr/bin/forkbox)

forkbox   104/104     250000 
\tffffffff8400 handle_mm_fault ([kernel.kallsyms])
\tffffffff8401 exc_page_fault ([kernel.kallsyms])
\tffffffff8402 asm_exc_page_fault ([kernel.kallsyms])
\t5555 malloc (/usr/lib/x86_64-linux-gnu/libc.so.6)

forkbox   104/104     250000 
\t5555 forkbox::sandbox::init::launch (/usr/bin/forkbox)

true   104/104     750000 
\t7777 intel_check_word.constprop.0 (/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2)

redis-server   99/99     250000 
\t6666 processCommand (/usr/bin/redis-server)

rcu_exp_gp_kthr    17/17     250000 
\tffffffff8500 synchronize_rcu_expedited ([kernel.kallsyms])

swapper     0/0     1000000 
\tffffffff8600 default_idle ([kernel.kallsyms])

"""


def test_samples_go_to_their_roles_per_job():
    out = subprocess.run([sys.executable, PROFILE, "--jobs", "2"], input=TRANSCRIPT,
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out)
    assert r["samples"] == 10
    assert r["cpu_s"] == 0.004
    # Microseconds per job: each period in ns, halved for two jobs.
    assert r["us_per_job"] == {
        "idle": 500.0, "sandbox": 375.0, "program": 375.0, "zygote": 250.0,
        "loadgen": 125.0, "node": 125.0, "redis": 125.0, "kernel": 125.0,
    }
    assert r["sandbox_us_per_job"] == {"mount": 125.0, "page fault": 125.0, "user space": 125.0}


def sample(pid, period, kernel, user):
    """One sample as `perf script` prints it: kernel frames innermost first, then the user's."""
    frames = "".join(f"\tffffffff8400 {f} ([kernel.kallsyms])\n" for f in kernel)
    return f"forkbox   {pid}/{pid}     {period} \n{frames}\t5555 {user} (/usr/bin/forkbox)\n\n"


def test_sandbox_page_faults_are_split_by_kind_and_the_zygote_by_entry():
    events = TRANSCRIPT.split("forkbox-loadgen   100/100     250000")[0]
    fault = ["handle_mm_fault", "exc_page_fault"]
    samples = "".join([
        sample(104, 500000, ["wp_page_copy", "do_wp_page", *fault], "PyDict_GetItem"),
        sample(104, 250000, ["next_uptodate_folio", "filemap_map_pages", "do_read_fault", *fault],
               "forkbox::sandbox::init::launch"),
        sample(104, 250000, ["clear_page_erms", "do_anonymous_page", *fault], "malloc"),
        sample(102, 500000, ["insert_header", "__x64_sys_unshare"], "forkbox::sandbox::netns::create"),
        sample(102, 250000, [], "forkbox::sandbox::zygote::Zygote::replenish"),
    ])
    out = subprocess.run([sys.executable, PROFILE, "--jobs", "1"], input=events + samples,
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out)
    assert r["sandbox_page_faults_us_per_job"] == {
        "copy-on-write": 500.0, "file": 250.0, "new memory": 250.0,
    }
    assert r["zygote_us_per_job"] == {"unshare": 500.0, "user space": 250.0}
