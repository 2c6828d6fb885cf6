"""`memspec measure`: measure one experiment, or every entry of a matrix, into records.

Contract: `add_arguments(parser)` adds the subcommand's arguments (imports nothing heavy);
`main(args)` runs it and returns the exit code: 0 ok, 1 the input cannot be measured (or
torch/transformers are missing), 2 usage, 3 a bug (the only case that prints a traceback).
Progress goes to stderr, one line per record; a record JSON goes to `-o` (or stdout).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from .experiment import (
    ATTENTIONS,
    PRECISION_MODES,
    PRECISIONS,
    ExperimentError,
    changed_keys,
    expand_matrix,
    label,
    load_experiment,
    to_record,
    with_overrides,
)

DESCRIPTION = (
    "Measure the peak GPU memory of training steps by tracing them on fake tensors, or by running "
    "them on a CUDA device with --device cuda (needs torch and transformers)."
)
EXAMPLES = """examples:
  memspec measure tests/measured/tiny/tiny-finetune.yaml --steps 2                    # the record on stdout
  memspec measure tests/measured/tiny/tiny-pretrain.yaml --micro-batch 1 --seq-len 32 --format text
  memspec measure specs/experiments/llava-1.5-7b-finetune.yaml --no-parallel -o out.json --timeline out.jsonl
  memspec measure --matrix specs/matrices/llava-1.5.yaml -o tests/measured/cpu-trace --only 7b_proj
  memspec measure --matrix specs/matrices/gpu-h100.yaml -o tests/measured/gpu --device cuda   # on a GPU machine

Traces the step on fake tensors (real sizes, no GPU, no weights) with CUDA's allocation
behaviour emulated; `memspec validate` compares the records with the estimates. Needs the
[measure] extra (torch, transformers, peft). --format text prints the one-line summary on
stdout instead of the record (which still goes to -o when given).

