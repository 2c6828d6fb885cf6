"""Family mappings: how a Hugging Face config.json becomes a spec's modules, as data.

Contract: `load_families(folder)` reads every `specs/families/<family>.yaml`, validates each
against `schemas/family.schema.json` and compiles its expressions in the formulas' sandbox
(`formula.compile_expr`): every name an expression uses must be a config name declared
above it (or `image_tokens`, for module inputs), so a typo fails when the family loads. It
returns a frozen `Families` (model_type -> `Family`), or raises one `MemspecError` with
every problem of every file.

`Family.read(config, processor)` maps the Hugging Face keys to the family's neutral names
(aliases tried in order, a null value counting as absent, then the config class's default
or a derivation) and returns `Values`; `Family.inputs(values)` and `Family.context(values)`
give a module's spec inputs and context expressions. Nothing here reads files other than
the family files, and nothing prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import Diagnostic, MemspecError, did_you_mean
from ..library.formula import Expr, _env, compile_expr
from ..pipeline.load import Document, child_path, load_yaml
from ..paths import display

_MISSING = object()  # a key absent from config.json (or null there)


@dataclass(frozen=True)
class ConfigValue:
    name: str
    keys: tuple[str, ...]  # "config.a.b" / "processor.a.b", first present wins
    default: Any  # _MISSING when none
    derive: Expr | None
    path: str  # JSON path in the family file


@dataclass(frozen=True)
class Template:
    """A spec expression with `{{ expr }}` holes filled from config values at import."""

    source: str
    file: str
    path: str

    def render(self, values: Mapping[str, Any]) -> str:
        return _env().from_string(self.source).render(**values).strip()


@dataclass(frozen=True)
class FamilyModule:
    name: str
    type: str
    inputs: Mapping[str, Expr]
    context: Mapping[str, Template]  # batch, seq
    tensors: tuple[str, ...]  # tensor-name prefixes
    trainable: bool | None
    doc: str | None


@dataclass(frozen=True)
class Requirement:
    check: Expr
    message: str


@dataclass(frozen=True)
class Values:
    """The neutral config values and where each came from (for the spec's comments)."""

    values: Mapping[str, Any]
    origin: Mapping[str, str]  # name -> "config.text_config.hidden_size" | "default" | "derived: ..."


@dataclass(frozen=True)
class AnyresMapping:
    """Where a family's anyres tiling comes from: the tile (an expression), the pinpoints' key."""

    tile: Expr
    pinpoints_key: str
    image_size: tuple[Expr, Expr]


VISION_CHUNK_KEYS = ("scale", "max_slices", "slices")


@dataclass(frozen=True)
class VisionChunkMapping:
    """The spec's vision_chunk (scale, max_slices, slices), expressions over the family's config names."""

    scale: Expr
    max_slices: Expr
    slices: Expr


@dataclass(frozen=True)
class ImageResizeMapping:
    """The processor's smart_resize bounds, expressions over the family's config names."""

    factor: Expr
    min_pixels: Expr
    max_pixels: Expr


@dataclass(frozen=True)
class Family:
    name: str
    file: str
    summary: Template
    model_types: tuple[str, ...]
    config: tuple[ConfigValue, ...]
    requires: tuple[Requirement, ...]
    image_tokens: Expr
    modules: tuple[FamilyModule, ...]
    ignore_tensors: tuple[str, ...]
    notes: tuple[str, ...]
    doc: Document
    anyres: AnyresMapping | None = None
    image_resize: ImageResizeMapping | None = None
    video_temporal_patch: Expr | None = None  # frames per temporal patch of a video input
    vision_chunk: VisionChunkMapping | None = None  # the tower's slices at once (MiniCPM-V 2.6's vision_batch_size)
    encoder_decoder: bool = False  # an encoder over seq_len and a decoder over the experiment's target_len

    def pinpoints(self, config: Mapping[str, Any], processor: Mapping[str, Any] | None, where: str) -> list[list[int]]:
        """The anyres grid pinpoints as [[height, width], ...] pixels, or E717."""
        root, *parts = self.anyres.pinpoints_key.split(".")
        found = _lookup({"config": config, "processor": processor or {}}[root], parts)
        ok = (
            isinstance(found, list)
            and found
            and all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in p) for p in found)
        )
        if not ok:
            shown = "missing" if found is _MISSING else repr(found)
            raise MemspecError(
                Diagnostic(
                    "E717",
                    "",
                    0,
                    0,
                    "",
                    f"{where}: {self.anyres.pinpoints_key.split('.', 1)[1]} is {shown}, not a list of [height, width] pixel pairs (the {self.name} family's anyres tiling)",
                    "LLaVA-NeXT configs list them as image_grid_pinpoints, e.g. [[336, 672], [672, 336], [672, 672]]",
                )
            )
        return [list(p) for p in found]

    # Implementations transformers accepts, its default first: a list, or an expression giving
    # them comma-separated; () for all three.
    attention: tuple[str, ...] | Expr = ()

    def attention_for(self, scope: Mapping[str, Any]) -> tuple[str, ...]:
        if isinstance(self.attention, tuple):
            return self.attention
        return tuple(a.strip() for a in str(self.attention(scope)).split(",") if a.strip())

    def read(self, config: Mapping[str, Any], processor: Mapping[str, Any] | None, where: str) -> Values:
        """Neutral values from the Hugging Face files; `where` names the source in errors
        ("repo 'x', revision 'y'" or "folder 'd'")."""
        roots = {"config": config, "processor": processor or {}}
        values: dict[str, Any] = {}
        origin: dict[str, str] = {}
        problems: list[Diagnostic] = []
        malformed: set[tuple[str, str]] = set()  # (root, dotted path) of each sub-config that is no mapping
        for c in self.config:
            found, source, through = _first(c.keys, roots)
            if source is not None:
                origin[c.name] = source
            if found is _MISSING and through is not None:
                # NB: no default for a value whose sub-config is malformed (text_config: "x")
                root, key, bad = through
                if (root, bad.where) not in malformed:
                    malformed.add((root, bad.where))
                    problems.append(_not_a_mapping(where, root, bad, self.name, c.name, key))
                continue
            if found is _MISSING and c.derive is not None:
                if not c.derive.names <= values.keys():
                    continue  # NB: what it derives from is missing, and that is reported already
                found = c.derive(values)
                origin[c.name] = f"derived: {c.derive.source}"
            elif found is _MISSING and c.default is not _MISSING:
                found = c.default
                origin[c.name] = f"default ({', '.join(k.split('.', 1)[1] for k in c.keys)} not set)"
            if found is _MISSING:
                problems.append(
                    Diagnostic(
                        "E706",
                        "",
                        0,
                        0,
                        "",
                        f"{where}: config.json has none of {', '.join(k.split('.', 1)[1] for k in c.keys)} (the {self.name} family's '{c.name}')",
                        f"add the key to config.json, or give '{c.name}' a default in {self.file}",
                    )
                )
                continue
            if isinstance(found, float) and found.is_integer():
                found = int(found)
            # NB: a float (InternVL's downsample_ratio 0.5) may be compared in `requires` and
            # derivations; formula inputs take integers and booleans only, which resolve checks.
            if not isinstance(found, (int, bool, str, float)):
                problems.append(
                    Diagnostic(
                        "E713",
                        "",
                        0,
                        0,
                        "",
                        f"{where}: config value {origin[c.name]} = {found!r} is not a number, boolean or string (the {self.name} family's '{c.name}')",
                        f"check config.json against {self.file}",
                    )
                )
                continue
            values[c.name] = found
        if problems:
            raise MemspecError(problems)
        unmet = [r for r in self.requires if not r.check(values)]
        if unmet:
            raise MemspecError(
                [
                    Diagnostic(
                        "E713",
                        "",
                        0,
                        0,
                        "",
                        f"{where}: not supported by the {self.name} family: {r.check.source} is false ({r.message})",
                        f"the values read: {_show_names(values, r.check.names)}; a family for this variant is a new file in specs/families/ (docs/adding-a-family.md)",
                    )
                    for r in unmet
                ]
            )
        return Values(values, origin)


