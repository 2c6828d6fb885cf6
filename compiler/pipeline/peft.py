"""peft's rules, read by expand: which linear layers LoRA adapts (`lora_target`), which
bitsandbytes quantizes (`quantized`), which module a modules_to_save name replaces
(`saved_name`, `save_matches`) and what it must not (E320, E322), and where bias='all' trains
a tensor the formula gives (`bias_elements`, E323).

Contract: pure functions of the setup's `lora` / `quantization` blocks and a layer's memspec
path (`language.layers[3].self_attn.q_proj`), matched by peft's and transformers' own rules
(suffix matching on the dotted name); no instance is built here.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ..errors import Diagnostic, MemspecError, did_you_mean
from ..library.formula import Formula, integer
from .vocabulary import Setup


# peft matches modules_to_save by the module's full name ending with the given name (a plain
# string suffix: utils/other.py _set_trainable, `key.endswith(target_key)`). memspec matches
# the same rule against its layer paths (`language.layers.3.mlp`) and, for a whole module,
# the name Hugging Face gives it in the model of its layer type.
MODULE_NAMES: Mapping[str, tuple[str, ...]] = {
    "mlp_projector": ("model.multi_modal_projector",),  # LlavaForConditionalGeneration
    "llava_next_projector": ("model.multi_modal_projector",),  # LlavaNextForConditionalGeneration
    "clip_vision_tower": ("model.vision_tower",),
}


def save_matches(target: str, path: str, layer_type: str | None = None) -> bool:
    """Whether the modules_to_save name `target` matches the instance at `path` (a module root
    gives its layer type, for its Hugging Face name)."""
    names = (re.sub(r"\[(\d+)\]", r".\1", path),) + (MODULE_NAMES.get(layer_type, ()) if layer_type else ())
    return any(n.endswith(target) for n in names)


def saved_name(lora, path: str, layer_type: str | None = None) -> str | None:
    """The modules_to_save name that matches the instance at `path`, or None."""
    if lora is None or not lora.modules_to_save:
        return None
    hits = [t for t in lora.modules_to_save if save_matches(t, path, layer_type)]
    return hits[0] if hits else None


def save_error(setup: Setup, target: str, code: str, message: str, help: str) -> MemspecError:
    names = setup.lora.modules_to_save
    i = names.index(target) if target in names else 0
    file, line, col, where = setup.lora.saves_at[i] if i < len(setup.lora.saves_at) else (setup.file, 0, 0, "$.lora.modules_to_save")
    return MemspecError(Diagnostic(code, file, line, col, where, message, help))


def bias_elements(formula: Formula, scope: Mapping[str, Any]) -> int:
    """Bytes of a layer's parameter tensors named `bias` (peft's bias='all' matches a parameter
    named `bias` or ending in `.bias`: tuners_utils._mark_only_adapters_as_trainable)."""
    return sum(integer(e, e(scope)) for e, name in zip(formula.param_tensors, formula.param_names) if name == "bias")


# Layer types whose parameters named `bias` are not a tensor of their own in the formula
# (the whole attention head as one block, bitsandbytes' layers): bias='all' is refused there.
BIAS_UNSPLIT = ("siglip_attention_head", "linear_4bit", "linear_8bit")


def check_bias_modelled(setup: Setup, formula: Formula, scope: Mapping[str, Any], path: str) -> None:
    if formula.layer_type in BIAS_UNSPLIT and (formula.layer_type == "siglip_attention_head" or scope.get("bias")):
        file, line, col, where = setup.lora.bias_at or (setup.file, 0, 0, "$.lora.bias")
        raise MemspecError(
            Diagnostic(
                "E323",
                file,
                line,
                col,
                where,
                f"peft bias='{setup.lora.bias}' would train the biases of '{path}' ({formula.layer_type}), whose formula does not give them as a tensor of their own",
                "use bias: none, or adapt another module (lora.modules)",
            )
        )


# Layer types that are nn.Linear subclasses with a forward of their own, which peft would wrap
# as a plain linear (lora.Linear over the whole module, under all-linear its own linears too):
# InternLM-XComposer2's Partial LoRA (PLoRA.forward(x, im_mask)). Not modelled.
NOT_ADAPTABLE = ("plora_linear",)


def peft_problems(setup: Setup, roots: tuple, matched: set) -> list[Diagnostic]:
    """What expand's instances `roots` show of the LoRA setup: a LoRA target that is a layer of a
    NOT_ADAPTABLE type (E326), a modules_to_save name that matches nothing (E320)."""
    if setup.lora is None:
        return []
    return _unadaptable(setup, roots)[:1] + _reached_elsewhere(setup, roots) + unmatched_saves(setup, roots, matched)


# Root layer types whose recipes hand peft the whole model with bare target names (CogVLM2's
# finetune demo: get_peft_model on CogVLMForCausalLM), and per other module's layer type the
# checkpoint names of its adaptable layers there, with whether each is an nn.Linear (peft's
# all-linear takes those, not the convs). peft's suffix rule reaches them from any target that
# names them; memspec adapts lora.modules only, so such a target is refused (E335) while their
# module is not in lora.modules.
WHOLE_MODEL_TARGETS: Mapping[str, Mapping[str, tuple[tuple[str, bool], ...]]] = {
    "cogvlm_causal_lm": {
        "eva2clip_vision_tower": (
            ("model.vision.transformer.layers.0.attention.query_key_value", True),
            ("model.vision.transformer.layers.0.attention.dense", True),
            ("model.vision.transformer.layers.0.mlp.fc1", True),
            ("model.vision.transformer.layers.0.mlp.fc2", True),
            ("model.vision.patch_embedding.proj", False),
        ),
        "glm4v9b_projector": (
            ("model.vision.linear_proj.linear_proj", True),
            ("model.vision.linear_proj.gate_proj", True),
            ("model.vision.linear_proj.dense_h_to_4h", True),
            ("model.vision.linear_proj.dense_4h_to_h", True),
            ("model.vision.conv", False),
        ),
    },
}


def _reached_elsewhere(setup: Setup, roots: tuple) -> list[Diagnostic]:
    """E335 for each LoRA target that peft would also match in a module outside lora.modules,
    where the model's recipes wrap the whole model (WHOLE_MODEL_TARGETS)."""
    lora, out = setup.lora, []
    for root in roots:
        table = WHOLE_MODEL_TARGETS.get(root.formula.layer_type)
        if table is None or root.module not in lora.modules:
            continue
        for other in (r for r in roots if r.module not in lora.modules):
            names = table.get(other.formula.layer_type, ())
            targets = ("all-linear",) if lora.target_modules == "all-linear" else lora.target_modules
            for t in targets:
                hits = [n for n, linear in names if (linear if t == "all-linear" else n == t or n.endswith("." + t))]
                if hits:
                    out.append(
                        Diagnostic(
                            "E335",
                            setup.file,
                            0,
                            0,
                            "$.lora.target_modules",
                            f"LoRA target '{t}' also matches {other.module}'s {', '.join(hits)} (peft matches target names over the whole model), "
                            f"which lora.modules ({', '.join(sorted(lora.modules))}) leaves out: not modelled",
                            f"add {other.module} to lora.modules (its adapters are then counted), or name only the language model's linears "
                            "(vision_expert_query_key_value, language_expert_query_key_value, vision_expert_dense, language_expert_dense, up_proj, down_proj)",
                        )
                    )
    return sorted(out, key=lambda d: d.message)


