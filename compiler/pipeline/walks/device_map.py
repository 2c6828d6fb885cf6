"""A model split across the GPUs of one process by `from_pretrained(device_map=...)`: where
each layer goes, and what one GPU holds beside its own layers.

Contract: `place(nodes, setup)` gives the GPU of every layer as transformers 5.23 and
accelerate 1.15 place it (`_get_device_map` in transformers/integrations/accelerate.py:
`get_balanced_memory` unless the strategy is "sequential", then its `infer_auto_device_map`,
a copy of accelerate's with tied weights left out of the sizes), or as an explicit map names
it; `on_gpu(nodes, placement, gpu)` is the layer tree with every other GPU's layers made
empty, which `simulate` walks once per GPU; `DeviceMapWalk` adds what crosses the GPUs.

The rule works on the Hugging Face module tree (`_hf_tree`: module names, `named_children()`
order, `_no_split_modules`, sizes of the 16-bit weights and buffers before peft, tied weights
left out), built from the layer tree for the layouts it knows: a Llama-style causal LM
(`llama_causal_lm`: `model.embed_tokens`, `model.layers.N`, `model.norm`, `model.rotary_emb`,
`lm_head`) and LLaVA (`clip_vision_tower`, `mlp_projector`, `llama_causal_lm` under
`model.vision_tower`, `model.multi_modal_projector`, `model.language_model`). Anything the
rule would send to "cpu" or "disk" is refused: offloaded weights are not modelled.

What crosses the GPUs (accelerate's AlignDevicesHook on every placed module sends a module's
inputs to its GPU; the hook on the model sends its outputs back to the GPU of the inputs):
- the gradient of the hidden states at each boundary, copied back (`.to(device)`'s backward)
  and alive while the layer before the boundary runs its backward, where that layer is a leaf
  (a decoder layer's backward transient counts its output's gradient already; the forward's
  copy is the next layer's input, which that layer's own formula charges);
- cos and sin (`position_embeddings`): computed once on the GPU of `rotary_emb`, copied for
  every layer elsewhere, and each copy is saved by that layer's `q * cos` and `k * sin`; a
  checkpointing unit keeps its copies of cos, sin and the position ids (made on the GPU of the
  embeddings) until its backward;
- the model's output, logits included, copied to the GPU of the batch (GPU 0) when the
  forward returns, alive until the training loop drops the output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from ...errors import Diagnostic, MemspecError, did_you_mean
from ..evaluate import Cost, Node
from ..resolve import Setup
from .base import Walk
from .timeline import ALLOCATOR_GRANULE, Row, round_up

HANDOFF = Row("handoff", "activations")  # the breakdown row of what crosses GPUs
OUTPUT_COPY = Row("output_copy", "activations", transient=True)
GRADIENT_COPY = Row("gradient_copy", "transient", transient=True)

_INDEXED = re.compile(r"^(\w+)\[(\d+)\]$")
_ADAPTERS = ("lora_linear", "dora_linear")
# get_balanced_memory: "buffer = int(1.25 * max(biggest_no_split_module, biggest_leaf))"
BALANCED_BUFFER = 1.25


@dataclass
class HfModule:
    """One module of the Hugging Face model: its full name, whether accelerate may split it
    (`no_split`: a class in `_no_split_modules`), its children in `named_children()` order,
    its size in bytes (weights and buffers, tied weights left out) and the layers it covers."""

    name: str
    no_split: bool = False
    children: list["HfModule"] = field(default_factory=list)
    own: int = 0  # bytes of the layers it covers directly
    leaves: list[int] = field(default_factory=list)  # bytes of each leaf module inside it
    nodes: list[Node] = field(default_factory=list)

    def child(self, local: str, no_split: bool = False) -> "HfModule":
        name = f"{self.name}.{local}" if self.name else local
        for c in self.children:
            if c.name == name:
                return c
        c = HfModule(name, no_split)
        self.children.append(c)
        return c

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()


def _weights(node: Node, setup: Setup) -> tuple[int, list[int]]:
    """Bytes of a layer's weights and buffers as from_pretrained loads them (no adapters, no
    modules_to_save copy), and the bytes of each leaf module in it."""
    skip: set[int] = set()
    for n in node.walk():
        if n.inst.formula.layer_type in _ADAPTERS:
            skip |= {id(a) for c in n.children[1:] for a in c.walk()}
        elif n.inst.formula.layer_type == "modules_to_save":
            skip |= {id(a) for a in n.children[1].walk()}
    leaves = [sum(n.cost.param_tensors) + sum(n.cost.buffer_tensors) for n in node.walk() if id(n) not in skip]
    return sum(leaves), [b for b in leaves if b]


class Unsupported(Exception):
    pass


def _local(root: Node, node: Node) -> tuple[str, int | None]:
    local = node.inst.path[len(root.inst.path) + 1 :]
    m = _INDEXED.match(local)
    return (m.group(1), int(m.group(2))) if m else (local, None)


def _causal_lm(root: Node, body: HfModule, top: HfModule) -> None:
    """LlamaModel / Qwen2Model ... under `body`, lm_head under `top`: named_children() order is
    embed_tokens, layers, norm, rotary_emb."""
    order = {"embed_tokens": 0, "layers": 1, "norm": 2, "rotary_emb": 3}
    placed = []
    for c in root.children:
        name, index = _local(root, c)
        if name == "lm_head":
            continue
        if name in ("loss", "image_merge"):
            continue  # NB: no module: runs where its inputs are (see _follow)
        if name not in order:
            raise Unsupported(f"{root.inst.module}.{name} ({c.inst.formula.layer_type})")
        placed.append((order[name], index or 0, name, index, c))
    for _, _, name, index, c in sorted(placed, key=lambda t: t[:2]):
        if name == "layers":
            body.child("layers").child(str(index), no_split=True).nodes.append(c)
        else:
            body.child(name).nodes.append(c)
    head = next((c for c in root.children if _local(root, c)[0] == "lm_head"), None)
    if head is None:
        raise Unsupported(f"{root.inst.module} without lm_head")
    top.child("lm_head").nodes.append(head)


def _clip(root: Node, body: HfModule) -> None:
    """CLIPVisionModel (transformers 5): embeddings (CLIPVisionEmbeddings, no split: the patch
    embedding and the class and position embeddings), pre_layrnorm, encoder.layers.N
    (CLIPEncoderLayer, no split; the layers after the feature layer too), post_layernorm."""
    parts: dict[str, list[Node]] = {"embeddings": [], "pre_layrnorm": [], "layers": [], "post_layernorm": []}
    used = sum(1 for c in root.children if _local(root, c)[0] == "layers")
    for c in root.children:
        name, index = _local(root, c)
        if name in ("patch_embedding", "embeddings"):
            parts["embeddings"].append(c)
        elif name in ("layers", "unused_layers"):
            parts["layers"].append((index if name == "layers" else used + index, c))
        elif name in ("pre_layrnorm", "post_layernorm"):
            parts[name].append(c)
        else:
            raise Unsupported(f"{root.inst.module}.{name} ({c.inst.formula.layer_type})")
    body.child("embeddings", no_split=True).nodes.extend(parts["embeddings"])
    body.child("pre_layrnorm").nodes.extend(parts["pre_layrnorm"])
    layers = body.child("encoder").child("layers")
    for i, c in sorted(parts["layers"], key=lambda t: t[0]):
        layers.child(str(i), no_split=True).nodes.append(c)
    body.child("post_layernorm").nodes.extend(parts["post_layernorm"])


def _projector(root: Node, body: HfModule) -> None:
    """LlavaMultiModalProjector: linear_1, act, linear_2."""
    for c in root.children:
        name, _ = _local(root, c)
        if name not in ("linear_1", "act", "linear_2"):
            raise Unsupported(f"{root.inst.module}.{name} ({c.inst.formula.layer_type})")
        body.child(name).nodes.append(c)


LAYOUTS = "a Llama-style causal LM (llama_causal_lm) or LLaVA (clip_vision_tower, mlp_projector, llama_causal_lm)"


def _hf_tree(nodes: tuple[Node, ...], setup: Setup) -> tuple[HfModule, list[list[str]]]:
    """The Hugging Face module tree of the model and its tied weight groups."""
    types = [n.inst.formula.layer_type for n in nodes]
    top = HfModule("")
    if types == ["llama_causal_lm"]:
        lm, prefix = nodes[0], "model"
        _causal_lm(lm, top.child("model"), top)
    elif types == ["clip_vision_tower", "mlp_projector", "llama_causal_lm"]:
        model = top.child("model")
        _clip(nodes[0], model.child("vision_tower"))
        _projector(nodes[1], model.child("multi_modal_projector"))
        lm, prefix = nodes[2], "model.language_model"
        _causal_lm(lm, model.child("language_model"), top)
    else:
        raise Unsupported(f"modules of types {', '.join(types)}")
    for m in top.walk():
        for n in m.nodes:
            own, leaves = _weights(n, setup)
            m.own += own
            m.leaves += leaves
    tied: list[list[str]] = []
    embed = next(m for m in top.walk() if m.name == f"{prefix}.embed_tokens")
    head = next(m for m in top.walk() if m.name == "lm_head")
    if embed.own == 0 and head.own:
        # NB: a tied table: memspec charges it to lm_head, transformers counts it with the
        # embeddings (compute_module_sizes skips the tied key lm_head.weight)
        embed.own, embed.leaves, head.own, head.leaves = head.own, head.leaves, 0, []
        tied = [sorted(["lm_head.weight", f"{prefix}.embed_tokens.weight"])]
    return top, tied


def _sizes(top: HfModule) -> dict[str, int]:
    sizes: dict[str, int] = {}

    def total(m: HfModule) -> int:
        sizes[m.name] = m.own + sum(total(c) for c in m.children)
        return sizes[m.name]

    total(top)
    return sizes


def _max_layer(modules: list[HfModule], sizes: dict[str, int]) -> tuple[int, list[str]]:
    """accelerate's get_max_layer_size: the largest module that is a leaf or not to be split."""
    best, names = 0, []
    todo = list(modules)
    while todo:
        m = todo.pop(0)
        if not m.children or m.no_split:
            if sizes[m.name] > best:
                best, names = sizes[m.name], [m.name]
            elif sizes[m.name] == best:
                names.append(m.name)
        else:
            todo = list(m.children) + todo
    return best, names


