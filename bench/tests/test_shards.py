"""bench/shards.py: the busiest shard sets a partitioned queue's Redis ceiling, and the section
compares every partition count with one partition."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import shards  # noqa: E402


def reading(partitions, rnd, per_shard, lost=0, ports=None):
    shard_list = [{"port": 7000 + i, "cpu_us_per_job": v} for i, v in enumerate(per_shard)]
    busiest = max(per_shard)
    return {"partitions": partitions, "round": rnd, "jobs": 100, "completed": 100, "lost": lost,
            "duplicated": 0, "jobs_per_s": 300.0, "shards": shard_list,
            "partition_ports": ports or [7000 + i for i in range(partitions)],
            "total_cpu_us_per_job": sum(per_shard), "busiest_cpu_us_per_job": busiest}


def test_the_busiest_shard_sets_the_ceiling():
    runs = [reading(1, 0, [300, 2, 1]), reading(3, 0, [110, 100, 90]),
            reading(1, 1, [200, 1, 1]), reading(3, 1, [100, 95, 105]),
            reading(1, 2, [250, 0, 0], lost=1), reading(3, 2, [120, 80, 100])]
    one, three = shards.medians(runs)
    assert (one["partitions"], three["partitions"]) == (1, 3)
    assert one["busiest_cpu_us_per_job"] == 250
    assert three["busiest_cpu_us_per_job"] == 110
    assert one["ceiling_jobs_per_s"] == 1e6 / 250
    assert three["ceiling_jobs_per_s"] == 1e6 / 110
    assert one["lost"] == 1, "a lost job in any round shows in the medians"
    assert three["distinct_primaries"] == 3


def test_the_section_compares_with_one_partition():
    runs = [reading(1, 0, [300, 0, 0]), reading(3, 0, [100, 100, 100])]
    meta = {"date": "2026-12-02", "machine": "a 2-core VM", "redis": "Redis 7.0.15",
            "build": "release build", "primaries": 3, "jobs": 100, "workers": 1, "slots": 2, "rounds": 1}
    s = shards.section(meta, shards.medians(runs))
    rows = s["tables"][0]["rows"]
    assert rows[0][5] == "3,333 (1.00×)"
    assert rows[1][5] == "10,000 (3.00×)"
    assert rows[1][3] == "100 / 100 / 100"
    assert rows[1][7] == "0 / 0"