_FILES = {"config": "config.json", "processor": "preprocessor_config.json"}  # a key's root -> the file it reads


def _first(keys, roots: Mapping[str, Any]) -> tuple[Any, str | None, tuple | None]:
    """The value of the first of `keys` present: (value, where it was read, None), or
    (_MISSING, None, (root, key, _NotAMapping)) where a key ran into a sub-config that is no
    mapping and no other key gave a value, (_MISSING, None, None) where none is set."""
    through = None
    for key in keys:
        root, *parts = key.split(".")
        try:
            found = _lookup(roots[root], parts)
        except _NotAMapping as bad:
            # NB: another key may read it (processor size 224 where size.height is first)
            through = through or (root, key, bad)
            continue
        if found is not _MISSING:
            return found, f"{_FILES[root]} {key.split('.', 1)[1]}", None
    return _MISSING, None, through


def _not_a_mapping(where: str, root: str, bad: "_NotAMapping", family: str, name: str, key: str) -> Diagnostic:
    return Diagnostic(
        "E713",
        "",
        0,
        0,
        "",
        f"{where}: {_FILES[root]} {bad.where} = {bad.value!r} is not a mapping (the {family} family's '{name}' reads {key.split('.', 1)[1]})",
        f"{bad.where} holds a sub-config, a JSON object, or null for Hugging Face's defaults",
    )


