"""FSDP2 under ``torch.distributed.pipelining``: what a device keeps unsharded between micro-batches.

The rule, from the trainers' code: torchtitan shards every block and the root with
``reshard_after_forward = not pp_enabled`` (torchtitan/parallelisms/parallelize_llama.py, apply_fsdp;
torchtitan/distributed/fsdp.py, get_fsdp_reshard_after_forward_policy: "For PP, by default do not
reshard after forward to avoid per-microbatch all-gathers"), and PyTorch's
``_PipelineStageBase.backward_maybe_with_nosync`` calls ``set_reshard_after_backward(False)`` and
``set_requires_gradient_sync(False)`` on every backward of a stage but its last (``last_backward``:
the stage's own backward count reaching the number of micro-batches, in Schedule1F1B, ScheduleGPipe
and, per stage, in the interleaved schedules). So from a stage's first forward to its last backward
its weights stay gathered (in the compute type, bf16: 2 bytes a parameter), and from its first
backward to its last its unsharded gradients accumulate (FSDP2 upcasts them to the reduce type,
fp32 in torchtitan's mixed precision: 4 bytes a parameter). Under the interleaved schedule every
chunk of the device is such a stage: while one chunk runs a later micro-batch, the device's other
chunks hold theirs too, 6 bytes for every parameter of the device.
"""

from __future__ import annotations

import pytest

from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.cost.runtime import CUBLAS_WORKSPACE_BYTES, FSDP, IN_PLACE, Runtime
from parplan.solver.cost.timeline import NUMBERS, StepOptions, StepUnit, kept_between_microbatches
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.strategy import ParallelConfig, Schedule


def _unit(is_block: bool, gathered: float, own_params: float, own_grads: float) -> StepUnit[float]:
    return StepUnit(is_block, FSDP, False, 0.0, gathered, own_grads, own_params, own_grads, own_grads,
                    lambda: (0.0,), lambda unsharded: ((0.0, 0.0),))


def test_kept_between_microbatches_is_every_gathered_weight_and_accumulated_gradient() -> None:
    # an embedding outside the blocks (5 bytes of weights, 3 of gradients) and two blocks
    units = [_unit(False, 5.0, 5.0, 3.0), _unit(True, 10.0, 10.0, 4.0), _unit(True, 20.0, 20.0, 6.0)]
    pipelined = StepOptions[float](accumulating=True, pipelined=True)
    assert kept_between_microbatches(NUMBERS, units, None, pipelined) == (5.0 + 10.0 + 20.0, 3.0 + 4.0 + 6.0)
    # accumulation without pipelining (the agent's FSDP2): gradients kept, weights resharded
    assert kept_between_microbatches(NUMBERS, units, None, StepOptions[float](accumulating=True)) == (0.0, 13.0)
    # gradients reduced every micro-batch: nothing kept
    assert kept_between_microbatches(NUMBERS, units, None, StepOptions[float](pipelined=True)) == (0.0, 0.0)
    # units that do not gather keep nothing
    plain = [StepUnit(True, IN_PLACE, False, 0.0, 10.0, 4.0, 10.0, 4.0, 4.0, lambda: (0.0,),
                      lambda unsharded: ((0.0, 0.0),))]
    assert kept_between_microbatches(NUMBERS, plain, None, pipelined) == (0.0, 0.0)


H, V, S, FFN = 256, 512, 128, 1024


def _device0_params() -> int:
    """Parameters of device 0 of a 4-block GPT cut into pp·v = 4 chunks of one block: chunk 0 (the
    token and position embeddings, block 0) and chunk 2 (block 2). A GPT block: QKV 3h² + 3h, the
    projection h² + h, the MLP 2·h·ffn + ffn + h, two LayerNorms 4h."""
    block = 3 * H * H + 3 * H + H * H + H + 2 * H * FFN + FFN + H + 4 * H
    return V * H + S * H + 2 * block


def test_interleaved_device_holds_every_chunks_gathered_weights_and_fp32_gradients() -> None:
    graph = build_graph(TransformerConfig("gpt", "gpt-test", 4, H, 8, FFN, V, S), batch=2)
    par = ParallelConfig(pp=2, dp=2, zero=3, num_microbatches=8, schedule=Schedule.INTERLEAVED, virtual_stages=2,
                         recompute=Recompute.FULL, runtime=Runtime.TORCHTITAN)
    st = plan_memory(graph, par).stages[0]
    kept = 6 * _device0_params()  # bf16 weights gathered + fp32 unsharded gradients, both chunks
    # held through the step besides: cuBLAS's two workspaces and the pipeline's receive buffers, one
    # per micro-batch (8) for each boundary tensor of the device (chunk 0's output, chunk 2's input
    # and output), each b·s·h in bf16
    fixed = 2 * CUBLAS_WORKSPACE_BYTES + 8 * 3 * (2 * S * H * 2)
    assert st.memory.bytes.temporary >= kept + fixed
    # and the running block's backward (recomputation, its gradients): a few MiB at micro-batch 2
    assert st.memory.bytes.temporary < kept + fixed + 8 * 2**20


@pytest.mark.parametrize("schedule", [Schedule.ONE_F_ONE_B, Schedule.GPIPE])
def test_single_stage_schedules_keep_the_same_six_bytes(schedule: Schedule) -> None:
    """1F1B and GPipe: one stage per device, the same rule (device 0 of a 2-stage pipeline: the
    embeddings and blocks 0 and 1)."""
    graph = build_graph(TransformerConfig("gpt", "gpt-test", 4, H, 8, FFN, V, S), batch=2)
    par = ParallelConfig(pp=2, dp=2, zero=3, num_microbatches=8, schedule=schedule, recompute=Recompute.FULL,
                         runtime=Runtime.TORCHTITAN)
    st = plan_memory(graph, par).stages[0]
    assert st.memory.bytes.temporary >= 6 * _device0_params()
