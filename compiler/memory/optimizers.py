"""The optimizers memspec models: the state tensors each creates per parameter tensor, the
tensors it creates once per optimizer, and the temporaries alive while `step()` runs.

Contract: pure functions of an `Optimizer` (resolve's value), a parameter tensor's element
count and shape, and the byte sizes `resolve` derives; no torch. Byte sizes are unrounded;
the simulator rounds every allocation to the caching allocator's granule.

States appear at the first `step()` (PyTorch, transformers' Adafactor and bitsandbytes all
create them lazily, on the first step that sees a gradient), so the first step's peak before
its optimizer step has none, and the steady-state step has them all along.

Sources (the versions installed or pinned; see each function):
- torch/optim/adam.py (Adam, AdamW: `_single_tensor_adam`, `_multi_tensor_adam`, `_fused_adam`),
  torch/optim/sgd.py (`_single_tensor_sgd`, `_multi_tensor_sgd`), torch 2.13;
- transformers/optimization.py, Adafactor.step (transformers 5.23), created by the Trainer
  with scale_parameter=False, relative_step=False (trainer_optimizer.py, _get_adafactor);
- bitsandbytes/optim/optimizer.py at commit 51294d909e914f80d2f2c85f9e9229dd4386ef85
  (Optimizer8bit.get_state_buffer, Optimizer2State.init_state, Optimizer1State.init_state)
  and bitsandbytes/functional.py (create_dynamic_map: 2**8 = 256 fp32 values).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod

TYPES = ("adamw", "adam", "sgd", "adafactor", "lion")
IMPLS = ("foreach", "fused", "forloop", "bitsandbytes")
# Each type's implementations; the first is the default.
TYPE_IMPLS = {
    "adamw": ("foreach", "fused", "forloop", "bitsandbytes"),
    "adam": ("foreach", "fused", "forloop", "bitsandbytes"),
    "sgd": ("foreach", "forloop"),
    "adafactor": ("forloop",),
    "lion": ("bitsandbytes",),
}
FP32 = 4
# How the stepped tensors split into parameter groups: `one`, every tensor in one group (an
# optimizer built on model.parameters()); `trainer`, Hugging Face Trainer's two groups
# (transformers/trainer.py, Trainer.create_optimizer): the tensors get_decay_parameter_names
# lists, with the weight decay, then the others, without it, each in named_parameters() order.
PARAM_GROUPS = ("one", "trainer")
# transformers/trainer.py, Trainer.get_decay_parameter_names (5.23): a parameter decays unless
# its module is a torch.nn.LayerNorm or its lower-cased dotted name matches one of these
# (trainer_pt_utils.py, get_parameter_names, `pattern.search(name.lower())`).
TRAINER_NO_DECAY = tuple(re.compile(p) for p in (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"))
LAYER_NORM_CLASS = "torch.nn.LayerNorm"
# bitsandbytes/optim/optimizer.py, Optimizer2State/Optimizer1State.init_state: a tensor with
# fewer than min_8bit_size (default 4096) elements keeps fp32 states; an 8-bit state has one
# fp32 absmax per block of 256 elements (`blocks = n // 256`, plus one for a remainder).
BNB_MIN_8BIT_SIZE = 4096
BNB_BLOCK = 256
# Optimizer8bit.get_state_buffer: with is_paged, a state of 1e5 elements or more is
# F.get_paged (cudaMallocManaged), outside PyTorch's caching allocator; smaller ones are
# torch.zeros_like.
BNB_PAGED_MIN_ELEMENTS = 100_000
# functional.create_dynamic_map: the 8-bit quantile map, 2**8 fp32 values; the signed map
# ("dynamic") serves the first state, the unsigned one ("udynamic") the second.
BNB_QMAP_ELEMENTS = 256


@dataclass(frozen=True)
class Optimizer:
    type: str  # adamw | adam | sgd | adafactor | lion
    impl: str  # foreach | fused | forloop | bitsandbytes
    momentum: float = 0.0  # SGD momentum; Adafactor beta1 (0: no first moment)
    weight_decay: float = 0.0  # matters to memory only where it is coupled (Adam, SGD)
    bits: int = 32  # bitsandbytes state bits: 32 or 8
    paged: bool = False  # bitsandbytes paged states (CUDA unified memory)
    param_groups: str = "one"  # one | trainer (PARAM_GROUPS)

    @property
    def bnb(self) -> bool:
        return self.impl == "bitsandbytes"

    @property
    def n_dense_states(self) -> int:
        """State tensors of the parameter's size for the element-wise optimizers."""
        if self.type in ("adamw", "adam"):
            return 2  # exp_avg, exp_avg_sq
        if self.type == "lion":
            return 1  # exp_avg
        if self.type == "sgd":
            return 1 if self.momentum > 0 else 0  # momentum_buffer
        return 0

    @property
    def label(self) -> str:
        """How reports name it: `adamw foreach`, `sgd momentum 0.9`, `adamw bitsandbytes 8-bit paged`."""
        if self.type == "sgd":
            out = "sgd" + (" forloop" if self.impl == "forloop" else "") + f" momentum {self.momentum:g}"
        elif self.type == "adafactor":
            out = "adafactor" + (f" beta1 {self.momentum:g}" if self.momentum else "")
        elif self.bnb:
            out = f"{self.type} bitsandbytes {self.bits}-bit" + (" paged" if self.paged else "")
        else:
            out = f"{self.type} {self.impl}"
        out += f" weight_decay {self.weight_decay:g}" if self.weight_decay and self.type in ("adam", "sgd") else ""
        return out + (", Trainer's decay / no-decay groups" if self.param_groups == "trainer" else "")

    def group_of(self, name: str, module_class: str | None) -> int:
        """The parameter group (0 or 1) of the tensor called `name` (its layer's path, a dot
        and the tensor's name) in a layer of `module_class`: always 0 with one group."""
        return 0 if self.param_groups == "one" or trainer_decays(name, module_class) else 1

    def group_decay(self, group: int) -> float:
        """A group's weight decay: the Trainer's second group has none."""
        return self.weight_decay if group == 0 else 0.0