--device cuda (or cuda:N) runs the same steps on that GPU with random weights and writes
source "gpu" records: torch.cuda's max_memory_allocated and max_memory_reserved per phase,
and NVML's used bytes less the idle baseline (`device`, what nvidia-smi shows). A step
that runs out of memory is recorded with where it failed (`out_of_memory`), which is how
fit's answers are checked at their boundary. Run one measurement per process on an
otherwise idle GPU: the baseline is read before the process touches the device.
"""
EXIT_OK, EXIT_INPUT, EXIT_USAGE, EXIT_BUG = 0, 1, 2, 3
GIB = 2**30


def _modules(text: str) -> list[str]:
    return [] if text in ("", "none") else [m.strip() for m in text.split(",")]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", nargs="?", help="experiment YAML (specs/experiments/*.yaml)")
    parser.add_argument("--matrix", metavar="FILE", help="measure every entry of a matrix YAML into -o DIR")
    parser.add_argument("-o", "--output", metavar="PATH", help="record file (single experiment; default stdout) or folder (--matrix)")
    parser.add_argument("--steps", type=int, default=3, help="training steps to run (>= 2; default 3)")
    parser.add_argument("--name", help="record name (default: the experiment name plus overrides)")
    parser.add_argument("--micro-batch", type=int, dest="micro_batch")
    parser.add_argument("--seq-len", type=int, dest="seq_len")
    parser.add_argument("--target-len", type=int, dest="target_len", help="an encoder-decoder model's target positions (T5)")
    parser.add_argument("--attention", choices=ATTENTIONS)
    parser.add_argument("--precision", choices=PRECISIONS)
    parser.add_argument(
        "--precision-mode",
        choices=PRECISION_MODES,
        dest="precision_mode",
        help="how bf16-mixed runs: autocast (fp32 weights, torch.autocast as accelerate wraps the forward) "
        "or master-weights (16-bit weights, fp32 masters: DeepSpeed)",
    )
    parser.add_argument("--trainable", type=_modules, metavar="M[,M]", help="e.g. projector,language")
    parser.add_argument("--gradient-checkpointing", type=_modules, dest="gradient_checkpointing", metavar="M[,M]", help="e.g. language,vision; 'none' for off")
    parser.add_argument(
        "--alloc-conf",
        dest="alloc_conf",
        metavar="CONF",
        help="PYTORCH_CUDA_ALLOC_CONF to run (--device) or replay the step under, e.g. expandable_segments:True; "
        "with --matrix it applies to every entry, and the records' names end in it (_expandable_segments-True)",
    )
    parser.add_argument("--no-parallel", action="store_true", dest="no_parallel", help="measure as one GPU without sharding (parallel: {dp: 1, zero: 0})")
    parser.add_argument("--timeline", metavar="FILE", help="write the live-bytes timeline (JSON lines)")
    parser.add_argument("--inventory", metavar="FILE", help="write the live activations at the end of the last forward")
    parser.add_argument("--only", metavar="TEXT", help="with --matrix: entries whose name contains TEXT")
    parser.add_argument("--device", type=_cuda_device, metavar="cuda[:N]", help="run the steps on this CUDA device instead of tracing them on fake tensors")
    parser.add_argument(
        "--memory-history",
        metavar="PATH",
        dest="memory_history",
        help="keep the caching allocator's trace of every allocation and free (with --device the "
        "GPU's own; traced, the allocator model's, in the same actions) as gzip JSON lines; with "
        "--matrix PATH is a folder, one NAME.history.jsonl.gz each; memspec validate RECORD "
        "--history PATH lines the record's estimate up with it",
    )
    parser.add_argument(
        "--memory-history-frames",
        action="store_true",
        dest="memory_history_frames",
        help="with --device and --memory-history: each allocation's entry says where it was made (the autograd "
        "node of a backward's, else the innermost Python frame outside torch), which memspec validate --history "
        "prints beside the segments only the GPU opened; torch keeps every entry's stack, so the run is slower",
    )
    parser.add_argument(
        "--shared-device",
        action="store_true",
        dest="shared_device",
        help="with --device: other processes use the GPU at the same time; records carry allocated and reserved "
        "(this process's own) and no device figure (NVML's used bytes would count the others)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="with --matrix and --device: measure N entries at a time, each in its own process on the one GPU "
        "(as --shared-device: no device figure); their peaks together must fit the card",
    )
    parser.add_argument("--format", choices=["json", "text"], default="json", help="json: the record (default); text: a one-line summary per record")


def _cuda_device(text: str) -> str:
    index = text[len("cuda:") :] if text.startswith("cuda:") else None
    if text != "cuda" and not (index and index.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a CUDA device: give cuda or cuda:N (N a device index)")
    return text


OVERRIDES = ("micro_batch", "seq_len", "target_len", "attention", "precision", "precision_mode", "trainable", "gradient_checkpointing", "alloc_conf")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _summary(record: dict) -> str:
    if record["source"] == "gpu":
        return _gpu_summary(record)
    peak = max(record["steps"][1:], key=lambda s: s["allocated"])
    return (
        f"{record['allocated'] / GIB:8.2f} GiB steady, {record['allocated_first_step'] / GIB:8.2f} GiB step 1; "
        f"peak in {peak['phase']} at {peak['op']} ({peak['module'] or '<root>'})"
    )


def _gpu_summary(record: dict) -> str:
    device = "-" if record["device"] is None else f"{record['device'] / GIB:.2f}"
    figures = f"allocated {record['allocated'] / GIB:.2f} GiB, reserved {(record['reserved'] or 0) / GIB:.2f} GiB, device {device} GiB"
    oom = record.get("out_of_memory")
    if oom is None:
        return figures + f" (steady); {record['machine']['accelerator']}"
    return f"OUT OF MEMORY at step {oom['step']} {oom['phase']}; before it {figures}"


def _measure_one(name: str, exp: dict, args, history_path: Path | None = None) -> dict:
    """`history_path`: where the allocator's trace goes (args.memory_history for one experiment)."""
    from . import harness, history, record

    if getattr(args, "device", None):
        from . import cuda

        measurement = cuda.measure(
            exp, steps=args.steps, device=args.device, history=history_path is not None, shared=args.shared_device, frames=args.memory_history_frames
        )
        if history_path is not None:
            history.write(history_path, measurement.history or ())
        return record.build_gpu_record(name, exp, measurement, harness.config_sha256(exp["config"]))
    measurement = harness.measure(exp, steps=args.steps, timeline=bool(args.timeline), history=history_path is not None)
    if history_path is not None:
        history.write(history_path, measurement.history or ())
    if args.timeline:
        with open(args.timeline, "w", encoding="utf-8") as handle:
            for row in measurement.timeline:
                handle.write(json.dumps(row) + "\n")
    if args.inventory:
        Path(args.inventory).write_text(measurement.inventory, encoding="utf-8")
    return record.build_record(name, exp, measurement, harness.config_sha256(exp["config"]))