def balanced_memory(top: HfModule, max_memory: dict[int, int], low_zero: bool) -> dict[int, int]:
    """transformers' get_balanced_memory with max_memory given (GPUs only)."""
    sizes = _sizes(top)
    max_memory = dict(max_memory)
    gpus = sorted(g for g, b in max_memory.items() if b > 0)
    if not gpus:
        return max_memory
    if len(gpus) == 1:
        low_zero = False
    per_gpu = sizes[""] // (len(gpus) - 1 if low_zero else len(gpus))
    biggest_no_split = max((sizes[m.name] for m in top.walk() if m.no_split), default=0)
    biggest_leaf = max((b for m in top.walk() for b in m.leaves), default=0)
    per_gpu += int(BALANCED_BUFFER * max(biggest_no_split, biggest_leaf))
    for g in gpus[:-1]:
        max_memory[g] = min(max_memory[0] if low_zero and g == 0 else per_gpu, max_memory[g])
    if low_zero:
        min_zero = max(0, sizes[""] - sum(max_memory[i] for i in range(1, len(gpus))))
        max_memory[0] = min(min_zero, max_memory[0])
    return max_memory


def infer_device_map(top: HfModule, max_memory: dict[int, int], tied: list[list[str]]) -> dict[str, int | str]:
    """transformers' infer_auto_device_map (clean_result, no offload_buffers, no quantizer,
    no _no_placement_params), on the tree; GPUs first, then "disk"."""
    sizes = _sizes(top)
    devices: list[int | str] = sorted(max_memory) + ["disk"]
    main = devices[0]
    used = {d: 0 for d in devices}
    device_map: dict[str, int | str] = {}
    current = 0
    todo: list[HfModule] = list(top.children)
    by_name = {m.name: m for m in top.walk()}
    max_size, max_names = _max_layer(todo, sizes)
    while todo:
        m = todo.pop(0)
        name = m.name
        max_names = [n for n in max_names if n != name and not n.startswith(name + ".")]
        if not max_names:
            max_size, max_names = _max_layer(todo, sizes)
        size = sizes[name]
        groups = [g for g in tied if any(name + "." in k + "." for k in g) and not all(name + "." in k + "." for k in g)]
        tied_params = [p for g in groups for p in g if name + "." not in p + "."]
        device = devices[current]
        limit = max_memory[device] if device != "disk" else None
        reserved = 0
        if device == main:
            limit -= max_size
            reserved = max_size
        with_ties, tied_names = size, []
        for p in tied_params:
            t = next(x for x in todo if p.startswith(x.name + "."))
            if t.name not in tied_names:
                tied_names.append(t.name)
                with_ties += sizes[t.name]
        if limit is None or used[device] + with_ties <= limit:
            used[device] += with_ties
            device_map[name] = device
            for t in tied_names:
                todo = [x for x in todo if x.name != t]
                device_map[t] = device
            continue
        if tied_params and used[device] + size <= limit:
            split = False
            for t in tied_names:
                tm = by_name[t]
                if not tm.children or tm.no_split:
                    continue
                i = next(i for i, x in enumerate(todo) if x.name == t)
                todo = [m] + todo[:i] + list(tm.children) + todo[i + 1 :]
                max_size, max_names = _max_layer(todo, sizes)
                split = True
                break
            if split:
                continue
        if m.children and not m.no_split:
            todo = list(m.children) + todo
            max_size, max_names = _max_layer(todo, sizes)
            continue
        used[device] += reserved
        current += 1
        todo = [m] + todo
    return _clean(device_map)