def trainer_decays(name: str, module_class: str | None) -> bool:
    """Whether Hugging Face Trainer puts the parameter `name` in its weight-decay group
    (transformers/trainer.py, Trainer.get_decay_parameter_names)."""
    return module_class != LAYER_NORM_CLASS and not any(p.search(name.lower()) for p in TRAINER_NO_DECAY)


@dataclass(frozen=True)
class State:
    nbytes: int
    paged: bool = False  # in CUDA unified memory: not in torch.cuda.max_memory_allocated


def adafactor_factored(shape: tuple[int, ...]) -> bool:
    """Adafactor._get_options: second moments are factored for tensors of 2 or more dims."""
    return len(shape) >= 2


def adafactor_vectors(shape: tuple[int, ...]) -> tuple[int, int]:
    """Elements of exp_avg_sq_row (shape[:-1]) and exp_avg_sq_col (shape[:-2] + shape[-1:])."""
    return prod(shape[:-1]), prod(shape[:-2]) * shape[-1]


def states(opt: Optimizer, elements: int, shape: tuple[int, ...] | None, state_bytes: int) -> tuple[State, ...]:
    """The state tensors `opt` creates at its first step for one parameter tensor.

    `state_bytes` is one element of a torch optimizer's state: the dtype of what it steps
    (the fp32 master with mixed precision, else the weight's dtype). Adafactor keeps fp32
    states whatever the weight's dtype (`grad = grad.float()` first; the states are made
    `.to(grad)`), and so do bitsandbytes' 32-bit states (init_state: dtype torch.float32).
    """
    if opt.type == "adafactor":
        if shape is None:
            raise ValueError("Adafactor needs the parameter's shape")
        out = [State(FP32 * elements)] if opt.momentum > 0 else []  # exp_avg
        if adafactor_factored(shape):
            rows, cols = adafactor_vectors(shape)
            out += [State(FP32 * rows), State(FP32 * cols)]
        else:
            out.append(State(FP32 * elements))  # exp_avg_sq
        # state["RMS"] = self._rms(p_data_fp32): a 0-dim fp32 tensor kept in the state
        return tuple(out) + (State(FP32),)
    if not opt.bnb:
        return tuple(State(elements * state_bytes) for _ in range(opt.n_dense_states))
    n = opt.n_dense_states
    if opt.bits == 32 or elements < BNB_MIN_8BIT_SIZE:
        paged = opt.paged and elements >= BNB_PAGED_MIN_ELEMENTS
        return tuple(State(FP32 * elements, paged) for _ in range(n))
    paged = opt.paged and elements >= BNB_PAGED_MIN_ELEMENTS
    blocks = -(-elements // BNB_BLOCK)
    return tuple(State(elements, paged) for _ in range(n)) + tuple(State(FP32 * blocks) for _ in range(n))


def once(opt: Optimizer, tensors: list[int]) -> tuple[int, ...]:
    """Tensors the optimizer creates once, not per parameter: bitsandbytes' quantile maps,
    moved to the GPU the first time an 8-bit state is made (init_state: name2qmap[...].to(device))."""
    if not (opt.bnb and opt.bits == 8) or not any(e >= BNB_MIN_8BIT_SIZE for e in tensors):
        return ()
    return (FP32 * BNB_QMAP_ELEMENTS,) * opt.n_dense_states


def is_elementwise(opt: Optimizer) -> bool:
    """Whether every state is the parameter's size in `state_bytes` (bytes.optim is exact)."""
    return not opt.bnb and opt.type != "adafactor"


# Hugging Face TrainingArguments --optim names (transformers/training_args.py, OptimizerNames)
# -> the experiment's `optimizer` block, as Trainer builds them (trainer_optimizer.py):
# adamw_torch is torch.optim.AdamW with foreach left to torch (foreach on CUDA),
# adamw_torch_fused adds fused=True; adafactor is transformers' Adafactor (beta1 None); sgd is
# torch.optim.SGD with momentum 0 unless --optim_args says otherwise; the bitsandbytes names
# (_get_bitsandbytes_optimizer) are bnb.optim.AdamW / Lion with optim_bits 8 where the name
# says "8bit", else 32, and is_paged where it says "paged".
HF_OPTIM = {
    "adamw_torch": {"type": "adamw", "impl": "foreach"},
    "adamw_torch_fused": {"type": "adamw", "impl": "fused"},
    "adafactor": {"type": "adafactor"},
    "sgd": {"type": "sgd", "momentum": 0.0},
    "adamw_bnb_8bit": {"type": "adamw", "impl": "bitsandbytes", "bits": 8},
    "adamw_8bit": {"type": "adamw", "impl": "bitsandbytes", "bits": 8},
    "paged_adamw_8bit": {"type": "adamw", "impl": "bitsandbytes", "bits": 8, "paged": True},
    "paged_adamw_32bit": {"type": "adamw", "impl": "bitsandbytes", "bits": 32, "paged": True},
    "lion_32bit": {"type": "lion", "impl": "bitsandbytes", "bits": 32},
    "lion_8bit": {"type": "lion", "impl": "bitsandbytes", "bits": 8},
    "paged_lion_32bit": {"type": "lion", "impl": "bitsandbytes", "bits": 32, "paged": True},
    "paged_lion_8bit": {"type": "lion", "impl": "bitsandbytes", "bits": 8, "paged": True},
}
