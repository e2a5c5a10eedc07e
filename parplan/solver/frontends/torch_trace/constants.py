"""Constants of the tracer: dtypes, view-op families, recognised activation modules, limits
and the priorities of dim-name hints."""

from __future__ import annotations

ALIAS = frozenset({"alias", "contiguous", "clone", "detach", "to", "_to_copy", "type_as", "lift_fresh_copy"})
PERMUTE = frozenset({"transpose", "swapaxes", "swapdims", "permute", "t", "numpy_T", "movedim"})
REGROUP = frozenset({"view", "_unsafe_view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze",
                     "view_as", "reshape_as"})
EXPAND = frozenset({"expand", "expand_as", "broadcast_to"})
VIEWS = ALIAS | PERMUTE | REGROUP | EXPAND
#: Ops whose output does not depend on their inputs' values (new constants).
CREATE = frozenset({"zeros_like", "ones_like", "empty_like", "full_like", "new_zeros", "new_ones", "new_empty",
                    "new_full", "rand_like", "randn_like", "scalar_tensor"})
#: Activation modules recognised by class name (substring, first match) -> elementwise fn.
ACT_NAMES = (("gelu", "gelu"), ("silu", "silu"), ("swish", "silu"), ("relu", "relu"), ("tanh", "tanh"),
             ("sigmoid", "sigmoid"))

TORCH_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp32", "int64": "int64",
               "int32": "int32", "int16": "int32", "int8": "int8", "uint8": "int8", "bool": "bool",
                "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8"}
FLOAT = frozenset({"fp32", "tf32", "bf16", "fp16", "fp8"})

#: Largest broadcast (``expand``) of a computed tensor that is materialised as copies.
MAX_REPEAT = 256
#: Most pieces an uneven slice or split of a computed tensor is made of (selected and concatenated).
MAX_PIECES = 64

# name-hint priorities (lower wins)
P_USER, P_ATTN, P_NORM, P_EMBED, P_INPUT, P_CLASS, P_FFN, P_MISC = 0, 10, 12, 15, 20, 25, 30, 40
