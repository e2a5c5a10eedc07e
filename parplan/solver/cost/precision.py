"""Precision settings: bytes per element of each kind of training state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from parplan.solver.errors import ConfigError


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter (or per activation element) of each category of memory.

    ``master_bytes`` is the fp32 master copy mixed precision keeps (0 when the weights are
    already fp32); ``optimizer_bytes`` is Adam's two moments.
    """

    name: str
    param_bytes: int
    grad_bytes: int
    master_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    compute_dtype: str

    @property
    def optimizer_state_bytes(self) -> int:
        """Bytes per parameter the optimizer holds (master weights + moments)."""
        return self.master_bytes + self.optimizer_bytes

    @property
    def model_state_bytes(self) -> int:
        """Bytes per parameter of weights, gradients and optimizer states together."""
        return self.param_bytes + self.grad_bytes + self.optimizer_state_bytes


#: ``bf16`` is Megatron-LM's default: bf16 weights and activations, fp32 gradient accumulation,
#: fp32 master weights and Adam moments (18 bytes/parameter). ``*-grad16`` keeps 16-bit gradients
#: (the ZeRO paper's 16 bytes/parameter). ``fp32`` trains in single precision (16 bytes/parameter).
PRECISIONS: Mapping[str, Precision] = MappingProxyType({
    "bf16": Precision("bf16", 2, 4, 4, 8, 2, "bf16"),
    "bf16-grad16": Precision("bf16-grad16", 2, 2, 4, 8, 2, "bf16"),
    "fp16": Precision("fp16", 2, 4, 4, 8, 2, "fp16"),
    "fp16-grad16": Precision("fp16-grad16", 2, 2, 4, 8, 2, "fp16"),
    "fp32": Precision("fp32", 4, 4, 0, 8, 4, "fp32"),
})


def get_precision(name: str) -> Precision:
    try:
        return PRECISIONS[name.lower()]
    except KeyError:
        raise ConfigError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}") from None
