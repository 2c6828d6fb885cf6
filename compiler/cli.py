"""The `memspec` command: a thin layer over `compiler.api` and `compiler.pipeline.render`.

Exit codes: 0 ok; 1 the input is wrong (diagnostics on stderr); 2 usage; 3 a bug in memspec
(the only case that prints a traceback); 4 `estimate --fail-if-oom`: the estimate does not
fit the GPU (with the margin), a result rather than an error, for CI and schedulers.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from .cli_help import (
    CHECK_EXAMPLES, DIFF_EXAMPLES, ESTIMATE_EXAMPLES, FILE_FROM_SCRIPT, FIT_EXAMPLES, IMPORT_EXAMPLES, LIST_EXAMPLES,
    MAIN_EXAMPLES, REPORT_EXAMPLES, SWEEP_EXAMPLES, TABLE_EXAMPLES, VALIDATE_EXAMPLES,
)
from .errors import Diagnostic, MemspecError, UsageError
from .knobs import KNOBS
from .memory.optimizers import HF_OPTIM, TYPES

# `memspec estimate --fail-if-oom` when the job would not fit; distinct from the error codes
# 1 (input), 2 (usage) and 3 (bug) so that a scheduler can tell "too big" from "broken".
EXIT_DOES_NOT_FIT = 4

# The verbs whose file argument may come from a launch script's --model_name_or_path.
FILE_VERBS = ("estimate", "table", "report", "fit", "sweep")


def _knobs(p: argparse.ArgumentParser, skip: frozenset[str] = frozenset()) -> None:
    """The training-setup flags (compiler/knobs.py); `skip` leaves out those a verb takes
    differently (sweep)."""
    g = p.add_argument_group("training setup (override the experiment file)")
    for knob in KNOBS:
        if knob.flag not in skip:
            knob.add_to(g)
    r = p.add_argument_group("read what you already have")
    r.add_argument("--deepspeed", metavar="JSON", help="a DeepSpeed config: ZeRO stage, buckets, overlap_comm, bf16/fp16, micro-batch (\"auto\" as HF Trainer fills it), offload_optimizer to cpu under ZeRO-1/2, offload_optimizer and offload_param to cpu or nvme under ZeRO-3")
    r.add_argument("--accelerate-config", metavar="YAML", dest="accelerate_config", help="an accelerate config (accelerate config / launch --config_file): distributed_type FSDP/DEEPSPEED/MULTI_GPU/NO, num_processes, mixed_precision, fsdp_config, deepspeed_config")
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
    lora = {k: getattr(args, "lora_" + a, None) for k, a in (("r", "r"), ("alpha", "alpha"), ("dropout", "dropout"), ("target_modules", "targets"), ("use_dora", "dora"),
                                                         ("modules_to_save", "save"), ("bias", "bias"))}
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
        out["quantization"] = {"bits": args.quantization, **({"quant_type": args.quant_type} if args.quant_type else {}),
                               **({"double_quant": True} if args.double_quant else {})}
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
    e = sub.add_parser("estimate", help="peak memory of one training step", epilog=ESTIMATE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("file", nargs="?", help="an experiment (specs/experiments/*.yaml), a model spec, or a hub id / model folder to import first; " + FILE_FROM_SCRIPT)
    _knobs(e)
    e.add_argument("--revision", metavar="REV", help="branch, tag or commit of a hub id")
    e.add_argument("--fail-if-oom", action="store_true", dest="fail_if_oom",
                   help=f"exit {EXIT_DOES_NOT_FIT} when the estimate does not fit the GPU (--gpu, with the margin); the estimate is printed as usual")
    e.add_argument("--format", choices=["text", "json"], default="text")

    t = sub.add_parser("table", help="the layer table: factors per layer", epilog=TABLE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("file", nargs="?", help="an experiment, a model spec, or a hub id / model folder; " + FILE_FROM_SCRIPT)
    _knobs(t)
    t.add_argument("--revision", metavar="REV", help="branch, tag or commit of a hub id")
    t.add_argument("--format", choices=["text", "tsv", "json"], default="text")

    h = sub.add_parser("report", help="the estimate as one self-contained HTML page (charts, layer table, assumptions)", epilog=REPORT_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    h.add_argument("file", nargs="?", help="an experiment, a model spec, or a hub id / model folder to import first; " + FILE_FROM_SCRIPT)
    _knobs(h)
    h.add_argument("--revision", metavar="REV", help="branch, tag or commit of a hub id")
    h.add_argument("-o", "--output", required=True, metavar="FILE", help="write the page here ('-' for stdout)")
    h.add_argument("--force", action="store_true", help="replace an existing output file")
    h.add_argument("--format", choices=["text", "json"], default="text", help="what to print once the page is written: a line, or the estimate as JSON (as memspec estimate --format json) with the page's path and size")

    i = sub.add_parser("import", help="write a model spec from a Hugging Face checkpoint (hub id or local folder)", epilog=IMPORT_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    i.add_argument("source", help="a hub repo id (owner/name) or a folder with config.json and *.safetensors")
    i.add_argument("-o", "--output", metavar="FILE", help="write the spec here (default: print it)")
    i.add_argument("--force", action="store_true", help="overwrite an existing output file")
    i.add_argument("--revision", metavar="REV", help="branch, tag or commit of a hub id (default: main)")
    i.add_argument("--model", metavar="NAME", help="the spec's model name (default: the repo or folder name)")
    i.add_argument("--format", choices=["yaml", "json"], default="yaml")

    f = sub.add_parser("fit", help="the largest micro-batch and sequence, the smallest dp that fit a GPU", epilog=FIT_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("file", nargs="?", help="an experiment, a model spec, a model folder or a hub id; " + FILE_FROM_SCRIPT)
    _knobs(f)
    f.add_argument("--format", choices=["text", "json"], default="text")

    w = sub.add_parser("sweep", help="one estimate per point of a grid of knob values (table, CSV, JSON, SVG chart)", epilog=SWEEP_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p = _Parser(prog="memspec", description="Predict the peak GPU memory of a training step from declarative specs.",
                                epilog=MAIN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="command")

    _setup_verbs(sub)

    d = sub.add_parser("diff", help="what a change to formulas, specs or the compiler does to every checked-in case", epilog=DIFF_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--base", metavar="REV", help="the revision to compare with (default: the merge-base of HEAD and main, else origin/main, else HEAD)")
    d.add_argument("--format", choices=["text", "markdown", "json"], default="text")

    ls = sub.add_parser("list", help="the model specs and experiments memspec ships, by the short names every command takes",
                        epilog=LIST_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    ls.add_argument("filter", nargs="?", help="only entries whose name, model, modules or summary contain this text")
    ls.add_argument("--format", choices=["text", "json"], default="text")

    c = sub.add_parser("check", help="validate specs, experiments and formulas; all errors at once", epilog=CHECK_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("paths", nargs="+", help="files or folders")
    c.add_argument("--format", choices=["text", "json"], default="text")

    measure_cli = None
    if argv is None or "measure" in argv:
        try:
            from .measure import cli as measure_cli
        except ImportError:  # NB: the measuring side is optional; its absence is reported at run time
            pass
    if measure_cli is not None:
        m = sub.add_parser("measure", help="measure a training step (needs the [measure] extra)", epilog=measure_cli.EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
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
    return p


def is_source(arg: str) -> bool:
    """`importer.is_source` (a model folder or a hub repo id), importing the importer only
    when the argument is no file."""
    path = Path(arg)
    if path.is_dir():
        return True
    if path.exists():
        return False
    from .inputs.importer import is_source as source

    return source(arg)


def _spec(args):
    """The model spec of the file argument (for reading a launch command against it)."""
    from . import api
    from .inputs.importer import import_spec
    from .pipeline.load import load_yaml

    if is_source(args.file):
        return import_spec(args.file, getattr(args, "revision", None)).spec
    doc = load_yaml(args.file)
    if api.file_kind(doc) == "experiment" and isinstance(doc.data.get("model"), str):
        spec_path = Path(doc.file).parent / doc.data["model"]
        if spec_path.is_file():
            return api.load_spec(spec_path)
        return api.load_inputs(args.file)[0]  # NB: reports the missing spec as an estimate would
    return api.load_spec(args.file)


def _read_launch(args) -> tuple[dict[str, Any], list[str]]:
    """Overrides and notes from --from-command and --deepspeed; memspec's own flags win."""
    _model_from_script(args)
    out: dict[str, Any] = {}
    notes: list[str] = []
    ds_file = getattr(args, "deepspeed", None)
    explicit: dict[str, Any] = {}
    accelerate_file = getattr(args, "accelerate_config", None)
    if ds_file or accelerate_file or getattr(args, "from_command", None):
        from .inputs import launch  # NB: only then: its imports are a tenth of an estimate's start
    command = launch.read_command(args.from_command) if getattr(args, "from_command", None) else None
    if command is not None and command.config_file and not accelerate_file:
        accelerate_file = launch.config_path(command.config_file, command)
    if accelerate_file:
        reading = launch.read_accelerate(accelerate_file, tuple(m.name for m in _spec(args).modules))
        out.update(reading.overrides)
        notes += [f"note: accelerate config {accelerate_file}", *reading.notes]
    if command is not None:
        spec = _spec(args)
        script_model = getattr(args, "script_model", None)
        reading = launch.command_overrides(command, {m.name: {"type": m.type, "inputs": m.inputs} for m in spec.modules}, spec.model,
                                           model_from_script=script_model is not None)
        if accelerate_file and command.gpus is None:
            # NB: the config says how many processes; the command's silence is no news
            reading = launch.Reading({k: v for k, v in reading.overrides.items() if k != "dp"},
                                     tuple(n for n in reading.notes if "does not say how many GPUs" not in n))
        out.update(reading.overrides)
        notes.append(f"note: {command.file}:{command.line}: read the {command.launcher} command running {command.entry}")
        if script_model is not None:
            notes += [f"note: model from {script_model.describe()}", *script_model.notes]
        notes += reading.notes
        explicit = {k: out[k] for k in ("micro_batch", "precision") if k in out}
        if "lora" not in out:
            out["lora"] = None  # NB: the script is the whole training setup: no --lora_enable, no LoRA
        ds_file = ds_file or launch.command_deepspeed(command)
    if ds_file:
        reading = launch.read_deepspeed(ds_file, explicit)
        out.update(reading.overrides)
        notes += [f"note: DeepSpeed config {ds_file}", *reading.notes]
    flags = overrides(args)
    if isinstance(out.get("fsdp"), dict) and isinstance(flags.get("fsdp"), dict):
        flags["fsdp"] = {**out["fsdp"], **flags["fsdp"]}  # NB: --fsdp-* change single keys of the file's
    if isinstance(out.get("lora"), dict) and isinstance(flags.get("lora"), dict):
        flags["lora"] = {**out["lora"], **flags["lora"]}  # NB: --lora-* change single keys of the script's LoRA
    out.update(flags)
    return out, notes