def _clean(device_map: dict, module: str = "") -> dict:
    """accelerate's clean_device_map: a module whose every entry is on one device becomes one entry."""
    prefix = "" if module == "" else f"{module}."
    values = [v for k, v in device_map.items() if k.startswith(prefix)]
    if len(set(values)) == 1 and len(values) > 1:
        for k in [k for k in device_map if k.startswith(prefix)]:
            del device_map[k]
        device_map[module] = values[0]
    children = [k for k in device_map if k.startswith(prefix) and len(k) > len(module)]
    depth = len(module.split(".")) + 1 if module else 1
    for child in {".".join(k.split(".")[:depth]) for k in children}:
        _clean(device_map, child)
    return device_map


def _where(setup: Setup, key: str) -> tuple[str, int, int, str]:
    return dict(setup.device_map.where).get(key) or dict(setup.device_map.where).get("", ("", 0, 0, "$.device_map"))


def _fail(setup: Setup, key: str, message: str, help: str) -> MemspecError:
    file, line, col, path = _where(setup, key)
    return MemspecError([Diagnostic("E332", file, line, col, path, message, help)])


def hf_device_map(nodes: tuple[Node, ...], setup: Setup) -> tuple[HfModule, dict[str, int | str]]:
    """The Hugging Face module tree and the device map from_pretrained ends with."""
    dm = setup.device_map
    try:
        top, tied = _hf_tree(nodes, setup)
    except Unsupported as error:
        raise _fail(setup, "", f"device_map is not modelled for {error}", f"it is for {LAYOUTS}") from None
    if dm.strategy:
        memory = dict(dm.max_memory)
        if dm.strategy != "sequential":
            memory = balanced_memory(top, memory, low_zero=dm.strategy == "balanced_low_0")
        return top, infer_device_map(top, memory, tied)
    names = {m.name for m in top.walk()}
    for name, _ in dm.explicit:
        if name not in names:
            known = sorted(n for n in names if n)
            raise _fail(
                setup,
                name,
                f"device_map names '{name}', which is no module of the model (or lies inside a layer the rule never splits)",
                did_you_mean(name, known) or f"modules down to the layers: {', '.join(known[:12])}, ...",
            )
    return top, dict(dm.explicit)


