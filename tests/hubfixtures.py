"""Header-only safetensors checkpoints for the import tests, and the script that writes them.

`python tests/hubfixtures.py` rewrites `tests/fixtures/hub/<name>/`: each model's real
config.json (copied from the hub repos, as of their current main), and the real tensor names,
dtypes, shapes and shard layout in safetensors headers with no data section: the 8-byte
little-endian header length, then the JSON header, whose data_offsets are consistent (each
tensor spans its dtype size x its elements, back to back from 0) as if the data followed.
`sparse_copy` appends that data section as a hole, so that `safetensors.safe_open` accepts a
fixture without the file taking disk space.

NB: the header's order of names and the split into shards follow the hub's files only
roughly; reconciliation depends on neither.
"""

from __future__ import annotations

import json
import shutil
import sys
from math import prod
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "hub"
DTYPE_BYTES = {"F16": 2, "BF16": 2, "F32": 4, "U8": 1, "I64": 8, "BOOL": 1}


# --------------------------------------------------------------------------- tensor lists


def edited_copy(fixture: Path, folder: Path, edit, file: str = "config.json") -> str:
    """A copy of the fixture folder `fixture` at `folder` whose `file` (config.json, or
    preprocessor_config.json) `edit(data)` changed in place (a variant the family must refuse);
    the copy's path."""
    shutil.copytree(fixture, folder)
    data = json.loads((folder / file).read_text())
    edit(data)
    (folder / file).write_text(json.dumps(data))
    return str(folder)


def modules(spec) -> dict:
    """A resolved spec's modules as `memspec import` writes them: name -> (inputs, parameters),
    to hold a checked-in spec to what importing its fixture gives."""
    return {m.name: (dict(m.inputs), m.parameters) for m in spec.modules}


def contexts(spec, image_h: int, image_w: int, micro_batch: int = 1) -> dict:
    """The vision and projector modules' (batch, seq) in a resolved spec for one image of
    image_h x image_w per sample at seq_len 4096, as their context expressions give them."""
    scope = {"micro_batch": micro_batch, "images_per_sample": 1, "image_h": image_h, "image_w": image_w, "seq_len": 4096}
    return {m.name: (m.batch({**scope, **m.inputs}), m.seq({**scope, **m.inputs})) for m in spec.modules if m.name in ("vision", "projector")}


def meta_build(builder, fixture: Path):
    """(config, model): a measuring builder's (compiler.measure.families) model of the fixture,
    built on the meta device."""
    import torch

    config = builder.load_config(fixture / "config.json")
    with torch.device("meta"):
        return config, builder.model_class()._from_config(config)


def module_counts(builder, model) -> dict:
    """Parameters per experiment module of a builder's model (builder.module_groups), a tensor
    two of a module's submodules share (a tied head) counted once."""
    return {name: sum(p.numel() for p in {id(p): p for m in mods for p in m.parameters()}.values()) for name, mods in builder.module_groups(model).items()}


def imported_counts(fixture: Path, family: str) -> dict:
    """Per-module parameter counts of the fixture imported as `family`, the safetensors header's
    (asserted equal to the formulas' count of the spec written)."""
    from compiler.inputs import importer

    imported = importer.import_spec(str(fixture))
    assert imported.family == family
    assert importer.formula_counts(imported.spec) == imported.header_parameters
    return imported.header_parameters


def refusal(fixture: Path, folder: Path, where: str, key: str, value, file: str = "config.json") -> str:
    """The message `memspec import` refuses a copy of `fixture` with: `key` set to `value` in
    `file` (in its `where` sub-object, e.g. vision_config; "" for the top level). Raises
    AssertionError when the import succeeds."""
    from compiler.errors import MemspecError
    from compiler.inputs import importer

    def edit(data):
        (data[where] if where else data)[key] = value

    try:
        importer.import_spec(edited_copy(fixture, folder, edit, file))
    except MemspecError as err:
        return str(err)
    raise AssertionError(f"{fixture.name} with {file} {where}.{key} = {value!r} was imported, not refused")


