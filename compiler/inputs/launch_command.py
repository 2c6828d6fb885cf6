"""A launch script's training command: the first line that runs a training launcher, parsed.

Contract: `read_command(path)` finds the `deepspeed` / `torchrun` / `accelerate launch` /
`python` command in a shell script (backslash continuations joined, split as the shell
splits it, `NAME=value` assignments kept as the script's variables) and parses its launcher
options (GPUs per node, nodes, accelerate's config files) and the training script's flags
into a `Command`: each `Flag` with its value, line and column. What the flags mean is
`launch.command_overrides`'s; a script that cannot be read or holds no launcher line is a
`MemspecError`. Nothing prints.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..errors import Diagnostic, MemspecError


@dataclass(frozen=True)
class Flag:
    name: str  # without the leading dashes
    value: str | None  # None for a bare flag (True for a boolean)
    line: int
    col: int


@dataclass(frozen=True)
class Command:
    file: str
    launcher: str  # deepspeed, torchrun, accelerate, python
    entry: str  # the training script or module
    gpus: int | None  # processes per node, when the command says
    nodes: int
    launcher_deepspeed: str | None  # accelerate's --deepspeed_config_file
    flags: tuple[Flag, ...]
    positionals: tuple[str, ...]
    variables: Mapping[str, str]  # simple NAME=value assignments of the script
    line: int
    config_file: str | None = None  # accelerate launch --config_file


# Launcher options that take a value (the rest are bare flags). deepspeed/launcher/runner.py,
# torch/distributed/run.py, accelerate/commands/launch.py.
LAUNCHER_VALUE_OPTIONS = {
    "deepspeed": {
        "num_gpus",
        "num_nodes",
        "include",
        "exclude",
        "master_port",
        "master_addr",
        "hostfile",
        "launcher",
        "launcher_args",
        "node_rank",
        "ssh_port",
        "elastic_training",
        "min_elastic_nodes",
        "max_elastic_nodes",
        "bind_core_list",
        "comment",
        "venv_script",
    },
    "torchrun": {
        "nproc_per_node",
        "nproc-per-node",
        "nnodes",
        "node_rank",
        "node-rank",
        "master_addr",
        "master-addr",
        "master_port",
        "master-port",
        "rdzv_backend",
        "rdzv-backend",
        "rdzv_endpoint",
        "rdzv-endpoint",
        "rdzv_id",
        "rdzv-id",
        "rdzv_conf",
        "rdzv-conf",
        "max_restarts",
        "max-restarts",
        "monitor_interval",
        "monitor-interval",
        "start_method",
        "start-method",
        "role",
        "log_dir",
        "log-dir",
        "redirects",
        "tee",
        "local_addr",
        "local-addr",
        "logs_specs",
        "logs-specs",
    },
    "accelerate": {
        "num_processes",
        "num_machines",
        "machine_rank",
        "main_process_ip",
        "main_process_port",
        "config_file",
        "mixed_precision",
        "gpu_ids",
        "dynamo_backend",
        "deepspeed_config_file",
        "zero_stage",
        "gradient_accumulation_steps",
        "num_cpu_threads_per_process",
        "rdzv_backend",
    },
    "python": set(),
}
PYTHONS = ("python", "python3")
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\S*)$")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first physical line, text) per command line, backslash continuations joined."""
    out, start, parts = [], 0, []
    for i, line in enumerate(text.splitlines(), 1):
        if not parts:
            start = i
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        parts.append(line)
        out.append((start, " ".join(parts)))
        parts = []
    if parts:
        out.append((start, " ".join(parts)))
    return out


def _tokens(line: str) -> list[str] | None:
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return None


def _launcher(tokens: list[str]) -> tuple[str, list[str]] | None:
    """(launcher, its arguments) when `tokens` run a training launcher; None otherwise."""
    while tokens and _ASSIGNMENT.match(tokens[0]):  # NB: env prefixes (CUDA_VISIBLE_DEVICES=0 deepspeed ...)
        tokens = tokens[1:]
    if not tokens:
        return None
    head, rest = Path(tokens[0]).name, tokens[1:]
    if head == "deepspeed" or head == "torchrun":
        return head, rest
    if head == "accelerate" and rest[:1] == ["launch"]:
        return "accelerate", rest[1:]
    if head in PYTHONS:
        rest = [t for t in rest if t not in ("-u", "-O", "-B")]
        if rest[:1] == ["-m"] and len(rest) > 1 and rest[1] in TORCHRUN_MODULES:
            return "torchrun", rest[2:]
        if rest[:1] == ["-m"] and len(rest) > 1 and rest[1] == "deepspeed.launcher.runner":
            return "deepspeed", rest[2:]
        if rest:
            return "python", rest
    return None


def _split_options(args: list[str], value_options: set) -> tuple[dict[str, str | None], list[str]]:
    """Launcher options up to the training script, and what follows it."""
    opts: dict[str, str | None] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        name, eq, value = args[i].lstrip("-").partition("=")
        if name == "m":  # python -m module / deepspeed --module
            break
        if not eq and name in value_options and i + 1 < len(args):
            value, i = args[i + 1], i + 1
        opts[name] = value if (eq or name in value_options) else None
        i += 1
    return opts, args[i:]