def _run_single(args) -> int:
    from . import record

    exp = load_experiment(args.experiment)
    overrides = {k: getattr(args, k) for k in OVERRIDES if getattr(args, k) is not None}
    if args.no_parallel:
        overrides["parallel"] = {"dp": 1, "zero": 0}
    exp = with_overrides(exp, **overrides)
    name = args.name or "_".join([exp["experiment"]] + [label(k, v) for k, v in overrides.items()])
    started = time.perf_counter()
    rec = _measure_one(name, exp, args, Path(args.memory_history) if args.memory_history else None)
    if args.output:
        record.write_record(rec, args.output)
    elif getattr(args, "format", "json") == "json":
        print(json.dumps(rec, indent=2))
    if getattr(args, "format", "json") == "text":
        print(f"{name}: {_summary(rec)}")
    _say(f"{name}: {_summary(rec)} [{time.perf_counter() - started:.1f} s]")
    return EXIT_OK


def _cost(exp: dict) -> tuple:
    """Smaller first: tokens per step, then the language model's size, eager last."""
    config = json.loads(Path(exp["config"]).read_text())
    text = config.get("text_config", config)  # a text-only model's sizes are at the top level
    return (exp["micro_batch"] * exp["seq_len"], text.get("hidden_size", 0) * text.get("num_hidden_layers", 0), exp["attention"] == "eager")


def _run_matrix(args) -> int:
    from . import record

    if not args.output:
        _say("memspec measure --matrix needs -o DIR")
        return EXIT_USAGE
    out_dir = Path(args.output)
    entries = [(n, e) for n, e in expand_matrix(args.matrix) if not args.only or args.only in n]
    if args.alloc_conf is not None:
        entries = [(f"{n}_{label('alloc_conf', args.alloc_conf)}", with_overrides(e, alloc_conf=args.alloc_conf)) for n, e in entries]
    entries.sort(key=lambda item: _cost(item[1]))
    started = time.perf_counter()
    done = skipped = 0
    failed: list[tuple[int, str]] = []  # (the entry's place, its name)
    stale: list[str] = []  # present records of another experiment than their entry's
    pending = []
    for i, (name, exp) in enumerate(entries, 1):
        path = out_dir / f"{name}.json"
        if path.exists():
            changed = _changed(path, exp)
            if changed:
                stale.append(name)
                _say(f"[{i}/{len(entries)}] {name}: present, but not this entry's experiment ({changed}); remove {path} to measure it again")
                continue
            skipped += 1
            _say(f"[{i}/{len(entries)}] {name}: present, skipped")
        elif args.device:
            pending.append((i, name, exp, path))
        else:
            t0 = time.perf_counter()
            rec = _measure_one(name, exp, args, _history_path(args, name))
            record.write_record(rec, path)
            done += 1
            _say(f"[{i}/{len(entries)}] {name}: {_summary(rec)} [{time.perf_counter() - t0:.1f} s, {time.perf_counter() - started:.0f} s total]")
    for i, name, rec, seconds in _in_fresh_processes(pending, args):
        if rec is None:
            failed.append((i, name))
            continue
        done += 1
        _say(f"[{i}/{len(entries)}] {name}: {_summary(rec)} [{seconds:.1f} s, {time.perf_counter() - started:.0f} s total]")
    _say(
        f"{done} measured, {skipped} already present, {len(entries)} in the matrix"
        + (f"; {len(stale)} present of another experiment: {', '.join(stale)}" if stale else "")
        + (f"; {len(failed)} failed: {', '.join(name for _, name in sorted(failed))}" if failed else "")
    )
    return EXIT_INPUT if failed or stale else EXIT_OK


