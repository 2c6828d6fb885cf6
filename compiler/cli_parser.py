"""The `memspec` command line's grammar: every verb's flags (argparse), and `overrides`, the
training-setup flags of a parsed command line as experiment overrides.

Contract: `parser(argv)` is the parser of every verb (`measure`'s own flags only when `argv`
names it); the knobs come from `compiler/knobs.py` and each verb's examples from
`cli_help.py`. `overrides(args)` turns the parsed knobs into the experiment keys
`resolve.resolve_setup` takes, the counts checked against the experiment schema's bounds
(a `UsageError` otherwise). `compiler.cli` runs the verbs.
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from .cli_help import (
    CHECK_EXAMPLES,
    DIFF_EXAMPLES,
    ESTIMATE_EXAMPLES,
    FILE_FROM_SCRIPT,
    FIT_EXAMPLES,
    IMPORT_EXAMPLES,
    LIST_EXAMPLES,
    MAIN_EXAMPLES,
    REPORT_EXAMPLES,
    SWEEP_EXAMPLES,
    TABLE_EXAMPLES,
    VALIDATE_EXAMPLES,
)
from .errors import Diagnostic, UsageError
from .knobs import KNOBS
from .memory.optimizers import HF_OPTIM, TYPES

# `memspec estimate --fail-if-oom` when the job would not fit; distinct from the error codes
# 1 (input), 2 (usage) and 3 (bug) so that a scheduler can tell "too big" from "broken".
EXIT_DOES_NOT_FIT = 4


def _knobs(p: argparse.ArgumentParser, skip: frozenset[str] = frozenset()) -> None:
    """The training-setup flags (compiler/knobs.py); `skip` leaves out those a verb takes
    differently (sweep)."""
    g = p.add_argument_group("training setup (override the experiment file)")
    for knob in KNOBS:
        if knob.flag not in skip:
            knob.add_to(g)
    r = p.add_argument_group("read what you already have")
    r.add_argument(
        "--deepspeed",
        metavar="JSON",
        help='a DeepSpeed config: ZeRO stage, buckets, overlap_comm, bf16/fp16, micro-batch ("auto" as HF Trainer fills it), offload_optimizer to cpu under ZeRO-1/2, offload_optimizer and offload_param to cpu or nvme under ZeRO-3',
    )
    r.add_argument(
        "--accelerate-config",
        metavar="YAML",
        dest="accelerate_config",
        help="an accelerate config (accelerate config / launch --config_file): distributed_type FSDP/DEEPSPEED/MULTI_GPU/NO, num_processes, mixed_precision, fsdp_config, deepspeed_config",
    )
    r.add_argument("--from-command", metavar="SCRIPT", help="a launch script (deepspeed/torchrun/accelerate/python): its training flags and DeepSpeed config")


def _sweep_knobs(p: argparse.ArgumentParser) -> frozenset[str]:
    """The swept knobs' flags, each taking a value list; returns the flags it added."""
    from .commands.sweep import KNOBS

    g = p.add_argument_group("swept knobs (value lists; each overrides the experiment file)")
    added: set[str] = set()
    for k in KNOBS:
        names = [k.flag, "--lora-r"] if k.name == "lora_rank" else [k.flag]
        g.add_argument(*names, dest="sweep_" + k.name, metavar="LIST", help=f"e.g. {k.example}")
        added.update(names)
    return frozenset(added)