def _unadaptable(setup: Setup, roots: tuple) -> list[Diagnostic]:
    """E326 for each LoRA target of a NOT_ADAPTABLE type. NB: a Partial LoRA child is
    `<name>_plora` in the layer table, beside the plain `<name>` of the other families'
    formulas; the checkpoint and peft call it `<name>`."""
    out = []
    for root in roots:
        stack = list(root.children)
        while stack:
            inst = stack.pop()
            stack.extend(inst.children)
            plain = re.sub(r"_plora$", "", inst.path)
            if inst.formula.layer_type in NOT_ADAPTABLE and (lora_target(setup.lora, root.path, inst.path) or lora_target(setup.lora, root.path, plain)):
                out.append(
                    Diagnostic(
                        "E326",
                        setup.file,
                        0,
                        0,
                        "$.lora.target_modules",
                        f"LoRA on '{inst.path}', a {inst.formula.layer_type}: peft would wrap the whole module as a plain linear "
                        "and adapt its own linears too, which is not modelled",
                        "train without LoRA (the model's own Partial LoRA trains with the language model), or target other modules",
                    )
                )
    return sorted(out, key=lambda d: d.message)


def unmatched_saves(setup: Setup, roots: tuple, matched: set) -> list[Diagnostic]:
    """A modules_to_save name that matches nothing among `roots` (expand's instances): peft
    would silently train nothing extra, memspec says so (E320), with the names that exist."""
    if setup.lora is None:
        return []
    out = []
    for i, target in enumerate(setup.lora.modules_to_save):
        if target in matched:
            continue
        names = []
        for r in roots:
            names.extend(MODULE_NAMES.get(r.formula.layer_type, ()))
            names.append(r.path)
            names.extend(c.path.split(".", 1)[1] for c in r.children if "." in c.path)
        known = list(dict.fromkeys(re.sub(r"\[\d+\]", "", n) for n in names))
        file, line, col, where = setup.lora.saves_at[i] if i < len(setup.lora.saves_at) else (setup.file, 0, 0, "$.lora.modules_to_save")
        out.append(
            Diagnostic(
                "E320",
                file,
                line,
                col,
                where,
                f"modules_to_save '{target}' matches no module (peft matches a module whose full name ends with it)",
                did_you_mean(target, known) or f"modules: {', '.join(known)}",
            )
        )
    return out


