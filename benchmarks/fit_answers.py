"""Benchmark companion (not a test): every `memspec fit` answer over a matrix of experiments and
settings, as JSON lines, so that two revisions' answers can be compared. The estimate count
(`evaluations`) is left out: it is what a faster search changes; every value, device figure,
neighbour and lever must not.

    PYTHONPATH=. python benchmarks/fit_answers.py > after.jsonl
    PYTHONPATH=/path/to/base python /path/to/this/benchmarks/fit_answers.py > before.jsonl
    python benchmarks/fit_answers.py --compare before.jsonl after.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

EXPERIMENTS = sorted(str(p) for p in Path("specs/experiments").glob("*.yaml"))
SETTINGS = [
    [],
    ["--gpu", "h100-80gb", "--dp", "8", "--zero", "3"],
    ["--gpu", "a100-40gb", "--dp", "4", "--zero", "2"],
    ["--gpu", "a10g-24gb", "--dp", "2", "--zero", "1"],
    ["--gpu", "h100-80gb", "--seq-len", "1024"],
    ["--gpu", "a100-80gb", "--dp", "8", "--zero", "3", "--seq-len", "4096", "--margin", "0"],
]


def _strip(data):
    if isinstance(data, dict):
        return {k: _strip(v) for k, v in data.items() if k != "evaluations"}
    if isinstance(data, list):
        return [_strip(v) for v in data]
    return data


def answers():
    from compiler.cli import main

    for experiment in EXPERIMENTS:
        for setting in SETTINGS:
            argv = ["fit", experiment, *setting, "--format", "json"]
            out, err = io.StringIO(), io.StringIO()
            start = time.perf_counter()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv)
            seconds = time.perf_counter() - start
            answer = _strip(json.loads(out.getvalue())) if code == 0 else err.getvalue()
            evaluations = None
            if code == 0:
                data = json.loads(out.getvalue())
                searches = [data.get(k) for k in ("micro_batch", "seq_len", "dp")] + [(data.get("expandable_segments") or {}).get("micro_batch")]
                evaluations = sum(a["evaluations"] for a in searches if a)
            yield {"argv": argv[1:-2], "code": code, "answer": answer, "evaluations": evaluations, "seconds": round(seconds, 3)}


def compare(before: str, after: str) -> int:
    old = [json.loads(line) for line in Path(before).read_text().splitlines()]
    new = [json.loads(line) for line in Path(after).read_text().splitlines()]
    moved = [(a["argv"], a["answer"], b["answer"]) for a, b in zip(old, new) if (a["code"], a["answer"]) != (b["code"], b["answer"])]
    assert [a["argv"] for a in old] == [b["argv"] for b in new], "the two runs cover different matrices"
    fits = [(a, b) for a, b in zip(old, new) if a["code"] == 0]
    print(f"{len(old)} fits ({len(fits)} answered, {len(old) - len(fits)} refused): {len(moved)} moved")
    for argv, a, b in moved:
        print(" ".join(argv), "\n  before:", a, "\n  after: ", b)
    print(
        f"estimates: {sum(a['evaluations'] for a, _ in fits)} before, {sum(b['evaluations'] for _, b in fits)} after; "
        f"seconds: {sum(a['seconds'] for a in old):.1f} before, {sum(b['seconds'] for b in new):.1f} after"
    )
    return 1 if moved else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    for line in answers():
        print(json.dumps(line), flush=True)