def _changed(path: Path, exp: dict) -> str:
    """How the record at `path` differs from the entry `exp` it is named for ("" where it is
    that entry's): a record kept from before the matrix or expand_matrix changed measures
    something else under the entry's name. A record that cannot be read is not compared (the
    gate and `memspec validate` say what is wrong with it)."""
    from . import record

    try:
        stored = record.read_record(path)["experiment"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    changed = changed_keys(stored, to_record(exp))
    return "; ".join(f"{key} {json.dumps(old)} in the record, {json.dumps(new)} in the matrix" for key, old, new in changed)


def _in_fresh_processes(pending: list, args):
    """Each GPU measurement in a process of its own (spawned, so this one never touches the
    device): each starts from an empty caching allocator and reads the idle baseline before
    its CUDA context exists. With `--jobs N`, N run at once, sharing the device (no NVML
    figure). Yields (index, name, record or None when the child failed, seconds) as each ends;
    a child that failed has said why on stderr."""
    from multiprocessing.connection import wait

    queue, running = list(pending), {}
    while queue or running:
        while queue and len(running) < args.jobs:
            i, name, exp, path = queue.pop(0)
            child = _spawn(name, exp, args, path, shared=args.shared_device or args.jobs > 1)
            running[child.sentinel] = (child, i, name, path, time.perf_counter())
        for sentinel in wait(list(running)):
            child, i, name, path, t0 = running.pop(sentinel)
            child.join()
            yield i, name, _collected(child, name, path), time.perf_counter() - t0


def _history_path(args, name: str) -> Path | None:
    """With --matrix, where an entry's --memory-history goes: NAME.history.jsonl.gz in its folder."""
    return Path(args.memory_history) / f"{name}.history.jsonl.gz" if args.memory_history else None


def _spawn(name: str, exp: dict, args, path: Path, shared: bool):
    import multiprocessing

    child = multiprocessing.get_context("spawn").Process(
        target=_measure_child,
        args=(
            name,
            exp,
            args.steps,
            args.device,
            str(path),
            _history_path(args, name),
            shared,
            args.memory_history_frames,
        ),
    )
    child.start()
    return child


def _collected(child, name: str, path: Path) -> dict | None:
    from . import record

    if child.exitcode != 0 or not path.exists():
        _say(f"{name}: the measuring process failed (exit code {child.exitcode})")
        return None
    return record.read_record(path)


def _measure_child(
    name: str, exp: dict, steps: int, device: str, path: str, history_path: Path | None = None, shared: bool = False, frames: bool = False
) -> None:
    from . import cuda, harness, history, record

    try:
        measurement = cuda.measure(exp, steps=steps, device=device, history=history_path is not None, shared=shared, frames=frames)
    except ExperimentError as exc:
        _say(f"error: {exc}")
        raise SystemExit(EXIT_INPUT) from None
    if history_path is not None:
        history.write(history_path, measurement.history or ())
    record.write_record(record.build_gpu_record(name, exp, measurement, harness.config_sha256(exp["config"])), path)


def main(args: argparse.Namespace) -> int:
    if args.jobs < 1 or (args.jobs > 1 and not (args.matrix and getattr(args, "device", None))):
        _say("memspec measure: --jobs N (N >= 1) runs several entries of a --matrix at once on a --device cuda")
        return EXIT_USAGE
    if args.shared_device and not getattr(args, "device", None):
        _say("memspec measure: --shared-device says other processes share the GPU; it needs --device cuda")
        return EXIT_USAGE
    if args.memory_history_frames and not (getattr(args, "device", None) and args.memory_history):
        _say(
            "memspec measure: --memory-history-frames keeps where each of a GPU's allocations was made; it needs "
            "--device cuda and --memory-history PATH (a traced step's history names its allocations without it)"
        )
        return EXIT_USAGE
    if getattr(args, "device", None) and (args.timeline or args.inventory):
        _say("memspec measure: --timeline and --inventory come from the trace; they cannot be taken with --device")
        return EXIT_USAGE
    if bool(args.experiment) == bool(args.matrix):
        _say("memspec measure: give either an EXPERIMENT file or --matrix FILE")
        return EXIT_USAGE
    if args.steps < 2:
        _say("memspec measure: --steps must be at least 2 (step 1 creates the optimizer states)")
        return EXIT_USAGE
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        _say(f"memspec measure needs torch and transformers ({exc.name} is missing): pip install 'memspec[measure]'")
        return EXIT_INPUT
    try:
        return _run_matrix(args) if args.matrix else _run_single(args)
    except ExperimentError as exc:
        _say(f"error: {exc}")
        return EXIT_INPUT
    except Exception:  # noqa: BLE001 - a bug: show everything
        traceback.print_exc()
        return EXIT_BUG
