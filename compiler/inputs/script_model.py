"""The model a launch script trains, for `--from-command SCRIPT` given no model file.

Contract: `resolve(command, revision=None)` reads the command's `--model_name_or_path` (a
script variable substituted) and returns the `ScriptModel` memspec estimates, looked for in
this order:

1. a folder that exists, as `from_pretrained` prefers a local folder to a hub id (relative
   to the working directory, else to the nearest folder above the script, as --deepspeed is
   found): imported as `memspec import` reads it;
2. a bundled spec (`memspec list`) whose `source.repo`, model name or short name is the value;
3. a hub id, imported from the Hugging Face cache or memspec's header cache (or from the hub
   when it can be reached), as `memspec estimate <hub id>` does.

A LLaVA script (one with `--vision_tower`) names only the language model in
`--model_name_or_path`: it matches a bundled spec whose `source.parts` names the same language
model, vision tower and projector (`--mm_projector_type`, LLaVA's default `linear` when
absent). memspec does not compose a model from a language model and a vision tower, so such a
script matches bundled specs only.

Nothing found is one E814 at the flag (at the command when the script names no model): what
was looked for, and what to pass instead. Other problems of a model that was found (an
unknown model type, a quantized checkpoint, ...) are the importer's errors. Nothing prints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import Diagnostic, MemspecError
from ..paths import display
from .launch import flag_text
from .launch_command import Command, Flag

# LLaVA's ModelArguments.mm_projector_type default (llava/train/train.py)
LLAVA_DEFAULT_PROJECTOR = "linear"
LLAVA_FLAGS = ("vision_tower", "mm_projector_type")
# Hub errors that mean "not there" (not found, not cached offline): the script's model is then
# looked for nowhere else, and E814 says what to pass instead
NOT_FOUND = ("E701", "E703")


@dataclass(frozen=True)
class ScriptModel:
    file: str  # what memspec reads: a bundled spec's path, a model folder or a hub id
    kind: str  # bundled | folder | hub
    script: str
    line: int  # of --model_name_or_path
    flags: Mapping[str, str]  # model_name_or_path, and a LLaVA script's vision_tower and mm_projector_type
    target: str  # what the flags resolved to, in words
    notes: tuple[str, ...] = ()  # the bundled spec's source.parts note, as "note: ..." lines

    def describe(self) -> str:
        flags = " ".join(f"--{k} {v}" for k, v in self.flags.items())
        return f"{self.script}:{self.line} {flags} -> {self.target}"

    def as_data(self) -> dict[str, Any]:
        return {"script": self.script, "line": self.line, "flags": dict(self.flags), "kind": self.kind, "file": self.file, "description": self.describe()}


def _help(command: Command) -> str:
    return (
        f"name the model after the script (--from-command {command.file} MODEL): a spec or experiment file, "
        "a short name from 'memspec list', a model folder or a hub id"
    )


def resolve(command: Command, revision: str | None = None) -> ScriptModel:
    found = flag_text(command, "model_name_or_path")
    if found is None:
        raise MemspecError(
            Diagnostic(
                "E814",
                command.file,
                command.line,
                1,
                "",
                f"the {command.launcher} command names no --model_name_or_path, and no model was given to memspec",
                _help(command),
            )
        )
    flag, value = found
    if not value:
        raise MemspecError(
            Diagnostic("E812", command.file, flag.line, flag.col, "--model_name_or_path", "has no value", "write the model's hub id or folder after it")
        )
    if any(f.name == "vision_tower" for f in command.flags):
        return _llava(command, flag, value)
    folder = _folder(value, command)
    if folder is not None:
        return _imported(command, flag, value, folder, "folder", revision)
    bundled = _bundled(value)
    if bundled is not None:
        return _bundled_model(command, flag, {"model_name_or_path": value}, bundled)
    return _hub(command, flag, value, revision)


def _folder(value: str, command: Command) -> str | None:
    """The model folder `value` names, if one exists: from the working directory, else from
    the nearest folder above the script that has it (scripts run from their repo root)."""
    path = Path(os.path.expanduser(value))
    if path.is_dir():
        return str(path)
    if path.is_absolute():
        return None
    for parent in Path(command.file).resolve().parents:
        if (parent / path).is_dir():
            return display(parent / path)
    return None


def _bundled(value: str):
    """The bundled spec whose hub repo, model name or short name is `value` (hub ids compare
    without case, as the hub resolves them); of several with that repo (a variant such as
    `-router-aux`), the one named as the repo is."""
    from ..commands import catalog

    key = value.strip("/").lower()
    specs = [e for e in catalog.entries() if e.kind == "spec"]
    hits = [e for e in specs if str(e.source.get("repo", "")).lower() == key] or [e for e in specs if key in (e.name.lower(), e.model.lower())]
    if len(hits) > 1:
        base = key.rsplit("/", 1)[-1]
        hits = [e for e in hits if base in (e.name.lower(), e.model.lower())] or hits
    if len(hits) > 1:
        raise MemspecError(
            Diagnostic(
                "E111",
                "",
                0,
                0,
                "",
                f"'{value}' names {len(hits)} bundled specs: {', '.join(display(e.path) for e in hits)}",
                "give the path of the one you mean after the script",
            )
        )
    return hits[0] if hits else None


def _bundled_model(command: Command, flag: Flag, flags: Mapping[str, str], entry) -> ScriptModel:
    note = (entry.source.get("parts") or {}).get("note") if "vision_tower" in flags else None
    return ScriptModel(
        display(entry.path),
        "bundled",
        command.file,
        flag.line,
        dict(flags),
        f"bundled {entry.name} ({display(entry.path)})",
        (f"note: {entry.name}: {' '.join(note.split())}",) if note else (),
    )


def _llava(command: Command, flag: Flag, value: str) -> ScriptModel:
    """A LLaVA script: the bundled spec built from the same three parts, or E814."""
    from ..commands import catalog

    flags = {"model_name_or_path": value}
    for name in LLAVA_FLAGS:
        found = flag_text(command, name)
        flags[name] = found[1] if found and found[1] else (LLAVA_DEFAULT_PROJECTOR if name == "mm_projector_type" else "")
    parts = [(e, e.source.get("parts")) for e in catalog.entries() if e.kind == "spec" and isinstance(e.source.get("parts"), dict)]
    hits = [e for e, p in parts if all(str(p.get(k, "")).lower() == flags[k].lower() for k in flags)]
    if len(hits) > 1:
        raise MemspecError(
            Diagnostic(
                "E111",
                command.file,
                flag.line,
                flag.col,
                "--model_name_or_path",
                f"these parts name {len(hits)} bundled specs: {', '.join(display(e.path) for e in hits)}",
                "give the path of the one you mean after the script",
            )
        )
    if hits:
        return _bundled_model(command, flag, flags, hits[0])
    default = "" if any(f.name == "mm_projector_type" for f in command.flags) else " (LLaVA's default)"
    known = "; ".join(f"{e.name}: {p['model_name_or_path']}, {p['vision_tower']}, {p['mm_projector_type']}" for e, p in parts)
    raise MemspecError(
        Diagnostic(
            "E814",
            command.file,
            flag.line,
            flag.col,
            "--model_name_or_path",
            f"{value} with --vision_tower {flags['vision_tower']} and --mm_projector_type {flags['mm_projector_type']}{default}: "
            f"no bundled spec is built from these parts (bundled: {known or 'none'}); memspec does not compose a LLaVA "
            "model from a language model and a vision tower",
            _help(command),
        )
    )


def _imported(command: Command, flag: Flag, value: str, source: str, kind: str, revision: str | None) -> ScriptModel:
    from .importer import import_spec

    imported = import_spec(source, None if kind == "folder" else revision)
    commit = imported.data.get("source", {}).get("revision")
    target = f"folder {source}, imported" if kind == "folder" else f"hub id {source}, imported" + (f" at revision {commit}" if commit else "")
    return ScriptModel(source, kind, command.file, flag.line, {"model_name_or_path": value}, target)


def _hub(command: Command, flag: Flag, value: str, revision: str | None) -> ScriptModel:
    """A hub id read from the caches (or the hub); not found anywhere: E814."""
    from .hub import is_repo_id

    looked = (
        f"{value} is no model folder (neither {Path(os.path.expanduser(value)).resolve()} nor one below a folder above "
        "the script), no bundled spec's hub id, model or short name"
    )
    if not is_repo_id(value):
        raise MemspecError(
            Diagnostic("E814", command.file, flag.line, flag.col, "--model_name_or_path", f"{looked}, and no hub id (owner/name)", _help(command))
        )
    try:
        return _imported(command, flag, value, value, "hub", revision)
    except MemspecError as exc:
        if not all(d.code in NOT_FOUND for d in exc.diagnostics):
            raise
        reason = "; ".join(d.message for d in exc.diagnostics)
        raise MemspecError(
            Diagnostic(
                "E814", command.file, flag.line, flag.col, "--model_name_or_path", f"{looked}, and a hub id memspec cannot read ({reason})", _help(command)
            )
        ) from None
