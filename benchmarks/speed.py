"""Benchmark (not a test): how fast memspec starts and estimates.

Prints: the cold CLI time of `memspec estimate` on a built-in experiment (median of 5 fresh
processes), the import time of the estimating path, and in-process estimates per second
with the formula library already loaded (the speed `fit` and `sweep` see), and a
32-point sweep.

    python benchmarks/speed.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENT = "specs/experiments/llava-1.5-7b-finetune.yaml"


def cold_cli(runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "compiler.cli", "estimate", EXPERIMENT], cwd=ROOT, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def import_time(runs: int = 5) -> float:
    code = "import time; t = time.perf_counter(); import compiler.api, compiler.pipeline.render, compiler.cli; print(time.perf_counter() - t)"
    out = [float(subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True).stdout) for _ in range(runs)]
    return statistics.median(out)


def in_process(seconds: float = 3.0) -> tuple[float, float]:
    sys.path.insert(0, str(ROOT))
    from compiler.api import library, load_inputs, run

    library()  # formulas loaded once, as a long-lived caller would
    spec, setup = load_inputs(ROOT / EXPERIMENT)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        run(spec, setup)
        n += 1
    per_second = n / (time.perf_counter() - start)
    start = time.perf_counter()
    load_inputs(ROOT / EXPERIMENT)
    load_ms = (time.perf_counter() - start) * 1000
    return per_second, load_ms


def fit_time() -> list[tuple[int, float, int]]:
    """Seconds for `fit` on LLaVA-1.5-7B finetune, 8 x H100-80GB, ZeRO-2 and ZeRO-3."""
    from compiler.api import library, load_inputs
    from compiler.commands.fit import fit
    from compiler.pipeline.resolve import gpu_catalog

    library()
    gpu = gpu_catalog()[0]["h100-80gb"]
    out = []
    for zero in (2, 3):
        spec, setup = load_inputs(ROOT / EXPERIMENT, {"dp": 8, "zero": zero})
        start = time.perf_counter()
        f = fit(spec, setup, gpu, 0.05)
        n = f.micro_batch.evaluations + f.seq_len.evaluations + f.dp.evaluations
        out.append((zero, time.perf_counter() - start, n))
    return out


def sweep_time() -> tuple[int, float]:
    """(points, seconds) of a sweep on LLaVA-1.5-7B finetune: micro-batch 1,2,4,8 x
    seq 1024..8192 doubling x ZeRO 2,3 on 8 x H100-80GB, the spec and formulas loaded once."""
    from compiler.api import library, load_sources
    from compiler.commands.sweep import sweep

    library()
    start = time.perf_counter()
    spec, doc = load_sources(ROOT / EXPERIMENT)
    s = sweep(spec, doc, {"dp": 8, "gpu": "h100-80gb"}, {"micro_batch": [1, 2, 4, 8], "seq_len": [1024, 2048, 4096, 8192], "zero": [2, 3]})
    return len(s.rows), time.perf_counter() - start


def main() -> None:
    print(f"cold CLI 'memspec estimate {EXPERIMENT}': {cold_cli() * 1000:.0f} ms (median of 5 processes)")
    print(f"import of the estimating path: {import_time() * 1000:.0f} ms (median of 5)")
    per_second, load_ms = in_process()
    print(f"in-process estimates (library loaded, inputs resolved): {per_second:.1f} per second ({1000 / per_second:.1f} ms each)")
    print(f"loading + validating the experiment and its spec: {load_ms:.1f} ms")
    for zero, seconds, n in fit_time():
        print(f"fit (micro-batch, sequence, dp) on 8 x h100-80gb, ZeRO-{zero}: {seconds * 1000:.0f} ms ({n} estimates)")
    points, seconds = sweep_time()
    print(f"sweep of {points} points (micro-batch x seq x ZeRO) on 8 x h100-80gb: {seconds * 1000:.0f} ms ({seconds * 1000 / points:.1f} ms a point)")


if __name__ == "__main__":
    main()
