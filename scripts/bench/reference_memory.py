"""Memory of the plain-Python reference analysis of one run (what a Spark task of `rmq-analyze ROOT`
holds for a small run): the peak resident memory of a fresh process analysing synthetic runs of several
sizes, per event and per byte of event files, against the same process after its imports. JSON on stdout.

    python scripts/bench/reference_memory.py                       # 30 k, 100 k and 300 k events
    python scripts/bench/reference_memory.py --events 50000 --events 500000
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, resource, sys, time
from rmqlab.pipeline.discover import RunDir, discover
from rmqlab.pipeline.small_runs import analyse_run, run_bytes
run_dir = sys.argv[1]
run = RunDir("run", run_dir, discover(run_dir), {})
before = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.monotonic()
summary, _data = analyse_run(run, plots=True)
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({
    "events": summary["run"]["events"], "bytes": run_bytes(run),
    "baseline_rss_kib": before.ru_maxrss, "peak_rss_kib": after.ru_maxrss,
    "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
    "wall_s": time.monotonic() - t0,
}))
"""


def measure(run_dir: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(run_dir)], capture_output=True, text=True, check=True
    )
    r = json.loads(done.stdout)
    grown = (r["peak_rss_kib"] - r["baseline_rss_kib"]) * 1024
    return {
        "events": r["events"],
        "bytes": r["bytes"],
        "peak_rss_mib": round(r["peak_rss_kib"] / 1024, 1),
        "grown_mib": round(grown / 2**20, 1),
        "bytes_per_event": round(grown / r["events"]),
        "memory_per_file_byte": round(grown / r["bytes"], 2),
        "cpu_s": round(r["cpu_s"], 2),
        "events_per_cpu_s": round(r["events"] / r["cpu_s"]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--events", type=int, action="append", help="synthetic run size (repeatable)")
    args = p.parse_args(argv)
    sizes = args.events or [30_000, 100_000, 300_000]
    if any(n <= 0 for n in sizes):
        p.error("--events must be > 0")
    from rmqlab.pipeline.synth import realistic_run

    results = []
    with tempfile.TemporaryDirectory(prefix="rmq-bench-refmem-") as tmp:
        for n in sizes:
            run_dir = Path(tmp) / f"run-{n}"
            realistic_run(run_dir, events=n)
            results.append(measure(run_dir))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    load = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        json.dumps({"results": results, "children_cpu_s": round(load.ru_utime + load.ru_stime, 1)}, indent=2)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
