"""The memory cost model against the closed forms DESIGN.md names.

Each test's name says which formula it checks. The oracles are the formulas themselves, written
out here, never the model's own code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.pipeline import in_flight_microbatches
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.cost.runtime import Runtime
from parplan.solver.errors import StrategyError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.presets import get_preset
from parplan.solver.strategy import ParallelConfig, Schedule

REFERENCE = json.loads((Path(__file__).parent.parent / "data" / "megatron_memory_cases.json").read_text())


def _gpt(layers: int, hidden: int, heads: int, seq: int = 128, vocab: int = 512) -> TransformerConfig:
    return TransformerConfig("gpt", "gpt-test", layers, hidden, heads, 4 * hidden, vocab, seq)


# ---------------------------------------------------------------- ZeRO model-state table

def _states_per_device(zero: int, dp: int, precision: str) -> tuple[float, int]:
    graph = build_graph(get_preset("gpt-1.7b"), batch=1, seq_len=256)
    cfg = ParallelConfig(tp=1, pp=1, dp=dp, zero=zero, precision=precision)
    st0 = plan_memory(graph, cfg).stages[0]
    return st0.memory.bytes.model_states, graph.parameter_count()


@pytest.mark.parametrize("dp", [1, 2, 8, 64])
@pytest.mark.parametrize(("zero", "bytes_per_param"), [
    (0, lambda n: 16),                  # no sharding: 2 weight + 2 grad + 12 fp32 master/m/v
    (1, lambda n: 4 + 12 / n),          # ZeRO-1: 4Ψ + 12Ψ/N_d
    (2, lambda n: 2 + 14 / n),          # ZeRO-2: 2Ψ + 14Ψ/N_d
    (3, lambda n: 16 / n),              # ZeRO-3: 16Ψ/N_d
])
def test_zero_paper_table_16_bit_gradients(zero: int, bytes_per_param: Any, dp: int) -> None:
    held, psi = _states_per_device(zero, dp, "bf16-grad16")
    assert held == pytest.approx(bytes_per_param(dp) * psi, rel=1e-12)


@pytest.mark.parametrize("dp", [1, 4, 16])
@pytest.mark.parametrize(("zero", "bytes_per_param"), [
    (0, lambda n: 18),                  # Megatron-LM: fp32 gradient accumulation
    (1, lambda n: 6 + 12 / n),          # Megatron-LM distributed optimizer
])
def test_megatron_fp32_grad_accumulation_18_and_6_plus_12_over_dp(zero: int, bytes_per_param: Any, dp: int) -> None:
    held, psi = _states_per_device(zero, dp, "bf16")
    assert held == pytest.approx(bytes_per_param(dp) * psi, rel=1e-12)


def test_zero_redundancy_is_what_other_replicas_also_hold() -> None:
    graph = build_graph(get_preset("gpt-1.7b"), batch=1, seq_len=256)
    psi = graph.parameter_count()
    plain = plan_memory(graph, ParallelConfig(dp=8)).stages[0].memory
    assert plain.redundant.parameters == pytest.approx(2 * psi * (1 - 1 / 8))
    assert plain.redundant.optimizer_states == pytest.approx(12 * psi * (1 - 1 / 8))
    z3 = plan_memory(graph, ParallelConfig(dp=8, zero=3)).stages[0].memory
    assert z3.redundant.model_states == pytest.approx(0.0, abs=1e-6)


# ---------------------------------------------------------------- Korthikanti et al. activations

def _per_layer_activation_bytes(cfg: TransformerConfig, b: int, par: ParallelConfig) -> float:
    """Activation bytes of one transformer layer: the difference between L+1 and L layers."""
    small = plan_memory(build_graph(cfg, batch=b), par).stages[0].activation_bytes_per_microbatch
    large = plan_memory(build_graph(cfg.with_(layers=cfg.layers + 1), batch=b), par)
    return large.stages[0].activation_bytes_per_microbatch - small


_shapes = st.tuples(
    st.sampled_from([64, 128, 256]),       # s
    st.integers(1, 4),                      # b
    st.sampled_from([4, 8, 16]),            # a
    st.sampled_from([16, 32]),              # head dim
    st.sampled_from([1, 2, 4]),             # t
)


@settings(max_examples=25, deadline=None)
@given(_shapes)
def test_korthikanti_no_parallelism_sbh_34_plus_5as_over_h(shape: tuple[int, int, int, int, int]) -> None:
    s, b, a, d, _ = shape
    h = a * d
    par = ParallelConfig(recompute=Recompute.NONE, flash_attention=False)
    expected = s * b * h * (34 + 5 * a * s / h)
    assert _per_layer_activation_bytes(_gpt(2, h, a, seq=s), b, par) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(_shapes)
def test_korthikanti_tensor_parallel_sbh_10_plus_24_over_t_plus_5as_over_ht(shape: tuple[int, ...]) -> None:
    s, b, a, d, t = shape
    h = a * d
    par = ParallelConfig(tp=t, recompute=Recompute.NONE, flash_attention=False)
    expected = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert _per_layer_activation_bytes(_gpt(2, h, a, seq=s), b, par) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(_shapes)
def test_korthikanti_tensor_and_sequence_parallel_sbh_over_t_34_plus_5as_over_h(shape: tuple[int, ...]) -> None:
    s, b, a, d, t = shape
    h = a * d
    t = max(t, 2)
    par = ParallelConfig(tp=t, sequence_parallel=True, recompute=Recompute.NONE, flash_attention=False)
    expected = s * b * h / t * (34 + 5 * a * s / h)
    assert _per_layer_activation_bytes(_gpt(2, h, a, seq=s), b, par) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("recompute", "flash"), [(Recompute.SELECTIVE, False), (Recompute.NONE, True),
                                                   (Recompute.SELECTIVE, True)])
@pytest.mark.parametrize(("t", "sp"), [(1, False), (4, False), (4, True)])
def test_korthikanti_selective_recompute_or_flash_drops_the_5as_over_h_term(recompute: Recompute, flash: bool,
                                                                           t: int, sp: bool) -> None:
    s, b, a, h = 256, 2, 16, 512
    par = ParallelConfig(tp=t, sequence_parallel=sp, recompute=recompute, flash_attention=flash)
    expected = s * b * h * (34 / t if sp else 10 + 24 / t)
    assert _per_layer_activation_bytes(_gpt(2, h, a, seq=s), b, par) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("t", "sp"), [(1, False), (4, False), (4, True)])
def test_korthikanti_full_recompute_keeps_only_the_layer_input_2sbh(t: int, sp: bool) -> None:
    s, b, a, h = 256, 2, 16, 512
    par = ParallelConfig(tp=t, sequence_parallel=sp, recompute=Recompute.FULL, flash_attention=False)
    expected = 2 * s * b * h / (t if sp else 1)
    assert _per_layer_activation_bytes(_gpt(2, h, a, seq=s), b, par) == pytest.approx(expected, rel=1e-12)


def test_full_recompute_needs_one_layer_of_temporary_activations() -> None:
    s, b, a, h = 256, 2, 16, 512
    graph = build_graph(_gpt(4, h, a, seq=s), batch=b)
    full = plan_memory(graph, ParallelConfig(recompute=Recompute.FULL)).stages[0].memory.bytes
    assert full.temporary >= s * b * h * 34  # one whole layer (selective) is rebuilt in backward


# ---------------------------------------------------------------- pipeline in-flight rule

@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 8, 32])
def test_pipeline_1f1b_stage_i_holds_min_p_minus_i_m(p: int, m: int) -> None:
    for i in range(p):
        assert in_flight_microbatches(i, p, m, Schedule.ONE_F_ONE_B) == min(p - i, m)
        assert in_flight_microbatches(i, p, m, Schedule.GPIPE) == m


@pytest.mark.parametrize(("p", "v"), [(2, 2), (4, 2), (4, 4), (8, 3)])
def test_pipeline_interleaved_first_stage_is_p_times_1_plus_p_minus_1_over_pv(p: int, v: int) -> None:
    m = 64 * p
    assert in_flight_microbatches(0, p, m, Schedule.INTERLEAVED, v) == pytest.approx(p * (1 + (p - 1) / (p * v)))
    # later stages hold fewer, the last still holds at least one micro-batch
    counts = [in_flight_microbatches(i, p, m, Schedule.INTERLEAVED, v) for i in range(p)]
    assert counts == sorted(counts, reverse=True) and counts[-1] >= 1


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (2, 2, 8), (4, 2, 8), (4, 3, 16), (8, 2, 16)])
def test_interleaved_order_keeps_narayanans_count_of_chunk_forwards_in_flight(p: int, v: int, m: int) -> None:
    """Device i runs 2(p − i − 1) + (v − 1)p warm-up chunk-forwards and one more before its first
    backward (Narayanan et al. 2021), never more later; each chunk runs m forwards and m backwards."""
    from parplan.solver.cost.pipeline import interleaved_rank_order

    for i in range(p):
        order = interleaved_rank_order(p, v, m, i)
        live, most = 0, 0
        for kind, _ in order:
            live += 1 if kind == "F" else -1
            most = max(most, live)
        assert most == min(2 * (p - i - 1) + (v - 1) * p + 1, m * v)
        for k in range(v):
            assert order.count(("F", k)) == m and order.count(("B", k)) == m


def test_interleaved_device_holds_its_chunks_as_the_order_runs_them() -> None:
    """PyTorch's interleaved 1F1B on 2 devices, 2 chunks, 4 micro-batches: device 0 runs all four
    micro-batches of its first chunk (the embedding and block 0) before it finishes one of the
    second's, so its activations peak at 4 of chunk 0 and 1 of chunk 2, more than the average
    chunk's 2.5 micro-batches would say when chunk 0 is the heavier one."""
    graph = build_graph(_gpt(4, 256, 8, seq=128), batch=2)
    par = ParallelConfig(pp=2, num_microbatches=4, schedule=Schedule.INTERLEAVED, virtual_stages=2,
                         recompute=Recompute.FULL)
    st = plan_memory(graph, par).stages[0]
    chunk0 = plan_memory(build_graph(_gpt(4, 256, 8, seq=128), batch=2),
                         ParallelConfig(pp=4, num_microbatches=4, recompute=Recompute.FULL)).stages[0]
    # chunk 0 is what a 4-stage pipeline's first stage holds per micro-batch
    assert st.memory.bytes.activations >= 4 * chunk0.activation_bytes_per_microbatch


