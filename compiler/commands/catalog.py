"""`memspec list` and short names: the model specs and experiments memspec ships.

Contract: `entries()` lists every bundled model spec and experiment under `specs/` (not the
family mappings, matrices or the GPU catalog), read from the installed package's data or the
checkout; `find(name)` is the bundled file a short name means (the file's stem, or a spec's
`model:`, in any case; else the one spec named by it and a dash-separated suffix such as
`-instruct`), None when there is none, and E111 when the name means more than one file. A
short name never shadows a path that exists.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from ..errors import Diagnostic, MemspecError, did_you_mean
from ..paths import display, specs_dir

SKIPPED = ("families", "matrices", "hf")


@dataclass(frozen=True)
class Entry:
    name: str  # the file's stem
    kind: str  # spec | experiment
    path: Path
    model: str  # a spec's `model:`; an experiment's spec (its stem)
    parameters: int | None  # a spec's total (the checkpoint's count per module, summed)
    modules: tuple[str, ...]  # a spec's modules
    summary: str
    # a spec's `source:` (hub repo, and the parts a LLaVA script builds it from), which
    # `--from-command SCRIPT` matches the script's --model_name_or_path against
    source: Mapping[str, Any] = field(default_factory=dict)

    def as_data(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "path": display(self.path),
            "model": self.model,
            "parameters": self.parameters,
            "modules": list(self.modules),
            "summary": self.summary,
        }


@lru_cache(maxsize=1)
def entries() -> tuple[Entry, ...]:
    import yaml

    out = []
    root = specs_dir()
    for path in sorted(root.rglob("*.yaml")):
        rel = path.relative_to(root)
        if rel.parts[0] in SKIPPED or "hf" in rel.parts or rel.name == "gpus.yaml":
            continue
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue  # NB: `memspec check` reports a broken file; the list leaves it out
        if not isinstance(data, dict):
            continue
        summary = " ".join(str(data.get("summary", "")).split())
        if "experiment" in data:
            model = Path(str(data.get("model", ""))).stem
            out.append(Entry(path.stem, "experiment", path, model, None, (), summary))
        elif isinstance(data.get("modules"), dict):
            modules = data["modules"]
            counts = [m.get("parameters") for m in modules.values() if isinstance(m, dict)]
            total = sum(c for c in counts if isinstance(c, int)) if counts else None
            source = data.get("source") if isinstance(data.get("source"), dict) else {}
            out.append(Entry(path.stem, "spec", path, str(data.get("model", path.stem)), total, tuple(modules), summary, source))
    return tuple(out)


def find(name: str) -> Path | None:
    """The bundled file `name` means: a file's stem or a spec's `model:`, in any case; else
    the one model spec whose name continues `name` at a dash (`qwen2-vl-7b` is
    qwen2-vl-7b-instruct), which the estimate's first line then names."""
    folded = name.casefold()
    hits = [e for e in entries() if folded in (e.name.casefold(), e.model.casefold() if e.kind == "spec" else None)]
    if not hits:
        hits = [e for e in entries() if e.kind == "spec" and e.name.casefold().startswith(folded + "-")]
    paths = sorted({e.path for e in hits})
    if len(paths) > 1:
        raise MemspecError(
            Diagnostic(
                "E111",
                "",
                0,
                0,
                "",
                f"'{name}' names {len(paths)} bundled files: {', '.join(display(p) for p in paths)}",
                "give the path or the full short name of the one you mean (memspec list)",
            )
        )
    return paths[0] if paths else None


def suggestion(name: str) -> str | None:
    """A did-you-mean over the bundled names, for a file that is not found."""
    return did_you_mean(name, [e.name for e in entries()])


def main(args) -> int:
    shown = [e for e in entries() if not args.filter or args.filter.lower() in " ".join((e.name, e.kind, e.model, e.summary, " ".join(e.modules))).lower()]
    if args.format == "json":
        sys.stdout.write(json.dumps([e.as_data() for e in shown], indent=2) + "\n")
        return 0
    width = max([len(e.name) for e in shown] + [4])
    lines = []
    for kind, title in (("spec", "model specs"), ("experiment", "experiments")):
        rows = [e for e in shown if e.kind == kind]
        if not rows:
            continue
        lines.append(f"{title} ({len(rows)}):")
        for e in rows:
            if kind == "spec":
                size = f"{e.parameters / 1e9:6.2f} B" if e.parameters else "       -"
                lines.append(f"  {e.name:<{width}}  {size}  {','.join(e.modules)}")
            else:
                lines.append(f"  {e.name:<{width}}  {e.model}")
        lines.append("")
    lines.append(
        f"{len(shown)} of {len(entries())} bundled files; name one anywhere a file is taken, e.g. memspec estimate llava-1.5-7b --micro-batch 16 --seq-len 2048"
    )
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