# What a bare spec, a hub id or a model folder is estimated with when neither the command
# line nor a launch script says: the defaults of the trainers that fine-tune them.
BARE_DEFAULTS = (
    ("micro_batch", 8, "transformers' TrainingArguments default per_device_train_batch_size"),
    ("seq_len", 1024, "TRL's SFTConfig default max_length, image tokens included"),
)


def _inputs(args):
    """(spec, setup) of the file argument with the launch files and flags applied."""
    return _inputs_and_notes(args)[0]


def _inputs_and_notes(args):
    """`_inputs`, and the notes on reading the launch files and on the defaults taken (also
    printed on stderr)."""
    from .api import admitted_setup

    spec, doc, knobs, notes = _sources_and_notes(args)
    for line in notes:
        sys.stderr.write(line + "\n")
    return (spec, admitted_setup(doc, spec, knobs)), tuple(notes)


def _sources(args, searched: tuple[str, ...] = ()):
    """(spec, experiment document or None, overrides) of the file argument, loaded once for
    many setups (`api.admitted_setup(doc, spec, overrides)`); the notes go to stderr. `searched`:
    the knobs the command varies itself, which a bare spec takes no default for."""
    spec, doc, knobs, notes = _sources_and_notes(args, searched)
    for line in notes:
        sys.stderr.write(line + "\n")
    return spec, doc, knobs