def test_pipeline_stage_activations_are_per_microbatch_times_in_flight() -> None:
    graph = build_graph(_gpt(8, 256, 8, seq=128), batch=2)
    for schedule, m in ((Schedule.ONE_F_ONE_B, 16), (Schedule.ONE_F_ONE_B, 2), (Schedule.GPIPE, 6)):
        pm = plan_memory(graph, ParallelConfig(pp=4, num_microbatches=m, schedule=schedule))
        for stg in pm.stages:
            expected_flight = m if schedule is Schedule.GPIPE else min(4 - stg.stage, m)
            assert stg.in_flight_microbatches == expected_flight
            assert stg.memory.bytes.activations == pytest.approx(stg.activation_bytes_per_microbatch * expected_flight)


def test_interleaved_needs_microbatches_multiple_of_pp() -> None:
    with pytest.raises(StrategyError, match="multiple of pp"):
        ParallelConfig(pp=4, num_microbatches=6, schedule=Schedule.INTERLEAVED, virtual_stages=2)


# ---------------------------------------------------------------- Megatron-LM's own estimator

@pytest.mark.parametrize("case", REFERENCE["cases"], ids=lambda c: f"{c['model']}-tp{c['tp']}pp{c['pp']}dp{c['dp']}")
def test_megatron_reference_first_stage(case: dict[str, Any]) -> None:
    """Weights + optimizer within 3% and GPT activations within 10% of Megatron-LM's estimator,
    on the first pipeline stage (the one the estimator describes)."""
    graph = build_graph(get_preset(case["model"]), batch=case["micro_batch"], seq_len=case["seq_len"])
    par = ParallelConfig(tp=case["tp"], pp=case["pp"], dp=case["dp"], zero=int(case["distributed_optimizer_zero1"]),
                         sequence_parallel=case["sequence_parallel"], recompute=Recompute(case["recompute"]),
                         micro_batch=case["micro_batch"], num_microbatches=case["num_microbatches"])
    first = plan_memory(graph, par).stages[0].memory.bytes
    tol = REFERENCE["suggested_tolerance"]
    assert first.model_states == pytest.approx(case["megatron_weight_and_optimizer_bytes"],
                                               rel=tol["weight_and_optimizer"])
    if not case["swiglu"]:
        assert first.activations == pytest.approx(case["megatron_activation_bytes"], rel=tol["activations_gpt"])
        if case["sequence_parallel"]:
            # With sequence parallelism our graph reproduces the estimator's terms, but for the ids the
            # embeddings save: whole on every TP rank (8 bytes per token of each micro-batch in
            # flight), where the estimator divides the token ids by t and leaves the positions out
            in_flight = min(case["pp"], case["num_microbatches"])
            ids = 8 * case["seq_len"] * case["micro_batch"] * in_flight * (2 - 1 / case["tp"])
            assert first.activations == pytest.approx(case["megatron_activation_bytes"] + ids, rel=1e-6)