class _NotAMapping(Exception):
    """A key's path runs through a value that is no sub-config: `where` (dotted) holds `value`."""

    def __init__(self, where: str, value: Any):
        super().__init__(where)
        self.where, self.value = where, value


def _lookup(data: Any, parts: list[str]) -> Any:
    """The value at `parts`, _MISSING where a key on the way is absent or null (Hugging Face's
    defaults then apply); _NotAMapping where one holds a value that is neither a mapping nor,
    before an index, a list (text_config: "x")."""
    for i, part in enumerate(parts):
        if isinstance(data, list) and part.isdigit():
            if int(part) >= len(data):
                return _MISSING
            data = data[int(part)]  # a list item by index: vision_config.patch_size.0 of [14, 14]
        elif isinstance(data, Mapping):
            if data.get(part) is None:
                return _MISSING
            data = data[part]
        elif part.isdigit():
            return _MISSING  # NB: a scalar where a list may be (patch_size 14 or [14, 14]): the key's alternative reads it
        else:
            raise _NotAMapping(".".join(parts[:i]), data)
    return _MISSING if data is None else data


def _show_names(values: Mapping[str, Any], names) -> str:
    return ", ".join(f"{n} = {values[n]!r}" for n in sorted(names) if n in values)


@dataclass(frozen=True)
class Families:
    by_model_type: Mapping[str, Family]
    folder: str

    def get(self, model_type: Any, where: str, config: Mapping[str, Any] | None = None) -> Family:
        """The family for a config.json's model_type; one listed as "model_type/vision_type"
        (LLaVA with a Pixtral tower: "llava/pixtral") wins for a config whose
        vision_config.model_type is vision_type. A config with a `visual` block and no
        vision_config (Qwen-VL's remote code, model_type "qwen") has vision_type "visual"; a
        vision_config without a model_type (GLM-4V-9B's remote code, model_type "chatglm") has
        vision_type "vision_config". A LLaVA conversion marked is_yi_vl_derived_model (Yi-VL's
        -hf checkpoints, whose projector has LayerNorms) has vision_type "yi_vl". An
        InternLM-XComposer2 config (model_type "internlmxcomposer2") with img_size 336 has
        vision_type "hd336" (InternLM-XComposer2-4KHD's 336 px HD crops). A config of
        the original LLaVA repository's (mm_vision_tower and no vision_config: Yi-VL's own
        01-ai checkpoints) is refused, E713: its tower's config is not in config.json. A config
        without model_type goes by its first architecture; CogVLMForCausalLM with Vicuna's
        vocab_size 32000 (CogVLM v1) has vision_type "cogvlm"."""
        by_architecture = model_type is None and isinstance((config or {}).get("architectures"), list) and bool(config["architectures"])
        if by_architecture:
            # NB: CogVLM2's remote CogVLMConfig declares no model_type, so its config.json has
            # none: such a config is looked up by its first architecture (CogVLMForCausalLM)
            model_type = config["architectures"][0]
        vision = (config or {}).get("vision_config")
        vision_type = vision.get("model_type", "vision_config") if isinstance(vision, Mapping) else None
        if vision is None and isinstance((config or {}).get("visual"), Mapping):
            vision_type = "visual"
        if model_type == "CogVLMForCausalLM" and (config or {}).get("vocab_size") == 32000:
            vision_type = "cogvlm"  # CogVLM (v1): Vicuna's vocabulary, its own remote code (CogVLM2's is Llama-3's 128256)
        if (config or {}).get("is_yi_vl_derived_model") is True:
            vision_type = "yi_vl"
        if model_type == "internlmxcomposer2" and (config or {}).get("img_size") == 336:
            vision_type = "hd336"
        if vision is None and isinstance((config or {}).get("mm_vision_tower"), str):
            raise _original_llava(config, where)
        family = None
        if isinstance(model_type, str) and isinstance(vision_type, str):
            family = self.by_model_type.get(f"{model_type}/{vision_type}")
        if family is None and isinstance(model_type, str):
            family = self.by_model_type.get(model_type)
        if family is None:
            known = sorted(self.by_model_type)
            shown = f"'{model_type}'" if isinstance(model_type, str) else "missing"
            shown = f"missing, and its architecture {shown}" if by_architecture else shown
            hint = did_you_mean(model_type, known) if isinstance(model_type, str) else None
            raise MemspecError(
                Diagnostic(
                    "E708",
                    "",
                    0,
                    0,
                    "",
                    f"{where}: model_type {shown} is not covered by any family (covered: {', '.join(known)})",
                    (hint + " " if hint else "") + f"a family is one YAML file in {self.folder}/ (docs/adding-a-family.md)",
                )
            )
        return family


