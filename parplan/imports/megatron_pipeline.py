"""Megatron-LM's split of the decoder layers over pipeline stages, as :mod:`parplan.imports.megatron` reads
its flags (``megatron/core/transformer/transformer_block.py``: ``get_num_layers_to_build``;
``megatron/training/arguments.py`` for the virtual pipeline size and the asserts).

- Even: ``--num-layers`` over ``--pipeline-model-parallel-size`` stages (parplan's even split).
- ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``: the first (last) stage
  builds that many layers, the other stages split the rest evenly.
- ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``: the embedding
  (the loss) counts as one layer of the split, so ``num_layers + 1`` (``+ 2`` with both) layers are split
  evenly and the first (last) stage builds one decoder layer fewer: the same uneven first and last stages.
- Interleaved (``--num-layers-per-virtual-pipeline-stage`` or ``--num-virtual-stages-per-pipeline-rank``):
  each stage's count is cut into ``v`` equal chunks; the embedding's (loss's) layer comes off the first
  chunk of the first stage (the last chunk of the last stage), the virtual stages ``is_pipeline_first_stage``
  and ``is_pipeline_last_stage`` name with ``ignore_virtual=False``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineSplit:
    """Chunks per stage and the decoder layers each pipeline stage (each virtual stage, in virtual-stage
    order ``i + k * pp``, when ``virtual > 1``) builds; ``partition`` None for the even split."""

    virtual: int
    partition: tuple[int, ...] | None


def pipeline_split(layers: int, pp: int, first: int | None, last: int | None, embedding: bool, loss: bool,
                   per_virtual: int | None, virtual: int | None, problems: list[str]) -> PipelineSplit:
    """The split Megatron-LM builds (module docstring); ``problems`` gets what Megatron-LM asserts against
    and what parplan does not model (a stage without a decoder layer)."""
    counted = layers + embedding + loss  # the embedding and the loss as layers of the split
    if (first is not None or last is not None) and (embedding or loss):
        problems.append("--decoder-first/last-pipeline-num-layers with --account-for-embedding/loss-in-pipeline-"
                        "split (Megatron-LM asserts they are not given together)")
    if per_virtual is not None and virtual is not None:
        problems.append("--num-layers-per-virtual-pipeline-stage with --num-virtual-stages-per-pipeline-rank "
                        "(Megatron-LM asserts at most one is given)")
    v = virtual or 1
    if per_virtual is not None:
        if per_virtual < 1 or counted % (pp * per_virtual):
            problems.append(f"{counted} layers are not {pp} stages x chunks of {per_virtual}")
            return PipelineSplit(1, None)
        v = counted // (pp * per_virtual)
    stages = _stage_layers(counted, pp, first, last, embedding or loss, problems)
    if stages is None or problems:
        return PipelineSplit(v, None)
    if any(n % v for n in stages):
        problems.append(f"the stages' layers {list(stages)} do not split into {v} virtual stages each")
        return PipelineSplit(v, None)
    parts = [stages[i] // v for _ in range(v) for i in range(pp)]
    parts[0] -= embedding
    parts[-1] -= loss
    if min(parts) < 1:
        problems.append(f"the split gives the {'virtual ' if v > 1 else ''}pipeline stages {parts} decoder layers: "
                        "a stage without one is not modelled")
    return PipelineSplit(v, tuple(parts))


def _stage_layers(counted: int, pp: int, first: int | None, last: int | None, accounted: bool,
                  problems: list[str]) -> tuple[int, ...] | None:
    """Layers per pipeline stage (the embedding's and the loss's counted where ``accounted``); None for
    parplan's even split."""
    if first is None and last is None and not accounted:
        return None
    if pp < 2:
        if not accounted:
            problems.append("first/last stage layer counts need pipeline stages")
        return None
    if accounted:
        if counted % pp:
            problems.append(f"{counted} layers, the embedding and loss counted, do not split evenly over {pp} "
                            "stages (Megatron-LM asserts they do)")
            return None
        return (counted // pp,) * pp
    middle_stages = pp - (first is not None) - (last is not None)
    rest = counted - (first or 0) - (last or 0)
    if middle_stages < 0 or rest < 0 or (middle_stages and rest % middle_stages) or (not middle_stages and rest):
        problems.append(f"{counted} layers do not split as first {first}, last {last} and {middle_stages} even stages")
        return None
    even = rest // middle_stages if middle_stages else 0
    return (first if first is not None else even, *[even] * (pp - 2), last if last is not None else even)


__all__ = ["PipelineSplit", "pipeline_split"]