def test_tp_must_divide_heads() -> None:
    graph = build_graph(_gpt(2, 192, 12), batch=1)
    with pytest.raises(StrategyError, match="heads"):
        plan_memory(graph, ParallelConfig(tp=8))


# ---------------------------------------------------------------- PyTorch-native runtime (cost.runtime)

@settings(max_examples=15, deadline=None)
@given(_shapes)
def test_torch_sequence_parallel_saves_the_gathered_linear_inputs_plus_4sbh_times_1_minus_1_over_t(
        shape: tuple[int, ...]) -> None:
    """Korthikanti's TP+SP layer, except that the QKV and MLP inputs (2sbh each) are kept
    all-gathered instead of sharded: + 2 x 2sbh(1 - 1/t)."""
    s, b, a, d, t = shape
    h = a * d
    t = max(t, 2)
    par = ParallelConfig(tp=t, sequence_parallel=True, recompute=Recompute.NONE, flash_attention=False,
                         runtime=Runtime.TORCH)
    expected = s * b * h / t * (34 + 5 * a * s / h) + 4 * s * b * h * (1 - 1 / t)
    assert _per_layer_activation_bytes(_gpt(2, h, a, seq=s), b, par) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [1, 2])
def test_cpu_rmsnorm_keeps_fp32_input_and_normalised_input_12sbh_per_layer(t: int) -> None:
    """Two RMSNorms per Llama layer. The CUDA kernel keeps the bf16 input (2sbh); the CPU composite
    computes in fp32 and keeps an fp32 copy of the input and the fp32 normalised input (8sbh,
    measured on torchtitan's debug model: ``_to_copy`` and ``mul``, docs/notes/torchtitan-run.md): 6sbh more a norm."""
    cfg = get_preset("llama-2-7b").with_(layers=2, hidden=256, heads=8, kv_heads=None, ffn=688, vocab=512,
                                         seq_len=128)
    s, b, h = 128, 2, 256
    cuda = _per_layer_activation_bytes(cfg, b, ParallelConfig(tp=t, runtime=Runtime.TORCH))
    cpu = _per_layer_activation_bytes(cfg, b, ParallelConfig(tp=t, runtime=Runtime.TORCH_CPU))
    assert cpu - cuda == pytest.approx(2 * (4 + 4 - 2) * s * b * h, rel=1e-12)