def _device_of(name: str, device_map: dict) -> int | str | None:
    best = None
    for key, device in device_map.items():
        if key == "" or name == key or name.startswith(key + "."):
            if best is None or len(key) > len(best[0]):
                best = (key, device)
    return None if best is None else best[1]


def place(nodes: tuple[Node, ...], setup: Setup) -> dict[int, int]:
    """id(node) -> GPU for every node of the tree."""
    top, device_map = hf_device_map(nodes, setup)
    placement: dict[int, int] = {}
    for m in top.walk():
        if not m.nodes:
            continue
        device = _device_of(m.name, device_map)
        if device is None:
            raise _fail(setup, "", f"device_map gives no GPU for module '{m.name}'", "name it, or a module around it, in the map")
        if not isinstance(device, int):
            total = sum(m.own for m in top.walk())
            gpus = ", ".join(f"{b / 2**30:.2f} GiB" for _, b in setup.device_map.max_memory)
            raise _fail(
                setup,
                "max_memory" if setup.device_map.strategy else "",
                f"the weights ({total / 2**30:.2f} GiB) do not fit max_memory ({gpus}): "
                f"from_pretrained would put '{m.name}' on {device}, and offloaded weights are not modelled",
                "give the GPUs more max_memory, or more GPUs",
            )
        for n in m.nodes:
            for x in n.walk():
                placement[id(x)] = device
    for root in nodes:
        # NB: a model's own tensors (the batch: input_ids, labels, pixel_values, and what the
        # model's forward builds from it) are on the batch's GPU, 0
        placement[id(root)] = 0
        _follow(root, placement)
    return placement