def _original_llava(config: Mapping[str, Any], where: str) -> MemspecError:
    """E713 for a config.json in the original LLaVA repository's form (LlavaLlamaForCausalLM)."""
    shown = ", ".join(f"{k} {config[k]!r}" for k in ("model_type", "mm_vision_tower", "mm_projector_type") if k in config)
    return MemspecError(
        Diagnostic(
            "E713",
            "",
            0,
            0,
            "",
            f"{where}: a config.json of the original LLaVA code ({shown}, no vision_config): the vision tower's config is not in it, and the checkpoint's names (model.mm_projector.*) are not transformers' LlavaForConditionalGeneration's",
            "import the transformers conversion instead (Yi-VL: BUAADreamer/Yi-VL-6B-hf or -34B-hf; LLaVA-1.5: llava-hf/llava-1.5-7b-hf), or estimate a LLaVA launch script (README, From your launch script)",
        )
    )


# --------------------------------------------------------------------------- loading

_TEMPLATE_HOLE = re.compile(r"\{\{(.*?)\}\}", re.S)


def _compile_template(value: str, doc: Document, path: str, declared: frozenset[str], problems: list[Diagnostic]) -> Template:
    """A string whose `{{ expr }}` holes are checked like formula expressions."""
    rest = _TEMPLATE_HOLE.sub("", value)
    if "{%" in rest or "{#" in rest:
        problems.append(doc.diag("E403", path, f"'{value}': only {{{{ expr }}}} holes are allowed"))
    for hole in _TEMPLATE_HOLE.findall(value):
        compile_expr(hole.strip(), doc, path, declared, problems)
    return Template(value, doc.file, path)