def test_torch_replicate_keeps_a_copy_of_every_parameter_until_its_backward() -> None:
    """TP x plain DP in PyTorch (``replicate``, FSDP2 over a shard group of one), bounded by closed
    forms of two moments of the backward walk:

    - when backward starts: every saved activation and an unsharded copy of every parameter;
    - when the last block's backward ends: the other copies, and the last block's gradient three
      times (the gradient, the reduce-scatter input, and its output, which over a group of one is
      whole again and is all-reduced), besides activations not counted here.

    A GPT block under TP 2 has 6h² + 9.5h local elements (halved weights and QKV / MLP-in biases;
    the other biases and LayerNorms whole). Megatron-LM's DP, PyTorch without TP (DDP) and ZeRO
    keep no copy."""
    h, layers = 512, 2
    graph = build_graph(_gpt(layers, h, 8, seq=32), batch=1)  # few activations: the gradients peak
    st = plan_memory(graph, ParallelConfig(tp=2, dp=2, runtime=Runtime.TORCH)).stages[0]
    m = st.memory.bytes
    block = 6 * h * h + 9.5 * h  # bf16 copies (2 bytes), fp32 gradients (4 bytes)
    starts = m.model_states + st.activation_bytes_per_microbatch + m.parameters
    last_block_ends = m.model_states + m.parameters - 2 * block + 3 * 4 * block
    assert st.peak_bytes >= max(starts, last_block_ends) * (1 - 1e-9)
    assert st.peak_bytes <= m.total * (1 + 1e-9)
    for cfg in (ParallelConfig(tp=2, dp=2), ParallelConfig(tp=2, dp=2, zero=1, runtime=Runtime.TORCH)):
        other = plan_memory(graph, cfg).stages[0]
        # no copies: beyond the libraries' workspaces, which differ by runtime
        libs = other.memory.bytes.temporary - cfg.runtime.library_workspace_bytes
        assert libs < m.temporary - Runtime.TORCH.library_workspace_bytes