def _follow(node: Node, placement: dict[int, int]) -> None:
    """Layers that are no module (the loss, the image merge, a composite's own tensors) run
    where their inputs are: the GPU of the layer before them, or of their first placed child."""
    previous = None
    for c in node.children:
        if id(c) not in placement:
            _follow(c, placement)
        if id(c) not in placement:
            if previous is None:
                previous = next((placement[id(x)] for x in c.walk() if id(x) in placement), None)
            if previous is not None:
                placement[id(c)] = previous
        previous = placement.get(id(c), previous)
    if id(node) not in placement:
        first = next((placement[id(x)] for x in node.walk() if id(x) in placement), None)
        if first is not None:
            placement[id(node)] = first


_EMPTY = {f.name: (() if f.type.startswith("tuple") else 0) for f in fields(Cost)}


def on_gpu(nodes: tuple[Node, ...], placement: dict[int, int], gpu: int) -> tuple[Node, ...]:
    """The tree with the layers of other GPUs made empty (same structure, no cost)."""

    def keep(n: Node) -> Node:
        cost = n.cost if placement[id(n)] == gpu else Cost(**_EMPTY)
        return Node(n.inst, cost, tuple(keep(c) for c in n.children))

    return tuple(keep(r) for r in nodes)


def _copies(roots: tuple[Node, ...], placed: dict[str, int], gpu: int) -> list[int]:
    """Bytes of the copies `gpu`'s layers keep of tensors the model makes once for every layer
    on another GPU, beyond the one the walk charges by name: cos and sin (made on rotary_emb's
    GPU) saved by each layer's q * cos and k * sin; and where a layer is a checkpointing unit,
    what it keeps of its inputs (cos, sin, the position ids, made on the GPU of the embeddings)."""
    made = {}
    for root in roots:
        for c in root.children:
            kind = c.inst.formula.layer_type
            if kind == "rotary_embedding":
                made["rope"] = placed.get(c.inst.path)
            elif kind == "embedding" and "embed" not in made:
                made["embed"] = placed.get(c.inst.path)
    copies: dict[str, list[int]] = {}
    for root in roots:
        # NB: what a unit keeps of the model's tensors, as any unit lists it (the first layer's
        # formula lists none: the model's own copies are charged elsewhere, its GPU's copies not)
        inputs = {n: b for c in root.children if c.inst.checkpointed for n, b in c.cost.checkpoint if not n.startswith(c.inst.path + "/")}
        for c in root.children:
            if placed.get(c.inst.path) != gpu:
                continue
            rope = [(n, b) for x in c.walk() if x.inst.formula.layer_type == "rotary" for n, b in x.cost.saved]
            kept = rope + [(n, b) for n, b in inputs.items() if n not in dict(rope)] if c.inst.checkpointed else rope
            for name, size in kept:
                origin = made.get("rope") if name.endswith("rope") else made.get("embed")
                if origin is not None and origin != gpu:
                    copies.setdefault(name, []).append(size)
    return [b for sizes in copies.values() for b in sizes[1:]]


