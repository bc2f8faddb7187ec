"""bench/gateway_cpu.py reads the figures of forkbox-loadgen's gateway table."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import gateway_cpu  # noqa: E402

# As loadgen/src/gateway.rs's `Comparison::table` prints it.
TABLE = """arm        requests     p50 ms     p99 ms       jobs/s
direct          800      8.660     29.156        193.0
gateway         800     10.135     35.764        169.2
gateway adds +1.475 ms at p50 (target: at most 1 ms: MISSED); throughput 87.6% of direct (target: within 10%: MISSED)
gateway CPU per request: 338 µs (target: at most 100 µs: MISSED)
"""


def test_the_table_figures_are_read():
    fig = gateway_cpu.parse_table(TABLE)
    assert fig["direct"] == {"p50_ms": 8.66, "p99_ms": 29.156, "jobs_s": 193.0}
    assert fig["gateway"]["p50_ms"] == 10.135
    assert fig["cpu_us"] == 338


def test_a_table_without_the_cpu_has_none():
    text = TABLE.replace("gateway CPU per request: 338 µs (target: at most 100 µs: MISSED)",
                         "gateway CPU per request: not measured (give --gateway-pid)")
    assert "cpu_us" not in gateway_cpu.parse_table(text)