def test_torch_ddp_holds_the_gradients_twice_when_it_rebuilds_its_buckets() -> None:
    """DDP rebuilds its gradient buckets once, in the second step's forward: the new buckets are
    allocated while the old ones (the gradients) live. With full recomputation and a short sequence
    that moment, resident states plus a second copy of the gradients (and cuBLAS's workspaces, held
    throughout), is the peak; Megatron-LM keeps one gradient buffer."""
    graph = build_graph(_gpt(2, 512, 8, seq=32), batch=1)
    torch_ = plan_memory(graph, ParallelConfig(dp=2, recompute=Recompute.FULL, runtime=Runtime.TORCH)).stages[0]
    m = torch_.memory.bytes
    lib = Runtime.TORCH.library_workspace_bytes
    assert torch_.peak_bytes == pytest.approx(m.model_states + m.gradients + lib, rel=1e-12)
    megatron = plan_memory(graph, ParallelConfig(dp=2, recompute=Recompute.FULL)).stages[0]
    assert megatron.peak_bytes - Runtime.MEGATRON.library_workspace_bytes < m.model_states + m.gradients


def test_torch_vocab_parallel_embedding_backward_makes_the_whole_table_gradient() -> None:
    """The embedding's gradient workspace: V x h gradients and then a copy of its own V/t x h rows
    under PyTorch, V/t x h under Megatron-LM."""
    from parplan.solver.cost.precision import get_precision
    from parplan.solver.cost.unit_strategy import UnitStrategy
    from parplan.solver.cost.units import GraphCosts

    cfg = _gpt(2, 256, 8, seq=64, vocab=1024)
    gc = GraphCosts(build_graph(cfg, batch=2))
    prec = get_precision("bf16")
    per_runtime = {r: gc.unit_cost("embed", UnitStrategy(tp=2, runtime=r), prec).grad_workspace_bytes
                   for r in (Runtime.MEGATRON, Runtime.TORCH)}
    assert per_runtime[Runtime.TORCH] == 1024 * 256 * prec.grad_bytes * (1 + 1 / 2)  # + its own rows, copied out
    assert per_runtime[Runtime.MEGATRON] == 1024 * 256 * prec.grad_bytes / 2