# HfArgumentParser flags of a list field (nargs="+"): every value up to the next flag,
# kept as one space-separated string (TRL's ModelConfig)
LIST_FLAGS = frozenset({"lora_target_modules", "lora_modules_to_save"})


def _script_flags(args: list[str], line_of) -> tuple[list[Flag], list[str]]:
    flags, positionals, i = [], [], 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--"):
            positionals.append(token)
            i += 1
            continue
        name, eq, value = token[2:].partition("=")
        if not eq:
            value = None
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                value, i = args[i + 1], i + 1
            while name in LIST_FLAGS and i + 1 < len(args) and not args[i + 1].startswith("--"):
                value, i = f"{value} {args[i + 1]}", i + 1
        flags.append(Flag(name, value, *line_of("--" + name)))
        i += 1
    return flags, positionals


def read_command(path: str) -> Command:
    """The training command of a shell script (the first launcher line)."""
    text = _read_script(path)
    physical = text.splitlines()
    variables: dict[str, str] = {}
    for start, line in _logical_lines(text):
        tokens = _tokens(line)
        if tokens is None:
            raise MemspecError(
                Diagnostic(
                    "E811", path, start, 1, "", "unbalanced quotes in this command", "close the quote; memspec splits the line as the shell does (shlex)"
                )
            )
        if len(tokens) == 1 and _ASSIGNMENT.match(tokens[0]):
            name, value = _ASSIGNMENT.match(tokens[0]).groups()
            variables[name] = value
            continue
        found = _launcher(tokens)
        if found is None:
            continue
        launcher, args = found
        return _command(path, start, launcher, args, _line_finder(physical, start), variables)
    raise MemspecError(
        Diagnostic(
            "E811",
            path,
            0,
            0,
            "",
            "no training command found",
            "memspec reads the first line running deepspeed, torchrun, python -m torch.distributed.run, accelerate launch or python",
        )
    )


def _read_script(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MemspecError(Diagnostic("E101", path, 0, 0, "", "file not found", f"looked for {Path(path).resolve()}")) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MemspecError(Diagnostic("E101", path, 0, 0, "", f"cannot read file: {exc}")) from None


def _line_finder(physical: list[str], start: int):
    """line_of(needle): (line, column) of a flag's first appearance in the script from line
    `start` on (the command's lines), else (start, 1)."""

    def line_of(needle: str) -> tuple[int, int]:
        for n in range(start, len(physical) + 1):
            m = re.search(re.escape(needle) + r"(?=[\s=]|$)", physical[n - 1])
            if m:
                return n, m.start() + 1
        return start, 1

    return line_of


def _command(path: str, start: int, launcher: str, args: list[str], line_of, variables: Mapping[str, str]) -> Command:
    """The `Command` of the launcher line at `start`: its options, the training script and its flags."""
    opts, rest = _split_options(args, LAUNCHER_VALUE_OPTIONS[launcher])
    if rest[:1] == ["-m"]:
        rest = rest[1:]
    if not rest:
        raise MemspecError(
            Diagnostic(
                "E811",
                path,
                start,
                1,
                "",
                f"the {launcher} command names no training script",
                "the command line is: launcher [options] train.py --flag value ...",
            )
        )
    entry, script_args = rest[0], rest[1:]
    gpus, nodes = _processes(launcher, opts, path, line_of)
    flags, positionals = _script_flags(script_args, line_of)
    return Command(
        path,
        launcher,
        entry,
        gpus,
        nodes,
        opts.get("deepspeed_config_file"),
        tuple(flags),
        tuple(positionals),
        dict(variables),
        start,
        opts.get("config_file") if launcher == "accelerate" else None,
    )


def _processes(launcher: str, opts: Mapping[str, str | None], path: str, line_of) -> tuple[int | None, int]:
    """(GPUs per node, nodes) from the launcher's options; GPUs None when it does not say."""
    names = {
        "deepspeed": ("num_gpus", "num_nodes"),
        "torchrun": ("nproc_per_node", "nnodes"),
        "accelerate": ("num_processes", "num_machines"),
        "python": ("", ""),
    }[launcher]
    gpus_key = next((k for k in (names[0], names[0].replace("_", "-")) if k and k in opts), None)
    nodes_key = next((k for k in (names[1], names[1].replace("_", "-")) if k and k in opts), None)

    def number(key: str) -> int:
        value = opts[key]
        if value is None or not value.isdigit() or int(value) < 1:
            line, col = line_of("--" + key)
            raise MemspecError(
                Diagnostic(
                    "E812", path, line, col, "--" + key, f"expected a positive number of processes, got {value!r}", "write the number, e.g. --" + key + " 8"
                )
            )
        return int(value)

    gpus = number(gpus_key) if gpus_key else None
    if gpus is None and launcher == "deepspeed" and opts.get("include"):
        # --include localhost:0,1,2,3 (one host): the listed device ids
        gpus = sum(len(part.split(":", 1)[1].split(",")) for part in opts["include"].split("@") if ":" in part) or None
    if launcher == "python":
        gpus = 1
    accel_total = launcher == "accelerate" and gpus is not None  # NB: accelerate counts processes over all machines
    nodes = number(nodes_key) if nodes_key else 1
    if accel_total:
        return gpus, 1
    return gpus, nodes
