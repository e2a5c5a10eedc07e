"""Megatron-LM's mixture-of-experts flags (``--num-experts`` and the ``--moe-*`` family), as
:mod:`parplan.imports.megatron` reads them: the experts' model fields, what is refused and why, and
what the prediction does not price.

The experts (``megatron/core/transformer/moe``): ``--num-experts`` routed experts, each an MLP of
``--moe-ffn-hidden-size`` (``--ffn-hidden-size`` when not given), SwiGLU with ``--swiglu`` (parplan's
Mixtral) or GELU (parplan's GPT with experts); ``--moe-router-topk`` of them per token;
``--moe-shared-expert-intermediate-size`` wide shared experts every token goes through;
``--moe-layer-freq`` which layers have experts (``TransformerConfig.moe_layer_freq``: an int N, every
N-th layer; or a list of 0 and 1 per layer), the others a dense MLP of ``--ffn-hidden-size``.
"""

from __future__ import annotations

import re
from typing import Any

from parplan.solver.strategy import expert_data_span

#: MoE flags with a value that change the model or the layout
VALUED = {"--moe-ffn-hidden-size", "--moe-layer-freq", "--moe-shared-expert-intermediate-size",
          "--moe-expert-capacity-factor", "--mtp-num-layers"}
#: MoE switches that change the model or the layout
SWITCHES = {"--moe-pad-expert-input-to-capacity"}
#: switches that change what a rank holds in ways parplan does not model, with what they do
REFUSED = (
    ("--multi-latent-attention", "multi-head latent attention, as Megatron-LM runs it"),
    ("--overlap-moe-expert-parallel-comm", "the expert-parallel all-to-alls overlapped by running one "
     "micro-batch's forward with another's backward"),
    ("--delay-wgrad-compute", "the experts' weight gradients delayed past their backward"),
    ("--moe-layer-recompute", "recomputation of the MoE layers"),
    ("--moe-use-legacy-grouped-gemm", "the legacy grouped GEMM's buffers"),
)
#: flags of the router's arithmetic on a tokens x experts tensor (a few such tensors beside the
#: layer's tokens x hidden ones); ``--moe-router-dtype`` computes the router's logits in fp32
#: (``RouterGatingLinearFunction`` keeps its bf16 input), ``--moe-permute-fusion`` and
#: ``--moe-router-fusion`` fuse the permutation and the routing, ``--moe-shared-expert-overlap`` runs
#: the shared experts on the dispatcher's stream, ``--moe-token-drop-policy`` picks what a capacity drops
IGNORED_VALUED = {"--moe-router-dtype", "--moe-router-score-function", "--moe-router-topk-scaling-factor",
                  "--moe-router-bias-update-rate", "--moe-router-num-groups", "--moe-router-group-topk",
                  "--moe-z-loss-coeff", "--moe-input-jitter-eps", "--moe-token-drop-policy"}
IGNORED_SWITCHES = {"--moe-router-pre-softmax", "--moe-router-enable-expert-bias", "--moe-permute-fusion",
                    "--moe-router-fusion", "--moe-shared-expert-overlap"}
#: the token dispatchers parplan prices (their activations as the all-to-all's: see ``notes``)
DISPATCHERS = ("alltoall", "allgather")


def layer_pattern(text: str, layers: int) -> list[int] | None:
    """Which of ``layers`` layers have experts under ``--moe-layer-freq text``: an int N, every N-th
    layer from the first (``layer % N == 0``); or a list of 0 and 1, written as Megatron-LM's CI does
    (``([0]*3+[1]*5)``, ``[0,1,1]``); None where the text is neither or the list is not ``layers`` long
    (Megatron-LM asserts it: ``moe_layer_freq``'s length must equal the number of layers)."""
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        n = int(text)
        return [int(i % n == 0) for i in range(layers)] if n > 0 else None
    body = text[1:-1] if text.startswith("(") and text.endswith(")") else text
    out: list[int] = []
    for term in body.split("+"):
        m = re.fullmatch(r"\s*\[([01\s,]*)\]\s*(?:\*\s*(\d+))?\s*", term)
        if m is None:
            return None
        items = [int(x) for x in m.group(1).replace(",", " ").split()]
        out += items * int(m.group(2) or 1)
    return out if len(out) == layers else None


def _value(flags: dict[str, str | bool], name: str, problems: list[str]) -> int | None:
    v = flags.get(name)
    if v is None:
        return None
    if v is True or not str(v).isdigit() or int(str(v)) < 1:
        problems.append(f"{name} needs a positive integer, got {v!r}")
        return None
    return int(str(v))