@pytest.mark.parametrize(("pp", "t", "m"), [(2, 1, 4), (4, 1, 8), (2, 2, 4)])
def test_torch_pipelining_buffers_sbh_per_boundary_and_micro_batch(pp: int, t: int, m: int) -> None:
    """torch.distributed.pipelining, per stage, against Megatron-LM's accounting (s·b·h bf16 per
    boundary tensor, replicated over TP without sequence parallelism):

    - it holds the output a stage sent until that micro-batch's backward (+sbh activations per
      micro-batch, every stage but the last); Megatron-LM frees it once sent;
    - it allocates a receive buffer for every micro-batch's input (every stage but the first) and
      output gradient (every stage but the last) for the whole step (temporary), and the input a
      stage saves for backward is that buffer (-sbh activations per micro-batch).
    Without sequence parallelism the runtimes differ in nothing else here but the libraries' workspaces
    held for the whole step (temporary): cuBLAS's in both, Transformer Engine's besides under Megatron-LM."""
    s, b, h = 128, 2, 256
    graph = build_graph(_gpt(2 * pp, h, 8, seq=s), batch=b)

    def stages(runtime: Runtime) -> list[tuple[float, float]]:
        cfg = ParallelConfig(tp=t, pp=pp, num_microbatches=m, runtime=runtime)
        return [(st.activation_bytes_per_microbatch, st.memory.bytes.temporary)
                for st in plan_memory(graph, cfg).stages]

    sbh = 2 * s * b * h
    for i, (torch_, megatron) in enumerate(zip(stages(Runtime.TORCH), stages(Runtime.MEGATRON), strict=True)):
        sends, receives = i < pp - 1, i > 0
        assert torch_[0] - megatron[0] == pytest.approx(sbh * (sends - receives), abs=1e-6)
        libs = Runtime.TORCH.library_workspace_bytes - Runtime.MEGATRON.library_workspace_bytes
        assert torch_[1] - megatron[1] == pytest.approx(m * sbh * (sends + receives) + libs, rel=1e-12)


@pytest.mark.parametrize("schedule", [Schedule.ONE_F_ONE_B, Schedule.GPIPE])
def test_torch_1f1b_keeps_one_more_sent_output_through_the_steady_phase(schedule: Schedule) -> None:
    """PyTorch's 1F1B keeps its first warm-up send's handle, and with it that micro-batch's sent
    output (s·b·h), until the steady phase ends: one output beyond the in-flight micro-batches on
    every stage but the last. GPipe holds every micro-batch anyway: nothing more."""
    s, b, h, pp = 128, 2, 256, 4
    graph = build_graph(_gpt(2 * pp, h, 8, seq=s), batch=b)
    cfg = ParallelConfig(pp=pp, num_microbatches=8, schedule=schedule, runtime=Runtime.TORCH)
    extra = [st.memory.bytes.activations - st.activation_bytes_per_microbatch * st.in_flight_microbatches
             for st in plan_memory(graph, cfg).stages]
    sbh = 2 * s * b * h
    expected = [sbh] * (pp - 1) + [0.0] if schedule is Schedule.ONE_F_ONE_B else [0.0] * pp
    assert extra == pytest.approx(expected, abs=1e-6)


