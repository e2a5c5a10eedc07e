"""The defaults of a plan request that the command line shows in its help, apart from the request
model (:mod:`parplan.solver.request`) so that commands which send no plan request (``parplan
memory``) start without importing pydantic."""

from __future__ import annotations

DEFAULT_GPU = "A100-80GB"
DEFAULT_PRECISION = "bf16"
DEFAULT_TIME_LIMIT_SECONDS = 60.0
#: Uniform targets (megatron, deepspeed) try their strategies with part of the optimizer on the host when
#: none fits without (parplan.solver.targets.offload_variants).
DEFAULT_OPTIMIZER_OFFLOAD = True
