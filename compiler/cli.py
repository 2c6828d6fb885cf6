"""The `memspec` command: a thin layer over `compiler.api` and `compiler.pipeline.render`; its
parser (every verb's flags) is `cli_parser.py`.

Exit codes: 0 ok; 1 the input is wrong (diagnostics on stderr); 2 usage; 3 a bug in memspec
(the only case that prints a traceback); 4 `estimate --fail-if-oom`: the estimate does not
fit the GPU (with the margin), a result rather than an error, for CI and schedulers.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from .cli_parser import EXIT_DOES_NOT_FIT, overrides, parser
from .errors import Diagnostic, MemspecError, UsageError

# The verbs whose file argument may come from a launch script's --model_name_or_path.
FILE_VERBS = ("estimate", "table", "report", "fit", "sweep")


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
        reading = launch.command_overrides(
            command, {m.name: {"type": m.type, "inputs": m.inputs} for m in spec.modules}, spec.model, model_from_script=script_model is not None
        )
        if accelerate_file and command.gpus is None:
            # NB: the config says how many processes; the command's silence is no news
            reading = launch.Reading(
                {k: v for k, v in reading.overrides.items() if k != "dp"}, tuple(n for n in reading.notes if "does not say how many GPUs" not in n)
            )
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
        raise UsageError(
            Diagnostic(
                "E201",
                "",
                0,
                0,
                "--gpu",
                "--fail-if-oom needs a GPU to fit",
                "give --gpu NAME (specs/gpus.yaml) or a size such as 24GiB, or gpu: in the experiment",
            )
        )
    sys.stdout.write(render.json_text(report) if args.format == "json" else render.text(report))
    return EXIT_DOES_NOT_FIT if args.fail_if_oom and not report.fits else 0


def _html_report(args) -> int:
    import json

    from . import api
    from .pipeline import render
    from .commands.html_report import html

    if args.output == "-" and args.format == "json":
        raise UsageError(
            Diagnostic(
                "E902",
                "",
                0,
                0,
                "-o",
                "'-o -' writes the page to stdout, where --format json would go too",
                "write the page to a file (-o report.html), or leave out --format json",
            )
        )
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
        sys.stdout.write(
            f"wrote {args.output} ({size:,} bytes): allocated {render.gib(report.allocated)} GiB, device {render.gib(report.device)} GiB per GPU{verdict}\n"
        )
    return 0


def _write_page(output: str, page: str, force: bool) -> int:
    return _write_output("-o", output, page.encode("utf-8"), "the report", "report.html", force)


def _check_output(flag: str, output: str, what: str, example: str, force: bool) -> None:
    """A path that cannot take the output is the user's error (E901), and an existing file is
    kept unless --force (E903): both found before any work."""
    path = Path(output)
    problem = "is a folder" if path.is_dir() else f"its folder '{path.parent}' does not exist" if not path.parent.is_dir() else None
    if problem:
        raise MemspecError(
            Diagnostic(
                "E901", "", 0, 0, flag, f"cannot write {what} to '{output}': {problem}", f"give a file path in an existing folder, e.g. {flag} {example}"
            )
        )
    if path.exists() and not force:
        raise MemspecError(Diagnostic("E903", "", 0, 0, flag, f"'{output}' exists; {what} would replace it", "add --force to replace it, or give another path"))


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
        raise MemspecError(
            Diagnostic(
                "E901",
                "",
                0,
                0,
                flag,
                f"cannot write {what} to '{output}': {exc.strerror or exc}",
                f"give a file path in an existing folder, e.g. {flag} {example}",
            )
        ) from None
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
        sys.stderr.write(
            f"wrote {args.output}: {imported.data['model']}, {len(imported.data['modules'])} modules, {total:,} parameters ({imported.family} family)\n"
        )
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
        raise UsageError(
            Diagnostic("E201", "", 0, 0, "--gpu", "fit needs a GPU", "give --gpu NAME (specs/gpus.yaml) or a size such as 24GiB, or gpu: in the experiment")
        )
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
        raise MemspecError(
            Diagnostic("E101", name, 0, 0, "", "is neither a file nor the short name of a bundled spec or experiment", f"{hint} (memspec list shows them all)")
        )


def _model_from_script(args) -> None:
    """No model file: the launch script's --model_name_or_path names the model (the file
    verbs with --from-command); with neither, the command line lacks the model. Once the
    model is found, `args.file` names it and a second call changes nothing."""
    if getattr(args, "command", None) not in FILE_VERBS or args.file is not None:
        return
    if not getattr(args, "from_command", None):
        raise UsageError(
            Diagnostic(
                "E201",
                "",
                0,
                0,
                "",
                "missing the model: a spec or experiment file, a short name, a hub id or a model folder",
                f"give one, e.g. memspec {args.command} llava-1.5-7b-finetune, or --from-command SCRIPT "
                "to take the model from the script's --model_name_or_path",
            )
        )
    from .inputs import launch, script_model

    args.script_model = script_model.resolve(launch.read_command(args.from_command), getattr(args, "revision", None))
    args.file = args.script_model.file


COMMANDS = {
    "list": _catalog,
    "estimate": _estimate,
    "report": _html_report,
    "table": _table,
    "fit": _fit,
    "sweep": _sweep,
    "diff": _diff,
    "import": _import,
    "check": _check,
    "measure": _measure,
    "validate": _validate,
}


# `memspec measure` runs under a fixed string hash (PYTHONHASHSEED, unless the environment sets
# one): transformers' Gemma3TextModel.forward makes its two rotary tables `for layer_type in
# set(self.config.layer_types)` (as 17 other models' forwards of transformers 5.23 do), so which
# table a step makes first follows the hash seed Python draws for each process, and with it where
# the caching allocator puts them. Measured on Gemma-3-1B b 4 seq 1024 sdpa checkpointed (its
# trace): reserved 37,251,710,976 B under seed 0, 37,249,613,824 B under seed 1, allocated equal.
MEASURE_HASH_SEED = "0"


def measure_hash_seed(argv: Sequence[str], module: str = "compiler.cli") -> None:
    """Run this command line again (the same interpreter and program, `module` where Python
    ran one with -m; replacing this process) with PYTHONHASHSEED=MEASURE_HASH_SEED, unless the
    environment sets a seed already. POSIX only (os.execve)."""
    if os.environ.get("PYTHONHASHSEED") is not None or os.name != "posix":
        return
    # NB: under -m, sys.argv[0] is the module's file (runpy sets it before the module runs)
    program = ["-m", module] if Path(sys.argv[0]).suffix == ".py" else [sys.argv[0]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *program, *argv], {**os.environ, "PYTHONHASHSEED": MEASURE_HASH_SEED})


def main(argv: Sequence[str] | None = None) -> int:
    console = argv is None  # NB: the console script's call; a caller's own argv runs here as it is
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = parser(argv).parse_args(argv)
    except SystemExit as exc:  # argparse: --help is 0, usage errors are 2
        return int(exc.code or 0)
    if console and args.command == "measure":
        measure_hash_seed(argv)
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
