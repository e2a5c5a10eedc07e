"""Megatron-LM's precision-aware optimizer (``--use-precision-aware-optimizer`` and the dtypes it reads),
as the states Transformer Engine's ``FusedAdam`` keeps.

megatron-core hands the bf16 weights' shards to TE's ``FusedAdam`` with ``master_weights=True``,
``master_weight_dtype=--main-params-dtype``, ``exp_avg_dtype``/``exp_avg_sq_dtype`` from
``--exp-avg-dtype``/``--exp-avg-sq-dtype`` and ``store_param_remainders=OptimizerConfig.store_param_remainders``
(true, no flag; false before TE 2.1), when the master is not megatron-core's own: its distributed optimizer
keeps an fp32 master itself under FP8 recipes other than delayed scaling
(``use_precision_aware_optimizer_no_fp8_or_ds_fp8``, ``megatron/core/optimizer/optimizer_config.py`` and
``__init__.py``). TE stores the remainders only for bf16 weights with an fp32 master
(``transformer_engine/pytorch/optimizers/fused_adam.py``). parplan prices the states with
:func:`~parplan.solver.cost.precision.te_fused_adam`.
"""

from __future__ import annotations

from parplan.solver.cost.precision import TE_ADAM_BASES

AWARE = "--use-precision-aware-optimizer"
_DTYPES = ("--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype")


def precision_aware_states(flags: dict[str, str | bool], name: str, problems: list[str], adjusted: list[str]) -> str:
    """The precision ``name`` (read from the mixed-precision flags) with the precision-aware optimizer's
    states; ``problems`` gets what Megatron-LM refuses or parplan does not price."""
    dtypes = {f: str(flags.get(f, "fp32")) for f in _DTYPES}
    lowered = [f"{f} {v}" for f, v in dtypes.items() if v != "fp32"]
    if AWARE not in flags:
        if lowered:  # OptimizerConfig.__post_init__ asserts fp32 for each without the precision-aware optimizer
            problems.append(f"{', '.join(lowered)} without {AWARE} (megatron-core asserts fp32 without it)")
        return name
    moments = (dtypes["--exp-avg-dtype"], dtypes["--exp-avg-sq-dtype"])
    if "--optimizer-cpu-offload" in flags:
        if moments != ("fp32", "fp32") or dtypes["--main-params-dtype"] != "fp32":
            problems.append("the precision-aware optimizer's state dtypes with --optimizer-cpu-offload: "
                            "megatron-core's hybrid CPU/GPU optimizer keeps fp32 master weights and moments")
        return name
    if "--use-distributed-optimizer" not in flags:
        problems.append(f"{AWARE} needs --use-distributed-optimizer (megatron-core raises ValueError without it)")
    if dtypes["--main-params-dtype"] != "fp32":
        problems.append("--main-params-dtype fp16: Transformer Engine's FusedAdam unscales an fp16 master into an fp32 "
                        "copy of every parameter at each step (not modelled)")
    if moments not in (("fp32", "fp32"), ("bf16", "bf16")):
        problems.append(f"--exp-avg-dtype {moments[0]} --exp-avg-sq-dtype {moments[1]}: parplan prices Adam's moments "
                        "both fp32 or both bf16 (Transformer Engine's FusedAdam unscales fp16, fp8 or a lone bf16 "
                        "moment into fp32 copies at each step)")
    bf16_moments = moments == ("bf16", "bf16")
    if name not in TE_ADAM_BASES:
        if name.startswith("fp8") and "-cs" not in name:
            problems.append(f"{AWARE} with --fp8-param-gather under delayed scaling (FusedAdam's FP8 weights) is not "
                            "modelled")
        elif name == "fp32" or bf16_moments:
            problems.append(f"{AWARE} with precision {name}"
                            + (" and bf16 moments" if bf16_moments else "") + " is not modelled")
        else:
            adjusted.append(f"{AWARE} with precision {name}: fp32 master weights and moments (Transformer Engine "
                            "stores remainders for bf16 weights only; megatron-core keeps its own fp32 master under "
                            "FP8 current scaling)")
        return name
    priced = f"{name}-remainders" + ("-moments-bf16" if bf16_moments else "")
    adjusted.append(f"{AWARE}: Transformer Engine's FusedAdam keeps the fp32 master as the bf16 weight and its "
                    "16-bit remainder (megatron-core's store_param_remainders, true; Transformer Engine 2.1 or later)"
                    + (", Adam's moments in bf16" if bf16_moments else "") + f": precision {priced}")
    return priced