def expert_fields(flags: dict[str, str | bool], layers: int, ffn: int, problems: list[str],
                  adjusted: list[str]) -> dict[str, Any]:
    """The :class:`~parplan.solver.frontends.config.TransformerConfig` fields of the experts the flags
    describe (empty without ``--num-experts``); ``problems`` gets what parplan does not build."""
    experts = _value(flags, "--num-experts", problems) or 0
    if not experts:
        return {}
    top_k = _value(flags, "--moe-router-topk", problems) or 2
    if "--moe-router-topk" not in flags:
        adjusted.append("no --moe-router-topk: Megatron-LM's default, 2")
    width = _value(flags, "--moe-ffn-hidden-size", problems) or ffn
    out: dict[str, Any] = {"num_experts": experts, "top_k": top_k, "ffn": width,
                           "moe_bias": "--disable-bias-linear" not in flags}
    pattern = layer_pattern(str(flags.get("--moe-layer-freq", "1")), layers)
    dense = pattern.index(1) if pattern and 1 in pattern else len(pattern or [])
    if pattern is None or not all(pattern[dense:]) or dense == len(pattern):
        problems.append(f"--moe-layer-freq {flags.get('--moe-layer-freq')}: parplan builds experts in every "
                        "layer after the first dense ones (Megatron-LM's 1, or a list of 0s then 1s)")
    elif dense:
        out |= {"dense_layers": dense, "dense_ffn": ffn}
    shared = _value(flags, "--moe-shared-expert-intermediate-size", problems)
    if shared is not None:
        if shared % width:
            problems.append(f"--moe-shared-expert-intermediate-size {shared}: parplan builds shared experts a "
                            f"multiple of the experts' width ({width}) wide")
        else:
            out["shared_experts"] = shared // width
    factor = flags.get("--moe-expert-capacity-factor")
    if factor is not None:
        out["capacity_factor"] = _capacity_factor(flags, str(factor), problems, adjusted)
    return out


def _capacity_factor(flags: dict[str, str | bool], text: str, problems: list[str], adjusted: list[str]) -> float:
    """parplan's capacity factor for ``--moe-expert-capacity-factor``: with
    ``--moe-pad-expert-input-to-capacity`` each expert's input is padded to its capacity
    (``moe_utils.permute`` with ``drop_and_pad``), the factor's; without it an expert holds the tokens
    routed to it up to that capacity, on a balanced load the average, factor 1."""
    try:
        factor = float(text)
    except ValueError:
        problems.append(f"--moe-expert-capacity-factor {text!r} is not a number")
        return 1.0
    if factor <= 0:
        problems.append(f"--moe-expert-capacity-factor must be positive, got {text}")
        return 1.0
    if "--moe-pad-expert-input-to-capacity" in flags:
        return factor
    adjusted.append(f"--moe-expert-capacity-factor {text} without --moe-pad-expert-input-to-capacity: an expert "
                    "holds the tokens routed to it, priced on a balanced load (capacity factor 1)")
    return 1.0


def refusals(flags: dict[str, str | bool], dp: int, cp: int, tp: int = 1, etp: int = 1) -> list[str]:
    """What of a mixture of experts (and of DeepSeek's models) parplan does not build, each in one
    sentence; ``dp``, ``cp``, ``tp`` and ``etp`` the data-, context-, tensor- and expert
    tensor-parallel sizes."""
    out = [f"{f} ({why}) is not modelled" for f, why in REFUSED if f in flags]
    if str(flags.get("--mtp-num-layers", "0")) != "0":
        out.append("--mtp-num-layers (multi-token prediction layers after the last block) is not modelled")
    if not flags.get("--num-experts"):
        return out
    dispatcher = str(flags.get("--moe-token-dispatcher-type", "allgather"))
    if dispatcher not in DISPATCHERS:
        out.append(f"--moe-token-dispatcher-type {dispatcher} (its communication library's buffers) is not "
                   f"modelled; parplan prices {' and '.join(DISPATCHERS)}")
    ep = _value(flags, "--expert-model-parallel-size", out) or 1
    span = expert_data_span(tp, ep, etp)  # the data-parallel replicas an expert group spans
    if span > 1 and dp % span and (dp * cp) % span == 0:
        out.append("expert parallelism across the context-parallel ranks (Megatron-LM's expert groups span "
                   "dp x cp; parplan's ep divides dp) is not modelled")
    return out


def notes(flags: dict[str, str | bool], ep: int) -> list[str]:
    """What a mixture of experts runs that the prediction does not price as Megatron-LM runs it."""
    if not flags.get("--num-experts"):
        return []
    out = []
    dispatcher = str(flags.get("--moe-token-dispatcher-type", "allgather"))
    if ep > 1 and dispatcher != "alltoall":
        out.append(f"--moe-token-dispatcher-type {dispatcher} (Megatron-LM's default: allgather) is priced as the "
                   "all-to-all dispatcher (its all-gathered tokens, TP x EP ranks' worth, kept in Megatron-LM's "
                   "global memory buffer, are not counted)")
    if "--moe-grouped-gemm" in flags:
        out.append("--moe-grouped-gemm: the experts' GEMMs are priced one expert at a time (the grouped kernel's "
                   "speed-up is not counted)")
    return out