def _compile_family(doc: Document, problems: list[Diagnostic]) -> Family:
    data = doc.data
    stem = Path(doc.file).stem
    if data["family"] != stem:
        problems.append(doc.diag("E206", "$.family", f"family '{data['family']}' must equal the file stem '{stem}'"))
    declared: set[str] = set()
    config = []
    for name, entry in data["config"].items():
        path = child_path("$.config", name)
        derive = None
        if "derive" in entry:
            derive = compile_expr(entry["derive"], doc, child_path(path, "derive"), frozenset(declared), problems)
        config.append(ConfigValue(name, tuple(entry.get("keys", ())), entry.get("default", _MISSING), derive, path))
        declared.add(name)
    names = frozenset(declared)
    requires = tuple(
        Requirement(compile_expr(r["check"], doc, child_path(child_path("$.requires", i), "check"), names, problems), r["message"])
        for i, r in enumerate(data.get("requires") or ())
    )
    image_tokens = compile_expr(data["image_tokens"], doc, "$.image_tokens", names, problems)
    with_tokens = names | {"image_tokens"}
    modules = []
    for name, m in data["modules"].items():
        path = child_path("$.modules", name)
        inputs = {k: compile_expr(v, doc, child_path(child_path(path, "inputs"), k), with_tokens, problems) for k, v in m["inputs"].items()}
        context = {k: _compile_template(m["context"][k], doc, child_path(child_path(path, "context"), k), with_tokens, problems) for k in ("batch", "seq")}
        modules.append(FamilyModule(name, m["type"], inputs, context, tuple(m["tensors"]), m.get("trainable"), m.get("doc")))
    summary = _compile_template(data["summary"], doc, "$.summary", with_tokens | {"repo"}, problems)
    anyres = None
    if "anyres" in data:
        a = data["anyres"]
        anyres = AnyresMapping(
            compile_expr(a["tile"], doc, "$.anyres.tile", names, problems),
            a["grid_pinpoints"],
            tuple(compile_expr(x, doc, child_path("$.anyres.image_size", i), names, problems) for i, x in enumerate(a["image_size"])),
        )
    image_resize = None
    if "image_resize" in data:
        r = data["image_resize"]
        image_resize = ImageResizeMapping(
            *(compile_expr(r[k], doc, child_path("$.image_resize", k), names, problems) for k in ("factor", "min_pixels", "max_pixels"))
        )
    return Family(
        name=data["family"],
        file=doc.file,
        summary=summary,
        model_types=tuple(data["model_types"]),
        config=tuple(config),
        requires=requires,
        image_tokens=image_tokens,
        modules=tuple(modules),
        ignore_tensors=tuple(data.get("ignore_tensors") or ()),
        notes=tuple(data.get("notes") or ()),
        doc=doc,
        anyres=anyres,
        image_resize=image_resize,
        video_temporal_patch=(
            compile_expr(data["video_temporal_patch"], doc, "$.video_temporal_patch", names, problems) if "video_temporal_patch" in data else None
        ),
        vision_chunk=(
            VisionChunkMapping(*(compile_expr(data["vision_chunk"][k], doc, child_path("$.vision_chunk", k), names, problems) for k in VISION_CHUNK_KEYS))
            if "vision_chunk" in data
            else None
        ),
        attention=(
            compile_expr(data["attention"], doc, "$.attention", names, problems)
            if isinstance(data.get("attention"), str)
            else tuple(data.get("attention") or ())
        ),
        encoder_decoder=bool(data.get("encoder_decoder")),
    )


def load_family(path: str | Path) -> Family:
    """One family file, validated and compiled."""
    from ..pipeline.validate import load_schema, validate

    doc = load_yaml(path)
    problems = validate(doc, load_schema("family"))
    if problems:
        raise MemspecError(problems)
    problems = []
    family = _compile_family(doc, problems)
    if problems:
        raise MemspecError(problems)
    return family


def load_families(folder: str | Path) -> Families:
    problems: list[Diagnostic] = []
    by_type: dict[str, Family] = {}
    for path in sorted(Path(folder).glob("*.yaml")):
        try:
            family = load_family(display(path))
        except MemspecError as exc:
            problems.extend(exc.diagnostics)
            continue
        for i, model_type in enumerate(family.model_types):
            if model_type in by_type:
                problems.append(
                    family.doc.diag("E207", child_path("$.model_types", i), f"model_type '{model_type}' is already covered by {by_type[model_type].file}")
                )
            by_type[model_type] = family
    if problems:
        raise MemspecError(problems)
    return Families(by_type, display(Path(folder)))