def _sources_and_notes(args, searched: tuple[str, ...] = ()):
    from . import api
    knobs, notes = _read_launch(args)
    revision = getattr(args, "revision", None)
    if is_source(args.file):
        from .inputs.importer import import_spec

        spec, doc = import_spec(args.file, revision).spec, None
    else:
        if revision:
            raise UsageError(Diagnostic("E208", "", 0, 0, "--revision", "applies to a hub id, not to a spec or experiment file"))
        spec, doc = api.load_sources(args.file)
    if doc is None:
        for key, value, source in BARE_DEFAULTS:
            if key not in knobs and key not in searched:
                knobs[key] = value
                notes.append(f"note: no --{key.replace('_', '-')}: {value}, {source}")
    return _with_origin(spec, args), doc, knobs, notes


def _with_origin(spec, args):
    """The spec, saying where the launch script named it when no model file was given."""
    script_model = getattr(args, "script_model", None)
    return spec if script_model is None else replace(spec, origin=script_model.as_data())


def _report(args):
    """An estimate of a spec or experiment file, or of a hub id / model folder imported in memory."""
    from . import api

    return api.run(*_inputs(args))


def _estimate(args) -> int:
    from .pipeline import render

    report = _report(args)
    if args.fail_if_oom and report.gpu is None:
        raise UsageError(Diagnostic("E201", "", 0, 0, "--gpu", "--fail-if-oom needs a GPU to fit", "give --gpu NAME (specs/gpus.yaml) or a size such as 24GiB, or gpu: in the experiment"))
    sys.stdout.write(render.json_text(report) if args.format == "json" else render.text(report))
    return EXIT_DOES_NOT_FIT if args.fail_if_oom and not report.fits else 0