def _count_bounds() -> dict[str, tuple[int, int | None]]:
    """The experiment schema's bounds of the counts a flag sets (--micro-batch, --dp, ...)."""
    from .pipeline.validate import load_schema

    props = load_schema("experiment")["properties"]
    found = {k: props[k] for k in ("micro_batch", "seq_len", "target_len", "images_per_sample", "videos_per_sample", "video_frames")}
    found.update({k: props["parallel"]["properties"][k] for k in ("dp", "tp", "pp")})
    return {k: (v["minimum"], v.get("maximum")) for k, v in found.items()}


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for knob in KNOBS:
        if knob.key is not None and getattr(args, knob.attribute, None) is not None:
            out[knob.key] = getattr(args, knob.attribute)
    for key, (low, high) in _count_bounds().items():
        if key in out and not low <= out[key] <= (high if high is not None else out[key]):
            bounds = f">= {low}" if high is None else f"between {low} and {high:,}"
            raise UsageError(Diagnostic("E204", "", 0, 0, "--" + key.replace("_", "-"), f"must be {bounds}, got {out[key]:,}"))
    if getattr(args, "transformers_version", None) is not None:
        out["versions"] = {"transformers": args.transformers_version}
    lora = {
        k: getattr(args, "lora_" + a, None)
        for k, a in (
            ("r", "r"),
            ("alpha", "alpha"),
            ("dropout", "dropout"),
            ("target_modules", "targets"),
            ("use_dora", "dora"),
            ("modules_to_save", "save"),
            ("bias", "bias"),
        )
    }
    if any(v is not None for v in lora.values()):
        targets = lora["target_modules"]
        if targets is not None and targets == ["all-linear"]:
            lora["target_modules"] = "all-linear"
        out["lora"] = {k: v for k, v in lora.items() if v is not None}
    if getattr(args, "fsdp", False) or getattr(args, "fsdp_reshard", None) or getattr(args, "fsdp_reduce", None):
        block: dict[str, Any] = {}
        if args.fsdp_reshard:
            block["reshard_after_forward"] = args.fsdp_reshard == "true"
        if args.fsdp_reduce:
            block["reduce_dtype"] = args.fsdp_reduce
        out["fsdp"] = block
    if getattr(args, "quantization", None) is not None:
        out["quantization"] = {
            "bits": args.quantization,
            **({"quant_type": args.quant_type} if args.quant_type else {}),
            **({"double_quant": True} if args.double_quant else {}),
        }
    if args.optimizer or args.optimizer_impl or args.momentum is not None or getattr(args, "weight_decay", None) is not None:
        name = args.optimizer or "adamw"
        opt = dict(HF_OPTIM[name]) if name in HF_OPTIM and name not in TYPES else {"type": name}
        if args.optimizer_impl:
            opt["impl"] = args.optimizer_impl
        if args.momentum is not None:
            opt["momentum"] = args.momentum
        if getattr(args, "weight_decay", None) is not None:
            opt["weight_decay"] = args.weight_decay
        out["optimizer"] = opt
    if getattr(args, "param_groups", None):
        out["param_groups"] = args.param_groups  # NB: resolve sets it in whichever optimizer block applies
    return out