def test_tied_embedding_gradients_coexist_only_on_a_stage_that_holds_both_uses() -> None:
    """One stage with the embedding and the LM head: the head's gradient of the tied table (V·h)
    is made during the head's backward, as an untied head's would be, and then waits through the
    rest of backward; at the embedding's backward its own gradient and their sum join it (3·V·h
    at once). Pipelined, each stage uses the table once; the two copies are summed across stages
    instead. fp32: 4 bytes."""
    h, v = 256, 4096
    tied = _gpt(4, h, 8, seq=512, vocab=v)
    untied = tied.with_(tied_embeddings=False)

    def temps(cfg: TransformerConfig, pp: int, b: int, s: int) -> list[float]:
        par = ParallelConfig(pp=pp, num_microbatches=4, precision="fp32")
        libs = par.runtime.library_workspace_bytes  # held through the step, beside the buffers compared here
        return [st.memory.bytes.temporary - libs
                for st in plan_memory(build_graph(cfg, batch=b, seq_len=s), par).stages]

    # the logits' gradient (b·s·V) is the largest buffer, while the head's weight gradient is made
    assert temps(tied, 1, 8, 512)[0] == pytest.approx(temps(untied, 1, 8, 512)[0], rel=1e-12)
    # a short sequence: the embedding's moment, 3·V·h, is the stage's temporary peak
    assert temps(tied, 1, 1, 16)[0] == pytest.approx(3 * v * h * 4, rel=1e-12)
    assert temps(tied, 2, 8, 512) == pytest.approx(temps(untied, 2, 8, 512), rel=1e-12)


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 2), (8, 8), (16, 4)])
def test_torch_gqa_keeps_k_and_v_repeated_to_every_query_head(heads: int, kv_heads: int) -> None:
    """PyTorch-native GQA (torchtitan, Hugging Face) repeats K and V to all ``a`` query heads before
    SDPA, which keeps the copies: + 2·s·b·(a - kv)·d bf16 per layer over Megatron-LM, whose kernel
    reads the ``kv`` heads; none under selective recomputation (the core re-repeats them). Either way
    PyTorch's ``silu(gate) * up`` keeps the SiLU output (2·s·b·f), which Megatron-LM's fused SwiGLU
    computes again in backward."""
    s, b, d, f = 128, 2, 32, 256
    cfg = get_preset("llama-2-7b").with_(layers=2, hidden=heads * d, heads=heads, kv_heads=kv_heads, ffn=f,
                                         vocab=512, seq_len=s)
    for rec, expected in ((Recompute.NONE, 2 * s * b * (heads - kv_heads) * d * 2), (Recompute.SELECTIVE, 0)):
        torch_ = _per_layer_activation_bytes(cfg, b, ParallelConfig(recompute=rec, runtime=Runtime.TORCH))
        megatron = _per_layer_activation_bytes(cfg, b, ParallelConfig(recompute=rec))
        assert torch_ - megatron == pytest.approx(expected + 2 * s * b * f, rel=1e-12)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_torch_cross_entropy_backward_holds_more_logits_sized_buffers(t: int) -> None:
    """The loss's backward, on top of the saved fp32 probabilities: Megatron-LM's fused loss makes
    the logits' gradient (s·b·V/t, activation bytes); PyTorch's log_softmax + nll_loss on the logits
    cast to fp32 makes it in fp32 and also the log-probabilities' gradient (fp32), and DTensor's loss
    parallelism (t > 1) one more fp32 buffer."""
    from parplan.solver.cost.backward import UnitSizes, op_transient_bytes
    from parplan.solver.cost.precision import get_precision
    from parplan.solver.cost.unit_strategy import UnitStrategy
    from parplan.solver.cost.units import GraphCosts
    from parplan.solver.ir import OpKind

    s, b, vocab = 64, 2, 1024
    gc = GraphCosts(build_graph(_gpt(2, 256, 8, seq=s, vocab=vocab), batch=b))
    prec = get_precision("bf16")
    loss = next(n for n in gc.graph.nodes if n.kind is OpKind.CROSS_ENTROPY)
    logits = s * b * vocab / t
    extra = {Runtime.MEGATRON: (prec.activation_bytes, 0), Runtime.TORCH: (4, 4 * (2 if t > 1 else 1))}
    for runtime, (gradient, more) in extra.items():
        us = UnitStrategy(tp=t, runtime=runtime)
        got = op_transient_bytes(loss, gc.graph, UnitSizes(gc.graph, us, prec.activation_bytes),
                                 prec.activation_bytes, prec.grad_bytes, runtime)
        per_token_losses = s * b * 4  # their gradient (fp32), the operator's output
        assert got == pytest.approx(logits * (gradient + more) + per_token_losses, rel=1e-12)
        unit = next(u for u, ns in gc.nodes.items() if loss in ns)
        assert gc.unit_cost(unit, us, prec).logits_grad_bytes == pytest.approx(logits * (gradient + more), rel=1e-12)