def _html_report(args) -> int:
    import json

    from . import api
    from .pipeline import render
    from .commands.html_report import html

    if args.output == "-" and args.format == "json":
        raise UsageError(Diagnostic("E902", "", 0, 0, "-o", "'-o -' writes the page to stdout, where --format json would go too",
                                    "write the page to a file (-o report.html), or leave out --format json"))
    if args.output != "-":
        _check_output("-o", args.output, "the report", "report.html", args.force)  # NB: before the estimate runs
    inputs, notes = _inputs_and_notes(args)
    report = api.run(*inputs).with_notes(notes)
    page = html(report)
    if args.output == "-":
        sys.stdout.write(page)
        return 0
    size = _write_page(args.output, page, args.force)
    if args.format == "json":
        data = {"schema": "memspec/report/v1", "output": args.output, "bytes": size, "estimate": render.as_data(report)}
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        verdict = ""
        if report.gpu is not None:
            verdict = f"; {'fits' if report.fits else 'does NOT fit'} on {report.gpu.key} (margin {report.margin.text})"
        sys.stdout.write(f"wrote {args.output} ({size:,} bytes): allocated {render.gib(report.allocated)} GiB, "
                         f"device {render.gib(report.device)} GiB per GPU{verdict}\n")
    return 0


def _write_page(output: str, page: str, force: bool) -> int:
    return _write_output("-o", output, page.encode("utf-8"), "the report", "report.html", force)


def _check_output(flag: str, output: str, what: str, example: str, force: bool) -> None:
    """A path that cannot take the output is the user's error (E901), and an existing file is
    kept unless --force (E903): both found before any work."""
    path = Path(output)
    problem = ("is a folder" if path.is_dir() else
               f"its folder '{path.parent}' does not exist" if not path.parent.is_dir() else None)
    if problem:
        raise MemspecError(Diagnostic("E901", "", 0, 0, flag, f"cannot write {what} to '{output}': {problem}",
                                      f"give a file path in an existing folder, e.g. {flag} {example}"))
    if path.exists() and not force:
        raise MemspecError(Diagnostic("E903", "", 0, 0, flag, f"'{output}' exists; {what} would replace it",
                                      "add --force to replace it, or give another path"))