class DeviceMapWalk(Walk):
    """What one GPU of a device_map holds beside its own layers (the module's docstring)."""

    rank = 120

    @classmethod
    def applies(cls, setup: Setup, trainable: int) -> bool:
        return setup.device_map is not None and setup.device_map.gpu >= 0

    def _placed(self) -> dict[str, int]:
        return dict(self.setup.device_map.placement)

    def start(self) -> None:
        placed, gpu, setup = self._placed(), self.setup.device_map.gpu, self.setup
        mine = [n for r in self.step.nodes for n in r.walk() if placed.get(n.inst.path) == gpu]
        extra = 0
        if not any(n.cost.parameters for n in mine):
            # NB: a GPU with no layer (GPU 0 under balanced_low_0) runs no GEMM: no cuBLAS workspace
            self.state.level -= self.state.workspace
            self.state.workspace = self.state.first_forward_workspace = 0
        extra = sum(round_up(b, ALLOCATOR_GRANULE) for b in _copies(self.step.nodes, placed, gpu))
        self.state.add_buffer(HANDOFF, extra)
        # the gradient of a boundary's hidden states, copied back from the GPU after it: alive
        # while the layer before the boundary runs its backward
        self.senders = {path: round_up(size, ALLOCATOR_GRANULE) for path, size in _senders(self.step.nodes, placed, gpu, setup)}

    def before_layer_backward(self, node: Node, stack) -> None:
        size = self.senders.get(node.inst.path)
        if size:
            self.state.add_buffer(GRADIENT_COPY, size)

    def after_layer_backward(self, node: Node, stack) -> None:
        size = self.senders.get(node.inst.path)
        if size:
            self.state.drop_buffer(GRADIENT_COPY, size)

    def after_forward(self) -> None:
        placed, gpu = self._placed(), self.setup.device_map.gpu
        head = next((n for r in self.step.nodes for n in r.walk() if n.inst.path.endswith(".lm_head")), None)
        if gpu != 0 or head is None or placed.get(head.inst.path) == 0:
            return
        # the model's output (the logits) sent to the batch's GPU by the hook on the model
        s = head.inst.scope
        # NB: and the loss, a 0-dim fp32 tensor
        logits = 0 if self.setup.loss == "fused_linear_cross_entropy" else s["tokens"] * s["d_out"] * self.setup.bytes["act"]
        size = round_up(logits, ALLOCATOR_GRANULE) + ALLOCATOR_GRANULE
        self.state.add_buffer(OUTPUT_COPY, size)
        self.state.observe("forward", "device_map.output_copy", {})
        self.state.drop_buffer(OUTPUT_COPY, size)


def _senders(roots: tuple[Node, ...], placed: dict[str, int], gpu: int, setup: Setup) -> list[tuple[str, int]]:
    """(path, bytes) of each layer on `gpu` whose output goes to a layer on another GPU, in the
    order the forward runs a module's layers: the gradient of that output comes back as a
    copy of [tokens, hidden]."""
    out = []
    for root in roots:
        # NB: rotary_emb's output is not the hidden states; the loss follows lm_head
        seq = [c for c in root.children if c.inst.formula.layer_type != "rotary_embedding"]
        s = root.inst.scope
        hidden = s.get("hidden") or 0
        tokens = s.get("tokens") or (s.get("batch", 1) * s.get("seq", 0))
        for a, b in zip(seq, seq[1:]):
            # NB: a composite (a decoder layer) counts the gradient of its output in its own
            # backward transient (llama_decoder_layer: the residual's gradient, one x); a leaf
            # (the final norm before lm_head) had it from the layer after it, on the other GPU
            if placed.get(a.inst.path) == gpu and placed.get(b.inst.path) not in (None, gpu) and not a.children:
                out.append((a.inst.path, tokens * hidden * setup.bytes["act"]))
    return out


WALKS = (DeviceMapWalk,)