class _Parser(argparse.ArgumentParser):
    """argparse with a short error: the reason and where the options are, not the verb's whole
    usage (some 30 lines that buried the one that matters). Subcommands inherit the class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\nsee '{self.prog} --help' for the options and examples\n")


def _setup_verbs(sub) -> None:
    """The verbs that take a training setup: estimate, table, report, import, fit, sweep."""
    _one_estimate_verbs(sub)
    _import_fit_sweep_verbs(sub)


def _one_estimate_verbs(sub) -> None:
    """estimate, table, report: one estimate, printed, tabled or drawn."""
    e = sub.add_parser("estimate", help="peak memory of one training step", epilog=ESTIMATE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument(
        "file", nargs="?", help="an experiment (specs/experiments/*.yaml), a model spec, or a hub id / model folder to import first; " + FILE_FROM_SCRIPT
    )
    _knobs(e)
    e.add_argument("--revision", metavar="REV", help="branch, tag or commit of a hub id")
    e.add_argument(
        "--fail-if-oom",
        action="store_true",
        dest="fail_if_oom",
        help=f"exit {EXIT_DOES_NOT_FIT} when the estimate does not fit the GPU (--gpu, with the margin); the estimate is printed as usual",
    )
    e.add_argument("--format", choices=["text", "json"], default="text")

    t = sub.add_parser("table", help="the layer table: factors per layer", epilog=TABLE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("file", nargs="?", help="an experiment, a model spec, or a hub id / model folder; " + FILE_FROM_SCRIPT)
    _knobs(t)
    t.add_argument("--revision", metavar="REV", help="branch, tag or commit of a hub id")
    t.add_argument("--format", choices=["text", "tsv", "json"], default="text")

    h = sub.add_parser(
        "report",
        help="the estimate as one self-contained HTML page (charts, layer table, assumptions)",
        epilog=REPORT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    h.add_argument("file", nargs="?", help="an experiment, a model spec, or a hub id / model folder to import first; " + FILE_FROM_SCRIPT)
    _knobs(h)
    h.add_argument("--revision", metavar="REV", help="branch, tag or commit of a hub id")
    h.add_argument("-o", "--output", required=True, metavar="FILE", help="write the page here ('-' for stdout)")
    h.add_argument("--force", action="store_true", help="replace an existing output file")
    h.add_argument(
        "--format",
        choices=["text", "json"],
        default="text",
        help="what to print once the page is written: a line, or the estimate as JSON (as memspec estimate --format json) with the page's path and size",
    )


def _import_fit_sweep_verbs(sub) -> None:
    """import (a spec from a checkpoint), fit (the setups that fit a GPU), sweep (a grid of setups)."""
    i = sub.add_parser(
        "import",
        help="write a model spec from a Hugging Face checkpoint (hub id or local folder)",
        epilog=IMPORT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    i.add_argument("source", help="a hub repo id (owner/name) or a folder with config.json and *.safetensors")
    i.add_argument("-o", "--output", metavar="FILE", help="write the spec here (default: print it)")
    i.add_argument("--force", action="store_true", help="overwrite an existing output file")
    i.add_argument("--revision", metavar="REV", help="branch, tag or commit of a hub id (default: main)")
    i.add_argument("--model", metavar="NAME", help="the spec's model name (default: the repo or folder name)")
    i.add_argument("--format", choices=["yaml", "json"], default="yaml")

    f = sub.add_parser(
        "fit",
        help="the largest micro-batch and sequence, the smallest dp that fit a GPU",
        epilog=FIT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    f.add_argument("file", nargs="?", help="an experiment, a model spec, a model folder or a hub id; " + FILE_FROM_SCRIPT)
    _knobs(f)
    f.add_argument("--format", choices=["text", "json"], default="text")

    w = sub.add_parser(
        "sweep",
        help="one estimate per point of a grid of knob values (table, CSV, JSON, SVG chart)",
        epilog=SWEEP_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w.add_argument("file", nargs="?", help="an experiment, a model spec, a model folder or a hub id; " + FILE_FROM_SCRIPT)
    _knobs(w, skip=_sweep_knobs(w))
    w.add_argument("--revision", metavar="REV", help="branch, tag or commit of a hub id")
    w.add_argument("--format", choices=["text", "csv", "json"], help="default: from the -o file's extension, else text")
    w.add_argument("-o", "--output", metavar="FILE", help="write the rows here instead of stdout")
    w.add_argument("--svg", metavar="FILE", help="also write a line chart of the device figure against a swept knob")
    w.add_argument("--force", action="store_true", help="replace existing output files (-o, --svg)")
    w.add_argument("--x", metavar="KNOB", help="the chart's x axis, e.g. seq-len (default: the first knob, in the order listed below, with two or more values)")
    w.add_argument("--quiet", action="store_true", help="no progress bar")


def parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser. With `argv`, `measure`'s own flags are added only when
    `argv` names it: the measuring side's imports stay out of every other command's start."""
    p = _Parser(
        prog="memspec",
        description="Predict the peak GPU memory of a training step from declarative specs.",
        epilog=MAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="command")

    _setup_verbs(sub)

    d = sub.add_parser(
        "diff",
        help="what a change to formulas, specs or the compiler does to every checked-in case",
        epilog=DIFF_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("--base", metavar="REV", help="the revision to compare with (default: the merge-base of HEAD and main, else origin/main, else HEAD)")
    d.add_argument("--format", choices=["text", "markdown", "json"], default="text")

    ls = sub.add_parser(
        "list",
        help="the model specs and experiments memspec ships, by the short names every command takes",
        epilog=LIST_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ls.add_argument("filter", nargs="?", help="only entries whose name, model, modules or summary contain this text")
    ls.add_argument("--format", choices=["text", "json"], default="text")

    c = sub.add_parser(
        "check",
        help="validate specs, experiments and formulas; all errors at once",
        epilog=CHECK_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("paths", nargs="+", help="files or folders")
    c.add_argument("--format", choices=["text", "json"], default="text")

    measure_cli = None
    if argv is None or "measure" in argv:
        try:
            from .measure import cli as measure_cli
        except ImportError:  # NB: the measuring side is optional; its absence is reported at run time
            pass
    if measure_cli is not None:
        m = sub.add_parser(
            "measure",
            help="measure a training step (needs the [measure] extra)",
            epilog=measure_cli.EXAMPLES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        measure_cli.add_arguments(m)
    else:
        m = sub.add_parser("measure", help="measure a training step (needs the [measure] extra)")
        m.add_argument("rest", nargs=argparse.REMAINDER)

    v = sub.add_parser("validate", help="estimates against measured records", epilog=VALIDATE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("paths", nargs="+", help="measured record files or folders (tests/measured/)")
    v.add_argument("--max-mape", type=float, metavar="PCT", help="exit 1 when the allocated MAPE exceeds PCT")
    v.add_argument("--max-worst", type=float, metavar="PCT", help="exit 1 when any record's |error| exceeds PCT")
    v.add_argument("--max-under", type=int, metavar="N", help="exit 1 when more than N estimates are below their measurement")
    v.add_argument("--format", choices=["text", "json"], default="text")
    v.add_argument(
        "--history",
        metavar="FILE",
        help="the allocator history of the one record's step (memspec measure --memory-history: with --device cuda "
        "the GPU's, traced the allocator model's): also list the segments only it or only the estimate opened",
    )
    v.add_argument("--min-mib", dest="min_mib", type=float, default=64.0, metavar="MIB", help="with --history: segments of MIB or more (64)")
    return p