def _write_output(flag: str, output: str, data: bytes, what: str, example: str, force: bool) -> int:
    """Write `data` whole or not at all: a temporary file beside the target, then a rename, so
    an interrupted run or a parallel one never leaves half a file."""
    _check_output(flag, output, what, example, force)
    path = Path(output)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise MemspecError(Diagnostic("E901", "", 0, 0, flag, f"cannot write {what} to '{output}': {exc.strerror or exc}",
                                      f"give a file path in an existing folder, e.g. {flag} {example}")) from None
    return len(data)


def _table(args) -> int:
    from .pipeline import render

    report = _report(args)
    if args.format == "tsv":
        sys.stdout.write(render.table_tsv(report.rows))
    elif args.format == "json":
        import json

        sys.stdout.write(json.dumps(render.table_data(report.rows), indent=2) + "\n")
    else:
        sys.stdout.write(render.table_text(report.rows))
    return 0


def _import(args) -> int:
    import json

    from .inputs.importer import import_spec, write_spec

    imported = import_spec(args.source, args.revision, args.model)
    text = json.dumps(imported.data, indent=2) + "\n" if args.format == "json" else imported.text
    if args.output:
        write_spec(args.output, text, args.force)
        total = sum(m["parameters"] for m in imported.data["modules"].values())
        sys.stderr.write(f"wrote {args.output}: {imported.data['model']}, {len(imported.data['modules'])} modules, {total:,} parameters ({imported.family} family)\n")
    else:
        sys.stdout.write(text)
    if imported.header_parameters is None:
        sys.stderr.write("note: no safetensors in the checkpoint; the parameter counts come from config.json arithmetic (see the spec's notes)\n")
    return 0


def _fit(args) -> int:
    from .pipeline import render
    from .commands.fit import fit
    from .api import admitted_setup

    spec, doc, knobs = _sources(args, searched=("micro_batch",))
    if doc is None and "micro_batch" not in knobs:
        knobs["micro_batch"] = 1  # NB: where the search for the largest micro-batch starts
    setup = admitted_setup(doc, spec, knobs)
    if setup.gpu is None:
        raise UsageError(Diagnostic("E201", "", 0, 0, "--gpu", "fit needs a GPU", "give --gpu NAME (specs/gpus.yaml) or a size such as 24GiB, or gpu: in the experiment"))
    report = fit(spec, setup, setup.gpu, resolve=lambda more: admitted_setup(doc, spec, {**knobs, **more}))
    sys.stdout.write(render.fit_json(report) if args.format == "json" else render.fit_text(report))
    return 0


def _sweep(args) -> int:
    from .pipeline import render
    from .commands.chart import sweep_svg, x_knob
    from .commands.sweep import KNOBS, ProgressBar, parse_values, sweep

    grid = {k.name: parse_values(k, getattr(args, "sweep_" + k.name)) for k in KNOBS if getattr(args, "sweep_" + k.name) is not None}
    fmt = args.format or {".csv": "csv", ".json": "json"}.get(Path(args.output or "").suffix.lower(), "text")
    spec, doc, base = _sources(args, searched=tuple(grid))
    progress = ProgressBar(sys.stderr) if not args.quiet and sys.stderr.isatty() else None
    if args.svg or args.x:
        x_knob(grid, args.x)  # NB: a chart that cannot be drawn is refused before the sweep runs
    # NB: an output that cannot be written is refused before the sweep runs, too
    outputs = [("-o", args.output, "the sweep", "sweep.csv"), ("--svg", args.svg, "the chart", "sweep.svg")]
    for flag, output, what, example in outputs:
        if output:
            _check_output(flag, output, what, example, args.force)
    report = sweep(spec, doc, base, grid, progress)
    text = {"csv": render.sweep_csv, "json": render.sweep_json, "text": render.sweep_text}[fmt](report)
    if args.output:
        _write_output("-o", args.output, text.encode("utf-8"), "the sweep", "sweep.csv", args.force)
    else:
        sys.stdout.write(text)
    if args.svg:
        _write_output("--svg", args.svg, sweep_svg(report, args.x).encode("utf-8"), "the chart", "sweep.svg", args.force)
    return 0


