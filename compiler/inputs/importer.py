"""`memspec import`: a Hugging Face checkpoint and its family mapping become a model spec.

Contract: `import_spec(source, revision=None, model=None)` returns an `Imported`: the spec as
reviewed-looking YAML text (comments carry where each value came from and the header's count
per module), the same spec as plain data, and the resolved `Spec`. The steps, in order:

1. read the checkpoint (`hub.open_checkpoint`): config.json, preprocessor_config.json, the
   safetensors headers;
2. refuse a quantized checkpoint (not estimated yet) rather than miscount it;
3. pick the family by `model_type` (`specs/families/*.yaml`) and read its config values;
4. assign every header tensor to a module by name prefix (the longest wins; the family's
   buffer suffixes are set aside); a tensor no module claims is an error;
5. compile the spec with the formulas and reconcile: the formulas' parameter count per module
   must equal the header's. Without safetensors (a .bin-only checkpoint) the formulas' count
   is used and the spec's notes say so.

`write_spec(path, text, force)` writes atomically and never overwrites without `force`.
`source_inputs(source, overrides)` is the dry run behind `memspec estimate <hub id or folder>`.
Nothing here prints.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from ..errors import Diagnostic, MemspecError
from .family import VISION_CHUNK_KEYS, Families, Family, Values, load_families
from .hub import FLOAT_DTYPES, QUANTIZED_SUFFIXES, Checkpoint, Tensor, open_checkpoint
from ..pipeline.load import load_yaml_text
from ..paths import families_dir
from ..pipeline.resolve import Setup, Spec, resolve_spec

_MODEL_NAME = re.compile(r"[^A-Za-z0-9._-]+")
_SHOWN_TENSORS = 8  # tensor groups named in one error
COUNTING_SEQ = 1 << 16  # LLM positions of the setup the parameter counts are evaluated in


@dataclass(frozen=True)
class Imported:
    text: str  # the spec as YAML, with comments
    data: Mapping[str, Any]  # the same spec as plain data (for --format json)
    spec: Spec
    family: str
    header_parameters: Mapping[str, int] | None  # module -> the header's count; None without safetensors


def families(folder: str | None = None) -> Families:
    # Keyed by the working directory too: the family files' names in messages are relative to it.
    return _families(folder, os.getcwd())


@lru_cache(maxsize=4)
def _families(folder: str | None, cwd: str) -> Families:
    return load_families(folder or families_dir())


def import_spec(source: str, revision: str | None = None, model: str | None = None) -> Imported:
    ckpt = open_checkpoint(source, revision)
    _refuse_quantized(ckpt)
    family = families().get(ckpt.config.get("model_type"), ckpt.where, ckpt.config)
    values = family.read(ckpt.config, ckpt.processor, ckpt.where)
    scope = dict(values.values)
    scope["image_tokens"] = _integer(family.image_tokens(scope), "image_tokens", family, ckpt)
    header = _assign(ckpt, family) if ckpt.tensors is not None else None
    name = model or _model_name(source)
    counts = header[0] if header else {m.name: 0 for m in family.modules}
    draft = _spec_data(ckpt, family, values, scope, name, counts, header)
    spec = _resolve(draft, ckpt)
    formula = formula_counts(spec)
    if header is None:
        draft = _spec_data(ckpt, family, values, scope, name, formula, None)
        spec = _resolve(draft, ckpt)
    else:
        _reconcile(formula, header, ckpt, family)
    return Imported(_yaml(draft, ckpt, family, values, scope, header), draft["data"], spec, family.name, header[0] if header else None)


def _integer(value: Any, what: str, family: Family, ckpt: Checkpoint) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MemspecError(Diagnostic("E713", "", 0, 0, "", f"{ckpt.where}: {what} evaluated to {value!r}, not an integer", f"check {family.file}"))
    return value


def _model_name(source: str) -> str:
    base = Path(source.rstrip("/\\")).name or "model"
    name = _MODEL_NAME.sub("-", base).strip("-._")
    return name or "model"


# --------------------------------------------------------------------------- quantized weights


def _refuse_quantized(ckpt: Checkpoint) -> None:
    qc = ckpt.config.get("quantization_config")
    companions = [t for t in ckpt.tensors or () if t.name.endswith(QUANTIZED_SUFFIXES)]
    packed = [t for t in ckpt.tensors or () if t.name.endswith(".weight") and t.dtype not in FLOAT_DTYPES]
    if not (qc or companions or packed):
        return
    method = qc.get("quant_method", "unknown method") if isinstance(qc, Mapping) else "no quantization_config"
    found = []
    if packed:
        dtypes = ", ".join(sorted({t.dtype for t in packed}))
        found.append(f"{len(packed)} weights stored as {dtypes} (e.g. {packed[0].name})")
    if companions:
        suffixes = sorted({s for t in companions for s in QUANTIZED_SUFFIXES if t.name.endswith(s)})
        found.append(f"{len(companions)} companion tensors ({', '.join(suffixes)})")
    raise MemspecError(
        Diagnostic(
            "E711",
            "",
            0,
            0,
            "",
            f"{ckpt.where}: quantized checkpoint ({method}{': ' + '; '.join(found) if found else ''}): not estimated yet",
            "memspec counts 16- and 32-bit weights only; import the unquantized base model instead",
        )
    )


# --------------------------------------------------------------------------- reconciliation

Header = tuple[dict[str, int], dict[str, list[Tensor]], list[Tensor]]  # counts, tensors per module, set aside


def _assign(ckpt: Checkpoint, family: Family) -> Header:
    prefixes = sorted(((p, m.name) for m in family.modules for p in m.tensors), key=lambda x: -len(x[0]))
    by_module: dict[str, list[Tensor]] = {m.name: [] for m in family.modules}
    ignored, unassigned = [], []
    for t in ckpt.tensors or ():
        if t.name.endswith(family.ignore_tensors):
            ignored.append(t)
            continue
        owner = next((m for p, m in prefixes if t.name.startswith(p)), None)
        (by_module[owner] if owner else unassigned).append(t)
    if unassigned:
        raise MemspecError(
            Diagnostic(
                "E709",
                "",
                0,
                0,
                "",
                f"{ckpt.where}: {len(unassigned)} header tensors belong to no module of the {family.name} family: {_groups(unassigned)}",
                f"the module prefixes are {', '.join(p for p, _ in prefixes)}; add the missing prefix (or a buffer suffix under ignore_tensors) in {family.file}",
            )
        )
    counts = {m: sum(t.elements for t in ts) for m, ts in by_module.items()}
    return counts, by_module, ignored


def _groups(tensors: list[Tensor]) -> str:
    """Tensor names with layer indices folded: `model.layers.{0..31}.mlp.up_proj.weight x32 [11008, 4096]`."""
    groups: dict[tuple[str, str, tuple[int, ...]], list[int]] = {}
    for t in tensors:
        indices = [int(x) for x in re.findall(r"\.(\d+)\.", t.name)]
        key = (re.sub(r"\.\d+\.", ".{}.", t.name), t.dtype, t.shape)
        groups.setdefault(key, []).extend(indices[:1])
    shown = []
    for (name, dtype, shape), idx in list(groups.items())[:_SHOWN_TENSORS]:
        if idx:
            name = name.replace("{}", f"{{{min(idx)}..{max(idx)}}}", 1).replace("{}", "N") + f" x{len(idx)}"
        shown.append(f"{name} {dtype}{list(shape)}")
    more = len(groups) - len(shown)
    return "; ".join(shown) + (f"; and {more} more groups" if more > 0 else "")


def _reconcile(formula: Mapping[str, int], header: Header, ckpt: Checkpoint, family: Family) -> None:
    counts, by_module, _ = header
    problems = []
    for name, count in counts.items():
        if formula[name] != count:
            problems.append(
                Diagnostic(
                    "E710",
                    "",
                    0,
                    0,
                    "",
                    f"{ckpt.where}: module '{name}': the formulas count {formula[name]:,} parameters, the header {count:,} (off by {formula[name] - count:+,}); its tensors: {_groups(by_module[name]) or 'none'}",
                    f"check the module's inputs in {family.file} against config.json, and its tensor prefixes against the header",
                )
            )
    if problems:
        raise MemspecError(problems)


def formula_counts(spec: Spec) -> dict[str, int]:
    """The formulas' parameter count per module (elements), as `api.run` reconciles them."""
    from ..api import admitted_setup, spec_library
    from ..pipeline.evaluate import evaluate
    from ..pipeline.expand import expand

    # NB: parameters do not depend on the sequence; one of COUNTING_SEQ positions holds the
    # image tokens of any default image (a tiled one has more than spec.image_tokens)
    setup = admitted_setup(None, spec, {"micro_batch": 1, "seq_len": max(spec.image_tokens, COUNTING_SEQ)})
    nodes = evaluate(expand(spec, setup, spec_library(spec)), setup.optimizer, setup.state_bytes, setup.master_bytes)
    return {n.inst.module: sum(x.cost.parameters for x in n.walk()) // setup.bytes["param"] for n in nodes}


# --------------------------------------------------------------------------- the spec


def trainer_hidden_size(config: Mapping[str, Any]) -> int | None:
    """The hidden size HF Trainer fills DeepSpeed's "auto" bucket sizes from, found the way
    transformers/integrations/deepspeed.py (trainer_config_finalize) looks for it."""
    for c in (config, config.get("text_config")):
        if not isinstance(c, Mapping):
            continue
        if isinstance(c.get("hidden_size"), int):
            return c["hidden_size"]
        sizes = c.get("hidden_sizes")
        if isinstance(sizes, list) and sizes and all(isinstance(n, int) for n in sizes):
            return max(sizes)
    return None


def context_length(config: Mapping[str, Any]) -> tuple[int, str] | None:
    """The language model's context and the key that gave it: `seq_length` where the config
    has one (the trained context of Qwen, ChatGLM and BLOOM; Qwen's max_position_embeddings,
    4 x seq_length, is reached by dynamic NTK at inference only), else max_position_embeddings;
    at the top level, in text_config (VLMs in transformers) or llm_config (InternVL's remote
    code); None when the config has neither."""
    configs = [c for c in (config, config.get("text_config"), config.get("llm_config")) if isinstance(c, Mapping)]
    for key in ("seq_length", "max_position_embeddings"):
        for c in configs:
            if isinstance(c.get(key), int) and not isinstance(c[key], bool):
                return c[key], key
    return None


def _number_or_text(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def _spec_data(
    ckpt: Checkpoint, family: Family, values: Values, scope: Mapping[str, Any], name: str, counts: Mapping[str, int], header: Header | None
) -> dict[str, Any]:
    source: dict[str, Any] = {"repo": ckpt.source}
    if ckpt.revision:
        source["revision"] = ckpt.revision
    modules = {}
    for m in family.modules:
        modules[m.name] = {
            "type": m.type,
            "inputs": {k: e(scope) for k, e in m.inputs.items()},
            "context": {k: _number_or_text(t.render(scope)) for k, t in m.context.items()},
            "parameters": counts[m.name],
        }
    notes = list(family.notes)
    if header is None:
        files = ", ".join(ckpt.weight_files) or "no weight files found"
        notes.append(f"No safetensors in the checkpoint ({files}): the parameter counts are the formulas' arithmetic over config.json, not a header's count.")
    elif header[2]:
        notes.append(f"Left out of the counts as buffers, not parameters: {_groups(header[2])}.")
    defaulted = [n for n, o in values.origin.items() if o.startswith("default")]
    if defaulted:
        notes.append(f"Not in the checkpoint's config files, so the config class's defaults were used: {', '.join(defaulted)} (see the comments).")
    data: dict[str, Any] = {
        "model": name,
        "summary": " ".join(family.summary.render({**scope, "repo": ckpt.source}).split()),
        "source": source,
        **({"hidden_size": hidden} if (hidden := trainer_hidden_size(ckpt.config)) else {}),
        **({"context_length": n[0]} if (n := context_length(ckpt.config)) else {}),
        **_anyres_data(ckpt, family, scope),
        **(
            {
                "image_resize": {
                    k: _integer(getattr(family.image_resize, k)(scope), f"image_resize.{k}", family, ckpt) for k in ("factor", "min_pixels", "max_pixels")
                }
            }
            if family.image_resize
            else {}
        ),
        **({"video_temporal_patch": _integer(family.video_temporal_patch(scope), "video_temporal_patch", family, ckpt)} if family.video_temporal_patch else {}),
        **(
            {"vision_chunk": {k: _integer(getattr(family.vision_chunk, k)(scope), f"vision_chunk.{k}", family, ckpt) for k in VISION_CHUNK_KEYS}}
            if family.vision_chunk
            else {}
        ),
        **({"attention": list(attention)} if (attention := family.attention_for(scope)) else {}),
        **({"encoder_decoder": True} if family.encoder_decoder else {}),
        "image_tokens": scope["image_tokens"],
        "modules": modules,
        "notes": notes,
    }
    return {"data": data}


def _anyres_data(ckpt: Checkpoint, family: Family, scope: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's image_size and anyres block, for a family with anyres tiling (else nothing)."""
    if family.anyres is None:
        return {}
    a = family.anyres
    return {
        "image_size": [_integer(e(scope), "anyres.image_size", family, ckpt) for e in a.image_size],
        "anyres": {"tile": _integer(a.tile(scope), "anyres.tile", family, ckpt), "grid_pinpoints": family.pinpoints(ckpt.config, ckpt.processor, ckpt.where)},
    }


def _resolve(draft: Mapping[str, Any], ckpt: Checkpoint) -> Spec:
    from ..pipeline.validate import load_schema, validate

    text = json.dumps(draft["data"], indent=1)
    doc = load_yaml_text(text, f"imported from {ckpt.source}")
    problems = validate(doc, load_schema("spec"))
    if problems:
        raise MemspecError(problems)
    return resolve_spec(doc)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    import yaml

    try:
        plain = re.fullmatch(r"[A-Za-z0-9_(][^#:{}\[\]'\"\n]*", text) and yaml.safe_load(text) == text and text == text.strip()
    except yaml.YAMLError:
        plain = False
    return text if plain else json.dumps(text, ensure_ascii=False)


def _thousands(n: int) -> str:
    return f"{n:_}"


def _explain(expr, scope: Mapping[str, Any]) -> str:
    used = ", ".join(f"{n} {scope[n]!r}" for n in sorted(expr.names) if n in scope)
    return f"{expr.source}" + (f" with {used}" if used else "")


def _input_comment(expr, values: Values, scope: Mapping[str, Any]) -> str:
    if not expr.compiled:
        return ""
    if expr.source in values.origin:
        origin = values.origin[expr.source]
        if origin.startswith("derived: "):
            d = origin[len("derived: ") :]
            used = ", ".join(f"{n} {scope[n]!r}" for n in sorted(scope) if re.search(rf"\b{n}\b", d) and n != expr.source)
            return f"{d}" + (f" with {used}" if used else "")
        return origin
    if expr.source == "image_tokens":
        return "image_tokens above"
    return _explain(expr, scope)


def _yaml(draft: Mapping[str, Any], ckpt: Checkpoint, family: Family, values: Values, scope: Mapping[str, Any], header: Header | None) -> str:
    data = draft["data"]
    rev = f" (revision {ckpt.revision})" if ckpt.revision else ""
    lines = [
        f"# Imported by `memspec import {ckpt.source}`{rev} with the {family.name} family",
        f"# ({family.file}). Review it before committing: the comments say where each value came from.",
        f"model: {_scalar(data['model'])}",
        f"summary: {_scalar(data['summary'])}",
        "source:",
        f"  repo: {_scalar(data['source']['repo'])}",
    ]
    if "revision" in data["source"]:
        lines.append(f"  revision: {_scalar(data['source']['revision'])}")
    if "hidden_size" in data:
        lines.append(_commented(f"hidden_size: {data['hidden_size']}", 'what HF Trainer\'s DeepSpeed "auto" bucket sizes use'))
    if "context_length" in data:
        lines.append(
            _commented(f"context_length: {data['context_length']}", f"config.json {context_length(ckpt.config)[1]}: the longest sequence fit proposes")
        )
    if "anyres" in data:
        a = data["anyres"]
        lines.append(
            _commented(f"image_size: [{', '.join(map(str, data['image_size']))}]", "the default input image (height, width); experiments set their own")
        )
        lines.append(_commented("anyres:", f"tiling: config.json {family.anyres.pinpoints_key.split('.', 1)[1]}, tiles of {a['tile']} px"))
        lines.append(f"  tile: {a['tile']}")
        lines.append(f"  grid_pinpoints: [{', '.join(f'[{h}, {w}]' for h, w in a['grid_pinpoints'])}]")
    if "attention" in data:
        lines.append(_commented(f"attention: [{', '.join(data['attention'])}]", "what transformers accepts for this model, its default first"))
    if data.get("encoder_decoder"):
        lines.append(_commented("encoder_decoder: true", "seq_len is the encoder's source length, target_len the decoder's"))
    lines.append(_commented(f"image_tokens: {data['image_tokens']}", _explain(family.image_tokens, scope) if family.image_tokens.compiled else ""))
    if "image_resize" in data:
        r = data["image_resize"]
        lines.append(_commented("image_resize:", "the processor's smart_resize: the bounds from preprocessor_config.json, factor patch x merge"))
        lines += [f"  {k}: {r[k]}" for k in ("factor", "min_pixels", "max_pixels")]
    if "vision_chunk" in data:
        c = data["vision_chunk"]
        lines.append(_commented("vision_chunk:", "the tower runs at most `slices` slices at once (vision_batch_size); more are refused (E725)"))
        lines += [f"  {k}: {c[k]}" for k in VISION_CHUNK_KEYS]
    if "video_temporal_patch" in data:
        lines.append(
            _commented(
                f"video_temporal_patch: {data['video_temporal_patch']}", "a video's frames per temporal patch: F frames are read as ceil(F / this) images"
            )
        )
    lines.append("modules:")
    for m in family.modules:
        spec_m = data["modules"][m.name]
        role = m.doc or ("" if m.trainable is None else ("trained" if m.trainable else "frozen") + " in the family's usual recipes")
        lines.append(_commented(f"  {m.name}:", role))
        lines.append(f"    type: {spec_m['type']}")
        lines.append("    inputs:")
        for k, v in spec_m["inputs"].items():
            lines.append(_commented(f"      {k}: {_scalar(v)}", _input_comment(m.inputs[k], values, scope)))
        lines.append("    context:")
        for k in ("batch", "seq"):
            source = m.context[k].source
            lines.append(_commented(f"      {k}: {_scalar(spec_m['context'][k])}", source if "{{" in source else ""))
        lines.append(_commented(f"    parameters: {_thousands(spec_m['parameters'])}", _count_comment(m.name, header)))
    lines.append("notes:")
    lines.extend(f"  - {_scalar(n)}" for n in data["notes"])
    return "\n".join(lines) + "\n"


def _count_comment(module: str, header: Header | None) -> str:
    if header is None:
        return "the formulas' count: no safetensors header to read"
    tensors = header[1][module]
    dtypes = Counter(t.dtype for t in tensors)
    return f"header: {len(tensors)} tensors, " + ", ".join(f"{d} x{n}" for d, n in dtypes.most_common())


def _commented(line: str, comment: str) -> str:
    if not comment:
        return line
    return f"{line.ljust(30)}  # {comment}"


# --------------------------------------------------------------------------- writing, estimating


def write_spec(path: str | Path, text: str, force: bool = False) -> None:
    """Write atomically (a temporary file in the same folder, then a rename)."""
    target = Path(path)
    if target.exists() and not force:
        raise MemspecError(Diagnostic("E712", str(path), 0, 0, "", "already exists; not overwritten", "pass --force to replace it, or choose another -o path"))
    if target.is_dir():
        raise MemspecError(Diagnostic("E712", str(path), 0, 0, "", "is a directory", "give the path of the spec file to write"))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def is_source(arg: str) -> bool:
    """A model folder or a hub repo id, rather than a spec or experiment file."""
    from .hub import is_repo_id

    path = Path(arg)
    if path.is_dir():
        return True
    return not path.exists() and is_repo_id(arg)


def source_inputs(source: str, overrides: Mapping[str, Any] | None = None, revision: str | None = None) -> tuple[Spec, Setup]:
    """The dry run: import in memory, then resolve the setup as for a bare spec."""
    from ..api import admitted_setup

    imported = import_spec(source, revision)
    return imported.spec, admitted_setup(None, imported.spec, overrides)