# peft's `all-linear` skips the model's output embedding (tuners_utils
# `_maybe_include_all_linear_layers`: get_output_embeddings()); in memspec's specs it is the
# language model's `lm_head` child.
OUTPUT_EMBEDDING = "lm_head"


# Root layer types whose linears of these names peft does not adapt as linears: for the model
# types transformers' conversion mapping makes qwen2_moe-like (deepseek_v2), peft 0.21 turns a
# target named gate_proj, up_proj or down_proj into target_parameters on the stacked routed
# experts (utils/transformers_weight_conversion.py, _convert_peft_config_moe), adapted through
# ParamWrapper with merged [E, 2f, h] / [E, h, f] weights the grouped GEMMs save; the dense
# MLPs and shared experts of those names stay unadapted. Not modelled: refused (E334).
RETARGETED: Mapping[str, tuple[str, ...]] = {
    "deepseek_causal_lm": ("gate_proj", "up_proj", "down_proj"),
}


def check_not_retargeted(setup: Setup, root_type: str | None, path: str, name: str) -> None:
    """E334 where peft would move the LoRA target at `path` (a linear named `name`) to the
    stacked experts of a model whose root layer type is `root_type` (RETARGETED)."""
    if name in RETARGETED.get(root_type or "", ()):
        raise MemspecError(
            Diagnostic(
                "E334",
                setup.file,
                0,
                0,
                "$.lora.target_modules",
                f"LoRA on '{path}': for this model type peft moves targets named {', '.join(RETARGETED[root_type])} "
                "to the stacked routed experts (target_parameters through ParamWrapper), which is not modelled",
                "name the attention projections (target_modules: [q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj]; "
                "q_a_proj and q_b_proj where the model has them)",
            )
        )


def lora_target(lora, module: str, path: str) -> bool:
    """Whether peft adapts the linear layer at `path` (memspec path, `layers[3]` indices).

    peft matches a module whose name equals a target or ends with `.<target>`
    (tuners_utils.check_target_module_exists); memspec restricts that to `lora.modules`.
    """
    if module not in lora.modules:
        return False
    dotted = re.sub(r"\[(\d+)\]", r".\1", path)
    if lora.target_modules == "all-linear":
        return dotted.rsplit(".", 1)[-1] != OUTPUT_EMBEDDING
    return any(dotted == t or dotted.endswith("." + t) for t in lora.target_modules)


def quantized(q, module: str, parent_type: str, name: str, path: str) -> bool:
    """Whether transformers' replace_with_bnb_linear makes the linear at `path` a bitsandbytes
    one: every nn.Linear of the quantized modules but the output embedding and
    llm_int8_skip_modules; inside a LoRA wrapper only the base layer (the adapters are added
    after quantization, in the compute dtype)."""
    if module not in q.modules:
        return False
    if parent_type in ("lora_linear", "dora_linear"):
        return name == "base_layer"
    dotted = re.sub(r"\[(\d+)\]", r".\1", path)
    if dotted.rsplit(".", 1)[-1] == OUTPUT_EMBEDDING:
        return False
    return not any(dotted == s or dotted.endswith("." + s) or f".{s}." in f".{dotted}." for s in q.skip_modules)