def _diff(args) -> int:
    from .commands import diff

    report = diff.diff(args.base)
    sys.stdout.write({"text": diff.render_text, "markdown": diff.render_markdown, "json": diff.render_json}[args.format](report))
    return 0


def _check(args) -> int:
    from .commands.check import check_paths
    from .commands.progress import Progress

    checked, problems = check_paths([Path(p) for p in args.paths], Progress(sys.stderr, "check"))
    if args.format == "json":
        import json

        sys.stdout.write(json.dumps({"checked": checked, "errors": [d.__dict__ for d in problems]}, indent=2) + "\n")
    elif not problems:
        sys.stdout.write(f"ok: {len(checked)} files checked\n")
    if problems:
        if args.format != "json":
            sys.stderr.write(MemspecError(problems).render(source=True) + "\n")
        return 1
    return 0


def _measure(args) -> int:
    try:
        from .measure import cli as measure_cli
    except ImportError as exc:
        raise MemspecError(Diagnostic("E601", "", 0, 0, "", f"the measuring side is not installed ({exc})", "pip install 'memspec[measure]'")) from None
    return measure_cli.main(args)


def _validate(args) -> int:
    from .commands.validation import main as validate_main

    return validate_main(args)


def _catalog(args) -> int:
    from .commands import catalog

    return catalog.main(args)


def _short_name(args) -> None:
    """A bundled spec or experiment named by its short name (`memspec list`), wherever a file
    is taken; a path that exists, a folder or a hub id (owner/name) is never a short name."""
    name = getattr(args, "file", None)
    if not name or "/" in name or Path(name).exists():
        return
    from .commands import catalog

    found = catalog.find(name)
    if found is not None:
        args.file = str(found)
    elif not name.endswith((".yaml", ".yml")) and (hint := catalog.suggestion(name)):
        raise MemspecError(Diagnostic("E101", name, 0, 0, "", "is neither a file nor the short name of a bundled spec or experiment",
                                      f"{hint} (memspec list shows them all)"))


def _model_from_script(args) -> None:
    """No model file: the launch script's --model_name_or_path names the model (the file
    verbs with --from-command); with neither, the command line lacks the model. Once the
    model is found, `args.file` names it and a second call changes nothing."""
    if getattr(args, "command", None) not in FILE_VERBS or args.file is not None:
        return
    if not getattr(args, "from_command", None):
        raise UsageError(Diagnostic("E201", "", 0, 0, "", "missing the model: a spec or experiment file, a short name, a hub id or a model folder",
                                    f"give one, e.g. memspec {args.command} llava-1.5-7b-finetune, or --from-command SCRIPT "
                                    "to take the model from the script's --model_name_or_path"))
    from .inputs import launch, script_model

    args.script_model = script_model.resolve(launch.read_command(args.from_command), getattr(args, "revision", None))
    args.file = args.script_model.file


COMMANDS = {"list": _catalog, "estimate": _estimate, "report": _html_report, "table": _table, "fit": _fit, "sweep": _sweep, "diff": _diff, "import": _import, "check": _check, "measure": _measure, "validate": _validate}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = parser(argv).parse_args(argv)
    except SystemExit as exc:  # argparse: --help is 0, usage errors are 2
        return int(exc.code or 0)
    try:
        _short_name(args)
        _model_from_script(args)
        return COMMANDS[args.command](args)
    except MemspecError as exc:  # UsageError included
        sys.stderr.write(exc.render(source=True) + "\n")
        return exc.exit_code
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception:  # a bug in memspec: the one case with a traceback
        import traceback

        traceback.print_exc()
        sys.stderr.write("memspec: internal error (exit 3); please report it with the command above\n")
        return 3


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
