"""A plain `oxrl doctor`'s wall time: a benchmark, never a test.

Runs the console script beside this Python (the table, as a user runs it) several times in a row and prints each
run's wall seconds with the 1-minute load average before it, then the median. Other work on the machine slows the
doctor (its probes start processes that need the cores), so compare runs made at a low load.

    python benchmarks/doctor.py [--runs 3] [--out FILE.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the runs here as JSON")
    args = parser.parse_args()
    oxrl = Path(sys.executable).with_name("oxrl")
    runs = []
    for _ in range(args.runs):
        load = os.getloadavg()[0]
        start = time.perf_counter()
        subprocess.run([str(oxrl), "doctor"], stdout=subprocess.DEVNULL, check=False)
        runs.append({"seconds": round(time.perf_counter() - start, 2), "load_before": round(load, 2)})
        print(json.dumps(runs[-1]), flush=True)
    result = {"cores": os.cpu_count(), "median_s": statistics.median(r["seconds"] for r in runs), "runs": runs}
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