def llama_tensors(
    c: dict,
    prefix: str = "model.",
    head: str | None = "lm_head.weight",
    dtype: str = "F16",
    inv_freq: bool = False,
    qkv_bias: bool = False,
    qk_norm: bool = False,
    fused: bool = False,
    moe: str | None = None,
) -> list[tuple[str, str, list[int]]]:
    """A Llama-style decoder's tensors; `qkv_bias` (Qwen2), `qk_norm` (Qwen3), `fused`
    (Phi-3: one qkv_proj and one gate_up_proj) and `moe` (a sparse MoE block in place of the
    MLP, in the layout of the named family's checkpoints) are the variants' differences."""
    h, inter, nh = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    nkv = c.get("num_key_value_heads") or nh
    hd = c.get("head_dim") or h // nh
    out = [(f"{prefix}embed_tokens.weight", dtype, [c["vocab_size"], h])]
    for i in range(c["num_hidden_layers"]):
        p = f"{prefix}layers.{i}."
        out.append((p + "input_layernorm.weight", dtype, [h]))
        if fused:
            out.append((p + "self_attn.qkv_proj.weight", dtype, [(nh + 2 * nkv) * hd, h]))
        else:
            for proj, rows in (("q_proj", nh * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)):
                out.append((p + f"self_attn.{proj}.weight", dtype, [rows, h]))
                if qkv_bias:
                    out.append((p + f"self_attn.{proj}.bias", dtype, [rows]))
        if qk_norm:
            out += [(p + "self_attn.q_norm.weight", dtype, [hd]), (p + "self_attn.k_norm.weight", dtype, [hd])]
        out += [
            (p + "self_attn.o_proj.weight", dtype, [h, nh * hd]),
            (p + "post_attention_layernorm.weight", dtype, [h]),
        ]
        if moe == "qwen3_moe":  # mlp: the router, then gate_proj, up_proj, down_proj per expert
            m, f = p + "mlp.", c["moe_intermediate_size"]
            out.append((m + "gate.weight", dtype, [c["num_experts"], h]))
            for e in range(c["num_experts"]):
                out += [
                    (m + f"experts.{e}.gate_proj.weight", dtype, [f, h]),
                    (m + f"experts.{e}.up_proj.weight", dtype, [f, h]),
                    (m + f"experts.{e}.down_proj.weight", dtype, [h, f]),
                ]
        elif moe == "qwen2_moe":  # mlp: the router, the routed experts as Qwen3-MoE's, the shared expert and its gate
            m, f, fs = p + "mlp.", c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
            out.append((m + "gate.weight", dtype, [c["num_experts"], h]))
            for e in range(c["num_experts"]):
                out += [
                    (m + f"experts.{e}.gate_proj.weight", dtype, [f, h]),
                    (m + f"experts.{e}.up_proj.weight", dtype, [f, h]),
                    (m + f"experts.{e}.down_proj.weight", dtype, [h, f]),
                ]
            out += [
                (m + "shared_expert.gate_proj.weight", dtype, [fs, h]),
                (m + "shared_expert.up_proj.weight", dtype, [fs, h]),
                (m + "shared_expert.down_proj.weight", dtype, [h, fs]),
                (m + "shared_expert_gate.weight", dtype, [1, h]),
            ]
        elif moe == "mixtral":  # block_sparse_moe: the router, then w1 (gate), w2 (down), w3 (up) per expert
            m = p + "block_sparse_moe."
            out.append((m + "gate.weight", dtype, [c["num_local_experts"], h]))
            for e in range(c["num_local_experts"]):
                out += [
                    (m + f"experts.{e}.w1.weight", dtype, [inter, h]),
                    (m + f"experts.{e}.w2.weight", dtype, [h, inter]),
                    (m + f"experts.{e}.w3.weight", dtype, [inter, h]),
                ]
        elif fused:
            out.append((p + "mlp.gate_up_proj.weight", dtype, [2 * inter, h]))
        else:
            out += [(p + "mlp.gate_proj.weight", dtype, [inter, h]), (p + "mlp.up_proj.weight", dtype, [inter, h])]
        if moe is None:
            out.append((p + "mlp.down_proj.weight", dtype, [h, inter]))
        if inv_freq:  # a buffer that checkpoints saved before transformers 4.31 made it non-persistent
            out.append((p + "self_attn.rotary_emb.inv_freq", "F32", [hd // 2]))
    out.append((f"{prefix}norm.weight", dtype, [h]))
    if head:
        out.append((head, dtype, [c["vocab_size"], h]))
    return out


def vit_encoder_tensors(v: dict, prefix: str, dtype: str) -> list[tuple[str, str, list[int]]]:
    """The encoder layers and post-layernorm CLIP and SigLIP towers share (names and shapes)."""
    h, inter = v["hidden_size"], v["intermediate_size"]
    out = []
    for i in range(v["num_hidden_layers"]):
        q = f"{prefix}encoder.layers.{i}."
        for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
            out += [(q + f"self_attn.{proj}.weight", dtype, [h, h]), (q + f"self_attn.{proj}.bias", dtype, [h])]
        out += [
            (q + "layer_norm1.weight", dtype, [h]),
            (q + "layer_norm1.bias", dtype, [h]),
            (q + "mlp.fc1.weight", dtype, [inter, h]),
            (q + "mlp.fc1.bias", dtype, [inter]),
            (q + "mlp.fc2.weight", dtype, [h, inter]),
            (q + "mlp.fc2.bias", dtype, [h]),
            (q + "layer_norm2.weight", dtype, [h]),
            (q + "layer_norm2.bias", dtype, [h]),
        ]
    out += [(prefix + "post_layernorm.weight", dtype, [h]), (prefix + "post_layernorm.bias", dtype, [h])]
    return out


def clip_tensors(v: dict, prefix: str, dtype: str) -> list[tuple[str, str, list[int]]]:
    h, p, size = v["hidden_size"], v["patch_size"], v["image_size"]
    e = prefix + "embeddings."
    out = [
        (e + "class_embedding", dtype, [h]),
        (e + "patch_embedding.weight", dtype, [h, v.get("num_channels", 3), p, p]),
        (e + "position_embedding.weight", dtype, [(size // p) ** 2 + 1, h]),
        (prefix + "pre_layrnorm.weight", dtype, [h]),
        (prefix + "pre_layrnorm.bias", dtype, [h]),
    ]
    return out + vit_encoder_tensors(v, prefix, dtype)


def llava_tensors(c: dict, dtype: str = "F16") -> list[tuple[str, str, list[int]]]:
    t, v = c["text_config"], c["vision_config"]
    projector = [
        ("multi_modal_projector.linear_1.weight", dtype, [t["hidden_size"], v["hidden_size"]]),
        ("multi_modal_projector.linear_1.bias", dtype, [t["hidden_size"]]),
        ("multi_modal_projector.linear_2.weight", dtype, [t["hidden_size"], t["hidden_size"]]),
        ("multi_modal_projector.linear_2.bias", dtype, [t["hidden_size"]]),
    ]
    language = llama_tensors({**t, "vocab_size": t.get("vocab_size", c.get("vocab_size"))}, "language_model.model.", "language_model.lm_head.weight", dtype)
    return language + projector + clip_tensors(v, "vision_tower.vision_model.", dtype)


# the text_config classes' defaults that llava-v1.6's config.json files leave out
LLAMA_DEFAULTS = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32}
MISTRAL_DEFAULTS = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8}
CLIP_DEFAULTS = {"num_channels": 3}


def llava_next_tensors(c: dict, dtype: str = "F16") -> list[tuple[str, str, list[int]]]:
    """llava-hf's llava-v1.6 checkpoints: LLaVA-1.5's layout plus the image_newline [hidden]."""
    t = {**(MISTRAL_DEFAULTS if c["text_config"]["model_type"] == "mistral" else LLAMA_DEFAULTS), **c["text_config"]}
    filled = {**c, "text_config": t, "vision_config": {**CLIP_DEFAULTS, **c["vision_config"]}}
    return llava_tensors(filled, dtype) + [("image_newline", dtype, [t["hidden_size"]])]


def qwen2_vl_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """Qwen2-VL / Qwen2.5-VL as the hub checkpoints store them: model.* (the Qwen2 language
    model), lm_head, visual.* (patch embedding, blocks, merger)."""
    v, qwen25 = c["vision_config"], c["model_type"] == "qwen2_5_vl"
    dim = v["hidden_size"] if qwen25 else v["embed_dim"]
    inter = v["intermediate_size"] if qwen25 else dim * v["mlp_ratio"]
    wide = dim * v["spatial_merge_size"] ** 2
    out = [("visual.patch_embed.proj.weight", dtype, [dim, v.get("in_chans", 3), v["temporal_patch_size"], v["patch_size"], v["patch_size"]])]
    for i in range(v["depth"]):
        b = f"visual.blocks.{i}."
        norms = ["norm1", "norm2"]
        out += [(b + n + ".weight", dtype, [dim]) for n in norms]
        if not qwen25:
            out += [(b + n + ".bias", dtype, [dim]) for n in norms]
        out += [
            (b + "attn.qkv.weight", dtype, [3 * dim, dim]),
            (b + "attn.qkv.bias", dtype, [3 * dim]),
            (b + "attn.proj.weight", dtype, [dim, dim]),
            (b + "attn.proj.bias", dtype, [dim]),
        ]
        if qwen25:
            for proj, shape in (("gate_proj", [inter, dim]), ("up_proj", [inter, dim]), ("down_proj", [dim, inter])):
                out += [(b + f"mlp.{proj}.weight", dtype, shape), (b + f"mlp.{proj}.bias", dtype, [shape[0]])]
        else:
            out += [
                (b + "mlp.fc1.weight", dtype, [inter, dim]),
                (b + "mlp.fc1.bias", dtype, [inter]),
                (b + "mlp.fc2.weight", dtype, [dim, inter]),
                (b + "mlp.fc2.bias", dtype, [dim]),
            ]
    out.append(("visual.merger.ln_q.weight", dtype, [dim]))
    if not qwen25:
        out.append(("visual.merger.ln_q.bias", dtype, [dim]))
    out += [
        ("visual.merger.mlp.0.weight", dtype, [wide, wide]),
        ("visual.merger.mlp.0.bias", dtype, [wide]),
        ("visual.merger.mlp.2.weight", dtype, [c["hidden_size"], wide]),
        ("visual.merger.mlp.2.bias", dtype, [c["hidden_size"]]),
    ]
    language = llama_tensors(c, dtype=dtype)
    h, nkv = c["hidden_size"], c["num_key_value_heads"]
    kv = nkv * h // c["num_attention_heads"]
    for i in range(c["num_hidden_layers"]):  # Qwen2: bias on q, k and v
        p = f"model.layers.{i}.self_attn."
        language += [(p + "q_proj.bias", dtype, [h]), (p + "k_proj.bias", dtype, [kv]), (p + "v_proj.bias", dtype, [kv])]
    return language + out


def qwen3_vl_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """Qwen3-VL as the hub checkpoints store them: model.language_model.* (the Qwen3 language
    model, q/k norms), lm_head unless tied, model.visual.* (patch embedding with bias, the learned
    position table, blocks, the final merger and the DeepStack mergers)."""
    v, t = c["vision_config"], c["text_config"]
    dim, inter, out_dim = v["hidden_size"], v["intermediate_size"], v["out_hidden_size"]
    wide = dim * v["spatial_merge_size"] ** 2
    out = [
        ("model.visual.patch_embed.proj.weight", dtype, [dim, v["in_channels"], v["temporal_patch_size"], v["patch_size"], v["patch_size"]]),
        ("model.visual.patch_embed.proj.bias", dtype, [dim]),
        ("model.visual.pos_embed.weight", dtype, [v["num_position_embeddings"], dim]),
    ]
    for i in range(v["depth"]):
        b = f"model.visual.blocks.{i}."
        for n in ("norm1", "norm2"):
            out += [(b + n + ".weight", dtype, [dim]), (b + n + ".bias", dtype, [dim])]
        out += [
            (b + "attn.qkv.weight", dtype, [3 * dim, dim]),
            (b + "attn.qkv.bias", dtype, [3 * dim]),
            (b + "attn.proj.weight", dtype, [dim, dim]),
            (b + "attn.proj.bias", dtype, [dim]),
            (b + "mlp.linear_fc1.weight", dtype, [inter, dim]),
            (b + "mlp.linear_fc1.bias", dtype, [inter]),
            (b + "mlp.linear_fc2.weight", dtype, [dim, inter]),
            (b + "mlp.linear_fc2.bias", dtype, [dim]),
        ]
    mergers = [("model.visual.merger.", dim)] + [(f"model.visual.deepstack_merger_list.{k}.", wide) for k in range(len(v["deepstack_visual_indexes"]))]
    for m, norm in mergers:
        out += [
            (m + "norm.weight", dtype, [norm]),
            (m + "norm.bias", dtype, [norm]),
            (m + "linear_fc1.weight", dtype, [wide, wide]),
            (m + "linear_fc1.bias", dtype, [wide]),
            (m + "linear_fc2.weight", dtype, [out_dim, wide]),
            (m + "linear_fc2.bias", dtype, [out_dim]),
        ]
    head = None if c.get("tie_word_embeddings") else "lm_head.weight"
    return llama_tensors(t, prefix="model.language_model.", head=head, dtype=dtype, qk_norm=True) + out


def internvl_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """InternVL 2.5 / 3 with a Qwen2 language model (InternViT-300M or InternViT-6B), in either layout: the remote-code
    checkpoints (model_type internvl_chat: vision_model.*, mlp1.*, language_model.model.*,
    language_model.lm_head) or the transformers-native ones (model_type internvl:
    model.vision_tower.*, model.multi_modal_projector.*, model.language_model.*, lm_head)."""
    native = c["model_type"] == "internvl"
    v, t = c["vision_config"], c["text_config" if native else "llm_config"]
    h, inter = v["hidden_size"], v["intermediate_size"]
    patch = v["patch_size"][0] if native else v["patch_size"]
    size = v["image_size"][0] if native else v["image_size"]
    positions = (size // patch) ** 2 + 1
    wide = h * 4  # pixel shuffle 0.5: 2 x 2 patches per token
    rms = v["norm_type"] == "rms_norm"  # InternViT-6B: weight-only RMSNorm, q/k norms, no q/k/v bias
    out = []
    if native:
        e = "model.vision_tower.embeddings."
        out += [
            (e + "cls_token", dtype, [1, 1, h]),
            (e + "position_embeddings", dtype, [1, positions, h]),
            (e + "patch_embeddings.projection.weight", dtype, [h, v["num_channels"], patch, patch]),
            (e + "patch_embeddings.projection.bias", dtype, [h]),
        ]
        for i in range(v["num_hidden_layers"]):
            q = f"model.vision_tower.encoder.layer.{i}."
            for proj in ("q_proj", "k_proj", "v_proj", "projection_layer"):
                out.append((q + f"attention.{proj}.weight", dtype, [h, h]))
                if proj == "projection_layer" or v["attention_bias"]:
                    out.append((q + f"attention.{proj}.bias", dtype, [h]))
            if v["use_qk_norm"]:
                out += [(q + "attention.q_norm.weight", dtype, [h]), (q + "attention.k_norm.weight", dtype, [h])]
            out += [(q + "lambda_1", dtype, [h]), (q + "lambda_2", dtype, [h])]
            for norm in ("layernorm_before", "layernorm_after"):
                out.append((q + f"{norm}.weight", dtype, [h]))
                if not rms:
                    out.append((q + f"{norm}.bias", dtype, [h]))
            out += [
                (q + "mlp.fc1.weight", dtype, [inter, h]),
                (q + "mlp.fc1.bias", dtype, [inter]),
                (q + "mlp.fc2.weight", dtype, [h, inter]),
                (q + "mlp.fc2.bias", dtype, [h]),
            ]
        m = "model.multi_modal_projector."
        projector = [
            (m + "layer_norm.weight", dtype, [wide]),
            (m + "layer_norm.bias", dtype, [wide]),
            (m + "linear_1.weight", dtype, [t["hidden_size"], wide]),
            (m + "linear_1.bias", dtype, [t["hidden_size"]]),
            (m + "linear_2.weight", dtype, [t["hidden_size"], t["hidden_size"]]),
            (m + "linear_2.bias", dtype, [t["hidden_size"]]),
        ]
        language = llama_tensors(t, "model.language_model.", None if c.get("tie_word_embeddings", True) else "lm_head.weight", dtype, qkv_bias=True)
    else:
        e = "vision_model.embeddings."
        out += [
            (e + "class_embedding", dtype, [1, 1, h]),
            (e + "position_embedding", dtype, [1, positions, h]),
            (e + "patch_embedding.weight", dtype, [h, v["num_channels"], patch, patch]),
            (e + "patch_embedding.bias", dtype, [h]),
        ]
        for i in range(v["num_hidden_layers"]):
            q = f"vision_model.encoder.layers.{i}."
            out.append((q + "attn.qkv.weight", dtype, [3 * h, h]))
            if v["qkv_bias"]:
                out.append((q + "attn.qkv.bias", dtype, [3 * h]))
            if v["qk_normalization"]:
                out += [(q + "attn.q_norm.weight", dtype, [h]), (q + "attn.k_norm.weight", dtype, [h])]
            out += [
                (q + "attn.proj.weight", dtype, [h, h]),
                (q + "attn.proj.bias", dtype, [h]),
                (q + "ls1", dtype, [h]),
                (q + "ls2", dtype, [h]),
                (q + "mlp.fc1.weight", dtype, [inter, h]),
                (q + "mlp.fc1.bias", dtype, [inter]),
                (q + "mlp.fc2.weight", dtype, [h, inter]),
                (q + "mlp.fc2.bias", dtype, [h]),
            ]
            for norm in ("norm1", "norm2"):
                out.append((q + f"{norm}.weight", dtype, [h]))
                if not rms:
                    out.append((q + f"{norm}.bias", dtype, [h]))
        projector = [
            ("mlp1.0.weight", dtype, [wide]),
            ("mlp1.0.bias", dtype, [wide]),
            ("mlp1.1.weight", dtype, [t["hidden_size"], wide]),
            ("mlp1.1.bias", dtype, [t["hidden_size"]]),
            ("mlp1.3.weight", dtype, [t["hidden_size"], t["hidden_size"]]),
            ("mlp1.3.bias", dtype, [t["hidden_size"]]),
        ]
        if t["model_type"] == "internlm2":
            language = internlm2_tensors(t, "language_model.", dtype)
        else:
            head = None if t.get("tie_word_embeddings") else "language_model.lm_head.weight"
            language = llama_tensors(t, "language_model.model.", head, dtype, qkv_bias=True)
    return language + projector + out


def llava_onevision_tensors(c: dict, dtype: str = "F16") -> list[tuple[str, str, list[int]]]:
    """llava-hf's llava-onevision checkpoints: language_model.model.* (Qwen2; the 0.5B ties its
    head, so no language_model.lm_head), the projector, SigLIP (no head, post_layernorm kept)
    as vision_tower.vision_model.*, and the image_newline [hidden]."""
    t, v = c["text_config"], c["vision_config"]
    head = None if t.get("tie_word_embeddings") else "language_model.lm_head.weight"
    projector = [
        ("multi_modal_projector.linear_1.weight", dtype, [t["hidden_size"], v["hidden_size"]]),
        ("multi_modal_projector.linear_1.bias", dtype, [t["hidden_size"]]),
        ("multi_modal_projector.linear_2.weight", dtype, [t["hidden_size"], t["hidden_size"]]),
        ("multi_modal_projector.linear_2.bias", dtype, [t["hidden_size"]]),
    ]
    language = llama_tensors(t, "language_model.model.", head, dtype, qkv_bias=True)
    return language + projector + siglip_tensors(v, "vision_tower.vision_model.", dtype) + [("image_newline", dtype, [t["hidden_size"]])]


def gemma_tensors(c: dict, prefix: str = "model.", dtype: str = "F32") -> list[tuple[str, str, list[int]]]:
    """Gemma / Gemma 2 / Gemma 3 text decoders: Llama's projections, tied embeddings (no
    lm_head tensor); Gemma 2 and 3 add pre/post feed-forward norms, Gemma 3 the per-head q/k
    norms."""
    post_norms = c["model_type"] in ("gemma2", "gemma3_text")
    out = [t for t in llama_tensors(c, prefix, head=None, dtype=dtype, qk_norm=c["model_type"] == "gemma3_text")]
    if not post_norms:
        return out
    h, extra = c["hidden_size"], []
    for i in range(c["num_hidden_layers"]):
        p = f"{prefix}layers.{i}."
        extra += [(p + "pre_feedforward_layernorm.weight", dtype, [h]), (p + "post_feedforward_layernorm.weight", dtype, [h])]
    return out + extra


def siglip_tensors(v: dict, prefix: str, dtype: str) -> list[tuple[str, str, list[int]]]:
    """A SigLIP vision tower (SiglipVisionModel, no pooling head) as PaliGemma stores it."""
    h, p, size = v["hidden_size"], v["patch_size"], v.get("image_size", 224)
    e = prefix + "embeddings."
    out = [
        (e + "patch_embedding.weight", dtype, [h, v.get("num_channels", 3), p, p]),
        (e + "patch_embedding.bias", dtype, [h]),
        (e + "position_embedding.weight", dtype, [(size // p) ** 2, h]),
    ]
    return out + vit_encoder_tensors(v, prefix, dtype)


def paligemma_tensors(c: dict, dtype: str) -> list[tuple[str, str, list[int]]]:
    """PaliGemma / PaliGemma 2 in the hub's layout: language_model.model.* (Gemma, tied: no
    lm_head), multi_modal_projector.linear, vision_tower.vision_model.*."""
    t, v = c["text_config"], c["vision_config"]
    text = {"num_key_value_heads": 1, "head_dim": 256, **t}
    language = gemma_tensors(text, prefix="language_model.model.", dtype=dtype)
    projector = [
        ("multi_modal_projector.linear.weight", dtype, [v["projection_dim"], v["hidden_size"]]),
        ("multi_modal_projector.linear.bias", dtype, [v["projection_dim"]]),
    ]
    return language + projector + siglip_tensors(v, "vision_tower.vision_model.", dtype)


def gemma3_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """Gemma 3 (Gemma3ForConditionalGeneration) in the hub's layout: language_model.model.*
    (Gemma 3 text, tied: no lm_head), multi_modal_projector.mm_input_projection_weight
    ([vision hidden, text hidden], a bare parameter) and mm_soft_emb_norm, vision_tower.vision_model.*
    (SigLIP, no head). The text config's unwritten sizes are Gemma3TextConfig's defaults."""
    t, v = c["text_config"], c["vision_config"]
    text = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208, **t}
    language = gemma_tensors(text, prefix="language_model.model.", dtype=dtype)
    projector = [
        ("multi_modal_projector.mm_input_projection_weight", dtype, [v["hidden_size"], t["hidden_size"]]),
        ("multi_modal_projector.mm_soft_emb_norm.weight", dtype, [v["hidden_size"]]),
    ]
    return language + projector + siglip_tensors(v, "vision_tower.vision_model.", dtype)


def idefics3_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """Idefics3 / SmolVLM in the hub's layout: model.vision_model.* (SigLIP, no head),
    model.connector.modality_projection.proj (no bias; its input is the pixel-shuffled
    vision hidden size x scale_factor^2), model.text_model.* (Llama, untied) and lm_head."""
    t, v = c["text_config"], c["vision_config"]
    projector = [("model.connector.modality_projection.proj.weight", dtype, [t["hidden_size"], v["hidden_size"] * c["scale_factor"] ** 2])]
    return siglip_tensors(v, "model.vision_model.", dtype) + projector + llama_tensors(t, prefix="model.text_model.", dtype=dtype)


def deepseek_vl_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """DeepSeek-VL (DeepseekVLForConditionalGeneration) in the -hf conversions' layout:
    model.vision_model.vision_model.* (SiglipVisionModel with its attention-pooling head, which
    the original timm tower carried as attn_pool), model.aligner.linear1 / linear2 (with bias),
    model.language_model.* (Llama) and lm_head (untied)."""
    t, v = c["text_config"], c["vision_config"]
    h, inter = v["hidden_size"], v["intermediate_size"]
    head = "model.vision_model.vision_model.head."
    pooling = [
        (head + "probe", dtype, [1, 1, h]),
        (head + "attention.in_proj_weight", dtype, [3 * h, h]),
        (head + "attention.in_proj_bias", dtype, [3 * h]),
        (head + "attention.out_proj.weight", dtype, [h, h]),
        (head + "attention.out_proj.bias", dtype, [h]),
        (head + "layernorm.weight", dtype, [h]),
        (head + "layernorm.bias", dtype, [h]),
        (head + "mlp.fc1.weight", dtype, [inter, h]),
        (head + "mlp.fc1.bias", dtype, [inter]),
        (head + "mlp.fc2.weight", dtype, [h, inter]),
        (head + "mlp.fc2.bias", dtype, [h]),
    ]
    aligner = [
        ("model.aligner.linear1.weight", dtype, [t["hidden_size"], h]),
        ("model.aligner.linear1.bias", dtype, [t["hidden_size"]]),
        ("model.aligner.linear2.weight", dtype, [t["hidden_size"], t["hidden_size"]]),
        ("model.aligner.linear2.bias", dtype, [t["hidden_size"]]),
    ]
    return siglip_tensors(v, "model.vision_model.vision_model.", dtype) + pooling + aligner + llama_tensors(t, prefix="model.language_model.", dtype=dtype)


def mistral3_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """Mistral 3.1 / 3.2 (Mistral3ForConditionalGeneration) in the released checkpoints' layout:
    vision_tower.* (PixtralVisionModel: patch_conv without bias, ln_pre, transformer.layers.N with
    attention_norm, attention.q/k/v/o_proj, ffn_norm, feed_forward.gate/up/down_proj, no biases),
    multi_modal_projector.* (norm, patch_merger.merging_layer, linear_1, linear_2 without bias),
    language_model.model.* (Mistral) and language_model.lm_head (untied)."""
    t, v = c["text_config"], c["vision_config"]
    h, inter, p, ch = v["hidden_size"], v["intermediate_size"], v["patch_size"], v.get("num_channels", 3)
    merge, d = c.get("spatial_merge_size", 2), t["hidden_size"]
    out = [("vision_tower.patch_conv.weight", dtype, [h, ch, p, p]), ("vision_tower.ln_pre.weight", dtype, [h])]
    for i in range(v["num_hidden_layers"]):
        q = f"vision_tower.transformer.layers.{i}."
        out += [(q + "attention_norm.weight", dtype, [h]), (q + "ffn_norm.weight", dtype, [h])]
        out += [(q + f"attention.{n}.weight", dtype, [h, h]) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        out += [
            (q + "feed_forward.gate_proj.weight", dtype, [inter, h]),
            (q + "feed_forward.up_proj.weight", dtype, [inter, h]),
            (q + "feed_forward.down_proj.weight", dtype, [h, inter]),
        ]
    out += [
        ("multi_modal_projector.norm.weight", dtype, [h]),
        ("multi_modal_projector.patch_merger.merging_layer.weight", dtype, [h, h * merge * merge]),
        ("multi_modal_projector.linear_1.weight", dtype, [d, h]),
        ("multi_modal_projector.linear_2.weight", dtype, [d, d]),
    ]
    return out + llama_tensors(t, prefix="language_model.model.", head="language_model.lm_head.weight", dtype=dtype)


def pixtral_llava_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """Pixtral-12B in its llava form (mistral-community/pixtral-12b: LlavaForConditionalGeneration):
    vision_tower.* as in Mistral 3 (PixtralVisionModel, no biases), multi_modal_projector.linear_1
    and linear_2 with biases (LlavaMultiModalProjector, no norm and no patch merger),
    language_model.model.* (Mistral-Nemo) and language_model.lm_head (untied)."""
    # the keys the config leaves out take PixtralVisionConfig's and MistralConfig's defaults
    v = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, **c["vision_config"]}
    t = {"num_attention_heads": 32, **c["text_config"]}
    h, d = v["hidden_size"], t["hidden_size"]
    tower = [x for x in mistral3_tensors({**c, "text_config": t, "vision_config": v}, dtype) if x[0].startswith("vision_tower.")]
    projector = [
        ("multi_modal_projector.linear_1.weight", dtype, [d, h]),
        ("multi_modal_projector.linear_1.bias", dtype, [d]),
        ("multi_modal_projector.linear_2.weight", dtype, [d, d]),
        ("multi_modal_projector.linear_2.bias", dtype, [d]),
    ]
    return tower + projector + llama_tensors(t, prefix="language_model.model.", head="language_model.lm_head.weight", dtype=dtype)


def yi_vl_tensors(c: dict, dtype: str = "F16") -> list[tuple[str, str, list[int]]]:
    """Yi-VL in its transformers form (BUAADreamer/Yi-VL-6B-hf, -34B-hf: LlavaForConditionalGeneration):
    LLaVA-1.5's layout, the projector's four modules multi_modal_projector.linear_1 .. linear_4 of
    which linear_2 and linear_4 are LayerNorms ([hidden] weight and bias), the tower's CLIP
    ViT-H/14 at 448 px (a 1025-row position table)."""
    t, v = c["text_config"], c["vision_config"]
    h, d = v["hidden_size"], t["hidden_size"]
    projector = [
        ("multi_modal_projector.linear_1.weight", dtype, [d, h]),
        ("multi_modal_projector.linear_1.bias", dtype, [d]),
        ("multi_modal_projector.linear_2.weight", dtype, [d]),
        ("multi_modal_projector.linear_2.bias", dtype, [d]),
        ("multi_modal_projector.linear_3.weight", dtype, [d, d]),
        ("multi_modal_projector.linear_3.bias", dtype, [d]),
        ("multi_modal_projector.linear_4.weight", dtype, [d]),
        ("multi_modal_projector.linear_4.bias", dtype, [d]),
    ]
    language = llama_tensors(t, "language_model.model.", "language_model.lm_head.weight", dtype)
    return language + projector + clip_tensors(v, "vision_tower.vision_model.", dtype)


def internlm2_tensors(c: dict, prefix: str = "", dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """InternLM2 / InternLM2.5 (remote code InternLM2ForCausalLM): model.tok_embeddings, per layer
    attention.wqkv ([(heads + 2 kv heads) x head_dim, hidden]) and attention.wo, feed_forward.w1 / w3 / w2,
    attention_norm and ffn_norm; model.norm and output (never tied)."""
    h, inter, heads, nkv = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d = h // heads
    bias = c.get("bias", False)
    out = [(prefix + "model.tok_embeddings.weight", dtype, [c["vocab_size"], h])]
    for i in range(c["num_hidden_layers"]):
        p = f"{prefix}model.layers.{i}."
        out += [(p + "attention.wqkv.weight", dtype, [(heads + 2 * nkv) * d, h]), (p + "attention.wo.weight", dtype, [h, heads * d])]
        if bias:
            out += [(p + "attention.wqkv.bias", dtype, [(heads + 2 * nkv) * d]), (p + "attention.wo.bias", dtype, [h])]
        out += [
            (p + "feed_forward.w1.weight", dtype, [inter, h]),
            (p + "feed_forward.w3.weight", dtype, [inter, h]),
            (p + "feed_forward.w2.weight", dtype, [h, inter]),
            (p + "attention_norm.weight", dtype, [h]),
            (p + "ffn_norm.weight", dtype, [h]),
        ]
    return out + [(prefix + "model.norm.weight", dtype, [h]), (prefix + "output.weight", dtype, [c["vocab_size"], h])]


def ixc2_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """InternLM-XComposer2-VL (remote code InternLMXComposer2ForCausalLM): InternLM2's tensors, each
    wqkv / wo / w1 / w3 / w2 with its Partial LoRA pair Plora_A [256, d_in] and Plora_B [d_out, 256]
    (modeling_internlm2.py: PLoRA(..., lora_r=256)); vit.vision_tower, CLIP ViT-L/14 whose position
    embedding build_mlp.py resized to (img_size / 14)^2 + 1 rows before the checkpoint was saved;
    vision_proj, mlp2x_gelu from 1024 to hidden (nn.Sequential indices 0 and 2)."""
    h, inter, heads, nkv, r = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"], 256
    d = h // heads
    plora = {
        "attention.wqkv": (h, (heads + 2 * nkv) * d),
        "attention.wo": (heads * d, h),
        "feed_forward.w1": (h, inter),
        "feed_forward.w3": (h, inter),
        "feed_forward.w2": (inter, h),
    }
    language = internlm2_tensors(c, "", dtype)
    for i in range(c["num_hidden_layers"]):
        for name, (d_in, d_out) in plora.items():
            p = f"model.layers.{i}.{name}."
            language += [(p + "Plora_A.weight", dtype, [r, d_in]), (p + "Plora_B.weight", dtype, [d_out, r])]
    vision = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "patch_size": 14, "image_size": c["img_size"]}
    projector = [
        ("vision_proj.0.weight", dtype, [h, 1024]),
        ("vision_proj.0.bias", dtype, [h]),
        ("vision_proj.2.weight", dtype, [h, h]),
        ("vision_proj.2.bias", dtype, [h]),
    ]
    return language + projector + clip_tensors(vision, "vit.vision_tower.vision_model.", dtype)


def ixc2_4khd_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """InternLM-XComposer2-4KHD: XComposer2-VL's language model and Plora pairs (ixc2_tensors),
    vit.vision_tower at CLIP ViT-L/14-336's own 577 positions, vision_proj from the 2 x 2 merged
    4096 features to hidden, and the separators plora_glb_GN [1, 1, 4096], plora_sub_GN [1, 1, 1, 4096]
    (modeling_internlm_xcomposer2.py, build_mlp.py)."""
    h = c["hidden_size"]
    tensors = [t for t in ixc2_tensors(c, dtype) if not t[0].startswith("vision_proj.0.")]
    return tensors + [
        ("vision_proj.0.weight", dtype, [h, 4096]),
        ("vision_proj.0.bias", dtype, [h]),
        ("plora_glb_GN", dtype, [1, 1, 4096]),
        ("plora_sub_GN", dtype, [1, 1, 1, 4096]),
    ]


def gpt_neox_tensors(c: dict, dtype: str = "F16") -> list[tuple[str, str, list[int]]]:
    """GPTNeoXForCausalLM as the Pythia checkpoints store it: LayerNorms with bias, one
    query_key_value and dense with bias, a biased GELU MLP, the head as `embed_out`; each layer
    also carries the buffers of the transformers version that saved it (the causal mask
    `attention.bias`, `attention.masked_bias` and the rotary `inv_freq`)."""
    h, inter, n = c["hidden_size"], c["intermediate_size"], c["max_position_embeddings"]
    rotary = int(h // c["num_attention_heads"] * c["rotary_pct"])
    out = [("gpt_neox.embed_in.weight", dtype, [c["vocab_size"], h])]
    for i in range(c["num_hidden_layers"]):
        p = f"gpt_neox.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out += [(p + f"{norm}.weight", dtype, [h]), (p + f"{norm}.bias", dtype, [h])]
        out += [
            (p + "attention.bias", "BOOL", [1, 1, n, n]),
            (p + "attention.masked_bias", dtype, []),
            (p + "attention.rotary_emb.inv_freq", dtype, [rotary // 2]),
            (p + "attention.query_key_value.weight", dtype, [3 * h, h]),
            (p + "attention.query_key_value.bias", dtype, [3 * h]),
            (p + "attention.dense.weight", dtype, [h, h]),
            (p + "attention.dense.bias", dtype, [h]),
            (p + "mlp.dense_h_to_4h.weight", dtype, [inter, h]),
            (p + "mlp.dense_h_to_4h.bias", dtype, [inter]),
            (p + "mlp.dense_4h_to_h.weight", dtype, [h, inter]),
            (p + "mlp.dense_4h_to_h.bias", dtype, [h]),
        ]
    out += [("gpt_neox.final_layer_norm.weight", dtype, [h]), ("gpt_neox.final_layer_norm.bias", dtype, [h]), ("embed_out.weight", dtype, [c["vocab_size"], h])]
    return out


def phi_tensors(c: dict, dtype: str = "F16") -> list[tuple[str, str, list[int]]]:
    """PhiForCausalLM (transformers' native phi layout): biased q, k, v and dense projections,
    one input_layernorm per layer shared by attention and MLP, fc1 / fc2, a final LayerNorm and an
    lm_head with bias."""
    h, inter, nh = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    nkv = c.get("num_key_value_heads") or nh
    hd = h // nh
    out = [("model.embed_tokens.weight", dtype, [c["vocab_size"], h])]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", dtype, [h]), (p + "input_layernorm.bias", dtype, [h])]
        for proj, rows, cols in (("q_proj", nh * hd, h), ("k_proj", nkv * hd, h), ("v_proj", nkv * hd, h), ("dense", h, nh * hd)):
            out += [(p + f"self_attn.{proj}.weight", dtype, [rows, cols]), (p + f"self_attn.{proj}.bias", dtype, [rows])]
        out += [
            (p + "mlp.fc1.weight", dtype, [inter, h]),
            (p + "mlp.fc1.bias", dtype, [inter]),
            (p + "mlp.fc2.weight", dtype, [h, inter]),
            (p + "mlp.fc2.bias", dtype, [h]),
        ]
    out += [
        ("model.final_layernorm.weight", dtype, [h]),
        ("model.final_layernorm.bias", dtype, [h]),
        ("lm_head.weight", dtype, [c["vocab_size"], h]),
        ("lm_head.bias", dtype, [c["vocab_size"]]),
    ]
    return out


def opt_tensors(c: dict, prefix: str = "decoder.", dtype: str = "F16") -> list[tuple[str, str, list[int]]]:
    """OPT as the facebook/opt-* checkpoints store it (saved from OPTModel: no `model.` prefix and
    no lm_head, which is tied to embed_tokens): the token table, the learned position table with
    its 2 offset rows, per layer biased q, k, v and out_proj, self_attn_layer_norm, fc1 / fc2 with
    biases and final_layer_norm, then the decoder's final_layer_norm."""
    h, ffn = c["hidden_size"], c["ffn_dim"]
    out = [
        (f"{prefix}embed_tokens.weight", dtype, [c["vocab_size"], c["word_embed_proj_dim"]]),
        (f"{prefix}embed_positions.weight", dtype, [c["max_position_embeddings"] + 2, h]),
    ]
    for i in range(c["num_hidden_layers"]):
        p = f"{prefix}layers.{i}."
        for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
            out += [(p + f"self_attn.{proj}.weight", dtype, [h, h]), (p + f"self_attn.{proj}.bias", dtype, [h])]
        out += [
            (p + "self_attn_layer_norm.weight", dtype, [h]),
            (p + "self_attn_layer_norm.bias", dtype, [h]),
            (p + "fc1.weight", dtype, [ffn, h]),
            (p + "fc1.bias", dtype, [ffn]),
            (p + "fc2.weight", dtype, [h, ffn]),
            (p + "fc2.bias", dtype, [h]),
            (p + "final_layer_norm.weight", dtype, [h]),
            (p + "final_layer_norm.bias", dtype, [h]),
        ]
    out += [(f"{prefix}final_layer_norm.weight", dtype, [h]), (f"{prefix}final_layer_norm.bias", dtype, [h])]
    return out


def blip2_tensors(c: dict, dtype: str = "F32") -> list[tuple[str, str, list[int]]]:
    """Blip2ForConditionalGeneration with an OPT language model as Salesforce/blip2-opt-* store it:
    vision_model.* (EVA ViT-g: the patch conv with bias, class and position embeddings, per layer one
    qkv projection whose bias is [q_bias, 0, v_bias], projection, two LayerNorms, fc1 / fc2;
    post_layernorm), query_tokens, qformer.* (layernorm, then per layer the self-attention block,
    the cross-attention block every cross_attention_frequency-th layer, intermediate_query and
    output_query), language_projection.*, and language_model.* (OPT's decoder and its own copy of
    the tied lm_head)."""
    v, q, t = c["vision_config"], c.get("qformer_config") or {}, c["text_config"]
    vh, vi = v.get("hidden_size", 1408), v.get("intermediate_size", 6144)
    size, patch = v.get("image_size", 224), v.get("patch_size", 14)
    qh, qi, enc = q.get("hidden_size", 768), q.get("intermediate_size", 3072), q.get("encoder_hidden_size", 1408)
    freq = q.get("cross_attention_frequency", 2)
    out = [
        ("vision_model.embeddings.class_embedding", dtype, [1, 1, vh]),
        ("vision_model.embeddings.position_embedding", dtype, [1, (size // patch) ** 2 + 1, vh]),
        ("vision_model.embeddings.patch_embedding.weight", dtype, [vh, v.get("num_channels", 3), patch, patch]),
        ("vision_model.embeddings.patch_embedding.bias", dtype, [vh]),
    ]
    for i in range(v.get("num_hidden_layers", 39)):
        p = f"vision_model.encoder.layers.{i}."
        out += [
            (p + "self_attn.qkv.weight", dtype, [3 * vh, vh]),
            (p + "self_attn.qkv.bias", dtype, [3 * vh]),
            (p + "self_attn.projection.weight", dtype, [vh, vh]),
            (p + "self_attn.projection.bias", dtype, [vh]),
            (p + "layer_norm1.weight", dtype, [vh]),
            (p + "layer_norm1.bias", dtype, [vh]),
            (p + "mlp.fc1.weight", dtype, [vi, vh]),
            (p + "mlp.fc1.bias", dtype, [vi]),
            (p + "mlp.fc2.weight", dtype, [vh, vi]),
            (p + "mlp.fc2.bias", dtype, [vh]),
            (p + "layer_norm2.weight", dtype, [vh]),
            (p + "layer_norm2.bias", dtype, [vh]),
        ]
    out += [
        ("vision_model.post_layernorm.weight", dtype, [vh]),
        ("vision_model.post_layernorm.bias", dtype, [vh]),
        ("query_tokens", dtype, [1, c["num_query_tokens"], qh]),
        ("qformer.layernorm.weight", dtype, [qh]),
        ("qformer.layernorm.bias", dtype, [qh]),
    ]
    for i in range(q.get("num_hidden_layers", 12)):
        p = f"qformer.encoder.layer.{i}."
        blocks = [("attention", qh)] + ([("crossattention", enc)] if i % freq == 0 else [])
        for block, kv in blocks:
            out += [
                (p + f"{block}.attention.query.weight", dtype, [qh, qh]),
                (p + f"{block}.attention.query.bias", dtype, [qh]),
                (p + f"{block}.attention.key.weight", dtype, [qh, kv]),
                (p + f"{block}.attention.key.bias", dtype, [qh]),
                (p + f"{block}.attention.value.weight", dtype, [qh, kv]),
                (p + f"{block}.attention.value.bias", dtype, [qh]),
                (p + f"{block}.output.dense.weight", dtype, [qh, qh]),
                (p + f"{block}.output.dense.bias", dtype, [qh]),
                (p + f"{block}.output.LayerNorm.weight", dtype, [qh]),
                (p + f"{block}.output.LayerNorm.bias", dtype, [qh]),
            ]
        out += [
            (p + "intermediate_query.dense.weight", dtype, [qi, qh]),
            (p + "intermediate_query.dense.bias", dtype, [qi]),
            (p + "output_query.dense.weight", dtype, [qh, qi]),
            (p + "output_query.dense.bias", dtype, [qh]),
            (p + "output_query.LayerNorm.weight", dtype, [qh]),
            (p + "output_query.LayerNorm.bias", dtype, [qh]),
        ]
    th = t["hidden_size"]
    out += [("language_projection.weight", dtype, [th, qh]), ("language_projection.bias", dtype, [th])]
    text = {"max_position_embeddings": 2048, "word_embed_proj_dim": th, **t}
    out += opt_tensors(text, prefix="language_model.model.decoder.", dtype=dtype)
    out.append(("language_model.lm_head.weight", dtype, [t["vocab_size"], th]))
    return out


def falcon_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """FalconForCausalLM of the new decoder architecture (Falcon-40B / 180B): ln_attn and ln_mlp,
    one query_key_value of (heads + 2 groups) x head_dim rows, no biases; the head is tied to
    word_embeddings, so the safetensors files hold the table once (NB: assumed, as
    save_pretrained writes tied weights)."""
    h, nh, g = c["hidden_size"], c["num_attention_heads"], c["num_kv_heads"]
    inter, hd = c.get("ffn_hidden_size") or 4 * h, h // nh
    out = [("transformer.word_embeddings.weight", dtype, [c["vocab_size"], h])]
    for i in range(c["num_hidden_layers"]):
        p = f"transformer.h.{i}."
        for norm in ("ln_attn", "ln_mlp"):
            out += [(p + f"{norm}.weight", dtype, [h]), (p + f"{norm}.bias", dtype, [h])]
        out += [
            (p + "self_attention.query_key_value.weight", dtype, [(nh + 2 * g) * hd, h]),
            (p + "self_attention.dense.weight", dtype, [h, h]),
            (p + "mlp.dense_h_to_4h.weight", dtype, [inter, h]),
            (p + "mlp.dense_4h_to_h.weight", dtype, [h, inter]),
        ]
    out += [("transformer.ln_f.weight", dtype, [h]), ("transformer.ln_f.bias", dtype, [h])]
    return out


def bloom_tensors(c: dict, dtype: str = "F16") -> list[tuple[str, str, list[int]]]:
    """BloomForCausalLM checkpoints (bigscience/bloom-560m, bloomz-7b1): saved from BloomModel, so
    the names have no `transformer.` prefix; word_embeddings_layernorm after the embedding, one
    query_key_value of 3 x hidden rows (per head [q | k | v]), biases on every projection and
    LayerNorm; the head is tied to word_embeddings and not stored."""
    h = c["hidden_size"]
    out = [
        ("word_embeddings.weight", dtype, [c["vocab_size"], h]),
        ("word_embeddings_layernorm.weight", dtype, [h]),
        ("word_embeddings_layernorm.bias", dtype, [h]),
    ]
    for i in range(c["n_layer"]):
        p = f"h.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out += [(p + f"{norm}.weight", dtype, [h]), (p + f"{norm}.bias", dtype, [h])]
        for name, shape in (
            ("self_attention.query_key_value", [3 * h, h]),
            ("self_attention.dense", [h, h]),
            ("mlp.dense_h_to_4h", [4 * h, h]),
            ("mlp.dense_4h_to_h", [h, 4 * h]),
        ):
            out += [(p + name + ".weight", dtype, shape), (p + name + ".bias", dtype, [shape[0]])]
    out += [("ln_f.weight", dtype, [h]), ("ln_f.bias", dtype, [h])]
    return out


def glm_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """GlmForCausalLM / Glm4ForCausalLM: q, k and v with bias (attention_bias), o_proj without,
    one gate_up_proj; Glm4 adds post_self_attn_layernorm and post_mlp_layernorm to every layer."""
    h, inter, nh = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    nkv, hd = c["num_key_value_heads"], c["head_dim"]
    out = [("model.embed_tokens.weight", dtype, [c["vocab_size"], h])]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", dtype, [h]))
        for proj, rows in (("q_proj", nh * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)):
            out += [(p + f"self_attn.{proj}.weight", dtype, [rows, h]), (p + f"self_attn.{proj}.bias", dtype, [rows])]
        out += [
            (p + "self_attn.o_proj.weight", dtype, [h, nh * hd]),
            (p + "post_attention_layernorm.weight", dtype, [h]),
            (p + "mlp.gate_up_proj.weight", dtype, [2 * inter, h]),
            (p + "mlp.down_proj.weight", dtype, [h, inter]),
        ]
        if c["model_type"] == "glm4":
            out += [(p + "post_self_attn_layernorm.weight", dtype, [h]), (p + "post_mlp_layernorm.weight", dtype, [h])]
    out += [("model.norm.weight", dtype, [h]), ("lm_head.weight", dtype, [c["vocab_size"], h])]
    return out


def glm4v_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """Glm4vForConditionalGeneration as the hub checkpoint stores it: model.language_model.* (GLM-4-0414's
    layers: q/k/v with bias, o_proj without, one gate_up_proj, four RMSNorms), lm_head, model.visual.*
    (Conv3d patch embedding with bias, post_conv_layernorm, the learned position table, RMSNorm blocks
    with a bias-free qkv / proj and a SwiGLU MLP of out_hidden_size, post_layernorm, the 2 x 2 downsample
    Conv2d with bias, the merger: proj, post_projection_norm (LayerNorm), gate / up / down)."""
    v, t = c["vision_config"], c["text_config"]
    dim, out_dim, inter, ps = v["hidden_size"], v["out_hidden_size"], v["intermediate_size"], v["patch_size"]
    m = v["spatial_merge_size"]
    out = [
        ("model.visual.patch_embed.proj.weight", dtype, [dim, v["in_channels"], v["temporal_patch_size"], ps, ps]),
        ("model.visual.patch_embed.proj.bias", dtype, [dim]),
        ("model.visual.post_conv_layernorm.weight", dtype, [dim]),
        ("model.visual.embeddings.position_embedding.weight", dtype, [(v["image_size"] // ps) ** 2, dim]),
    ]
    for i in range(v["depth"]):
        b = f"model.visual.blocks.{i}."
        out += [
            (b + "norm1.weight", dtype, [dim]),
            (b + "norm2.weight", dtype, [dim]),
            (b + "attn.qkv.weight", dtype, [3 * dim, dim]),
            (b + "attn.proj.weight", dtype, [dim, dim]),
            (b + "mlp.gate_proj.weight", dtype, [out_dim, dim]),
            (b + "mlp.up_proj.weight", dtype, [out_dim, dim]),
            (b + "mlp.down_proj.weight", dtype, [dim, out_dim]),
        ]
    out += [
        ("model.visual.post_layernorm.weight", dtype, [dim]),
        ("model.visual.downsample.weight", dtype, [out_dim, dim, m, m]),
        ("model.visual.downsample.bias", dtype, [out_dim]),
        ("model.visual.merger.proj.weight", dtype, [out_dim, out_dim]),
        ("model.visual.merger.post_projection_norm.weight", dtype, [out_dim]),
        ("model.visual.merger.post_projection_norm.bias", dtype, [out_dim]),
        ("model.visual.merger.gate_proj.weight", dtype, [inter, out_dim]),
        ("model.visual.merger.up_proj.weight", dtype, [inter, out_dim]),
        ("model.visual.merger.down_proj.weight", dtype, [out_dim, inter]),
    ]
    language = [
        (n.replace("model.", "model.language_model.", 1), d, s)
        for n, d, s in glm_tensors({**t, "model_type": "glm4", "head_dim": t["hidden_size"] // t["num_attention_heads"]}, dtype)
    ]
    return language + out


def minicpmv4_6_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """MiniCPMV4_6ForConditionalGeneration as the hub checkpoint stores it (one file, no lm_head: tied):
    model.language_model.* (Qwen3.5 text: Gated DeltaNet layers with in_proj_qkv / in_proj_z / in_proj_b /
    in_proj_a, the depthwise conv1d, A_log, dt_bias, the gated norm and out_proj; full-attention layers with
    a doubled q_proj (query and gate), q_norm / k_norm; SwiGLU MLPs), model.vision_tower.* (SigLIP
    embeddings and encoder, post_layernorm, the window-attention vit_merger), model.merger.mlp.*."""
    v, t = c["vision_config"], c["text_config"]
    h, inter, vocab = t["hidden_size"], t["intermediate_size"], t["vocab_size"]
    hd, nh, nkv = t["head_dim"], t["num_attention_heads"], t["num_key_value_heads"]
    kd = t["linear_key_head_dim"] * t["linear_num_key_heads"]
    vd = t["linear_value_head_dim"] * t["linear_num_value_heads"]
    conv, nv = 2 * kd + vd, t["linear_num_value_heads"]
    out = [("model.language_model.embed_tokens.weight", dtype, [vocab, h])]
    for i, kind in enumerate(t["layer_types"]):
        p = f"model.language_model.layers.{i}."
        out.append((p + "input_layernorm.weight", dtype, [h]))
        if kind == "linear_attention":
            a = p + "linear_attn."
            out += [
                (a + "A_log", dtype, [nv]),
                (a + "conv1d.weight", dtype, [conv, 1, t["linear_conv_kernel_dim"]]),
                (a + "dt_bias", dtype, [nv]),
                (a + "in_proj_a.weight", dtype, [nv, h]),
                (a + "in_proj_b.weight", dtype, [nv, h]),
                (a + "in_proj_qkv.weight", dtype, [conv, h]),
                (a + "in_proj_z.weight", dtype, [vd, h]),
                (a + "norm.weight", dtype, [t["linear_value_head_dim"]]),
                (a + "out_proj.weight", dtype, [h, vd]),
            ]
        else:
            a = p + "self_attn."
            out += [
                (a + "k_norm.weight", dtype, [hd]),
                (a + "k_proj.weight", dtype, [nkv * hd, h]),
                (a + "o_proj.weight", dtype, [h, nh * hd]),
                (a + "q_norm.weight", dtype, [hd]),
                (a + "q_proj.weight", dtype, [2 * nh * hd, h]),
                (a + "v_proj.weight", dtype, [nkv * hd, h]),
            ]
        out += [
            (p + "mlp.down_proj.weight", dtype, [h, inter]),
            (p + "mlp.gate_proj.weight", dtype, [inter, h]),
            (p + "mlp.up_proj.weight", dtype, [inter, h]),
            (p + "post_attention_layernorm.weight", dtype, [h]),
        ]
    out.append(("model.language_model.norm.weight", dtype, [h]))
    vh, vi = v["hidden_size"], v["intermediate_size"]
    out += siglip_tensors(v, "model.vision_tower.", dtype)
    m = "model.vision_tower.vit_merger."
    for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
        out += [(m + f"self_attn.{proj}.weight", dtype, [vh, vh]), (m + f"self_attn.{proj}.bias", dtype, [vh])]
    out += [
        (m + "layer_norm1.weight", dtype, [vh]),
        (m + "layer_norm1.bias", dtype, [vh]),
        (m + "pre_norm.weight", dtype, [4 * vh]),
        (m + "pre_norm.bias", dtype, [4 * vh]),
        (m + "linear_1.weight", dtype, [4 * vi, 4 * vh]),
        (m + "linear_1.bias", dtype, [4 * vi]),
        (m + "linear_2.weight", dtype, [vh, 4 * vi]),
        (m + "linear_2.bias", dtype, [vh]),
    ]
    g = "model.merger.mlp.0."
    out += [
        (g + "pre_norm.weight", dtype, [4 * vh]),
        (g + "pre_norm.bias", dtype, [4 * vh]),
        (g + "linear_1.weight", dtype, [4 * vh, 4 * vh]),
        (g + "linear_1.bias", dtype, [4 * vh]),
        (g + "linear_2.weight", dtype, [h, 4 * vh]),
        (g + "linear_2.bias", dtype, [h]),
    ]
    return out


def olmo2_tensors(c: dict, dtype: str = "F32") -> list[tuple[str, str, list[int]]]:
    """Olmo2ForCausalLM: no input norms; RMSNorms after the attention and the MLP
    (post_attention_layernorm, post_feedforward_layernorm), q_norm and k_norm over the whole q
    and k projection widths, a SwiGLU MLP, an untied lm_head."""
    h, inter, nh = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    nkv = c.get("num_key_value_heads") or nh
    hd = h // nh
    out = [("model.embed_tokens.weight", dtype, [c["vocab_size"], h])]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", dtype, [nh * hd, h]),
            (p + "self_attn.k_proj.weight", dtype, [nkv * hd, h]),
            (p + "self_attn.v_proj.weight", dtype, [nkv * hd, h]),
            (p + "self_attn.o_proj.weight", dtype, [h, nh * hd]),
            (p + "self_attn.q_norm.weight", dtype, [nh * hd]),
            (p + "self_attn.k_norm.weight", dtype, [nkv * hd]),
            (p + "post_attention_layernorm.weight", dtype, [h]),
            (p + "mlp.gate_proj.weight", dtype, [inter, h]),
            (p + "mlp.up_proj.weight", dtype, [inter, h]),
            (p + "mlp.down_proj.weight", dtype, [h, inter]),
            (p + "post_feedforward_layernorm.weight", dtype, [h]),
        ]
    out += [("model.norm.weight", dtype, [h]), ("lm_head.weight", dtype, [c["vocab_size"], h])]
    return out


def t5_tensors(c: dict, dtype: str = "F32") -> list[tuple[str, str, list[int]]]:
    """T5ForConditionalGeneration: `shared` (the token table both stacks read), an encoder and a
    decoder stack of T5Blocks (self-attention q, k, v, o without biases; the decoder's cross-
    attention EncDecAttention; the feed-forward DenseReluDense: wi, or wi_0 and wi_1 when gated,
    and wo), each with a relative position bias table [buckets, heads] in its first block's
    self-attention and a final_layer_norm; lm_head unless the head is tied (T5 v1.0)."""
    d, ff, nh, kv = c["d_model"], c["d_ff"], c["num_heads"], c["d_kv"]
    inner = nh * kv
    gated = c.get("feed_forward_proj", "relu").startswith("gated-")
    out = [("shared.weight", dtype, [c["vocab_size"], d])]
    for stack, layers in (("encoder", c["num_layers"]), ("decoder", c.get("num_decoder_layers") or c["num_layers"])):
        for i in range(layers):
            p = f"{stack}.block.{i}.layer."
            parts = ["SelfAttention"] + (["EncDecAttention"] if stack == "decoder" else [])
            for k, name in enumerate(parts):
                a = f"{p}{k}.{name}."
                out += [
                    (a + "q.weight", dtype, [inner, d]),
                    (a + "k.weight", dtype, [inner, d]),
                    (a + "v.weight", dtype, [inner, d]),
                    (a + "o.weight", dtype, [d, inner]),
                ]
                if k == 0 and i == 0:
                    out.append((a + "relative_attention_bias.weight", dtype, [c["relative_attention_num_buckets"], nh]))
                out.append((f"{p}{k}.layer_norm.weight", dtype, [d]))
            f = f"{p}{len(parts)}."
            wi = [("wi_0", [ff, d]), ("wi_1", [ff, d])] if gated else [("wi", [ff, d])]
            out += [(f"{f}DenseReluDense.{n}.weight", dtype, s) for n, s in wi]
            out += [(f"{f}DenseReluDense.wo.weight", dtype, [d, ff]), (f"{f}layer_norm.weight", dtype, [d])]
        out.append((f"{stack}.final_layer_norm.weight", dtype, [d]))
    if c.get("tie_word_embeddings") is False:
        out.append(("lm_head.weight", dtype, [c["vocab_size"], d]))
    return out


def chatglm_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """The remote-code ChatGLM checkpoints (ChatGLM2 / ChatGLM3, GLM-4-9B-chat): transformer.embedding,
    per layer one query_key_value of (heads + 2 groups) x kv_channels rows with bias, dense, one
    dense_h_to_4h of 2 x ffn_hidden_size rows and dense_4h_to_h; the RoPE inv_freq buffer is saved."""
    h, inter, nh, hd = c["hidden_size"], c["ffn_hidden_size"], c["num_attention_heads"], c["kv_channels"]
    g = c["multi_query_group_num"] if c.get("multi_query_attention") else nh
    out = [("transformer.embedding.word_embeddings.weight", dtype, [c["padded_vocab_size"], h]), ("transformer.rotary_pos_emb.inv_freq", dtype, [hd // 4])]
    for i in range(c["num_layers"]):
        p = f"transformer.encoder.layers.{i}."
        out += [
            (p + "input_layernorm.weight", dtype, [h]),
            (p + "self_attention.query_key_value.weight", dtype, [(nh + 2 * g) * hd, h]),
            (p + "self_attention.query_key_value.bias", dtype, [(nh + 2 * g) * hd]),
            (p + "self_attention.dense.weight", dtype, [h, nh * hd]),
            (p + "post_attention_layernorm.weight", dtype, [h]),
            (p + "mlp.dense_h_to_4h.weight", dtype, [2 * inter, h]),
            (p + "mlp.dense_4h_to_h.weight", dtype, [h, inter]),
        ]
    out += [("transformer.encoder.final_layernorm.weight", dtype, [h]), ("transformer.output_layer.weight", dtype, [c["padded_vocab_size"], h])]
    return out


def qwen_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """The first-generation Qwen checkpoints (remote code QWenLMHeadModel): transformer.wte, per layer
    ln_1, one attn.c_attn of 3 x kv_channels x heads rows with bias, attn.c_proj, ln_2, mlp.w1 and
    mlp.w2 of intermediate_size // 2 rows each and mlp.c_proj; transformer.ln_f and an untied lm_head."""
    h, nh, kv, ff, v = c["hidden_size"], c["num_attention_heads"], c["kv_channels"], c["intermediate_size"] // 2, c["vocab_size"]
    out = [("transformer.wte.weight", dtype, [v, h])]
    for i in range(c["num_hidden_layers"]):
        p = f"transformer.h.{i}."
        out += [
            (p + "ln_1.weight", dtype, [h]),
            (p + "attn.c_attn.weight", dtype, [3 * nh * kv, h]),
            (p + "attn.c_attn.bias", dtype, [3 * nh * kv]),
            (p + "attn.c_proj.weight", dtype, [nh * kv, h]),
            (p + "ln_2.weight", dtype, [h]),
            (p + "mlp.w1.weight", dtype, [ff, h]),
            (p + "mlp.w2.weight", dtype, [ff, h]),
            (p + "mlp.c_proj.weight", dtype, [h, ff]),
        ]
    out += [("transformer.ln_f.weight", dtype, [h]), ("lm_head.weight", dtype, [v, h])]
    return out


def baichuan_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """Baichuan2-7B (remote code BaichuanForCausalLM): model.embed_tokens, per layer self_attn.W_pack
    (q, k and v stacked, [3 x hidden, hidden], no bias) and o_proj, mlp.gate_proj / down_proj / up_proj,
    input_layernorm and post_attention_layernorm; model.norm and lm_head (NormHead's weight). The
    rotary's inv_freq is a plain attribute, not in the state dict."""
    h, inter = c["hidden_size"], c["intermediate_size"]
    out = [("model.embed_tokens.weight", dtype, [c["vocab_size"], h])]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.W_pack.weight", dtype, [3 * h, h]),
            (p + "self_attn.o_proj.weight", dtype, [h, h]),
            (p + "mlp.gate_proj.weight", dtype, [inter, h]),
            (p + "mlp.down_proj.weight", dtype, [h, inter]),
            (p + "mlp.up_proj.weight", dtype, [inter, h]),
            (p + "input_layernorm.weight", dtype, [h]),
            (p + "post_attention_layernorm.weight", dtype, [h]),
        ]
    return out + [("model.norm.weight", dtype, [h]), ("lm_head.weight", dtype, [c["vocab_size"], h])]


def qwen_vl_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """Qwen-VL (remote code QWenLMHeadModel with transformer.visual): Qwen-7B's tensors (qwen_tensors)
    and the VisionTransformer of visual.py under transformer.visual: conv1 without bias, a
    positional_embedding of 256 rows, ln_pre, per block ln_1, attn.in_proj (3 x width rows, bias),
    attn.out_proj, ln_2, mlp.c_fc (int(width x mlp_ratio) rows) and mlp.c_proj, then the Resampler
    attn_pool (query and the frozen 2-D sin-cos pos_embed of 256 x output_dim, kv_proj without bias,
    torch's nn.MultiheadAttention in_proj_weight / in_proj_bias / out_proj, ln_q, ln_kv), ln_post
    and the proj matrix."""
    v = c["visual"]
    w, out_dim, p, queries = v["width"], v["output_dim"], v["patch_size"], 256
    mlp = int(w * v["mlp_ratio"])
    out = qwen_tensors(c, dtype)
    vp = "transformer.visual."
    out += [(vp + "conv1.weight", dtype, [w, 3, p, p]), (vp + "positional_embedding", dtype, [queries, w])]
    out += [(vp + "ln_pre.weight", dtype, [w]), (vp + "ln_pre.bias", dtype, [w])]
    for i in range(v["layers"]):
        b = f"{vp}transformer.resblocks.{i}."
        out += [
            (b + "ln_1.weight", dtype, [w]),
            (b + "ln_1.bias", dtype, [w]),
            (b + "attn.in_proj.weight", dtype, [3 * w, w]),
            (b + "attn.in_proj.bias", dtype, [3 * w]),
            (b + "attn.out_proj.weight", dtype, [w, w]),
            (b + "attn.out_proj.bias", dtype, [w]),
            (b + "ln_2.weight", dtype, [w]),
            (b + "ln_2.bias", dtype, [w]),
            (b + "mlp.c_fc.weight", dtype, [mlp, w]),
            (b + "mlp.c_fc.bias", dtype, [mlp]),
            (b + "mlp.c_proj.weight", dtype, [w, mlp]),
            (b + "mlp.c_proj.bias", dtype, [w]),
        ]
    out += resampler_tensors(vp + "attn_pool.", vp, queries, out_dim, w, dtype, pos_embed=True)
    return out


def resampler_tensors(prefix: str, post: str, queries: int, dim: int, kv_in: int, dtype: str, pos_embed: bool = False) -> list[tuple[str, str, list[int]]]:
    """The Resampler of Qwen-VL's visual.py and MiniCPM-V's resampler.py under `prefix`: the learned
    query [queries, dim] (and Qwen-VL's stored sin-cos pos_embed), kv_proj without bias (kv_in to
    dim), torch's nn.MultiheadAttention (in_proj_weight, in_proj_bias, out_proj), ln_q and ln_kv;
    then ln_post and the proj matrix under `post`."""
    out = [(prefix + "query", dtype, [queries, dim])]
    out += [(prefix + "pos_embed", dtype, [queries, dim])] if pos_embed else []
    out += [
        (prefix + "kv_proj.weight", dtype, [dim, kv_in]),
        (prefix + "attn.in_proj_weight", dtype, [3 * dim, dim]),
        (prefix + "attn.in_proj_bias", dtype, [3 * dim]),
        (prefix + "attn.out_proj.weight", dtype, [dim, dim]),
        (prefix + "attn.out_proj.bias", dtype, [dim]),
        (prefix + "ln_q.weight", dtype, [dim]),
        (prefix + "ln_q.bias", dtype, [dim]),
        (prefix + "ln_kv.weight", dtype, [dim]),
        (prefix + "ln_kv.bias", dtype, [dim]),
        (post + "ln_post.weight", dtype, [dim]),
        (post + "ln_post.bias", dtype, [dim]),
        (post + "proj", dtype, [dim, dim]),
    ]
    return out


def phi3_v_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """Phi-3-vision / Phi-3.5-vision (remote code Phi3VForCausalLM): the Phi-3 decoder under model.
    (fused qkv_proj and gate_up_proj), lm_head, and model.vision_embed_tokens: img_processor (a
    CLIPVisionModel, ViT-L/14 at 336 px, the remote code's fixed CLIP_VIT_LARGE_PATCH14_336_CONFIG),
    the separators glb_GN [1, 1, 4096] and sub_GN [1, 1, 1, 4096] (4 x image_dim_out: the 2 x 2
    merge) and img_projection.0 / .2 (Linear 4096 -> hidden, GELU, Linear hidden -> hidden)."""
    h, dim = c["hidden_size"], c["img_processor"]["image_dim_out"]
    clip = {"hidden_size": dim, "intermediate_size": 4096, "num_hidden_layers": 24, "patch_size": 14, "image_size": 336}
    e = "model.vision_embed_tokens."
    vision = [(e + "glb_GN", dtype, [1, 1, 4 * dim]), (e + "sub_GN", dtype, [1, 1, 1, 4 * dim])]
    vision += clip_tensors(clip, e + "img_processor.vision_model.", dtype)
    vision += [
        (e + "img_projection.0.weight", dtype, [h, 4 * dim]),
        (e + "img_projection.0.bias", dtype, [h]),
        (e + "img_projection.2.weight", dtype, [h, h]),
        (e + "img_projection.2.bias", dtype, [h]),
    ]
    language = llama_tensors(c, dtype=dtype, fused=True)
    return language[:1] + vision + language[1:]


def minicpmv_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """MiniCPM-V 2.6 (remote code MiniCPMV): the Qwen2 language model under llm. (Qwen2ForCausalLM,
    q, k and v biased), the SigLIP tower of modeling_navit_siglip.py under vpm. (patch conv with bias,
    a position table of (image_size / patch)^2 rows, the encoder layers and post_layernorm, no pooling
    head), and resampler.py's Resampler: query [query_num, hidden], kv_proj without bias (vision hidden
    to hidden), torch's nn.MultiheadAttention (in_proj_weight, in_proj_bias, out_proj), ln_q, ln_kv,
    ln_post and the proj matrix. The 2-D sin-cos pos_embed is a non-persistent buffer, not stored."""
    h, q = c["hidden_size"], c["query_num"]
    out = llama_tensors(c, prefix="llm.model.", head="llm.lm_head.weight", dtype=dtype, qkv_bias=True)
    out += siglip_tensors(c["vision_config"], "vpm.", dtype)
    out += resampler_tensors("resampler.", "resampler.", q, h, c["vision_config"]["hidden_size"], dtype)
    return out


def starcoder2_tensors(c: dict, dtype: str = "F32") -> list[tuple[str, str, list[int]]]:
    """Starcoder2ForCausalLM: LayerNorms with bias, biased q, k, v and o projections (grouped
    key-value heads), a biased c_fc / c_proj MLP, the head tied to embed_tokens (no lm_head
    tensor)."""
    h, inter, nh = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    nkv = c.get("num_key_value_heads") or nh
    hd = h // nh
    out = [("model.embed_tokens.weight", dtype, [c["vocab_size"], h])]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", dtype, [h]), (p + "input_layernorm.bias", dtype, [h])]
        for proj, rows, cols in (("q_proj", nh * hd, h), ("k_proj", nkv * hd, h), ("v_proj", nkv * hd, h), ("o_proj", h, nh * hd)):
            out += [(p + f"self_attn.{proj}.weight", dtype, [rows, cols]), (p + f"self_attn.{proj}.bias", dtype, [rows])]
        out += [
            (p + "post_attention_layernorm.weight", dtype, [h]),
            (p + "post_attention_layernorm.bias", dtype, [h]),
            (p + "mlp.c_fc.weight", dtype, [inter, h]),
            (p + "mlp.c_fc.bias", dtype, [inter]),
            (p + "mlp.c_proj.weight", dtype, [h, inter]),
            (p + "mlp.c_proj.bias", dtype, [h]),
        ]
    out += [("model.norm.weight", dtype, [h]), ("model.norm.bias", dtype, [h])]
    return out


def stablelm_tensors(c: dict, dtype: str = "F16") -> list[tuple[str, str, list[int]]]:
    """StableLmForCausalLM (serial residual, no q/k LayerNorms): LayerNorms with bias, q, k and
    v with a bias when use_qkv_bias, o_proj without, a SwiGLU MLP without biases, an untied
    lm_head."""
    h, inter, nh = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    nkv = c.get("num_key_value_heads") or nh
    hd = h // nh
    out = [("model.embed_tokens.weight", dtype, [c["vocab_size"], h])]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", dtype, [h]), (p + "input_layernorm.bias", dtype, [h])]
        for proj, rows in (("q_proj", nh * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)):
            out.append((p + f"self_attn.{proj}.weight", dtype, [rows, h]))
            if c.get("use_qkv_bias"):
                out.append((p + f"self_attn.{proj}.bias", dtype, [rows]))
        out += [
            (p + "self_attn.o_proj.weight", dtype, [h, h]),
            (p + "post_attention_layernorm.weight", dtype, [h]),
            (p + "post_attention_layernorm.bias", dtype, [h]),
            (p + "mlp.gate_proj.weight", dtype, [inter, h]),
            (p + "mlp.up_proj.weight", dtype, [inter, h]),
            (p + "mlp.down_proj.weight", dtype, [h, inter]),
        ]
    out += [("model.norm.weight", dtype, [h]), ("model.norm.bias", dtype, [h]), ("lm_head.weight", dtype, [c["vocab_size"], h])]
    return out


def cohere_tensors(c: dict, dtype: str = "F16") -> list[tuple[str, str, list[int]]]:
    """CohereForCausalLM: one weight-only LayerNorm per layer (attention and MLP in parallel on
    it), q/k/v/o without bias (attention_bias false), per-head q_norm and k_norm weights
    [heads, head_dim] when use_qk_norm, a SwiGLU MLP without biases, the head tied to
    embed_tokens (no lm_head tensor in the checkpoint)."""
    h, inter, nh = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    nkv = c.get("num_key_value_heads") or nh
    hd = h // nh
    out = [("model.embed_tokens.weight", dtype, [c["vocab_size"], h])]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", dtype, [h]))
        for proj, shape in (("q_proj", [nh * hd, h]), ("k_proj", [nkv * hd, h]), ("v_proj", [nkv * hd, h]), ("o_proj", [h, nh * hd])):
            out.append((p + f"self_attn.{proj}.weight", dtype, shape))
        if c.get("use_qk_norm"):
            out += [(p + "self_attn.q_norm.weight", dtype, [nh, hd]), (p + "self_attn.k_norm.weight", dtype, [nkv, hd])]
        out += [(p + "mlp.gate_proj.weight", dtype, [inter, h]), (p + "mlp.up_proj.weight", dtype, [inter, h]), (p + "mlp.down_proj.weight", dtype, [h, inter])]
    out.append(("model.norm.weight", dtype, [h]))
    return out


def aya_vision_tensors(c: dict, dtype: str = "F16") -> list[tuple[str, str, list[int]]]:
    """AyaVisionForConditionalGeneration as the hub stores it: vision_tower.vision_model.*
    (SigLIP, no head), multi_modal_projector.{layernorm, linear_1, linear_2} (the LayerNorm and
    linear_1 over the 2 x 2 pixel-shuffled width, linear_1 to alignment_intermediate_size, its
    SwiGLU halves into linear_2; all with bias), language_model.model.* (Cohere2, head tied: no
    lm_head tensor)."""
    t, v = c["text_config"], c["vision_config"]
    wide = v["hidden_size"] * c.get("downsample_factor", 2) ** 2
    inner = c.get("alignment_intermediate_size", t["hidden_size"])
    projector = [
        ("multi_modal_projector.layernorm.weight", dtype, [wide]),
        ("multi_modal_projector.layernorm.bias", dtype, [wide]),
        ("multi_modal_projector.linear_1.weight", dtype, [inner, wide]),
        ("multi_modal_projector.linear_1.bias", dtype, [inner]),
        ("multi_modal_projector.linear_2.weight", dtype, [t["hidden_size"], inner // 2]),
        ("multi_modal_projector.linear_2.bias", dtype, [t["hidden_size"]]),
    ]
    language = [("language_model." + name, d, shape) for name, d, shape in cohere_tensors(t, dtype)]
    return siglip_tensors(v, "vision_tower.vision_model.", dtype) + projector + language


def cohere2_vision_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """Cohere2VisionForConditionalGeneration as the hub stores it (transformers 4.55's layout):
    model.vision_tower.vision_model.* (SigLIP, no head), model.multi_modal_projector.{linear_1,
    linear_2} (no LayerNorm: linear_1 over the 2 x 2 pixel-shuffled width to
    alignment_intermediate_size, its SwiGLU halves into linear_2; both with bias),
    model.language_model.* (Cohere2, head tied: no lm_head tensor)."""
    t, v = c["text_config"], c["vision_config"]
    wide = v["hidden_size"] * c.get("downsample_factor", 2) ** 2
    inner = c.get("alignment_intermediate_size", 36864)
    projector = [
        ("model.multi_modal_projector.linear_1.weight", dtype, [inner, wide]),
        ("model.multi_modal_projector.linear_1.bias", dtype, [inner]),
        ("model.multi_modal_projector.linear_2.weight", dtype, [t["hidden_size"], inner // 2]),
        ("model.multi_modal_projector.linear_2.bias", dtype, [t["hidden_size"]]),
    ]
    language = [("model.language_model." + name.removeprefix("model."), d, shape) for name, d, shape in cohere_tensors(t, dtype)]
    return siglip_tensors(v, "model.vision_tower.vision_model.", dtype) + projector + language


def ovis2_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """Ovis2ForConditionalGeneration as the -hf conversions store it: model.vision_tower.transformer.*
    (AIMv2: patch conv with bias, RMSNorm, learned positions, layers of RMSNorm, q/k/v/out
    projections and a SwiGLU ffn, a final RMSNorm), the visual tokenizer's head_linear (the
    hidden_stride^2-merged width to vocab_size - 5 visual words, no bias) and head_norm
    (LayerNorm), model.visual_embeddings_table ([vocab_size, text hidden]), model.language_model.*
    (Qwen2) and, untied only, lm_head."""
    t, v = c["text_config"], c["vision_config"]
    h, inter, p, size = v["hidden_size"], v["intermediate_size"], v["patch_size"], v["image_size"]
    qkv, mlp, stride = v.get("qkv_bias", False), v.get("mlp_bias", False), v.get("hidden_stride", 1)
    words = v["vocab_size"] - v.get("num_visual_indicator_tokens", 5)
    e = "model.vision_tower.transformer.embeddings."
    out = [
        (e + "patch_embedding.weight", dtype, [h, v.get("num_channels", 3), p, p]),
        (e + "patch_embedding.bias", dtype, [h]),
        (e + "position_embedding.weight", dtype, [(size // p) ** 2, h]),
        (e + "rms_norm.weight", dtype, [h]),
    ]
    for i in range(v["num_hidden_layers"]):
        q = f"model.vision_tower.transformer.encoder.layers.{i}."
        for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
            out.append((q + f"attention.{proj}.weight", dtype, [h, h]))
            if qkv:
                out.append((q + f"attention.{proj}.bias", dtype, [h]))
        for proj, shape in (("gate_proj", [inter, h]), ("up_proj", [inter, h]), ("down_proj", [h, inter])):
            out.append((q + f"ffn.{proj}.weight", dtype, shape))
            if mlp:
                out.append((q + f"ffn.{proj}.bias", dtype, shape[:1]))
        out += [(q + "rms_norm1.weight", dtype, [h]), (q + "rms_norm2.weight", dtype, [h])]
    out += [
        ("model.vision_tower.transformer.rms_norm.weight", dtype, [h]),
        ("model.vision_tower.head_linear.weight", dtype, [words, h * stride * stride]),
        ("model.vision_tower.head_norm.weight", dtype, [words]),
        ("model.vision_tower.head_norm.bias", dtype, [words]),
        ("model.visual_embeddings_table.weight", dtype, [v["vocab_size"], t["hidden_size"]]),
    ]
    head = None if c.get("tie_word_embeddings", True) else "lm_head.weight"
    return out + llama_tensors(t, prefix="model.language_model.", head=head, dtype=dtype, qkv_bias=True)


def idefics2_tensors(c: dict, dtype: str = "F32") -> list[tuple[str, str, list[int]]]:
    """Idefics2ForConditionalGeneration as the hub stores it: model.vision_model.* (SigLIP with
    post_layernorm, no head; positions for (image_size / patch)^2 patches), model.connector.
    {modality_projection (SwiGLU from the vision width to the text width, its intermediate the text
    model's), perceiver_resampler (latents, layers of latents / context norms, q/k/v/o, a post-attention
    norm and a 4x SwiGLU, a final norm)}, model.text_model.* (Mistral) and lm_head (untied)."""
    t, v, r = c["text_config"], c["vision_config"], c["perceiver_config"]
    h, vh, inter = t["hidden_size"], v["hidden_size"], t["intermediate_size"]
    heads, kv, hd = r.get("resampler_n_heads", 16), r.get("num_key_value_heads", 4), r.get("resampler_head_dim", 96)
    m = "model.connector.modality_projection."
    connector = [(m + "gate_proj.weight", dtype, [inter, vh]), (m + "up_proj.weight", dtype, [inter, vh]), (m + "down_proj.weight", dtype, [h, inter])]
    q = "model.connector.perceiver_resampler."
    connector.append((q + "latents", dtype, [r.get("resampler_n_latents", 64), h]))
    for i in range(r.get("resampler_depth", 3)):
        layer = f"{q}layers.{i}."
        connector += [
            (layer + "input_latents_norm.weight", dtype, [h]),
            (layer + "input_context_norm.weight", dtype, [h]),
            (layer + "self_attn.q_proj.weight", dtype, [heads * hd, h]),
            (layer + "self_attn.k_proj.weight", dtype, [kv * hd, h]),
            (layer + "self_attn.v_proj.weight", dtype, [kv * hd, h]),
            (layer + "self_attn.o_proj.weight", dtype, [h, heads * hd]),
            (layer + "post_attention_layernorm.weight", dtype, [h]),
            (layer + "mlp.gate_proj.weight", dtype, [4 * h, h]),
            (layer + "mlp.up_proj.weight", dtype, [4 * h, h]),
            (layer + "mlp.down_proj.weight", dtype, [h, 4 * h]),
        ]
    connector.append((q + "norm.weight", dtype, [h]))
    return siglip_tensors(v, "model.vision_model.", dtype) + connector + llama_tensors(t, prefix="model.text_model.", dtype=dtype)


def bnb_4bit_tensors(c: dict) -> list[tuple[str, str, list[int]]]:
    """A bitsandbytes nf4 checkpoint: packed U8 weights with their quant-state companions."""
    out = []
    for name, dtype, shape in llama_tensors(c, dtype="F16"):
        if name.endswith("proj.weight"):
            n = prod(shape)
            out += [
                (name, "U8", [n // 2, 1]),
                (name + ".absmax", "F32", [n // 64]),
                (name + ".quant_map", "F32", [16]),
                (name + ".quant_state.bitsandbytes__nf4", "U8", [96]),
            ]
        else:
            out.append((name, dtype, shape))
    return out


# --------------------------------------------------------------------------- writing


def header_bytes(tensors: list[tuple[str, str, list[int]]]) -> tuple[bytes, int]:
    """(length prefix + JSON header, size of the data section it describes)."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in tensors:
        size = prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)  # safetensors pads the header to 8 bytes with spaces
    return len(body).to_bytes(8, "little") + body, offset


def mllama_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """MllamaForConditionalGeneration as the hub checkpoints store it (transformers 4.45 layout):
    vision_model.* (the patch conv without bias, class embedding, the gated position and tile-position
    embeddings, pre/post LayerNorms, the 32-layer local transformer and the 8-layer gated global one),
    multi_modal_projector.* (one Linear with bias), language_model.model.* (the token table with 8 extra
    rows, self-attention layers and the cross-attention layers of cross_attention_layers) and
    language_model.lm_head.weight."""
    v, t = c["vision_config"], c["text_config"]
    vh, vi, tiles = v["hidden_size"], v["intermediate_size"], v["max_num_tiles"]
    ratios = len(v["supported_aspect_ratios"]) + 1
    positions = (v["image_size"] // v["patch_size"]) ** 2 + 1
    out = [
        ("vision_model.class_embedding", dtype, [vh]),
        ("vision_model.patch_embedding.weight", dtype, [vh, v["num_channels"], v["patch_size"], v["patch_size"]]),
        ("vision_model.gated_positional_embedding.gate", dtype, [1]),
        ("vision_model.gated_positional_embedding.embedding", dtype, [positions, vh]),
        ("vision_model.gated_positional_embedding.tile_embedding.weight", dtype, [ratios, tiles * positions * vh]),
    ]
    for side in ("pre", "post"):
        out += [
            (f"vision_model.{side}_tile_positional_embedding.gate", dtype, [1]),
            (f"vision_model.{side}_tile_positional_embedding.embedding.weight", dtype, [ratios, tiles * vh]),
            (f"vision_model.layernorm_{side}.weight", dtype, [vh]),
            (f"vision_model.layernorm_{side}.bias", dtype, [vh]),
        ]
    for stack, count in (("transformer", v["num_hidden_layers"]), ("global_transformer", v["num_global_layers"])):
        for i in range(count):
            p = f"vision_model.{stack}.layers.{i}."
            out += [(p + f"self_attn.{proj}.weight", dtype, [vh, vh]) for proj in ("q_proj", "k_proj", "v_proj", "o_proj")]
            out += [
                (p + "mlp.fc1.weight", dtype, [vi, vh]),
                (p + "mlp.fc1.bias", dtype, [vi]),
                (p + "mlp.fc2.weight", dtype, [vh, vi]),
                (p + "mlp.fc2.bias", dtype, [vh]),
            ]
            for norm in ("input_layernorm", "post_attention_layernorm"):
                out += [(p + f"{norm}.weight", dtype, [vh]), (p + f"{norm}.bias", dtype, [vh])]
            if stack == "global_transformer":
                out += [(p + "gate_attn", dtype, [1]), (p + "gate_ffn", dtype, [1])]
    h, inter, nh, nkv = t["hidden_size"], t["intermediate_size"], t["num_attention_heads"], t["num_key_value_heads"]
    hd = h // nh
    out += [
        ("multi_modal_projector.weight", dtype, [h, v["vision_output_dim"]]),
        ("multi_modal_projector.bias", dtype, [h]),
        ("language_model.model.embed_tokens.weight", dtype, [t["vocab_size"] + 8, h]),
        ("language_model.model.norm.weight", dtype, [h]),
        ("language_model.lm_head.weight", dtype, [t["vocab_size"], h]),
    ]
    for i in range(t["num_hidden_layers"]):
        p = f"language_model.model.layers.{i}."
        a = p + ("cross_attn." if i in t["cross_attention_layers"] else "self_attn.")
        out += [
            (a + "q_proj.weight", dtype, [nh * hd, h]),
            (a + "k_proj.weight", dtype, [nkv * hd, h]),
            (a + "v_proj.weight", dtype, [nkv * hd, h]),
            (a + "o_proj.weight", dtype, [h, nh * hd]),
        ]
        if i in t["cross_attention_layers"]:
            out += [
                (a + "q_norm.weight", dtype, [hd]),
                (a + "k_norm.weight", dtype, [hd]),
                (p + "cross_attn_attn_gate", dtype, [1]),
                (p + "cross_attn_mlp_gate", dtype, [1]),
            ]
        out += [
            (p + "input_layernorm.weight", dtype, [h]),
            (p + "post_attention_layernorm.weight", dtype, [h]),
            (p + "mlp.gate_proj.weight", dtype, [inter, h]),
            (p + "mlp.up_proj.weight", dtype, [inter, h]),
            (p + "mlp.down_proj.weight", dtype, [h, inter]),
        ]
    return out


def deepseek_v2_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """DeepseekV2ForCausalLM's checkpoint: multi-head latent attention (q_proj, or q_a_proj,
    q_a_layernorm, q_b_proj with a q_lora_rank; kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj,
    o_proj), a dense MLP in the first first_k_dense_replace layers and a MoE block in the others
    (the router mlp.gate, per-expert gate_proj / up_proj / down_proj, the shared experts as one
    MLP of n_shared_experts x moe_intermediate_size); DeepseekV3ForCausalLM's the same, with the
    router's e_score_correction_bias."""
    h, nh, v = c["hidden_size"], c["num_attention_heads"], c["v_head_dim"]
    qk, rope, kv = c["qk_nope_head_dim"] + c["qk_rope_head_dim"], c["qk_rope_head_dim"], c["kv_lora_rank"]
    f, inter, fs = c["moe_intermediate_size"], c["intermediate_size"], c["moe_intermediate_size"] * c["n_shared_experts"]
    out = [("model.embed_tokens.weight", dtype, [c["vocab_size"], h])]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        if c.get("q_lora_rank"):
            out += [
                (a + "q_a_proj.weight", dtype, [c["q_lora_rank"], h]),
                (a + "q_a_layernorm.weight", dtype, [c["q_lora_rank"]]),
                (a + "q_b_proj.weight", dtype, [nh * qk, c["q_lora_rank"]]),
            ]
        else:
            out.append((a + "q_proj.weight", dtype, [nh * qk, h]))
        out += [
            (a + "kv_a_proj_with_mqa.weight", dtype, [kv + rope, h]),
            (a + "kv_a_layernorm.weight", dtype, [kv]),
            (a + "kv_b_proj.weight", dtype, [nh * (qk - rope + v), kv]),
            (a + "o_proj.weight", dtype, [h, nh * v]),
        ]
        m = p + "mlp."
        if i < c["first_k_dense_replace"]:
            out += [(m + "gate_proj.weight", dtype, [inter, h]), (m + "up_proj.weight", dtype, [inter, h]), (m + "down_proj.weight", dtype, [h, inter])]
        else:
            for e in range(c["n_routed_experts"]):
                out += [
                    (m + f"experts.{e}.gate_proj.weight", dtype, [f, h]),
                    (m + f"experts.{e}.up_proj.weight", dtype, [f, h]),
                    (m + f"experts.{e}.down_proj.weight", dtype, [h, f]),
                ]
            if c["model_type"] == "deepseek_v3":  # noaux_tc routing's correction bias, fp32 as DeepSeek-V3's checkpoint
                out.append((m + "gate.e_score_correction_bias", "F32", [c["n_routed_experts"]]))
            out += [
                (m + "gate.weight", dtype, [c["n_routed_experts"], h]),
                (m + "shared_experts.gate_proj.weight", dtype, [fs, h]),
                (m + "shared_experts.up_proj.weight", dtype, [fs, h]),
                (m + "shared_experts.down_proj.weight", dtype, [h, fs]),
            ]
        out += [(p + "input_layernorm.weight", dtype, [h]), (p + "post_attention_layernorm.weight", dtype, [h])]
    out += [("model.norm.weight", dtype, [h]), ("lm_head.weight", dtype, [c["vocab_size"], h])]
    return out


def write_checkpoint(folder: Path, config: dict, tensors: list, shards: int = 1, processor: dict | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if processor is not None:
        (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    if shards == 1:
        (folder / "model.safetensors").write_bytes(header_bytes(tensors)[0])
        return
    total = sum(prod(s) * DTYPE_BYTES[d] for _, d, s in tensors)
    weight_map, groups, acc = {}, [[] for _ in range(shards)], 0
    for t in tensors:
        k = min(acc * shards // total, shards - 1)
        groups[k].append(t)
        acc += prod(t[2]) * DTYPE_BYTES[t[1]]
    for k, group in enumerate(groups, 1):
        name = f"model-{k:05d}-of-{shards:05d}.safetensors"
        (folder / name).write_bytes(header_bytes(group)[0])
        weight_map.update({t[0]: name for t in group})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def sparse_copy(src: Path, dst: Path) -> None:
    """A fixture shard with its data section appended as a hole (no disk space used)."""
    raw = src.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    data = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    with open(dst, "wb") as f:
        f.write(raw)
        f.truncate(len(raw) + data)


def hub_cache(cache: Path, repo: str, fixture: str, commit: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    """huggingface_hub's cache layout for `repo` at `commit` (refs/main), files copied from a fixture."""
    base = cache / ("models--" + repo.replace("/", "--"))
    snapshot = base / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(commit)
    for f in (FIXTURES / fixture).iterdir():
        shutil.copy(f, snapshot / f.name)
    return snapshot


# --------------------------------------------------------------------------- the fixtures

LLAMA_2_7B = {
    "_name_or_path": "meta-llama/Llama-2-7b-hf",
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.31.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}
LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 64,
    "intermediate_size": 128,
    "model_type": "llama",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}
MIXTRAL_8X7B_V01 = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
# the released config.json files (Qwen/Qwen1.5-MoE-A2.7B, Qwen/Qwen2-57B-A14B); neither writes
# qkv_bias or mlp_only_layers (Qwen2MoeConfig's defaults: true, [])
QWEN1_5_MOE_A2_7B = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 5632,
    "max_position_embeddings": 8192,
    "max_window_layers": 21,
    "model_type": "qwen2_moe",
    "moe_intermediate_size": 1408,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 16,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 5632,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
# the released config.json files (deepseek-ai/DeepSeek-V2-Lite, deepseek-ai/DeepSeek-V2), less
# auto_map (the remote code's class names, which transformers 5 does not read)
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 10944,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "pretraining_tp": 1,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "greedy",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 102400,
}
DEEPSEEK_V2 = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.003,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "ep_size": 1,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v2",
    "moe_intermediate_size": 1536,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 160,
    "n_shared_experts": 2,
    "norm_topk_prob": False,
    "num_attention_heads": 128,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 60,
    "num_key_value_heads": 128,
    "pretraining_tp": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 16.0,
    "scoring_func": "softmax",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 3,
    "topk_method": "group_limited_greedy",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.39.3",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 102400,
}
# moonshotai/Moonlight-16B-A3B's released config.json (model_type deepseek_v3, bf16 weights, no
# multi-token-prediction layers), less auto_map
MOONLIGHT_16B_A3B = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 163584,
    "eos_token_id": 163586,
    "ep_size": 1,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 11264,
    "kv_lora_rank": 512,
    "max_position_embeddings": 8192,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 1408,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "norm_topk_prob": True,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "num_nextn_predict_layers": 0,
    "pretraining_tp": 1,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-05,
    "rope_theta": 50000.0,
    "routed_scaling_factor": 2.446,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.46.3",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 163840,
}
QWEN2_57B_A14B = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2_moe",
    "moe_intermediate_size": 2560,
    "norm_topk_prob": False,
    "num_attention_heads": 28,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 20480,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN2_5_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_mrope": False,
    "use_sliding_window": False,
    "vocab_size": 152064,
}
QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
PHI_3_MINI_4K = {
    "architectures": ["Phi3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "embd_pdrop": 0.0,
    "eos_token_id": 32000,
    "hidden_act": "silu",
    "hidden_size": 3072,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 4096,
    "model_type": "phi3",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096,
    "pad_token_id": 32000,
    "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "sliding_window": 2047,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.2",
    "use_cache": True,
    "vocab_size": 32064,
}
# google/gemma-2-2b and google/gemma-2-9b, config.json as of the repos' main (revision of
# 2024-07/08; weights stored in float32, the 2B in 3 shards, the 9B in 8).
GEMMA_2_2B = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304,
    "initializer_range": 0.02,
    "intermediate_size": 9216,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 8,
    "num_hidden_layers": 26,
    "num_key_value_heads": 4,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "torch_dtype": "float32",
    "transformers_version": "4.42.4",
    "use_cache": True,
    "vocab_size": 256000,
}
GEMMA_2_9B = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "sliding_window_size": 4096,
    "torch_dtype": "float32",
    "transformers_version": "4.42.0.dev0",
    "use_cache": True,
    "vocab_size": 256000,
}
# google/gemma-2b, config.json as of the repo's main (2024-02; bfloat16, 2 shards). Its
# hidden_act "gelu" is the tanh approximation: GemmaConfig rewrites it to gelu_pytorch_tanh.
GEMMA_2B = {
    "architectures": ["GemmaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "head_dim": 256,
    "hidden_act": "gelu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 16384,
    "max_position_embeddings": 8192,
    "model_type": "gemma",
    "num_attention_heads": 8,
    "num_hidden_layers": 18,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.38.0.dev0",
    "use_cache": True,
    "vocab_size": 256000,
}
# google/gemma-3-1b-pt, config.json as of the repo's main (2025-03; one bfloat16 shard).
GEMMA_3_1B = {
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "initializer_range": 0.02,
    "intermediate_size": 6912,
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 26,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "use_cache": True,
    "vocab_size": 262144,
}
# google/paligemma-3b-pt-224 (2024-05, float32, 3 shards) and google/paligemma2-3b-pt-448
# (2024-12, bfloat16, 2 shards), config.json as of the repos' main.
PALIGEMMA_3B_PT_224 = {
    "architectures": ["PaliGemmaForConditionalGeneration"],
    "bos_token_id": 2,
    "eos_token_id": 1,
    "hidden_size": 2048,
    "ignore_index": -100,
    "image_token_index": 257152,
    "model_type": "paligemma",
    "pad_token_id": 0,
    "projection_dim": 2048,
    "text_config": {
        "hidden_size": 2048,
        "intermediate_size": 16384,
        "model_type": "gemma",
        "num_attention_heads": 8,
        "num_hidden_layers": 18,
        "num_image_tokens": 256,
        "num_key_value_heads": 1,
        "torch_dtype": "float32",
        "vocab_size": 257216,
    },
    "torch_dtype": "float32",
    "transformers_version": "4.41.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "num_image_tokens": 256,
        "patch_size": 14,
        "projection_dim": 2048,
        "projector_hidden_act": "gelu_fast",
        "vision_use_head": False,
    },
}
PALIGEMMA2_3B_PT_448 = {
    "architectures": ["PaliGemmaForConditionalGeneration"],
    "bos_token_id": 2,
    "eos_token_id": 1,
    "hidden_size": 2048,
    "image_token_index": 257152,
    "model_type": "paligemma",
    "pad_token_id": 0,
    "projection_dim": 2304,
    "text_config": {
        "attn_logit_softcapping": 50.0,
        "cache_implementation": "hybrid",
        "final_logit_softcapping": 30.0,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "model_type": "gemma2",
        "num_attention_heads": 8,
        "num_hidden_layers": 26,
        "num_image_tokens": 1024,
        "num_key_value_heads": 4,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "torch_dtype": "bfloat16",
        "vocab_size": 257216,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.47.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 448,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "num_image_tokens": 1024,
        "num_positions": 1024,
        "patch_size": 14,
        "projection_dim": 2304,
        "torch_dtype": "bfloat16",
        "vision_use_head": False,
    },
}
# google/paligemma2-3b-pt-896 (2024-12, bfloat16, 2 shards): the 448 checkpoint's config with
# the 896-px tower (image_size 896: 64 x 64 = 4096 patches, num_positions and num_image_tokens 4096).
PALIGEMMA2_3B_PT_896 = {
    **PALIGEMMA2_3B_PT_448,
    "text_config": {**PALIGEMMA2_3B_PT_448["text_config"], "num_image_tokens": 4096},
    "vision_config": {**PALIGEMMA2_3B_PT_448["vision_config"], "image_size": 896, "num_image_tokens": 4096, "num_positions": 4096},
}
# google/gemma-3-4b-it and google/gemma-3-12b-it (2025-03; bfloat16, 2 and 5 shards): the text
# configs write few keys, Gemma3TextConfig's defaults fill the rest (vocab_size 262208; the 4B's 8
# query and 4 key-value heads of 256). NB reconstructed, not copied: the 4B's values match copies
# of the released config.json in other projects' tests; the 12B's text sizes (hidden 3840,
# intermediate 15360, 48 layers, 16 heads, 8 key-value heads) are the published values; both
# checked against the published parameter counts (4,300,079,472 and 12,187,325,040).
GEMMA_3_4B_IT = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}
GEMMA_3_12B_IT = {
    **GEMMA_3_4B_IT,
    "text_config": {
        "hidden_size": 3840,
        "intermediate_size": 15360,
        "model_type": "gemma3_text",
        "num_attention_heads": 16,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
}
# google/gemma-3-27b-it (2025-03; bfloat16, 12 shards): config.json reconstructed from the published
# values (the repo is gated; its text config writes head_dim 128 and query_pre_attn_scalar 168 beside
# the sizes, the rest as the 12B's): 27,432,406,640 parameters with the tower, the published 27.4B.
GEMMA_3_27B_IT = {
    **GEMMA_3_4B_IT,
    "text_config": {
        "head_dim": 128,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "model_type": "gemma3_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
}
# HuggingFaceTB/SmolVLM-Instruct (2024-11; model_type idefics3, one bfloat16 shard) and
# HuggingFaceM4/Idefics3-8B-Llama3 (2024-08; bfloat16, 4 shards), config.json and
# preprocessor_config.json as of the repos' main (the generation-only keys left out).
SMOLVLM_INSTRUCT = {
    "architectures": ["Idefics3ForConditionalGeneration"],
    "image_token_id": 49190,
    "model_type": "idefics3",
    "scale_factor": 3,
    "text_config": {
        "_name_or_path": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
        "architectures": ["VLlama3ForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "max_position_embeddings": 16384,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 24,
        "num_key_value_heads": 32,
        "pad_token_id": 2,
        "rms_norm_eps": 1e-05,
        "rope_theta": 273768.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 49155,
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.46.0.dev0",
    "use_cache": True,
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 384,
        "intermediate_size": 4304,
        "max_image_size": {"longest_edge": 384},
        "model_type": "idefics3",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "size": {"longest_edge": 1536},
        "tie_word_embeddings": False,
    },
    "vocab_size": 49155,
}
SMOLVLM_INSTRUCT_PROCESSOR = {
    "do_convert_rgb": True,
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Idefics3ImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": 384},
    "processor_class": "Idefics3Processor",
    "resample": 1,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 1536},
}
# HuggingFaceTB/SmolVLM2-500M-Video-Instruct (2025-02; model_type smolvlm, one bfloat16 shard):
# NB reconstructed, not copied: the keys memory depends on, with the values the published model
# has (SigLIP base patch16-512 tower, 12 layers of 768; pixel shuffle 4; SmolLM2-360M: 32 layers
# of 960, 15 heads, 5 KV heads; vocabulary 49280; 512 px tiles, images resized to 2048 px), and
# SmolVLM2's video_sampling in preprocessor_config.json. The import and measuring tests need its
# shapes, not its exact file.
SMOLVLM2_500M = {
    "architectures": ["SmolVLMForConditionalGeneration"],
    "image_token_id": 49190,
    "model_type": "smolvlm",
    "scale_factor": 4,
    "text_config": {
        "architectures": ["VLlama3ForCausalLM"],
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 960,
        "intermediate_size": 2560,
        "max_position_embeddings": 8192,
        "model_type": "llama",
        "num_attention_heads": 15,
        "num_hidden_layers": 32,
        "num_key_value_heads": 5,
        "pad_token_id": 2,
        "rms_norm_eps": 1e-05,
        "rope_theta": 100000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 49280,
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "use_cache": True,
    "vision_config": {
        "hidden_size": 768,
        "image_size": 512,
        "intermediate_size": 3072,
        "max_image_size": {"longest_edge": 512},
        "model_type": "smolvlm_vision",
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
        "patch_size": 16,
        "size": {"longest_edge": 2048},
        "tie_word_embeddings": False,
    },
    "vocab_size": 49280,
}
SMOLVLM2_500M_PROCESSOR = {
    "do_convert_rgb": True,
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "SmolVLMImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": 512},
    "processor_class": "SmolVLMProcessor",
    "resample": 1,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 2048},
    "video_sampling": {"fps": 1, "max_frames": 64, "video_size": {"longest_edge": 512}},
}
# HuggingFaceTB/SmolVLM2-2.2B-Instruct (2025-02; model_type smolvlm, bfloat16): NB reconstructed,
# not copied: the keys memory depends on, with the published model's values (SmolVLM-Instruct's
# SigLIP so400m/14 tower on 384 px tiles, pixel shuffle 3, SmolLM2-1.7B: 24 layers of 2048, 32
# heads and 32 KV heads, intermediate 8192, untied head; SmolVLM2's vocabulary of 49280; images
# resized to 1536 px) and SmolVLM2's video_sampling in preprocessor_config.json.
SMOLVLM2_2_2B = {
    "architectures": ["SmolVLMForConditionalGeneration"],
    "image_token_id": 49190,
    "model_type": "smolvlm",
    "scale_factor": 3,
    "text_config": {
        "architectures": ["VLlama3ForCausalLM"],
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "max_position_embeddings": 16384,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 24,
        "num_key_value_heads": 32,
        "pad_token_id": 2,
        "rms_norm_eps": 1e-05,
        "rope_theta": 273768.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 49280,
    },
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.50.0.dev0",
    "use_cache": True,
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 384,
        "intermediate_size": 4304,
        "max_image_size": {"longest_edge": 384},
        "model_type": "smolvlm_vision",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "size": {"longest_edge": 1536},
        "tie_word_embeddings": False,
    },
    "vocab_size": 49280,
}
SMOLVLM2_2_2B_PROCESSOR = {
    "do_convert_rgb": True,
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "SmolVLMImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": 384},
    "processor_class": "SmolVLMProcessor",
    "resample": 1,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 1536},
    "video_sampling": {"fps": 1, "max_frames": 64, "video_size": {"longest_edge": 384}},
}
IDEFICS3_8B = {
    "architectures": ["Idefics3ForConditionalGeneration"],
    "image_token_id": 128257,
    "model_type": "idefics3",
    "scale_factor": 2,
    "text_config": {
        "_name_or_path": "meta-llama/Meta-Llama-3.1-8B-Instruct",
        "architectures": ["LlamaForCausalLM"],
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0,
        "torch_dtype": "bfloat16",
        "vocab_size": 128259,
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": True,
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 364,
        "intermediate_size": 4304,
        "model_type": "idefics3",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
    },
}
IDEFICS3_8B_PROCESSOR = {
    "do_convert_rgb": True,
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Idefics3ImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": 364},
    "processor_class": "Idefics3Processor",
    "resample": 1,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 1456},
}
IXC2_VL_7B = {
    "architectures": ["InternLMXComposer2ForCausalLM"],
    "auto_map": {
        "AutoConfig": "configuration_internlm_xcomposer2.InternLMXcomposer2Config",
        "AutoModel": "modeling_internlm_xcomposer2.InternLMXComposer2ForCausalLM",
        "AutoModelForCausalLM": "modeling_internlm_xcomposer2.InternLMXComposer2ForCausalLM",
    },
    "bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "img_size": 490,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_length": 4096,
    "max_position_embeddings": 32768,
    "model_type": "internlmxcomposer2",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pad_token_id": 2,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 1.0, "type": "dynamic"},
    "rope_theta": 1000000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.2",
    "use_cache": False,
    "vocab_size": 92544,
}
# reconstructed: no copy of internlm/internlm-xcomposer2-4khd-7b's config.json was found; the
# same InternLMXcomposer2Config as XComposer2-VL-7B's with img_size 336 (the remote code's tower
# is CLIP ViT-L/14-336 at its own size; finetune/README.md: img_size is not used by the 4khd model)
IXC2_4KHD_7B = {**IXC2_VL_7B, "img_size": 336}
INTERNLM2_5_7B_CHAT = {
    "architectures": ["InternLM2ForCausalLM"],
    "attn_implementation": "eager",
    "auto_map": {
        "AutoConfig": "configuration_internlm2.InternLM2Config",
        "AutoModel": "modeling_internlm2.InternLM2ForCausalLM",
        "AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM",
    },
    "bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "internlm2",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pad_token_id": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 2.0, "type": "dynamic"},
    "rope_theta": 1000000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.41.0",
    "use_cache": True,
    "vocab_size": 92544,
}
# EleutherAI/pythia-1.4b, config.json as of the repo's main (fp16 weights, one model.safetensors).
PYTHIA_1_4B = {
    "architectures": ["GPTNeoXForCausalLM"],
    "bos_token_id": 0,
    "eos_token_id": 0,
    "hidden_act": "gelu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048,
    "model_type": "gpt_neox",
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "rotary_emb_base": 10000,
    "rotary_pct": 0.25,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.24.0",
    "use_cache": True,
    "use_parallel_residual": True,
    "vocab_size": 50304,
}
# microsoft/phi-2 and microsoft/phi-1_5, config.json as of the repos' main (the transformers-native
# "phi" layout since transformers 4.37; fp16 weights, phi-2 in 2 shards).
PHI_2 = {
    "_name_or_path": "microsoft/phi-2",
    "architectures": ["PhiForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 50256,
    "embd_pdrop": 0.0,
    "eos_token_id": 50256,
    "hidden_act": "gelu_new",
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 10240,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048,
    "model_type": "phi",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "partial_rotary_factor": 0.4,
    "qk_layernorm": False,
    "resid_pdrop": 0.1,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.37.0",
    "use_cache": True,
    "vocab_size": 51200,
}
PHI_1_5 = {
    "_name_or_path": "microsoft/phi-1_5",
    "architectures": ["PhiForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": None,
    "embd_pdrop": 0.0,
    "eos_token_id": None,
    "hidden_act": "gelu_new",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048,
    "model_type": "phi",
    "num_attention_heads": 32,
    "num_hidden_layers": 24,
    "num_key_value_heads": None,
    "partial_rotary_factor": 0.5,
    "qk_layernorm": False,
    "resid_pdrop": 0.0,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.37.0",
    "use_cache": True,
    "vocab_size": 51200,
}
# bigscience/bloom-560m and bigscience/bloomz-7b1, config.json as of the repos' main (fp16
# weights; bloomz-7b1 is bloom-7b1's multitask fine-tune, the same sizes).
BLOOM_560M = {
    "apply_residual_connection_post_layernorm": False,
    "architectures": ["BloomForCausalLM"],
    "attention_dropout": 0.0,
    "attention_softmax_in_fp32": True,
    "bias_dropout_fusion": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_dropout": 0.0,
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "masked_softmax_fusion": True,
    "model_type": "bloom",
    "n_head": 16,
    "n_inner": None,
    "n_layer": 24,
    "offset_alibi": 100,
    "pad_token_id": 3,
    "pretraining_tp": 1,
    "skip_bias_add": True,
    "skip_bias_add_qkv": False,
    "slow_but_exact": False,
    "transformers_version": "4.27.0.dev0",
    "unk_token_id": 0,
    "use_cache": True,
    "vocab_size": 250880,
}
BLOOMZ_7B1 = {**BLOOM_560M, "hidden_size": 4096, "n_head": 32, "n_layer": 30, "pretraining_tp": 1, "seq_length": 2048, "transformers_version": "4.20.0"}
# tiiuae/falcon-40b, config.json as of the repo's main (transformers-native "falcon", bf16 weights in 9 shards).
FALCON_40B = {
    "alibi": False,
    "apply_residual_connection_post_layernorm": False,
    "architectures": ["FalconForCausalLM"],
    "attention_dropout": 0.0,
    "bias": False,
    "bos_token_id": 11,
    "eos_token_id": 11,
    "hidden_dropout": 0.0,
    "hidden_size": 8192,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "falcon",
    "new_decoder_architecture": True,
    "num_attention_heads": 128,
    "num_hidden_layers": 60,
    "num_kv_heads": 8,
    "parallel_attn": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.27.4",
    "use_cache": True,
    "vocab_size": 65024,
}
# THUDM/glm-4-9b-chat-hf and THUDM/GLM-4-9B-0414, config.json as of the repos' main
# (transformers-native "glm" and "glm4"; bf16 weights in 4 shards).
GLM_4_9B_CHAT_HF = {
    "architectures": ["GlmForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338],
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 13696,
    "max_position_embeddings": 131072,
    "model_type": "glm",
    "num_attention_heads": 32,
    "num_hidden_layers": 40,
    "num_key_value_heads": 2,
    "pad_token_id": 151329,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1.5625e-07,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.46.0",
    "use_cache": True,
    "vocab_size": 151552,
}
GLM_4_9B_0414 = {
    "architectures": ["Glm4ForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338],
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 13696,
    "max_position_embeddings": 32768,
    "model_type": "glm4",
    "num_attention_heads": 32,
    "num_hidden_layers": 40,
    "num_key_value_heads": 2,
    "pad_token_id": 151329,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.3",
    "use_cache": True,
    "vocab_size": 151552,
}
# Qwen/Qwen-7B (remote code, model_type "qwen"), config.json as of the repo's main (the 8K-context
# release of 2023-09; bf16 weights in 8 shards, total_size 15_442_649_088 in its index).
QWEN_7B = {
    "architectures": ["QWenLMHeadModel"],
    "auto_map": {"AutoConfig": "configuration_qwen.QWenConfig", "AutoModelForCausalLM": "modeling_qwen.QWenLMHeadModel"},
    "attn_dropout_prob": 0.0,
    "bf16": False,
    "emb_dropout_prob": 0.0,
    "fp16": False,
    "fp32": False,
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "initializer_range": 0.02,
    "kv_channels": 128,
    "layer_norm_epsilon": 1e-06,
    "max_position_embeddings": 32768,
    "model_type": "qwen",
    "no_bias": True,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "onnx_safe": None,
    "rotary_emb_base": 10000,
    "rotary_pct": 1.0,
    "scale_attn_weights": True,
    "seq_length": 8192,
    "tie_word_embeddings": False,
    "tokenizer_class": "QWenTokenizer",
    "transformers_version": "4.32.0",
    "use_cache": True,
    "use_dynamic_ntk": True,
    "use_flash_attn": "auto",
    "use_logn_attn": True,
    "vocab_size": 151936,
}
# Qwen/Qwen-1_8B, reconstructed from the published values (hidden 2048, 16 heads of kv_channels
# 128, 24 layers, intermediate_size 11008, max_position_embeddings 8192, vocab 151936, no_bias: the
# sizes mlx-examples' Qwen-1.8B port reads) and the keys every first-generation Qwen config writes
# as Qwen-7B's; bf16 weights in 2 shards. 1,836,828,672 parameters, the published 1.8B.
QWEN_1_8B = {**QWEN_7B, "hidden_size": 2048, "intermediate_size": 11008, "max_position_embeddings": 8192, "num_attention_heads": 16, "num_hidden_layers": 24}
# microsoft/Phi-3-vision-128k-instruct (remote code Phi3VForCausalLM, model_type "phi3_v"), config.json
# as of the repo's main (su rotary: 48 short and 48 long factors, one per rotated frequency of the
# 96-wide heads) and its preprocessor_config.json (Phi3VImageProcessor, num_crops 16); bf16 weights
# in 2 shards. 4,146,621,440 parameters, the published 4.15B.
PHI3_V_128K_SHORT_FACTOR = [
    1.05,
    1.05,
    1.05,
    1.1,
    1.1,
    1.1,
    1.2500000000000002,
    1.2500000000000002,
    1.4000000000000004,
    1.4500000000000004,
    1.5500000000000005,
    1.8500000000000008,
    1.9000000000000008,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.000000000000001,
    2.1000000000000005,
    2.1000000000000005,
    2.2,
    2.3499999999999996,
    2.3499999999999996,
    2.3499999999999996,
    2.3499999999999996,
    2.3999999999999995,
    2.3999999999999995,
    2.6499999999999986,
    2.6999999999999984,
    2.8999999999999977,
    2.9499999999999975,
    3.049999999999997,
    3.049999999999997,
    3.049999999999997,
]
PHI3_V_128K_LONG_FACTOR = [
    1.0299999713897705,
    1.0499999523162842,
    1.0499999523162842,
    1.0799999237060547,
    1.2299998998641968,
    1.2299998998641968,
    1.2999999523162842,
    1.4499999284744263,
    1.5999999046325684,
    1.6499998569488525,
    1.8999998569488525,
    2.859999895095825,
    3.68999981880188,
    5.419999599456787,
    5.489999771118164,
    5.489999771118164,
    9.09000015258789,
    11.579999923706055,
    15.65999984741211,
    15.769999504089355,
    15.789999961853027,
    18.360000610351562,
    21.989999771118164,
    23.079999923706055,
    30.009998321533203,
    32.35000228881836,
    32.590003967285156,
    35.56000518798828,
    39.95000457763672,
    53.840003967285156,
    56.20000457763672,
    57.95000457763672,
    59.29000473022461,
    59.77000427246094,
    59.920005798339844,
    61.190006256103516,
    61.96000671386719,
    62.50000762939453,
    63.3700065612793,
    63.48000717163086,
    63.48000717163086,
    63.66000747680664,
    63.850006103515625,
    64.08000946044922,
    64.760009765625,
    64.80001068115234,
    64.81001281738281,
    64.81001281738281,
]
PHI3_VISION_128K_INSTRUCT = {
    "_name_or_path": "Phi-3-vision-128k-instruct",
    "architectures": ["Phi3VForCausalLM"],
    "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_phi3_v.Phi3VConfig", "AutoModelForCausalLM": "modeling_phi3_v.Phi3VForCausalLM"},
    "bos_token_id": 1,
    "embd_layer": {
        "embedding_cls": "image",
        "hd_transform_order": "sub_glb",
        "projection_cls": "mlp",
        "use_hd_transform": True,
        "with_learnable_separator": True,
    },
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 3072,
    "img_processor": {"image_dim_out": 1024, "model_name": "openai/clip-vit-large-patch14-336", "name": "clip_vision_model", "num_img_tokens": 144},
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "model_type": "phi3_v",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"long_factor": PHI3_V_128K_LONG_FACTOR, "short_factor": PHI3_V_128K_SHORT_FACTOR, "type": "su"},
    "rope_theta": 10000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.38.1",
    "use_cache": True,
    "vocab_size": 32064,
    "_attn_implementation": "flash_attention_2",
}
PHI3_VISION_128K_PROCESSOR = {
    "auto_map": {"AutoImageProcessor": "image_processing_phi3_v.Phi3VImageProcessor", "AutoProcessor": "processing_phi3_v.Phi3VProcessor"},
    "do_convert_rgb": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "Phi3VImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "num_crops": 16,
    "num_img_tokens": 144,
    "processor_class": "Phi3VProcessor",
}
# microsoft/Phi-3.5-vision-instruct (the same remote code), config.json as of the repo's main (su
# rotary with its own factors, sliding_window 262144, pad_token_id 32000, the dropouts written out)
# and preprocessor_config.json (num_crops 4, the multi-frame setting it ships with); the same tensor
# layout and 4,146,621,440 parameters as Phi-3-vision-128k, the published 4.15B.
PHI3_5_V_SHORT_FACTOR = [
    1.08,
    1.1,
    1.1300000000000001,
    1.2800000000000002,
    1.3100000000000003,
    1.4500000000000004,
    1.4500000000000004,
    1.9500000000000008,
    2.030000000000001,
    2.4299999999999926,
    2.5699999999999896,
    2.9499999999999815,
    3.729999999999965,
    3.869999999999962,
    4.189999999999955,
    4.43999999999995,
    4.6399999999999455,
    4.979999999999938,
    5.159999999999934,
    5.279999999999932,
    5.759999999999922,
    5.889999999999919,
    5.889999999999919,
    5.969999999999917,
    6.089999999999915,
    6.2799999999999105,
    6.7699999999999,
    6.8899999999998975,
    7.109999999999893,
    7.129999999999892,
    7.179999999999891,
    7.289999999999889,
    7.339999999999888,
    7.559999999999883,
    7.619999999999882,
    7.69999999999988,
    7.879999999999876,
    7.879999999999876,
    7.879999999999876,
    7.939999999999875,
    7.949999999999875,
    7.979999999999874,
    8.19999999999987,
    8.439999999999864,
    8.469999999999864,
    8.589999999999861,
    8.809999999999857,
    8.999999999999853,
]
PHI3_5_V_LONG_FACTOR = [
    1.0800000429153442,
    1.1100000143051147,
    1.1399999856948853,
    1.340000033378601,
    1.5899999141693115,
    1.600000023841858,
    1.6200000047683716,
    2.620000123977661,
    3.2300000190734863,
    3.2300000190734863,
    4.789999961853027,
    7.400000095367432,
    7.700000286102295,
    9.09000015258789,
    12.199999809265137,
    17.670000076293945,
    24.46000099182129,
    28.57000160217285,
    30.420001983642578,
    30.840002059936523,
    32.590003967285156,
    32.93000411987305,
    42.320003509521484,
    44.96000289916992,
    50.340003967285156,
    50.45000457763672,
    57.55000305175781,
    57.93000411987305,
    58.21000289916992,
    60.1400032043457,
    62.61000442504883,
    62.62000274658203,
    62.71000289916992,
    63.1400032043457,
    63.1400032043457,
    63.77000427246094,
    63.93000411987305,
    63.96000289916992,
    63.970001220703125,
    64.02999877929688,
    64.06999969482422,
    64.08000183105469,
    64.12000274658203,
    64.41000366210938,
    64.4800033569336,
    64.51000213623047,
    64.52999877929688,
    64.83999633789062,
]
PHI3_5_VISION_INSTRUCT = {
    **{k: v for k, v in PHI3_VISION_128K_INSTRUCT.items() if k not in ("rope_scaling", "sliding_window")},
    "_name_or_path": "Phi-3.5-vision-instruct",
    "embd_pdrop": 0.0,
    "pad_token_id": 32000,
    "resid_pdrop": 0.0,
    "rope_scaling": {"long_factor": PHI3_5_V_LONG_FACTOR, "short_factor": PHI3_5_V_SHORT_FACTOR, "type": "su"},
    "sliding_window": 262144,
}
PHI3_5_VISION_PROCESSOR = {**PHI3_VISION_128K_PROCESSOR, "num_crops": 4}
# baichuan-inc/Baichuan2-7B-Base (remote code, model_type "baichuan"), config.json as of the repo's
# main; the hub ships one pytorch_model.bin (bf16), written here as a safetensors header of the same
# tensor names and shapes.
BAICHUAN2_7B_BASE = {
    "_from_model_config": True,
    "architectures": ["BaichuanForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_baichuan.BaichuanConfig", "AutoModelForCausalLM": "modeling_baichuan.BaichuanForCausalLM"},
    "tokenizer_class": "BaichuanTokenizer",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_max_length": 4096,
    "model_type": "baichuan",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.29.2",
    "use_cache": True,
    "vocab_size": 125696,
    "z_loss_weight": 0,
}
# BUAADreamer/Yi-VL-6B-hf and -34B-hf, the transformers conversions of 01-ai/Yi-VL-6B and -34B that
# LLaMA-Factory lists (template yi_vl). NB reconstructed, not copied (no stored copy of either hub
# file was found): the layout of llava-hf's config.json with LLaMA-Factory's is_yi_vl_derived_model
# marker; the text_config from Yi-6B's and Yi-34B's config.json (GQA 32 / 4 and 56 / 8 heads, vocab
# 64000, rope_theta 5e6), the vision_config from the vit/clip-vit-H-14-laion2B-s32B-b79K-yi-vl-*-448
# folders' CLIPVisionConfig (LAION ViT-H/14: hidden 1280, 32 layers, 16 heads, exact GELU, at 448 px),
# vision_feature_layer -2 from the original config's mm_vision_select_layer. The vocabulary as
# llava-hf's conversion script makes it (convert_llava_weights_to_hf.py: <image> and <pad> added
# to the tokenizer, the tables padded to a multiple of 64): Yi's 64000 rows become 64064, <image>
# 64000 and <pad> 64001 (the original's 64000 rows would leave <image> outside the table); fp16 weights.
YI_VL_VISION = {
    "hidden_act": "gelu",
    "hidden_size": 1280,
    "image_size": 448,
    "intermediate_size": 5120,
    "layer_norm_eps": 1e-05,
    "model_type": "clip_vision_model",
    "num_attention_heads": 16,
    "num_hidden_layers": 32,
    "patch_size": 14,
    "projection_dim": 1024,
}


def yi_vl_config(text: dict) -> dict:
    return {
        "architectures": ["LlavaForConditionalGeneration"],
        "ignore_index": -100,
        "image_token_index": 64000,
        "is_yi_vl_derived_model": True,
        "model_type": "llava",
        "pad_token_id": 64001,
        "projector_hidden_act": "gelu",
        "text_config": {
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": False,
            "hidden_act": "silu",
            "max_position_embeddings": 4096,
            "model_type": "llama",
            "rms_norm_eps": 1e-05,
            "rope_theta": 5000000.0,
            "torch_dtype": "float16",
            "vocab_size": 64064,
            **text,
        },
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "vision_config": YI_VL_VISION,
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "vocab_size": 64064,
    }


YI_VL_6B_HF = yi_vl_config({"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 4})
YI_VL_34B_HF = yi_vl_config({"hidden_size": 7168, "intermediate_size": 20480, "num_attention_heads": 56, "num_hidden_layers": 60, "num_key_value_heads": 8})
# the vit folders' CLIPImageProcessor: 448 px, no crop beyond the resize (Yi-VL pads to a square first)
YI_VL_PROCESSOR = {
    "crop_size": {"height": 448, "width": 448},
    "do_center_crop": True,
    "do_normalize": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "CLIPImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3,
    "size": {"shortest_edge": 448},
}
# Qwen/Qwen-VL-Chat (remote code, model_type "qwen" with a `visual` block), config.json as of the
# repo's main (2023-08; Qwen/Qwen-VL's is the same); bf16 weights in 10 shards. 9,656,935,168
# parameters: Qwen-7B's 7,721,324,544 and the visual tower's 1,935,610,624, the published 9.6B.
QWEN_VL_CHAT = {
    "architectures": ["QWenLMHeadModel"],
    "attn_dropout_prob": 0.0,
    "auto_map": {"AutoConfig": "configuration_qwen.QWenConfig", "AutoModelForCausalLM": "modeling_qwen.QWenLMHeadModel"},
    "bf16": False,
    "emb_dropout_prob": 0.0,
    "fp16": False,
    "fp32": False,
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 22016,
    "kv_channels": 128,
    "layer_norm_epsilon": 1e-06,
    "max_position_embeddings": 8192,
    "model_type": "qwen",
    "no_bias": True,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "onnx_safe": None,
    "rotary_emb_base": 10000,
    "rotary_pct": 1.0,
    "scale_attn_weights": True,
    "seq_length": 2048,
    "tie_word_embeddings": False,
    "tokenizer_type": "QWenTokenizer",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.31.0",
    "use_cache": True,
    "use_dynamic_ntk": True,
    "use_flash_attn": False,
    "use_logn_attn": True,
    "visual": {
        "heads": 16,
        "image_size": 448,
        "image_start_id": 151857,
        "layers": 48,
        "mlp_ratio": 4.9231,
        "output_dim": 4096,
        "patch_size": 14,
        "width": 1664,
    },
    "vocab_size": 151936,
}
# THUDM/chatglm3-6b and THUDM/glm-4-9b-chat (remote code, model_type "chatglm"), config.json as
# of the repos' main (fp16 weights in 7 shards, bf16 in 10); auto_map left out.
CHATGLM3_6B = {
    "_name_or_path": "THUDM/chatglm3-6b",
    "model_type": "chatglm",
    "architectures": ["ChatGLMModel"],
    "add_bias_linear": False,
    "add_qkv_bias": True,
    "apply_query_key_layer_scaling": True,
    "apply_residual_connection_post_layernorm": False,
    "attention_dropout": 0.0,
    "attention_softmax_in_fp32": True,
    "bias_dropout_fusion": True,
    "ffn_hidden_size": 13696,
    "fp32_residual_connection": False,
    "hidden_dropout": 0.0,
    "hidden_size": 4096,
    "kv_channels": 128,
    "layernorm_epsilon": 1e-05,
    "multi_query_attention": True,
    "multi_query_group_num": 2,
    "num_attention_heads": 32,
    "num_layers": 28,
    "original_rope": True,
    "padded_vocab_size": 65024,
    "post_layer_norm": True,
    "rmsnorm": True,
    "seq_length": 8192,
    "use_cache": True,
    "torch_dtype": "float16",
    "transformers_version": "4.30.2",
    "tie_word_embeddings": False,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
GLM_4_9B_CHAT = {
    "_name_or_path": "THUDM/glm-4-9b-chat",
    "model_type": "chatglm",
    "architectures": ["ChatGLMModel"],
    "add_bias_linear": False,
    "add_qkv_bias": True,
    "apply_query_key_layer_scaling": True,
    "apply_residual_connection_post_layernorm": False,
    "attention_dropout": 0.0,
    "attention_softmax_in_fp32": True,
    "attn_implementation": "sdpa",
    "bias_dropout_fusion": True,
    "ffn_hidden_size": 13696,
    "fp32_residual_connection": False,
    "hidden_dropout": 0.0,
    "hidden_size": 4096,
    "kv_channels": 128,
    "layernorm_epsilon": 1.5625e-07,
    "multi_query_attention": True,
    "multi_query_group_num": 2,
    "num_attention_heads": 32,
    "num_hidden_layers": 40,
    "num_layers": 40,
    "rope_ratio": 500,
    "original_rope": True,
    "padded_vocab_size": 151552,
    "post_layer_norm": True,
    "rmsnorm": True,
    "seq_length": 131072,
    "use_cache": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.4",
    "tie_word_embeddings": False,
    "eos_token_id": [151329, 151336, 151338],
    "pad_token_id": 151329,
}
# THUDM/glm-4v-9b (remote code, model_type "chatglm" with a vision_config block; bf16 weights in 15
# shards). NB reconstructed, not copied (no stored copy of the hub file was found): GLM-4-9B-chat's
# language keys with the hub repo's seq_length 8192 and its boi / eoi ids, and the vision_config
# block visual.py reads (EVA2-CLIP-E: 63 layers of 1792, 16 heads, MLP 15360, 1120 px, patch 14,
# 6401 positions); auto_map left out. 13,906,320,896 parameters:
# GLM-4-9B's language model 9,399,951,360, the EVA2-CLIP-E tower 4,291,915,264 and the projector
# (conv, GLU, boi, eoi) 214,454,272, the published 13.9B.
GLM_4V_9B = {
    **{k: v for k, v in GLM_4_9B_CHAT.items() if k not in ("rope_ratio", "seq_length")},
    "_name_or_path": "THUDM/glm-4v-9b",
    "boi_token_id": 151339,
    "eoi_token_id": 151340,
    "seq_length": 8192,
    "vision_config": {
        "dropout_prob": 0.0,
        "hidden_act": "gelu",
        "in_channels": 3,
        "num_hidden_layers": 63,
        "hidden_size": 1792,
        "patch_size": 14,
        "num_heads": 16,
        "intermediate_size": 15360,
        "layer_norm_eps": 1e-06,
        "num_positions": 6401,
        "image_size": 1120,
        "scaling_factor": 8,
    },
}


def eva2clip_tensors(v: dict, pre: str, dtype: str) -> list[tuple[str, str, list[int]]]:
    """An EVA2-CLIP-E tower under `pre` (GLM-4V-9B's transformer.vision., CogVLM2's
    model.vision.), from its vision_config `v`: patch_embedding.proj, cls_embedding,
    position_embedding, transformer.layers.N with query_key_value, dense, fc1, fc2 and two
    LayerNorms, all with bias."""
    w, m, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    out = [
        (pre + "patch_embedding.cls_embedding", dtype, [1, w]),
        (pre + "patch_embedding.proj.weight", dtype, [w, v["in_channels"], p, p]),
        (pre + "patch_embedding.proj.bias", dtype, [w]),
        (pre + "patch_embedding.position_embedding.weight", dtype, [v["num_positions"], w]),
    ]
    for i in range(v["num_hidden_layers"]):
        q = f"{pre}transformer.layers.{i}."
        out += [
            (q + "input_layernorm.weight", dtype, [w]),
            (q + "input_layernorm.bias", dtype, [w]),
            (q + "attention.query_key_value.weight", dtype, [3 * w, w]),
            (q + "attention.query_key_value.bias", dtype, [3 * w]),
            (q + "attention.dense.weight", dtype, [w, w]),
            (q + "attention.dense.bias", dtype, [w]),
            (q + "mlp.fc1.weight", dtype, [m, w]),
            (q + "mlp.fc1.bias", dtype, [m]),
            (q + "mlp.fc2.weight", dtype, [w, m]),
            (q + "mlp.fc2.bias", dtype, [w]),
            (q + "post_attention_layernorm.weight", dtype, [w]),
            (q + "post_attention_layernorm.bias", dtype, [w]),
        ]
    return out


def glu_projector_tensors(pre: str, w: int, conv: int, h: int, inter: int, dtype: str) -> list[tuple[str, str, list[int]]]:
    """The projector after an EVA2-CLIP-E tower of width `w` (GLM-4V-9B's, CogVLM2's): the 2 x 2
    conv to `conv` channels, the GLU linear_proj from them to the language width `h`
    (linear_proj, norm1, dense_h_to_4h, gate_proj, dense_4h_to_h of `inter`), boi and eoi."""
    return [
        (pre + "linear_proj.linear_proj.weight", dtype, [h, conv]),
        (pre + "linear_proj.norm1.weight", dtype, [h]),
        (pre + "linear_proj.norm1.bias", dtype, [h]),
        (pre + "linear_proj.dense_h_to_4h.weight", dtype, [inter, h]),
        (pre + "linear_proj.gate_proj.weight", dtype, [inter, h]),
        (pre + "linear_proj.dense_4h_to_h.weight", dtype, [h, inter]),
        (pre + "conv.weight", dtype, [conv, w, 2, 2]),
        (pre + "conv.bias", dtype, [conv]),
        (pre + "boi", dtype, [1, 1, h]),
        (pre + "eoi", dtype, [1, 1, h]),
    ]


def glm4v_9b_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """THUDM/glm-4v-9b: the ChatGLM language model (chatglm_tensors) and transformer.vision, the
    EVA2-CLIP-E tower (patch_embedding.proj, cls_embedding, position_embedding, transformer.layers.N
    with query_key_value, dense, fc1, fc2 and two LayerNorms, all with bias), the 2 x 2 conv, the GLU
    linear_proj (linear_proj, norm1, dense_h_to_4h, gate_proj, dense_4h_to_h) and boi / eoi."""
    v, h, inter = c["vision_config"], c["hidden_size"], c["ffn_hidden_size"]
    w = v["hidden_size"]
    pre = "transformer.vision."
    out = eva2clip_tensors(v, pre, dtype)
    out += glu_projector_tensors(pre, w, h, h, inter, dtype)
    return chatglm_tensors(c, dtype) + out


# THUDM/cogvlm2-llama3-chat-19B (remote code CogVLMForCausalLM, no model_type: CogVLMConfig declares
# none; bf16 weights in 8 shards). The config.json as stored in a copy of the hub repo
# (yongchenglai/llm-research model/model_cogvlm2/config.json), key for key; the tensor names and
# shapes those of its model.safetensors.index.json (1221 tensors, total_size 39_006_214_656 B), the
# shapes read from modeling_cogvlm.py and visual.py (the index lists names only; the shard grouping
# here is write_checkpoint's, not the hub's). 19,503,105,280 parameters: the language model with its
# visual experts 15,009,779,712, the EVA2-CLIP-E tower 4,296,961,536, the projector 196,364,032
# (+ 32 x 64 bf16 rotary inv_freq buffers: 19,503,107,328 x 2 B = the index's total_size).
COGVLM2_LLAMA3_CHAT_19B = {
    "architectures": ["CogVLMForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_cogvlm.CogVLMConfig", "AutoModelForCausalLM": "modeling_cogvlm.CogVLMForCausalLM"},
    "vision_config": {
        "dropout_prob": 0.0,
        "hidden_act": "gelu",
        "in_channels": 3,
        "num_hidden_layers": 63,
        "hidden_size": 1792,
        "patch_size": 14,
        "num_heads": 16,
        "intermediate_size": 15360,
        "layer_norm_eps": 1e-06,
        "num_positions": 9217,
        "image_size": 1344,
    },
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "template_version": "chat",
    "initializer_range": 0.02,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128009],
    "pad_token_id": 128002,
    "vocab_size": 128256,
    "num_hidden_layers": 32,
    "hidden_act": "silu",
    "use_cache": True,
}


def visual_expert_tensors(c: dict, qkv: int, vision_bias: bool, dtype: str) -> list[tuple[str, str, list[int]]]:
    """CogVLM's and CogVLM2's language model: model.embed_tokens, model.layers.N with both
    experts (self_attn.{language,vision}_expert_query_key_value of `qkv` rows, the vision one
    with a bias where `vision_bias`, {language,vision}_expert_dense, mlp.{language,vision}_mlp.
    {gate,up,down}_proj, two RMSNorms and the rotary's inv_freq buffer) and model.norm."""
    h, inter, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    out = [("model.embed_tokens.weight", dtype, [c["vocab_size"], h])]
    for i in range(c["num_hidden_layers"]):
        q = f"model.layers.{i}."
        out += [
            (q + "input_layernorm.weight", dtype, [h]),
            (q + "self_attn.rotary_emb.inv_freq", dtype, [h // heads // 2]),
            (q + "self_attn.language_expert_query_key_value.weight", dtype, [qkv, h]),
            (q + "self_attn.vision_expert_query_key_value.weight", dtype, [qkv, h]),
            *([(q + "self_attn.vision_expert_query_key_value.bias", dtype, [qkv])] if vision_bias else []),
            (q + "self_attn.language_expert_dense.weight", dtype, [h, h]),
            (q + "self_attn.vision_expert_dense.weight", dtype, [h, h]),
            (q + "post_attention_layernorm.weight", dtype, [h]),
        ]
        for expert in ("language_mlp", "vision_mlp"):
            out += [
                (f"{q}mlp.{expert}.gate_proj.weight", dtype, [inter, h]),
                (f"{q}mlp.{expert}.up_proj.weight", dtype, [inter, h]),
                (f"{q}mlp.{expert}.down_proj.weight", dtype, [h, inter]),
            ]
    return out + [("model.norm.weight", dtype, [h])]


def cogvlm2_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """THUDM/cogvlm2-llama3-chat-19B: model.embed_tokens, model.layers.N with both experts
    (self_attn.{language,vision}_expert_query_key_value, the vision one with a bias,
    {language,vision}_expert_dense, mlp.{language,vision}_mlp.{gate,up,down}_proj, two RMSNorms and
    the rotary's inv_freq buffer), model.norm, lm_head, and model.vision: the EVA2-CLIP-E tower as
    GLM-4V-9B's, the 2 x 2 conv (vision width to vision width), the GLU linear_proj from the vision
    width, boi and eoi."""
    v, h, inter, heads = c["vision_config"], c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    kv = c.get("num_multi_query_heads", 8)
    w = v["hidden_size"]
    out = visual_expert_tensors(c, h + 2 * (h // heads) * kv, True, dtype)
    pre = "model.vision."
    out += eva2clip_tensors(v, pre, dtype)
    out += glu_projector_tensors(pre, w, w, h, inter, dtype)
    return out + [("lm_head.weight", dtype, [c["vocab_size"], h])]


# THUDM/cogvlm-chat-hf (CogVLM v1, remote code CogVLMForCausalLM, no model_type). NB reconstructed,
# not copied (no copy of the hub config.json was found): CogVLMConfig's defaults (Vicuna-7B-v1.5:
# hidden 4096, intermediate 11008, 32 layers, 32 heads, vocab 32000, max_position_embeddings 2048,
# rms_norm_eps 1e-05 as Vicuna's (the class default 1e-06; memory does not read it); bos 1, eos 2, pad 0) and the vision_config its
# configuration code writes (EVA2-CLIP-E at 490 px: 63 layers of 1792, 16 heads, MLP 15360,
# num_positions 1226). The tensor names and shapes read from modeling_cogvlm.py and visual.py
# (copies and ports: no index of the hub repo was found); 8 bf16 shards as published, the grouping
# write_checkpoint's. 17,639,685,376 parameters: the language model with its visual experts
# 13,214,420,992, the tower 4,282,641,664, the projector 142,622,720 (the published 17B: 10B
# vision, 7B language).
COGVLM_CHAT_HF = {
    "architectures": ["CogVLMForCausalLM"],
    "auto_map": dict(COGVLM2_LLAMA3_CHAT_19B["auto_map"]),
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 2048,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-05,
    "template_version": "chat",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    # CogVLM2's EVA2-CLIP-E at 490 px: 35 x 35 patches and the class token
    "vision_config": {**COGVLM2_LLAMA3_CHAT_19B["vision_config"], "num_positions": 1226, "image_size": 490},
    "vocab_size": 32000,
}


def cogvlm_tensors(c: dict, dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    """THUDM/cogvlm-chat-hf: as cogvlm2_tensors with v1's differences: MHA (query_key_value 3 x
    hidden, the vision one without a bias) and no conv (the GLU's linear_proj reads the tower's
    width directly)."""
    v, h, inter = c["vision_config"], c["hidden_size"], c["intermediate_size"]
    w = v["hidden_size"]
    out = visual_expert_tensors(c, 3 * h, False, dtype)
    pre = "model.vision."
    out += eva2clip_tensors(v, pre, dtype)
    out += [t for t in glu_projector_tensors(pre, w, w, h, inter, dtype) if not t[0].startswith(pre + "conv.")]
    return out + [("lm_head.weight", dtype, [c["vocab_size"], h])]


# deepseek-community/deepseek-vl-1.3b-chat (2025-07, the transformers conversion of
# deepseek-ai/deepseek-vl-1.3b-chat; one bfloat16 shard). NB reconstructed, not copied: the keys
# memory depends on, with the values of the published model (SigLIP-L/16 at 384 px: 24 layers of
# 1024, 16 heads, MLP 4096, 576 patches, the attention-pooling head kept as the original tower's
# attn_pool; the aligner's two linears 1024 -> 2048 -> 2048; DeepSeek-LLM-1.3B: 24 layers of
# 2048, 16 heads, MLP 5632, vocabulary 102400, lm_head untied). 1,975,235,584 parameters.
DEEPSEEK_VL_1_3B_CHAT = {
    "architectures": ["DeepseekVLForConditionalGeneration"],
    "image_token_id": 100015,
    "model_type": "deepseek_vl",
    "text_config": {
        "bos_token_id": 100000,
        "eos_token_id": 100001,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "max_position_embeddings": 16384,
        "model_type": "llama",
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "num_key_value_heads": 16,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 102400,
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.56.0.dev0",
    "vision_config": {
        "hidden_size": 1024,
        "image_size": 384,
        "intermediate_size": 4096,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "patch_size": 16,
    },
}
DEEPSEEK_VL_1_3B_CHAT_PROCESSOR = {
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "DeepseekVLImageProcessorFast",
    "image_std": [0.5, 0.5, 0.5],
    "min_size": 14,
    "processor_class": "DeepseekVLProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 384, "width": 384},
}
# google/flan-t5-base, -large, -xl (fp32 weights; -xl in 2 shards) and google-t5/t5-base (the
# original T5: ReLU feed-forward, the head tied to `shared`). NB reconstructed, not copied: the
# released config.json's values as published, checked against the published parameter counts
# (flan-t5-base 247_577_856, t5-base 222_903_552).
_FLAN_T5 = {
    "architectures": ["T5ForConditionalGeneration"],
    "d_kv": 64,
    "decoder_start_token_id": 0,
    "dense_act_fn": "gelu_new",
    "dropout_rate": 0.1,
    "eos_token_id": 1,
    "feed_forward_proj": "gated-gelu",
    "initializer_factor": 1.0,
    "is_encoder_decoder": True,
    "is_gated_act": True,
    "layer_norm_epsilon": 1e-06,
    "model_type": "t5",
    "n_positions": 512,
    "output_past": True,
    "pad_token_id": 0,
    "relative_attention_max_distance": 128,
    "relative_attention_num_buckets": 32,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.23.1",
    "use_cache": True,
    "vocab_size": 32128,
}
FLAN_T5_BASE = {**_FLAN_T5, "d_ff": 2048, "d_model": 768, "num_decoder_layers": 12, "num_heads": 12, "num_layers": 12}
FLAN_T5_LARGE = {**_FLAN_T5, "d_ff": 2816, "d_model": 1024, "num_decoder_layers": 24, "num_heads": 16, "num_layers": 24}
FLAN_T5_XL = {**_FLAN_T5, "d_ff": 5120, "d_model": 2048, "num_decoder_layers": 24, "num_heads": 32, "num_layers": 24}
T5_BASE = {
    "architectures": ["T5ForConditionalGeneration"],
    "d_ff": 3072,
    "d_kv": 64,
    "d_model": 768,
    "decoder_start_token_id": 0,
    "dropout_rate": 0.1,
    "eos_token_id": 1,
    "initializer_factor": 1.0,
    "is_encoder_decoder": True,
    "layer_norm_epsilon": 1e-06,
    "model_type": "t5",
    "n_positions": 512,
    "num_heads": 12,
    "num_layers": 12,
    "output_past": True,
    "pad_token_id": 0,
    "relative_attention_num_buckets": 32,
    "vocab_size": 32128,
}
# allenai/OLMo-2-0425-1B (fp32 weights, one model.safetensors). NB reconstructed, not copied: the
# released config.json's values as published, checked against the published parameter count.
# facebook/opt-1.3b and facebook/opt-6.7b, config.json as of the repos' main (fp16 weights; the
# checkpoints were saved from OPTModel, their names start at decoder.; opt-6.7b in 2 shards).
OPT_1_3B = {
    "_name_or_path": "facebook/opt-1.3b",
    "activation_dropout": 0.0,
    "activation_function": "relu",
    "architectures": ["OPTForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 2,
    "do_layer_norm_before": True,
    "dropout": 0.1,
    "eos_token_id": 2,
    "ffn_dim": 8192,
    "hidden_size": 2048,
    "init_std": 0.02,
    "layerdrop": 0.0,
    "max_position_embeddings": 2048,
    "model_type": "opt",
    "num_attention_heads": 32,
    "num_hidden_layers": 24,
    "pad_token_id": 1,
    "prefix": "</s>",
    "torch_dtype": "float16",
    "transformers_version": "4.21.0.dev0",
    "use_cache": True,
    "vocab_size": 50272,
    "word_embed_proj_dim": 2048,
}
OPT_6_7B = {
    "_name_or_path": "facebook/opt-6.7b",
    "_remove_final_layer_norm": False,
    "activation_dropout": 0.0,
    "activation_function": "relu",
    "architectures": ["OPTForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 2,
    "do_layer_norm_before": True,
    "dropout": 0.1,
    "eos_token_id": 2,
    "ffn_dim": 16384,
    "hidden_size": 4096,
    "init_std": 0.02,
    "layerdrop": 0.0,
    "max_position_embeddings": 2048,
    "model_type": "opt",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "pad_token_id": 1,
    "prefix": "</s>",
    "torch_dtype": "float16",
    "transformers_version": "4.21.0.dev0",
    "use_cache": True,
    "vocab_size": 50272,
    "word_embed_proj_dim": 4096,
}
# Salesforce/blip2-opt-2.7b, config.json and preprocessor_config.json as of the repo's main
# (transformers 4.47's layout with image_token_index and num_query_tokens; fp32 weights in 2 shards,
# with language_model.lm_head.weight stored beside the decoder's token table it is tied to).
BLIP2_OPT_2_7B = {
    "architectures": ["Blip2ForConditionalGeneration"],
    "image_text_hidden_size": 256,
    "image_token_index": 50265,
    "initializer_factor": 1.0,
    "initializer_range": 0.02,
    "model_type": "blip-2",
    "num_query_tokens": 32,
    "qformer_config": {"classifier_dropout": None, "model_type": "blip_2_qformer"},
    "text_config": {
        "_name_or_path": "facebook/opt-2.7b",
        "activation_dropout": 0.0,
        "architectures": ["OPTForCausalLM"],
        "eos_token_id": 50118,
        "ffn_dim": 10240,
        "hidden_size": 2560,
        "model_type": "opt",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "prefix": "</s>",
        "torch_dtype": "float16",
        "vocab_size": 50304,
        "word_embed_proj_dim": 2560,
    },
    "torch_dtype": "float32",
    "transformers_version": "4.47.0.dev0",
    "use_decoder_only_language_model": True,
    "vision_config": {"dropout": 0.0, "initializer_factor": 1.0, "model_type": "blip_2_vision_model", "num_channels": 3, "projection_dim": 512},
}
BLIP2_PROCESSOR = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "BlipImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "processor_class": "Blip2Processor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 224, "width": 224},
}
OLMO_2_0425_1B = {
    "architectures": ["Olmo2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "eos_token_id": 100257,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 4096,
    "model_type": "olmo2",
    "num_attention_heads": 16,
    "num_hidden_layers": 16,
    "num_key_value_heads": 16,
    "pad_token_id": 100277,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 500000,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.48.0",
    "use_cache": True,
    "vocab_size": 100352,
}
# bigcode/starcoder2-3b (fp32 weights in 2 shards; the head tied to the embeddings,
# tie_word_embeddings left at its default, true). NB reconstructed, not copied: the released
# config.json's values as published, checked against the published parameter count; the three
# dropouts (0.1 each) are the least certain.
STARCODER2_3B = {
    "architectures": ["Starcoder2ForCausalLM"],
    "attention_dropout": 0.1,
    "residual_dropout": 0.1,
    "embedding_dropout": 0.1,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 3072,
    "initializer_range": 0.018042,
    "intermediate_size": 12288,
    "max_position_embeddings": 16384,
    "mlp_type": "default",
    "model_type": "starcoder2",
    "norm_epsilon": 1e-05,
    "norm_type": "layer_norm",
    "num_attention_heads": 24,
    "num_hidden_layers": 30,
    "num_key_value_heads": 2,
    "rope_theta": 999999.4420358813,
    "sliding_window": 4096,
    "torch_dtype": "float32",
    "transformers_version": "4.37.0.dev0",
    "use_bias": True,
    "use_cache": True,
    "vocab_size": 49152,
}
# stabilityai/stablelm-2-1_6b (fp16 weights, one model.safetensors). NB reconstructed, not copied:
# the released config.json's values as published, checked against the published parameter count.
STABLELM_2_1_6B = {
    "architectures": ["StableLmForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 100257,
    "eos_token_id": 100257,
    "hidden_act": "silu",
    "hidden_dropout": 0.0,
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 5632,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 4096,
    "model_type": "stablelm",
    "num_attention_heads": 32,
    "num_hidden_layers": 24,
    "num_key_value_heads": 32,
    "partial_rotary_factor": 0.25,
    "qk_layernorm": False,
    "rope_scaling": None,
    "rope_theta": 10000,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.38.0",
    "use_cache": True,
    "use_parallel_residual": False,
    "use_qkv_bias": True,
    "vocab_size": 100352,
}
# ibm-granite/granite-3.0-2b-base (bf16 weights in 2 shards; the head tied to embed_tokens). NB
# reconstructed, not copied: the released config.json's values as published, checked against the
# published parameter count; attention_dropout 0.1 is the least certain.
GRANITE_3_0_2B = {
    "architectures": ["GraniteForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.1,
    "attention_multiplier": 0.015625,
    "bos_token_id": 0,
    "embedding_multiplier": 12.0,
    "eos_token_id": 0,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "logits_scaling": 8.0,
    "max_position_embeddings": 4096,
    "mlp_bias": False,
    "model_type": "granite",
    "num_attention_heads": 32,
    "num_hidden_layers": 40,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "residual_multiplier": 0.22,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.46.0.dev0",
    "use_cache": True,
    "vocab_size": 49155,
}
# mistralai/Mistral-Small-3.1-24B-Instruct-2503, config.json as published (2025-03; the
# 2506 release, Mistral-Small-3.2-24B-Instruct, has the same sizes). Pixtral tower: 24 layers of
# 1024, 16 heads of 64, MLP 4096, patch 14, 1540 px longest edge; merger 2 x 2; Mistral-Small-24B:
# 40 layers of 5120, 32 heads of 128 with 8 key-value heads, MLP 32768, vocabulary 131072,
# lm_head untied. 24,011,361,280 parameters.
MISTRAL_SMALL_3_1_24B = {
    "architectures": ["Mistral3ForConditionalGeneration"],
    "image_token_index": 10,
    "model_type": "mistral3",
    "multimodal_projector_bias": False,
    "projector_hidden_act": "gelu",
    "spatial_merge_size": 2,
    "text_config": {
        "attention_dropout": 0.0,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "initializer_range": 0.02,
        "intermediate_size": 32768,
        "max_position_embeddings": 131072,
        "model_type": "mistral",
        "num_attention_heads": 32,
        "num_hidden_layers": 40,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000000.0,
        "sliding_window": None,
        "use_cache": True,
        "vocab_size": 131072,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "attention_dropout": 0.0,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "image_size": 1540,
        "initializer_range": 0.02,
        "intermediate_size": 4096,
        "model_type": "pixtral",
        "num_attention_heads": 16,
        "num_channels": 3,
        "num_hidden_layers": 24,
        "patch_size": 14,
        "rope_theta": 10000.0,
    },
    "vision_feature_layer": -1,
}
MISTRAL_SMALL_3_1_24B_PROCESSOR = {
    "crop_size": None,
    "data_format": "channels_first",
    "do_center_crop": None,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "PixtralImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "patch_size": {"height": 14, "width": 14},
    "processor_class": "PixtralProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 1540},
}
# mistral-community/pixtral-12b, the llava-form conversion of Pixtral-12B-2409 (bf16, six shards).
# NB reconstructed, not copied: the released config.json's values as published (2024-09,
# transformers 4.45.0.dev0; the keys it leaves out take LlavaConfig's, PixtralVisionConfig's and
# MistralConfig's defaults: hidden 1024, 24 layers, 16 heads, MLP 4096, 3 channels; projector
# biases on), checked against the published 12.7B parameters: 12,682,739,712 (tower 403,489,792,
# projector 31,467,520, Mistral-Nemo 12,247,782,400 with lm_head untied).
PIXTRAL_12B = {
    "architectures": ["LlavaForConditionalGeneration"],
    "ignore_index": -100,
    "image_seq_length": 1,
    "image_token_index": 10,
    "model_type": "llava",
    "projector_hidden_act": "gelu",
    "text_config": {
        "hidden_size": 5120,
        "head_dim": 128,
        "intermediate_size": 14336,
        "is_composition": True,
        "max_position_embeddings": 1024000,
        "model_type": "mistral",
        "num_hidden_layers": 40,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000000.0,
        "sliding_window": None,
        "vocab_size": 131072,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "vision_config": {
        "head_dim": 64,
        "hidden_act": "silu",
        "image_size": 1024,
        "is_composition": True,
        "model_type": "pixtral",
        "patch_size": 16,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    "vision_feature_layer": -1,
    "vision_feature_select_strategy": "full",
}
PIXTRAL_12B_PROCESSOR = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "PixtralImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "patch_size": {"height": 16, "width": 16},
    "processor_class": "PixtralProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 1024},
}
# CohereForAI/aya-expanse-8b (fp16 weights, four shards). NB reconstructed, not copied: the released
# config.json's values as published, checked against the published 8.03B parameters and partial
# copies in other projects.
AYA_EXPANSE_8B = {
    "architectures": ["CohereForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 5,
    "eos_token_id": 255001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "layer_norm_eps": 1e-05,
    "logit_scale": 0.125,
    "max_position_embeddings": 8192,
    "model_type": "cohere",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "rope_theta": 10000,
    "torch_dtype": "float16",
    "transformers_version": "4.44.0",
    "use_cache": True,
    "use_qk_norm": False,
    "vocab_size": 256000,
}
# CohereForAI/c4ai-command-r7b-12-2024 (bf16 weights, four shards; Cohere2ForCausalLM builds the
# same tensors as CohereForCausalLM without q/k norms). NB reconstructed, not copied: the released
# config.json's values as published, checked against the published parameter count.
COMMAND_R7B_12_2024 = {
    "architectures": ["Cohere2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 5,
    "cache_implementation": "hybrid",
    "eos_token_id": 255001,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "layer_norm_eps": 1e-05,
    "logit_scale": 0.25,
    "max_position_embeddings": 8192,
    "model_type": "cohere2",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "order_of_interleaved_layers": "local_attn_first",
    "pad_token_id": 0,
    "position_embedding_type": "rope_gptj",
    "rope_scaling": None,
    "rope_theta": 50000,
    "rotary_pct": 1.0,
    "sliding_window": 4096,
    "sliding_window_pattern": 4,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.48.0.dev0",
    "use_cache": True,
    "use_embedding_sharder": True,
    "use_gated_activation": True,
    "vocab_size": 256000,
}
# CohereForAI/aya-vision-8b (2025-03; model_type aya_vision, float16, four shards). NB reconstructed,
# not copied: the released config.json's values as published (SigLIP2 so400m/14 stored as
# siglip_vision_model at 364 px, 27 layers of 1152, no head; downsample_factor 2;
# alignment_intermediate_size 28672; Command R7B's Cohere2 text model with max_position_embeddings
# 16384 and logit_scale 0.125), checked against the published 8.63B parameters (8,631,842,032 as
# AyaVisionForConditionalGeneration builds them, the head tied), and GotOcr2ImageProcessor's
# crop-to-patches settings in preprocessor_config.json (364 px tiles, 1 to 12 plus a thumbnail).
AYA_VISION_8B = {
    "adapter_layer_norm_eps": 1e-06,
    "alignment_intermediate_size": 28672,
    "architectures": ["AyaVisionForConditionalGeneration"],
    "downsample_factor": 2,
    "image_token_index": 255036,
    "model_type": "aya_vision",
    "text_config": {
        "architectures": ["Cohere2ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 5,
        "eos_token_id": 255001,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "layer_norm_eps": 1e-05,
        "logit_scale": 0.125,
        "max_position_embeddings": 16384,
        "model_type": "cohere2",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pad_token_id": 0,
        "rope_theta": 50000,
        "sliding_window": 4096,
        "sliding_window_pattern": 4,
        "torch_dtype": "float16",
        "use_cache": True,
        "vocab_size": 256000,
    },
    "torch_dtype": "float16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "image_size": 364,
        "intermediate_size": 4304,
        "layer_norm_eps": 1e-06,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
    "vision_feature_layer": -1,
    "vision_feature_select_strategy": "full",
}
AYA_VISION_8B_PROCESSOR = {
    "crop_to_patches": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "GotOcr2ImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "max_patches": 12,
    "min_patches": 1,
    "processor_class": "AyaVisionProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 364, "width": 364},
}
# CohereLabs/command-a-vision-07-2025 (2025-07; model_type cohere2_vision, bfloat16; the hub's
# checkpoint has many more shards, four here). NB reconstructed, not copied: the released
# config.json's values as published (SigLIP2 so400m/16 at 512 px stored as siglip_vision_model,
# 27 layers of 1152, intermediate 4304, 16 heads, no head; downsample_factor 2;
# alignment_intermediate_size 36864; Command A's Cohere2 text model: 64 layers of 12288,
# intermediate 36864, 96 heads, 8 KV heads, vocab 256000, sliding window 4096, every fourth layer
# global), checked against the published 112B parameters (111,867,525,360 as
# Cohere2VisionForConditionalGeneration builds them, the head tied), and
# Cohere2VisionImageProcessor's preprocessor_config.json (512 px tiles, crop_to_patches, at most
# 12 plus a thumbnail).
COMMAND_A_VISION_07_2025 = {
    "alignment_intermediate_size": 36864,
    "architectures": ["Cohere2VisionForConditionalGeneration"],
    "downsample_factor": 2,
    "image_token_id": 255036,
    "model_type": "cohere2_vision",
    "text_config": {
        "architectures": ["Cohere2ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 5,
        "eos_token_id": 255001,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 12288,
        "initializer_range": 0.02,
        "intermediate_size": 36864,
        "layer_norm_eps": 1e-05,
        "logit_scale": 0.25,
        "max_position_embeddings": 32768,
        "model_type": "cohere2",
        "num_attention_heads": 96,
        "num_hidden_layers": 64,
        "num_key_value_heads": 8,
        "pad_token_id": 0,
        "rope_theta": 50000,
        "sliding_window": 4096,
        "sliding_window_pattern": 4,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 256000,
    },
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.55.0.dev0",
    "vision_config": {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "image_size": 512,
        "intermediate_size": 4304,
        "layer_norm_eps": 1e-06,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_channels": 3,
        "num_hidden_layers": 27,
        "patch_size": 16,
        "vision_use_head": False,
    },
}
COMMAND_A_VISION_07_2025_PROCESSOR = {
    "crop_to_patches": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Cohere2VisionImageProcessorFast",
    "image_std": [0.5, 0.5, 0.5],
    "max_patches": 12,
    "min_patches": 1,
    "patch_size": 16,
    "processor_class": "Cohere2VisionProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 512, "width": 512},
}
# HuggingFaceM4/idefics2-8b-base (2024-04; model_type idefics2, float32, seven shards). NB
# reconstructed, not copied: the released config.json's values as published (SigLIP so400m/14 adapted
# to 980 px, 27 layers of 1152, no head; a perceiver resampler of 3 layers, 64 latents, 16 heads of 96
# with 4 key/value heads; Mistral-7B-v0.1 as the text config with the 32,003-token vocabulary, head
# untied), checked against the published 8.4B (8,402,768,112 as Idefics2ForConditionalGeneration
# builds them); preprocessor_config.json as published for the base model (shortest edge 378, longest
# 980, no image splitting, which only the instruction-tuned idefics2-8b turns on).
IDEFICS2_8B_BASE = {
    "architectures": ["Idefics2ForConditionalGeneration"],
    "image_token_id": 32001,
    "model_type": "idefics2",
    "perceiver_config": {
        "hidden_act": "silu",
        "model_type": "idefics2",
        "num_key_value_heads": 4,
        "resampler_depth": 3,
        "resampler_head_dim": 96,
        "resampler_n_heads": 16,
        "resampler_n_latents": 64,
    },
    "text_config": {
        "architectures": ["MistralForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "model_type": "mistral",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "torch_dtype": "bfloat16",
        "vocab_size": 32003,
    },
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 980,
        "intermediate_size": 4304,
        "model_type": "idefics2",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
    },
}
IDEFICS2_PROCESSOR = {
    "do_convert_rgb": True,
    "do_image_splitting": False,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Idefics2ImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Idefics2Processor",
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 980, "shortest_edge": 378},
}
# thisisiron/Ovis2-2B-hf and -1B-hf (2025-08; model_type ovis2, bfloat16; the transformers
# conversions of AIDC-AI/Ovis2-2B and -1B, which Ovis2Config's docstring names). NB reconstructed,
# not copied: the released config.json's values as published (AIMv2-large/14 at 448 px flattened
# into the vision config: 24 layers of 1024, intermediate 2816, 8 heads, RMSNorm 1e-5, no biases,
# hidden_stride 2, 65,536 visual words with 5 indicator tokens, softmax tokenizer; Qwen2.5-1.5B- and
# 0.5B-Instruct as text configs, head tied), checked against AIMv2-large-448's published 309,984,256
# parameters and the published 2.22B (2,222,907,894 as Ovis2ForConditionalGeneration builds them) and
# 1.13B (1,131,283,318); preprocessor_config.json as the conversion script writes it (448 px tiles,
# crop_to_patches with the covering-area grid, at most 12 plus a thumbnail).
OVIS2_VISION = {
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "hidden_stride": 2,
    "image_size": 448,
    "initializer_range": 0.02,
    "intermediate_size": 2816,
    "mlp_bias": False,
    "model_type": "ovis2_vision",
    "num_attention_heads": 8,
    "num_channels": 3,
    "num_hidden_layers": 24,
    "num_visual_indicator_tokens": 5,
    "patch_size": 14,
    "qkv_bias": False,
    "rms_norm_eps": 1e-05,
    "tokenize_function": "softmax",
    "vocab_size": 65536,
}
OVIS2_2B_HF = {
    "architectures": ["Ovis2ForConditionalGeneration"],
    "hidden_size": 1536,
    "image_token_id": 151665,
    "model_type": "ovis2",
    "text_config": {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "hidden_act": "silu",
        "hidden_size": 1536,
        "initializer_range": 0.02,
        "intermediate_size": 8960,
        "max_position_embeddings": 32768,
        "max_window_layers": 21,
        "model_type": "qwen2",
        "num_attention_heads": 12,
        "num_hidden_layers": 28,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.56.0.dev0",
    "vision_config": OVIS2_VISION,
    "visual_indicator_token_ids": [151666, 151667, 151668, 151669, 151670],
    "vocab_size": 151936,
}
OVIS2_1B_HF = {
    **OVIS2_2B_HF,
    "hidden_size": 896,
    "text_config": {
        **OVIS2_2B_HF["text_config"],
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
    },
}
OVIS2_PROCESSOR = {
    "crop_to_patches": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "Ovis2ImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "max_patches": 12,
    "min_patches": 1,
    "processor_class": "Ovis2Processor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 448, "width": 448},
    "use_covering_area_grid": True,
}
# zai-org/GLM-4.1V-9B-Thinking (2025-07; bfloat16, four shards). NB reconstructed, not copied: the
# released config.json's values as published (vision hidden 1536, depth 24, 12 heads, out_hidden_size
# 4096, intermediate 13696, patch 14, image_size 336, spatial_merge 2, temporal_patch 2; text hidden
# 4096, 40 layers, 32 heads, 2 key-value heads, intermediate 13696, vocab 151552, partial_rotary_factor
# 0.5, mrope_section [8, 12, 12]), checked against modeling_glm4v.py's shapes and the published 10.3B
# parameters (10,292,777,472 as Glm4vForConditionalGeneration builds them, tensor for tensor); the processor bounds are
# Glm4vImageProcessor's (min 112 x 112, max 14 x 14 x 2 x 2 x 2 x 6144 pixels).
_GLM_4_1V_TEXT = {
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338, 151348],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "image_token_id": None,
    "initializer_range": 0.02,
    "intermediate_size": 13696,
    "max_position_embeddings": 65536,
    "model_type": "glm4v_text",
    "num_attention_heads": 32,
    "num_hidden_layers": 40,
    "num_key_value_heads": 2,
    "pad_token_id": 151329,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"mrope_section": [8, 12, 12], "rope_type": "default", "type": "default"},
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "video_token_id": None,
    "vocab_size": 151552,
}
GLM_4_1V_9B_THINKING = {
    "architectures": ["Glm4vForConditionalGeneration"],
    "model_type": "glm4v",
    "image_end_token_id": 151340,
    "image_start_token_id": 151339,
    "image_token_id": 151343,
    "video_end_token_id": 151342,
    "video_start_token_id": 151341,
    "video_token_id": 151344,
    "text_config": _GLM_4_1V_TEXT,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.53.0.dev0",
    "vision_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "depth": 24,
        "hidden_act": "silu",
        "hidden_dropout_prob": 0.0,
        "hidden_size": 1536,
        "image_size": 336,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 13696,
        "model_type": "glm4v",
        "num_heads": 12,
        "out_hidden_size": 4096,
        "patch_size": 14,
        "rms_norm_eps": 1e-05,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}
GLM_4_1V_9B_THINKING_PROCESSOR = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "Glm4vImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "merge_size": 2,
    "patch_size": 14,
    "processor_class": "Glm4vProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 9633792, "shortest_edge": 12544},
    "temporal_patch_size": 2,
}
# openbmb/MiniCPM-V-4.6 (2026-04; bfloat16, one model.safetensors, transformers 5.7.0): the released
# config.json and preprocessor_config.json, values as published; 1,300,428,016 parameters (the hub's
# safetensors count, BF16), which MiniCPMV4_6ForConditionalGeneration builds tensor for tensor (779 tensors,
# lm_head tied to the embeddings).
_MINICPM_V_4_6_LAYERS = ["linear_attention"] * 3 + ["full_attention"]
MINICPM_V_4_6 = {
    "architectures": ["MiniCPMV4_6ForConditionalGeneration"],
    "bos_token_id": None,
    "drop_vision_last_layer": False,
    "eos_token_id": 248044,
    "image_size": 1120,
    "model_type": "minicpmv4_6",
    "pad_token_id": None,
    "tie_word_embeddings": True,
    "transformers_version": "5.7.0",
    "use_cache": True,
    "vision_config": {
        "attention_dropout": 0.0,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "image_size": 980,
        "intermediate_size": 4304,
        "layer_norm_eps": 1e-06,
        "model_type": "minicpmv4_6_vision",
        "num_attention_heads": 16,
        "num_channels": 3,
        "num_hidden_layers": 27,
        "patch_size": 14,
    },
    "text_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "initializer_range": 0.02,
        "intermediate_size": 3584,
        "layer_types": _MINICPM_V_4_6_LAYERS * 6,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 16,
        "linear_value_head_dim": 128,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144,
        "mlp_only_layers": [],
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": 8,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"partial_rotary_factor": 0.25, "rope_theta": 10000000, "rope_type": "default"},
        "vocab_size": 248094,
        "model_type": "qwen3_5_text",
        "tie_word_embeddings": True,
    },
    "insert_layer_id": 6,
    "image_token_id": 248056,
    "video_token_id": 248057,
}
MINICPM_V_4_6_PROCESSOR = {
    "image_processor_type": "MiniCPMV4_6ImageProcessor",
    "processor_class": "MiniCPMV4_6Processor",
    "max_slice_nums": 9,
    "scale_resolution": 448,
    "patch_size": 14,
    "use_image_id": True,
    "slice_mode": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
# openbmb/MiniCPM-V-2_6 (remote code MiniCPMV, model_type "minicpmv", version 2.6; 2024-08), config.json
# and preprocessor_config.json as of the repo's main; bf16 weights in 4 shards. 8,099,175,152 parameters
# (the published 8.1B): Qwen2-7B's layers with a 151,666-token vocabulary 7,612,763,648, the SigLIP
# so400m tower at 980 px (4,900 positions) 417,792,240, the resampler 68,619,264.
MINICPM_V_2_6 = {
    "_name_or_path": "openbmb/MiniCPM-V-2_6",
    "architectures": ["MiniCPMV"],
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_minicpm.MiniCPMVConfig",
        "AutoModel": "modeling_minicpmv.MiniCPMV",
        "AutoModelForCausalLM": "modeling_minicpmv.MiniCPMV",
    },
    "batch_vision_input": True,
    "bos_token_id": 151643,
    "drop_vision_last_layer": False,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "image_size": 448,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "model_type": "minicpmv",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "patch_size": 14,
    "query_num": 64,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "slice_config": {"max_slice_nums": 9, "model_type": "minicpmv", "patch_size": 14, "scale_resolution": 448},
    "slice_mode": True,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0",
    "use_cache": True,
    "use_image_id": True,
    "use_sliding_window": False,
    "version": 2.6,
    "vision_batch_size": 16,
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 980,
        "intermediate_size": 4304,
        "model_type": "siglip",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
    },
    "vocab_size": 151666,
}
MINICPM_V_2_6_PROCESSOR = {
    "image_processor_type": "MiniCPMVImageProcessor",
    "auto_map": {
        "AutoProcessor": "processing_minicpmv.MiniCPMVProcessor",
        "AutoImageProcessor": "image_processing_minicpmv.MiniCPMVImageProcessor",
    },
    "processor_class": "MiniCPMVProcessor",
    "max_slice_nums": 9,
    "scale_resolution": 448,
    "patch_size": 14,
    "use_image_id": True,
    "image_feature_size": 64,
    "im_start": "<image>",
    "im_end": "</image>",
    "slice_start": "<slice>",
    "slice_end": "</slice>",
    "unk": "<unk>",
    "im_id_start": "<image_id>",
    "im_id_end": "</image_id>",
    "slice_mode": True,
    "norm_mean": [0.5, 0.5, 0.5],
    "norm_std": [0.5, 0.5, 0.5],
    "version": 2.6,
}
# meta-llama/Llama-3.2-11B-Vision-Instruct (2024-09; bfloat16, five shards, transformers 4.45.0.dev0): the
# released config.json (the keys that differ from the config classes' defaults are all written, values
# as published) and preprocessor_config.json; 10,670,220,835 parameters (the model card's and the hub's
# safetensors count, BF16), which MllamaForConditionalGeneration builds tensor for tensor.
_MLLAMA_VISION = {
    "attention_heads": 16,
    "hidden_act": "gelu",
    "hidden_size": 1280,
    "image_size": 560,
    "intermediate_layers_indices": [3, 7, 15, 23, 30],
    "intermediate_size": 5120,
    "max_num_tiles": 4,
    "model_type": "mllama_vision_model",
    "norm_eps": 1e-05,
    "num_channels": 3,
    "num_global_layers": 8,
    "num_hidden_layers": 32,
    "patch_size": 14,
    "supported_aspect_ratios": [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]],
    "torch_dtype": "bfloat16",
    "vision_output_dim": 7680,
}
LLAMA_3_2_11B_VISION_INSTRUCT = {
    "architectures": ["MllamaForConditionalGeneration"],
    "image_token_index": 128256,
    "model_type": "mllama",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "text_config": {
        "bos_token_id": 128000,
        "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38],
        "dropout": 0,
        "eos_token_id": [128001, 128008, 128009],
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "model_type": "mllama_text_model",
        "num_attention_heads": 32,
        "num_hidden_layers": 40,
        "num_key_value_heads": 8,
        "pad_token_id": 128004,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 128256,
    },
    "vision_config": _MLLAMA_VISION,
}
# meta-llama/Llama-3.2-90B-Vision-Instruct: the same tower and processor, the 70B-sized text model
# (hidden 8192, 100 layers, 64 heads of 128, 8 key-value heads, MLP 28672) with a cross-attention
# layer every 5th from layer 3 (20); 88,593,355,323 parameters, the published 88.6B. Reconstructed
# from those published sizes, not copied from the hub's config.json.
LLAMA_3_2_90B_VISION_INSTRUCT = {
    **LLAMA_3_2_11B_VISION_INSTRUCT,
    "text_config": {
        **LLAMA_3_2_11B_VISION_INSTRUCT["text_config"],
        "cross_attention_layers": list(range(3, 100, 5)),
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_attention_heads": 64,
        "num_hidden_layers": 100,
    },
}
LLAMA_3_2_VISION_PROCESSOR = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "MllamaImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "max_image_tiles": 4,
    "processor_class": "MllamaProcessor",
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 560, "width": 560},
}
TINY_BNB = {**TINY_LLAMA, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}}


def write_qwen3_vl(name: str, folder: str, shards: int) -> None:
    """One Qwen3-VL fixture from specs/qwen3_vl/hf/<folder>/ (config.json, preprocessor_config.json).

    NB: the 8B config and the preprocessor bounds match copies of the released files; the 2B's
    text sizes (hidden 2048, intermediate 6144, 28 layers, 16 heads, 8 key-value heads) are the
    published values, reconstructed, and checked only through the published 2.13B parameters."""
    hf = ROOT / "specs" / "qwen3_vl" / "hf" / folder
    config = json.loads((hf / "config.json").read_text())
    processor = json.loads((hf / "preprocessor_config.json").read_text())
    write_checkpoint(FIXTURES / name, config, qwen3_vl_tensors(config), shards=shards, processor=processor)


def write_pixtral_12b() -> None:
    """mistral-community/pixtral-12b alone (`python tests/hubfixtures.py pixtral-12b`)."""
    write_checkpoint(FIXTURES / "pixtral-12b", PIXTRAL_12B, pixtral_llava_tensors(PIXTRAL_12B), shards=6, processor=PIXTRAL_12B_PROCESSOR)


def write_glm4v() -> None:
    """zai-org/GLM-4.1V-9B-Thinking alone (`python tests/hubfixtures.py glm4v`)."""
    write_checkpoint(
        FIXTURES / "GLM-4.1V-9B-Thinking", GLM_4_1V_9B_THINKING, glm4v_tensors(GLM_4_1V_9B_THINKING), shards=4, processor=GLM_4_1V_9B_THINKING_PROCESSOR
    )


def write_smolvlm2_2_2b() -> None:
    """HuggingFaceTB/SmolVLM2-2.2B-Instruct alone (`python tests/hubfixtures.py smolvlm2-2.2b`)."""
    write_checkpoint(FIXTURES / "SmolVLM2-2.2B-Instruct", SMOLVLM2_2_2B, idefics3_tensors(SMOLVLM2_2_2B), processor=SMOLVLM2_2_2B_PROCESSOR)


def write_aya_vision_8b() -> None:
    """CohereForAI/aya-vision-8b alone (`python tests/hubfixtures.py aya-vision-8b`)."""
    write_checkpoint(FIXTURES / "aya-vision-8b", AYA_VISION_8B, aya_vision_tensors(AYA_VISION_8B), shards=4, processor=AYA_VISION_8B_PROCESSOR)


def write_command_a_vision() -> None:
    """CohereLabs/command-a-vision-07-2025 alone (`python tests/hubfixtures.py command-a-vision`)."""
    write_checkpoint(
        FIXTURES / "command-a-vision-07-2025",
        COMMAND_A_VISION_07_2025,
        cohere2_vision_tensors(COMMAND_A_VISION_07_2025),
        shards=4,
        processor=COMMAND_A_VISION_07_2025_PROCESSOR,
    )


def write_minicpmv4_6() -> None:
    """openbmb/MiniCPM-V-4.6 alone (`python tests/hubfixtures.py minicpmv4_6`)."""
    write_checkpoint(FIXTURES / "MiniCPM-V-4.6", MINICPM_V_4_6, minicpmv4_6_tensors(MINICPM_V_4_6), processor=MINICPM_V_4_6_PROCESSOR)


def write_t5() -> None:
    write_checkpoint(FIXTURES / "flan-t5-base", FLAN_T5_BASE, t5_tensors(FLAN_T5_BASE))
    write_checkpoint(FIXTURES / "flan-t5-large", FLAN_T5_LARGE, t5_tensors(FLAN_T5_LARGE))
    write_checkpoint(FIXTURES / "flan-t5-xl", FLAN_T5_XL, t5_tensors(FLAN_T5_XL), shards=2)
    write_checkpoint(FIXTURES / "t5-base", T5_BASE, t5_tensors(T5_BASE))


def write_deepseek_v2() -> None:
    """deepseek-ai/DeepSeek-V2-Lite, DeepSeek-V2 and moonshotai/Moonlight-16B-A3B (deepseek_v3) alone
    (`python tests/hubfixtures.py deepseek_v2`)."""
    write_checkpoint(FIXTURES / "DeepSeek-V2-Lite", DEEPSEEK_V2_LITE, deepseek_v2_tensors(DEEPSEEK_V2_LITE), shards=4)
    write_checkpoint(FIXTURES / "DeepSeek-V2", DEEPSEEK_V2, deepseek_v2_tensors(DEEPSEEK_V2), shards=55)
    write_checkpoint(FIXTURES / "Moonlight-16B-A3B", MOONLIGHT_16B_A3B, deepseek_v2_tensors(MOONLIGHT_16B_A3B), shards=27)


def write_bloom() -> None:
    """bigscience/bloom-560m and bigscience/bloomz-7b1 alone (`python tests/hubfixtures.py bloom`)."""
    write_checkpoint(FIXTURES / "bloom-560m", BLOOM_560M, bloom_tensors(BLOOM_560M))
    write_checkpoint(FIXTURES / "bloomz-7b1", BLOOMZ_7B1, bloom_tensors(BLOOMZ_7B1), shards=2)


def write_opt() -> None:
    """facebook/opt-1.3b and facebook/opt-6.7b alone (`python tests/hubfixtures.py opt`)."""
    write_checkpoint(FIXTURES / "opt-1.3b", OPT_1_3B, opt_tensors(OPT_1_3B))
    write_checkpoint(FIXTURES / "opt-6.7b", OPT_6_7B, opt_tensors(OPT_6_7B), shards=2)


def write_blip2() -> None:
    """Salesforce/blip2-opt-2.7b alone (`python tests/hubfixtures.py blip2`)."""
    write_checkpoint(FIXTURES / "blip2-opt-2.7b", BLIP2_OPT_2_7B, blip2_tensors(BLIP2_OPT_2_7B), shards=2, processor=BLIP2_PROCESSOR)


def write_mllama() -> None:
    """meta-llama/Llama-3.2-11B-Vision-Instruct and -90B-Vision-Instruct alone (`python tests/hubfixtures.py mllama`)."""
    write_checkpoint(
        FIXTURES / "Llama-3.2-11B-Vision-Instruct",
        LLAMA_3_2_11B_VISION_INSTRUCT,
        mllama_tensors(LLAMA_3_2_11B_VISION_INSTRUCT),
        shards=5,
        processor=LLAMA_3_2_VISION_PROCESSOR,
    )
    write_checkpoint(
        FIXTURES / "Llama-3.2-90B-Vision-Instruct",
        LLAMA_3_2_90B_VISION_INSTRUCT,
        mllama_tensors(LLAMA_3_2_90B_VISION_INSTRUCT),
        shards=37,
        processor=LLAMA_3_2_VISION_PROCESSOR,
    )


def write_ovis2() -> None:
    """thisisiron/Ovis2-2B-hf and -1B-hf alone (`python tests/hubfixtures.py ovis2`)."""
    write_checkpoint(FIXTURES / "Ovis2-2B-hf", OVIS2_2B_HF, ovis2_tensors(OVIS2_2B_HF), processor=OVIS2_PROCESSOR)
    write_checkpoint(FIXTURES / "Ovis2-1B-hf", OVIS2_1B_HF, ovis2_tensors(OVIS2_1B_HF), processor=OVIS2_PROCESSOR)


def write_idefics2() -> None:
    """HuggingFaceM4/idefics2-8b-base alone (`python tests/hubfixtures.py idefics2`)."""
    write_checkpoint(FIXTURES / "idefics2-8b-base", IDEFICS2_8B_BASE, idefics2_tensors(IDEFICS2_8B_BASE), shards=7, processor=IDEFICS2_PROCESSOR)


def write_phi3_v() -> None:
    write_checkpoint(
        FIXTURES / "Phi-3-vision-128k-instruct",
        PHI3_VISION_128K_INSTRUCT,
        phi3_v_tensors(PHI3_VISION_128K_INSTRUCT),
        shards=2,
        processor=PHI3_VISION_128K_PROCESSOR,
    )
    write_checkpoint(
        FIXTURES / "Phi-3.5-vision-instruct",
        PHI3_5_VISION_INSTRUCT,
        phi3_v_tensors(PHI3_5_VISION_INSTRUCT),
        shards=2,
        processor=PHI3_5_VISION_PROCESSOR,
    )


def write_qwen() -> None:
    """Qwen/Qwen-7B and Qwen/Qwen-1_8B alone (`python tests/hubfixtures.py qwen`)."""
    write_checkpoint(FIXTURES / "Qwen-7B", QWEN_7B, qwen_tensors(QWEN_7B), shards=8)
    write_checkpoint(FIXTURES / "Qwen-1_8B", QWEN_1_8B, qwen_tensors(QWEN_1_8B), shards=2)


def write_qwen_vl() -> None:
    """Qwen/Qwen-VL-Chat alone (`python tests/hubfixtures.py qwen_vl`)."""
    write_checkpoint(FIXTURES / "Qwen-VL-Chat", QWEN_VL_CHAT, qwen_vl_tensors(QWEN_VL_CHAT), shards=10)


def write_minicpmv() -> None:
    """openbmb/MiniCPM-V-2_6 alone (`python tests/hubfixtures.py minicpmv`)."""
    write_checkpoint(FIXTURES / "MiniCPM-V-2_6", MINICPM_V_2_6, minicpmv_tensors(MINICPM_V_2_6), shards=4, processor=MINICPM_V_2_6_PROCESSOR)


def write_glm4v_9b() -> None:
    """THUDM/glm-4v-9b alone (`python tests/hubfixtures.py glm4v_9b`)."""
    write_checkpoint(FIXTURES / "glm-4v-9b", GLM_4V_9B, glm4v_9b_tensors(GLM_4V_9B), shards=15)


def write_cogvlm2() -> None:
    """THUDM/cogvlm2-llama3-chat-19B alone (`python tests/hubfixtures.py cogvlm2`)."""
    c = COGVLM2_LLAMA3_CHAT_19B
    write_checkpoint(FIXTURES / "cogvlm2-llama3-chat-19B", c, cogvlm2_tensors(c), shards=8)


def write_cogvlm() -> None:
    """THUDM/cogvlm-chat-hf alone (`python tests/hubfixtures.py cogvlm`)."""
    c = COGVLM_CHAT_HF
    write_checkpoint(FIXTURES / "cogvlm-chat-hf", c, cogvlm_tensors(c), shards=8)


def write_yi_vl() -> None:
    """BUAADreamer/Yi-VL-6B-hf and -34B-hf alone (`python tests/hubfixtures.py yi_vl`)."""
    write_checkpoint(FIXTURES / "Yi-VL-6B-hf", YI_VL_6B_HF, yi_vl_tensors(YI_VL_6B_HF), shards=2, processor=YI_VL_PROCESSOR)
    write_checkpoint(FIXTURES / "Yi-VL-34B-hf", YI_VL_34B_HF, yi_vl_tensors(YI_VL_34B_HF), shards=8, processor=YI_VL_PROCESSOR)


def write_all() -> None:
    llava_dir = ROOT / "specs" / "llava" / "hf" / "llava-1.5-7b"
    llava = json.loads((llava_dir / "config.json").read_text())
    processor = json.loads((llava_dir / "preprocessor_config.json").read_text())
    if FIXTURES.exists():
        shutil.rmtree(FIXTURES)
    write_checkpoint(FIXTURES / "llava-1.5-7b-hf", llava, llava_tensors(llava), shards=3, processor=processor)
    write_checkpoint(FIXTURES / "Llama-2-7b-hf", LLAMA_2_7B, llama_tensors(LLAMA_2_7B, inv_freq=True), shards=2)
    write_checkpoint(FIXTURES / "Meta-Llama-3-8B", LLAMA_3_8B, llama_tensors(LLAMA_3_8B, dtype="BF16"), shards=4)
    write_checkpoint(FIXTURES / "Llama-3.2-1B", LLAMA_3_2_1B, llama_tensors(LLAMA_3_2_1B, head=None, dtype="BF16"))
    write_checkpoint(FIXTURES / "Mistral-7B-v0.1", MISTRAL_7B_V01, llama_tensors(MISTRAL_7B_V01, dtype="BF16"), shards=2)
    write_checkpoint(FIXTURES / "Mixtral-8x7B-v0.1", MIXTRAL_8X7B_V01, llama_tensors(MIXTRAL_8X7B_V01, dtype="BF16", moe="mixtral"), shards=19)
    write_checkpoint(FIXTURES / "Qwen3-30B-A3B", QWEN3_30B_A3B, llama_tensors(QWEN3_30B_A3B, dtype="BF16", qk_norm=True, moe="qwen3_moe"), shards=16)
    write_checkpoint(
        FIXTURES / "Qwen1.5-MoE-A2.7B", QWEN1_5_MOE_A2_7B, llama_tensors(QWEN1_5_MOE_A2_7B, dtype="BF16", qkv_bias=True, moe="qwen2_moe"), shards=8
    )
    write_deepseek_v2()
    write_checkpoint(FIXTURES / "Qwen2-57B-A14B", QWEN2_57B_A14B, llama_tensors(QWEN2_57B_A14B, dtype="BF16", qkv_bias=True, moe="qwen2_moe"), shards=30)
    write_checkpoint(FIXTURES / "Qwen2.5-7B", QWEN2_5_7B, llama_tensors(QWEN2_5_7B, dtype="BF16", qkv_bias=True), shards=4)
    write_checkpoint(FIXTURES / "Qwen2.5-0.5B", QWEN2_5_0_5B, llama_tensors(QWEN2_5_0_5B, head=None, dtype="BF16", qkv_bias=True))
    write_checkpoint(FIXTURES / "Qwen3-8B", QWEN3_8B, llama_tensors(QWEN3_8B, dtype="BF16", qk_norm=True), shards=5)
    write_checkpoint(FIXTURES / "Phi-3-mini-4k-instruct", PHI_3_MINI_4K, llama_tensors(PHI_3_MINI_4K, dtype="BF16", fused=True), shards=2)
    write_checkpoint(FIXTURES / "gemma-2-2b", GEMMA_2_2B, gemma_tensors(GEMMA_2_2B), shards=3)
    write_checkpoint(FIXTURES / "gemma-2-9b", GEMMA_2_9B, gemma_tensors(GEMMA_2_9B), shards=8)
    write_checkpoint(FIXTURES / "gemma-2b", GEMMA_2B, gemma_tensors(GEMMA_2B, dtype="BF16"), shards=2)
    write_checkpoint(FIXTURES / "gemma-3-1b-pt", GEMMA_3_1B, gemma_tensors(GEMMA_3_1B, dtype="BF16"))
    write_checkpoint(FIXTURES / "paligemma-3b-pt-224", PALIGEMMA_3B_PT_224, paligemma_tensors(PALIGEMMA_3B_PT_224, "F32"), shards=3)
    write_checkpoint(FIXTURES / "paligemma2-3b-pt-448", PALIGEMMA2_3B_PT_448, paligemma_tensors(PALIGEMMA2_3B_PT_448, "BF16"), shards=2)
    write_checkpoint(FIXTURES / "paligemma2-3b-pt-896", PALIGEMMA2_3B_PT_896, paligemma_tensors(PALIGEMMA2_3B_PT_896, "BF16"), shards=2)
    write_checkpoint(FIXTURES / "gemma-3-4b-it", GEMMA_3_4B_IT, gemma3_tensors(GEMMA_3_4B_IT), shards=2)
    write_checkpoint(FIXTURES / "gemma-3-12b-it", GEMMA_3_12B_IT, gemma3_tensors(GEMMA_3_12B_IT), shards=5)
    write_checkpoint(FIXTURES / "gemma-3-27b-it", GEMMA_3_27B_IT, gemma3_tensors(GEMMA_3_27B_IT), shards=12)
    write_checkpoint(FIXTURES / "SmolVLM-Instruct", SMOLVLM_INSTRUCT, idefics3_tensors(SMOLVLM_INSTRUCT), processor=SMOLVLM_INSTRUCT_PROCESSOR)
    write_checkpoint(FIXTURES / "SmolVLM2-500M-Video-Instruct", SMOLVLM2_500M, idefics3_tensors(SMOLVLM2_500M), processor=SMOLVLM2_500M_PROCESSOR)
    write_smolvlm2_2_2b()
    write_checkpoint(FIXTURES / "Idefics3-8B-Llama3", IDEFICS3_8B, idefics3_tensors(IDEFICS3_8B), shards=4, processor=IDEFICS3_8B_PROCESSOR)
    write_checkpoint(
        FIXTURES / "deepseek-vl-1.3b-chat", DEEPSEEK_VL_1_3B_CHAT, deepseek_vl_tensors(DEEPSEEK_VL_1_3B_CHAT), processor=DEEPSEEK_VL_1_3B_CHAT_PROCESSOR
    )
    write_checkpoint(
        FIXTURES / "Mistral-Small-3.1-24B-Instruct-2503",
        MISTRAL_SMALL_3_1_24B,
        mistral3_tensors(MISTRAL_SMALL_3_1_24B),
        shards=10,
        processor=MISTRAL_SMALL_3_1_24B_PROCESSOR,
    )
    write_pixtral_12b()
    write_glm4v()
    write_minicpmv4_6()
    write_mllama()
    write_opt()
    write_blip2()
    write_ovis2()
    write_idefics2()
    write_checkpoint(FIXTURES / "pythia-1.4b", PYTHIA_1_4B, gpt_neox_tensors(PYTHIA_1_4B))
    write_checkpoint(FIXTURES / "phi-2", PHI_2, phi_tensors(PHI_2), shards=2)
    write_checkpoint(FIXTURES / "phi-1_5", PHI_1_5, phi_tensors(PHI_1_5))
    write_checkpoint(FIXTURES / "falcon-40b", FALCON_40B, falcon_tensors(FALCON_40B), shards=9)
    write_bloom()
    write_checkpoint(FIXTURES / "glm-4-9b-chat-hf", GLM_4_9B_CHAT_HF, glm_tensors(GLM_4_9B_CHAT_HF), shards=4)
    write_checkpoint(FIXTURES / "GLM-4-9B-0414", GLM_4_9B_0414, glm_tensors(GLM_4_9B_0414), shards=4)
    write_checkpoint(FIXTURES / "chatglm3-6b", CHATGLM3_6B, chatglm_tensors(CHATGLM3_6B, dtype="F16"), shards=7)
    write_checkpoint(FIXTURES / "glm-4-9b-chat", GLM_4_9B_CHAT, chatglm_tensors(GLM_4_9B_CHAT), shards=10)
    write_checkpoint(FIXTURES / "OLMo-2-0425-1B", OLMO_2_0425_1B, olmo2_tensors(OLMO_2_0425_1B))
    write_t5()
    write_checkpoint(FIXTURES / "starcoder2-3b", STARCODER2_3B, starcoder2_tensors(STARCODER2_3B), shards=2)
    write_checkpoint(FIXTURES / "stablelm-2-1_6b", STABLELM_2_1_6B, stablelm_tensors(STABLELM_2_1_6B))
    write_checkpoint(FIXTURES / "granite-3.0-2b-base", GRANITE_3_0_2B, llama_tensors(GRANITE_3_0_2B, head=None, dtype="BF16"), shards=2)
    write_checkpoint(FIXTURES / "aya-expanse-8b", AYA_EXPANSE_8B, cohere_tensors(AYA_EXPANSE_8B), shards=4)
    write_checkpoint(FIXTURES / "c4ai-command-r7b-12-2024", COMMAND_R7B_12_2024, cohere_tensors(COMMAND_R7B_12_2024, "BF16"), shards=4)
    write_aya_vision_8b()
    write_command_a_vision()
    write_ovis2()
    write_idefics2()
    write_checkpoint(FIXTURES / "tiny-llama-bnb-4bit", TINY_BNB, bnb_4bit_tensors(TINY_BNB))
    write_checkpoint(FIXTURES / "internlm2_5-7b-chat", INTERNLM2_5_7B_CHAT, internlm2_tensors(INTERNLM2_5_7B_CHAT), shards=8)
    write_checkpoint(FIXTURES / "internlm-xcomposer2-vl-7b", IXC2_VL_7B, ixc2_tensors(IXC2_VL_7B), shards=2)
    write_checkpoint(FIXTURES / "internlm-xcomposer2-4khd-7b", IXC2_4KHD_7B, ixc2_4khd_tensors(IXC2_4KHD_7B), shards=2)
    write_qwen()
    write_checkpoint(FIXTURES / "Baichuan2-7B-Base", BAICHUAN2_7B_BASE, baichuan_tensors(BAICHUAN2_7B_BASE))
    write_qwen_vl()
    write_phi3_v()
    write_minicpmv()
    write_glm4v_9b()
    write_cogvlm2()
    write_cogvlm()
    write_yi_vl()
    for name, folder in (("llava-v1.6-mistral-7b-hf", "llava-v1.6-mistral-7b"), ("llava-v1.6-vicuna-7b-hf", "llava-v1.6-vicuna-7b")):
        hf = ROOT / "specs" / "llava_next" / "hf" / folder
        config = json.loads((hf / "config.json").read_text())
        processor = json.loads((hf / "preprocessor_config.json").read_text())
        write_checkpoint(FIXTURES / name, config, llava_next_tensors(config), shards=4 if "mistral" in name else 3, processor=processor)
    hf = ROOT / "specs" / "llava_next_video" / "hf" / "llava-next-video-7b"
    config = json.loads((hf / "config.json").read_text())
    write_checkpoint(FIXTURES / "LLaVA-NeXT-Video-7B-hf", config, llava_next_tensors(config, "BF16"), shards=3)
    for name, folder, shards in (
        ("llava-onevision-qwen2-0.5b-ov-hf", "llava-onevision-qwen2-0.5b-ov", 1),
        ("llava-onevision-qwen2-7b-ov-hf", "llava-onevision-qwen2-7b-ov", 4),
    ):
        hf = ROOT / "specs" / "llava_onevision" / "hf" / folder
        config = json.loads((hf / "config.json").read_text())
        processor = json.loads((hf / "preprocessor_config.json").read_text())
        write_checkpoint(FIXTURES / name, config, llava_onevision_tensors(config), shards=shards, processor=processor)
    for name, folder in (("Qwen2-VL-7B-Instruct", "qwen2-vl-7b-instruct"), ("Qwen2.5-VL-7B-Instruct", "qwen2.5-vl-7b-instruct")):
        hf = ROOT / "specs" / "qwen2_vl" / "hf" / folder
        config = json.loads((hf / "config.json").read_text())
        processor = json.loads((hf / "preprocessor_config.json").read_text())
        write_checkpoint(FIXTURES / name, config, qwen2_vl_tensors(config), shards=5, processor=processor)
    for name, folder, shards in (("Qwen3-VL-2B-Instruct", "qwen3-vl-2b-instruct", 1), ("Qwen3-VL-8B-Instruct", "qwen3-vl-8b-instruct", 4)):
        write_qwen3_vl(name, folder, shards)
    for name, folder in (
        ("InternVL3-8B", "internvl3-8b"),
        ("InternVL3-8B-hf", "internvl3-8b-hf"),
        ("InternVL3-38B", "internvl3-38b"),
        ("InternVL3-38B-hf", "internvl3-38b-hf"),
        ("InternVL2_5-8B", "internvl2_5-8b"),
    ):
        hf = ROOT / "specs" / "internvl" / "hf" / folder
        config = json.loads((hf / "config.json").read_text())
        pre = hf / "preprocessor_config.json"
        processor = json.loads(pre.read_text()) if pre.exists() else None
        write_checkpoint(FIXTURES / name, config, internvl_tensors(config), shards=4, processor=processor)


if __name__ == "__main__":
    if sys.argv[1:] == ["pixtral-12b"]:
        write_pixtral_12b()
    elif sys.argv[1:] == ["glm4v"]:
        write_glm4v()
    elif sys.argv[1:] == ["minicpmv4_6"]:
        write_minicpmv4_6()
    elif sys.argv[1:] == ["smolvlm2-2.2b"]:
        write_smolvlm2_2_2b()
    elif sys.argv[1:] == ["aya-vision-8b"]:
        write_aya_vision_8b()
    elif sys.argv[1:] == ["command-a-vision"]:
        write_command_a_vision()
    elif sys.argv[1:] == ["t5"]:
        write_t5()
    elif sys.argv[1:] == ["mllama"]:
        write_mllama()
    elif sys.argv[1:] == ["deepseek_v2"]:
        write_deepseek_v2()
    elif sys.argv[1:] == ["bloom"]:
        write_bloom()
    elif sys.argv[1:] == ["opt"]:
        write_opt()
    elif sys.argv[1:] == ["blip2"]:
        write_blip2()
    elif sys.argv[1:] == ["ovis2"]:
        write_ovis2()
    elif sys.argv[1:] == ["idefics2"]:
        write_idefics2()
    elif sys.argv[1:] == ["phi3_v"]:
        write_phi3_v()
    elif sys.argv[1:] == ["qwen"]:
        write_qwen()
    elif sys.argv[1:] == ["qwen_vl"]:
        write_qwen_vl()
    elif sys.argv[1:] == ["minicpmv"]:
        write_minicpmv()
    elif sys.argv[1:] == ["glm4v_9b"]:
        write_glm4v_9b()
    elif sys.argv[1:] == ["cogvlm2"]:
        write_cogvlm2()
    elif sys.argv[1:] == ["cogvlm"]:
        write_cogvlm()
    elif sys.argv[1:] == ["yi_vl"]:
        write_yi_vl()
    else:
        write_all()
    sys.stdout.write(f"wrote {FIXTURES}\n")
