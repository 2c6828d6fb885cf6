"""DeepSpeed's optimizer offload (zero_optimization.offload_optimizer, cpu or nvme): the fp32
partition, its gradient and the states in host memory; the optimizer steps there.

What stays on the GPU is `_offload_buffers`': a staging buffer from the engine's
construction, the gradient norms' temporaries through backward, the norms at the step. The
placing walk (ZeRO-1/2 or ZeRO-3) keeps the 16-bit weights (`resident._blocks`); this walk
comes after it and steps the optimizer instead of it.
"""

from __future__ import annotations

from typing import Mapping

from ..resolve import Setup
from .base import Step, Walk
from .deepspeed import DEEPSPEED
from .optimizer_step import _largest_trainable_tensor, _trainable_tensors
from .resident import _offloaded
from .timeline import ALLOCATOR_GRANULE, div, round_up

# deepspeed/runtime/zero/stage3.py, DeepSpeedZeroOptimizer_Stage3._constant_buffered_norm2:
# the norm is taken over chunks of at most 250_000_000 elements (buffer_size)
NORM_CHUNK = 250_000_000


def _offload_buffers(setup: Setup, largest: int, tensors: int = 0) -> tuple[int, int, int]:
    """(resident, backward transient, step transient) GPU bytes of DeepSpeed's optimizer offload.

    ZeRO-1/2, deepspeed/runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer:
    - __init__ with cpu_offload: `temp_grad_buffer_for_gpu_offload`, torch.zeros of the
      largest parameter's numel in the 16-bit dtype on the GPU, kept for the whole run (the
      fp32 partition `single_partition_of_fp32_groups` and its .grad are on the CPU);
    - copy_grads_in_partition with cpu_offload: no GPU gradient partition
      (`grads_in_partition` is never allocated); per parameter, set_norm_for_param_grad_in_gpu
      takes `.double().norm(2)` of its slice (8 bytes per element), then
      async_inplace_copy_grad_to_fp32_buffer_from_gpu converts it `.to(fp32)` (4 bytes) for
      the copy to the host. NB: the slice is at most the whole parameter; it is charged as
      the largest parameter's, for the whole backward (an upper bound: only the moment its
      bucket is reduced holds it).
    - step() runs the optimizer on the CPU: no optimizer temporaries on the GPU.

    ZeRO-3, deepspeed/runtime/zero/stage3.py, DeepSpeedZeroOptimizer_Stage3 (cpu and nvme):
    - _setup_for_real_optimizer: `grad_partitions_flat_buffer` and the fp32 partitions
      (_create_fp32_partitions) are made on self.device, the CPU with offload_optimizer
      (pinned with pin_memory); with nvme the fp32 partitions and states are swapped through
      pinned host buffers (swap_tensor/partitioned_optimizer_swapper.py): nothing resident on
      the GPU besides what ZeRO-3 keeps without offload (the IPG bucket, the 16-bit
      partition unless offload_param);
    - __partition_grads, per parameter of a reduced bucket: `grad_buffer.to(grad_partition.device)`,
      a GPU copy of its gradient partition in the 16-bit dtype, then
      _constant_buffered_norm2 takes `.double()` of it in chunks of NORM_CHUNK elements
      (8 bytes each), keeping the float64 norm in `norm_for_param_grads`, one 0-dim tensor
      (an allocator granule) per parameter until _post_step's reset_cpu_buffers. NB: the
      copy and the chunk are charged as the largest parameter's partition
      (ceil(numel / dp)), with every parameter's norm, for the whole backward (an upper
      bound); with nvme `grad_buffer.float()` (4 bytes) is made after the double is freed,
      so the bound holds;
    - step: complete_grad_norm_calculation_for_cpu_offload's `total_norm_cuda` (one
      granule) beside the norms; the CPU Adam updates the fp32 partition in host memory and
      _reassign_or_swap_out_partitioned_parameters copies it into the 16-bit partition
      (a host-to-device copy_ with a dtype change converts on the host: torch's
      copy_kernel_cuda), no GPU temporary.
    Not measured (DeepSpeed and a GPU are not available here).
    """
    if not _offloaded(setup):
        return 0, 0, 0
    if setup.zero == 3:
        part = div(largest, setup.dp)
        copy = round_up(part * setup.bytes["grad"], ALLOCATOR_GRANULE)
        double = round_up(min(part, NORM_CHUNK) * 8, ALLOCATOR_GRANULE)
        norms = tensors * ALLOCATOR_GRANULE
        return 0, copy + double + norms, norms + ALLOCATOR_GRANULE
    resident = round_up(largest * setup.bytes["grad"], ALLOCATOR_GRANULE)
    norm = round_up(largest * 8, ALLOCATOR_GRANULE)  # float64
    return resident, norm, 0


class OptimizerOffloadWalk(Walk):
    rank = 100

    @classmethod
    def applies(cls, setup: Setup, trainable: int) -> bool:
        return _offloaded(setup)

    def __init__(self, step: Step) -> None:
        super().__init__(step)
        nodes = step.nodes
        self.resident, self.backward, self.step_bytes = _offload_buffers(
            self.setup, _largest_trainable_tensor(nodes, self.setup), len(_trainable_tensors(nodes, self.setup))
        )

    def start(self) -> None:
        # DeepSpeed's offload staging buffer exists from the engine's construction on
        self.state.add_buffer(DEEPSPEED, self.resident)

    def through_backward(self) -> int:
        return self.backward

    def optimizer_step(self) -> Mapping[str, int]:
        # NB: DeepSpeedCPUAdam steps in host memory; ZeRO-3 keeps its per-parameter norms
        # on the GPU until the step ends
        return self.step.last_module(self.step_bytes)


WALKS = (OptimizerOffloadWalk,)
