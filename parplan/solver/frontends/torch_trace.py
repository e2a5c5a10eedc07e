"""Trace a PyTorch ``nn.Module`` into a parplan :class:`~parplan.solver.ir.Graph`.

:func:`trace_module` exports the module with ``torch.export`` (non-strict; works on the meta
device, so no weights are allocated) and maps the ATen graph onto the IR:

- every ``nn.Parameter`` becomes one ``parameter`` node named by its qualified name (tied
  parameters once, as ``module.parameters()`` counts them); user inputs become ``input`` nodes;
  buffers, constants and integer tensors computed from the inputs (position ids, shifted labels,
  masks) become ``input`` nodes when a mapped operator reads them (``attrs.constant`` /
  ``attrs.derived_from`` say which);
- operators are mapped by the explicit table :data:`OP_TABLE`; any other operator applied to a
  tensor that depends on the parameters raises :class:`ConfigError` naming the op and the module;
- custom normalisation and activation modules (``LlamaRMSNorm``, ``NewGELUActivation``, ...) are
  recognised as a whole and become one ``rmsnorm`` / ``layernorm`` / ``elementwise`` node;
- named dims come from a union-find over tensor axes ("atoms"): contractions, broadcasts and
  norms unify axes, views regroup them (splitting an axis into sub-axes where a view needs it,
  so ``[hidden] -> [heads, head_dim]`` costs no node), and no tensor may hold one axis twice.
  Axes get readable names from their role (``batch seq hidden heads head_dim kv_seq ffn vocab``)
  or from ``dim_names``; the rest are ``d<k>``. Renames the IR needs (a square weight feeding a
  residual, ``concat`` inputs) are zero-cost ``reshape`` nodes.

Block tags: a node inside module ``model.layers.3.mlp`` gets ``layer = "model.layers.3"`` (the
path up to and including its first integer component); other nodes get ``embed`` (before the
first block) or ``head`` (after the last), and ``meta["units"]`` lists the tags in order.
``meta`` also records ``parameter_count`` and, when those dims exist, ``batch`` and ``seq_len``.

Slices and splits become ``reduce`` nodes with ``op="select"`` (and ``index``) over a
``[parts, piece]`` split of the axis; an ``expand`` read whole by a non-elementwise op becomes
copies (``reshape`` + ``concat``). A strided slice ``start::step`` (interleaved rotary halves) is a
``[rows, step]`` reshape and a select. MoE: see :mod:`parplan.solver.frontends.torch_moe`. Not mapped
(they raise): ``scatter``, ``index_select``, ``where`` on activations,
convolutions, other strided slices.
Attention masks the model computes are kept as the attention's bias input (``causal`` is then
false, as the exported call says).
"""

from __future__ import annotations

import inspect
import itertools
import math
import operator
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from parplan.solver.errors import ConfigError
from parplan.solver.frontends.torch_moe import (
    collapse_experts,
    is_experts_module,
    map_gather,
    map_masked_fill,
    map_topk,
)
from parplan.solver.ir import DTYPE_BYTES, Graph, Node, OpKind, make_node

#: ATen operator (overload packet name, in-place ``_`` stripped) -> the IR it maps to.
OP_TABLE: Mapping[str, str] = {
    # contractions
    "linear": "einsum (+ elementwise add for the bias)",
    "addmm": "einsum + elementwise add",
    "baddbmm": "einsum + elementwise add",
    "mm": "einsum", "bmm": "einsum", "matmul": "einsum", "einsum": "einsum",
    # pointwise
    "add": "elementwise add", "sub": "elementwise sub", "rsub": "elementwise sub",
    "mul": "elementwise mul (scale when by a scalar)", "div": "elementwise mul (scale when by a scalar)",
    "neg": "elementwise scale", "square": "elementwise mul", "pow": "elementwise mul (integer exponent 2 or 3)",
    "gelu": "elementwise gelu", "silu": "elementwise silu", "relu": "elementwise relu",
    "tanh": "elementwise tanh", "sigmoid": "elementwise sigmoid", "exp": "elementwise exp",
    "dropout": "dropout", "feature_dropout": "dropout", "alpha_dropout": "dropout",
    # normalisation, attention, losses, reductions
    "layer_norm": "layernorm", "rms_norm": "rmsnorm",
    "softmax": "softmax", "_softmax": "softmax", "log_softmax": "softmax", "_log_softmax": "softmax",
    "embedding": "embedding", "scaled_dot_product_attention": "attention",
    "cross_entropy_loss": "cross_entropy (+ reduce)", "nll_loss": "cross_entropy (+ reduce)",
    "nll_loss_nd": "cross_entropy (+ reduce)", "mean": "reduce", "sum": "reduce",
    "cat": "concat", "stack": "reshape + concat",
    # views: no node, or a reshape when axes cannot be regrouped
    "view": "view", "_unsafe_view": "view", "reshape": "view", "flatten": "view", "unflatten": "view",
    "squeeze": "view", "unsqueeze": "view", "view_as": "view", "reshape_as": "view",
    "transpose": "view", "swapaxes": "view", "swapdims": "view", "permute": "view", "t": "view", "numpy_T": "view",
    "movedim": "view", "expand": "broadcast view", "expand_as": "broadcast view",
    "broadcast_to": "broadcast view",
    "alias": "alias", "contiguous": "alias", "clone": "alias", "detach": "alias", "to": "alias",
    "_to_copy": "alias", "type_as": "alias", "lift_fresh_copy": "alias",
    # slicing: reshape + reduce(op=select), or nothing when the slice is the whole axis
    "split": "select", "split_with_sizes": "select", "unsafe_split": "select", "chunk": "select",
    "unbind": "select", "slice": "select", "narrow": "select", "select": "select",
    # MoE routing (torch_moe): the values select k entries; a routed-experts module is one dispatch,
    # the experts' einsums and one combine
    "topk": "select (values) + index input (indices)",
    "gather": "select (as many entries along the dim as the index holds)",
    "masked_fill": "elementwise mul by the mask (a mask not derived from parameters)",
}

_ALIAS = frozenset({"alias", "contiguous", "clone", "detach", "to", "_to_copy", "type_as", "lift_fresh_copy"})
_PERMUTE = frozenset({"transpose", "swapaxes", "swapdims", "permute", "t", "numpy_T", "movedim"})
_REGROUP = frozenset({"view", "_unsafe_view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze",
                      "view_as", "reshape_as"})
_EXPAND = frozenset({"expand", "expand_as", "broadcast_to"})
_VIEWS = _ALIAS | _PERMUTE | _REGROUP | _EXPAND
#: Ops whose output does not depend on their inputs' values (new constants).
_CREATE = frozenset({"zeros_like", "ones_like", "empty_like", "full_like", "new_zeros", "new_ones", "new_empty",
                     "new_full", "rand_like", "randn_like", "scalar_tensor"})
#: Activation modules recognised by class name (substring, first match) -> elementwise fn.
_ACT_NAMES = (("gelu", "gelu"), ("silu", "silu"), ("swish", "silu"), ("relu", "relu"), ("tanh", "tanh"),
              ("sigmoid", "sigmoid"))

_TORCH_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp32", "int64": "int64",
                "int32": "int32", "int16": "int32", "int8": "int8", "uint8": "int8", "bool": "bool",
                "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8"}
_FLOAT = frozenset({"fp32", "tf32", "bf16", "fp16", "fp8"})

#: Largest broadcast (``expand``) of a computed tensor that is materialised as copies.
_MAX_REPEAT = 256
#: Most pieces an uneven slice or split of a computed tensor is made of (selected and concatenated).
_MAX_PIECES = 64

# name-hint priorities (lower wins)
_P_USER, _P_ATTN, _P_NORM, _P_EMBED, _P_INPUT, _P_CLASS, _P_FFN, _P_MISC = 0, 10, 12, 15, 20, 25, 30, 40


# ---------------------------------------------------------------------------------------------
# Axes ("atoms"): union-find with refinement and per-tensor distinctness


class _Atoms:
    """Union-find over tensor axes. An atom may be *refined* into two sub-atoms (a view split
    it); ``occ`` records which tensors hold each atom so that a union never gives one tensor the
    same axis twice (a square weight keeps two distinct axes)."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.size: list[int] = []
        self.occ: list[set[int]] = []
        self.children: dict[int, tuple[int, int]] = {}
        self.pinned: set[int] = set()  # roots that must stay one leaf (norm / softmax / class dims)
        self.hints: dict[int, tuple[int, int, str]] = {}  # root -> (priority, order, name)
        self.name_as: dict[int, int] = {}  # atom -> atom whose name it takes (concat inputs)
        self.keep: set[int] = set()  # size-1 atoms that stay in IR dims
        self.derived: dict[int, tuple[int, str]] = {}  # atom -> (atom, suffix) its name extends
        self.expanded: set[int] = set()  # atoms an ``expand`` created (broadcast copies when read whole)
        self._tensors = 0
        self._order = 0

    def new(self, size: int) -> int:
        a = len(self.parent)
        self.parent.append(a)
        self.size.append(size)
        self.occ.append(set())
        return a

    def find(self, a: int) -> int:
        root = a
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[a] != root:
            self.parent[a], a = root, self.parent[a]
        return root

    def leaves(self, atoms: Iterable[int]) -> list[int]:
        """The unrefined atoms (class roots) that ``atoms`` stand for, in order."""
        out: list[int] = []
        for a in atoms:
            r = self.find(a)
            kids = self.children.get(r)
            if kids is None:
                out.append(r)
            else:
                out.extend(self.leaves(kids))
        return out

    def hint(self, atom: int, name: str, priority: int) -> None:
        r = self.find(atom)
        self._order += 1
        cur = self.hints.get(r)
        if cur is None or priority < cur[0]:
            self.hints[r] = (priority, self._order, name)

    def register(self, atoms: Iterable[int]) -> bool:
        """Record that one tensor holds these atoms; False if a leaf repeats."""
        self._tensors += 1
        lv = self.leaves(atoms)
        for leaf in lv:
            self.occ[leaf].add(self._tensors)
        return len(set(lv)) == len(lv)

    def _refine(self, r: int, first: int) -> tuple[int, int]:
        a, b = self.new(first), self.new(self.size[r] // first)
        self.occ[a] = set(self.occ[r])
        self.occ[b] = set(self.occ[r])
        self.children[r] = (a, b)
        return a, b

    def refinable(self, r: int) -> bool:
        return r not in self.pinned and r not in self.name_as

    def regroup(self, leaves: Sequence[int], sizes: Sequence[int], *, refine: bool = True) -> list[list[int]] | None:
        """Group ``leaves`` (row-major) into consecutive runs of the given sizes, splitting a leaf
        where a boundary falls inside it (only when ``refine``). None, changing nothing, when
        impossible."""
        items = [(self.size[x], refine and self.refinable(x)) for x in leaves]
        if not _groups_ok(items, sizes):
            return None
        pending = deque(leaves)
        out: list[list[int]] = []
        for s in sizes:
            group: list[int] = []
            prod = 1
            while prod < s:
                leaf = pending.popleft()
                ls = self.size[leaf]
                if s % (prod * ls) == 0:
                    group.append(leaf)
                    prod *= ls
                else:
                    head, tail = self._refine(leaf, s // prod)
                    group.append(head)
                    pending.appendleft(tail)
                    prod = s
            out.append(group)
        return out

    def unify(self, xs: Sequence[int], ys: Sequence[int]) -> bool:
        """Make two axis groups the same axes, refining atoms to align them. False, with no union
        made, when they do not align or some tensor would hold one axis twice."""
        lx, ly = self.leaves(xs), self.leaves(ys)
        if lx == ly:
            return True
        if set(lx) & set(ly):
            return False
        ix = [(self.size[a], self.refinable(a)) for a in lx]
        iy = [(self.size[a], self.refinable(a)) for a in ly]
        if not _align_ok(ix, iy):
            return False
        px, py = deque(lx), deque(ly)
        pairs: list[tuple[int, int]] = []
        while px and py:
            x, y = px.popleft(), py.popleft()
            sx, sy = self.size[x], self.size[y]
            if sx == sy:
                pairs.append((x, y))
            elif sx > sy:
                a, b = self._refine(x, sy)
                pairs.append((a, y))
                px.appendleft(b)
            else:
                a, b = self._refine(y, sx)
                pairs.append((x, a))
                py.appendleft(b)
        return self._merge(pairs)

    def _merge(self, pairs: list[tuple[int, int]]) -> bool:
        tmp: dict[int, int] = {}

        def tf(a: int) -> int:
            while tmp.get(a, a) != a:
                a = tmp[a]
            return a

        for x, y in pairs:
            rx, ry = tf(x), tf(y)
            if rx != ry:
                tmp[ry] = rx
        groups: dict[int, list[int]] = {}
        for x, y in pairs:
            for r in (x, y):
                g = groups.setdefault(tf(r), [])
                if r not in g:
                    g.append(r)
        for members in groups.values():
            for i, a in enumerate(members):
                for b in members[i + 1:]:
                    small, big = sorted((self.occ[a], self.occ[b]), key=len)
                    if any(t in big for t in small):
                        return False
        for x, y in pairs:
            self._union(self.find(x), self.find(y))
        return True

    def _union(self, a: int, b: int) -> None:
        if a == b:
            return
        if len(self.occ[a]) < len(self.occ[b]):
            a, b = b, a
        self.parent[b] = a
        self.occ[a] |= self.occ[b]
        self.occ[b] = set()
        if b in self.pinned:
            self.pinned.add(a)
        hb = self.hints.pop(b, None)
        ha = self.hints.get(a)
        if hb is not None and (ha is None or hb[:2] < ha[:2]):
            self.hints[a] = hb


def _groups_ok(items: Sequence[tuple[int, bool]], sizes: Sequence[int]) -> bool:
    """Dry run of :meth:`_Atoms.regroup` on (size, refinable) items."""
    pending = deque(items)
    for s in sizes:
        prod = 1
        while prod < s:
            if not pending:
                return False
            ls, ok = pending.popleft()
            if s % (prod * ls) == 0:
                prod *= ls
            elif ok and s % prod == 0 and ls % (s // prod) == 0:
                pending.appendleft((ls // (s // prod), True))
                prod = s
            else:
                return False
    return not pending


def _align_ok(xs: Sequence[tuple[int, bool]], ys: Sequence[tuple[int, bool]]) -> bool:
    """Dry run of the alignment in :meth:`_Atoms.unify`."""
    px, py = deque(xs), deque(ys)
    while px and py:
        (sx, ox), (sy, oy) = px.popleft(), py.popleft()
        if sx == sy:
            continue
        if sx > sy:
            if not ox or sx % sy:
                return False
            px.appendleft((sx // sy, True))
        else:
            if not oy or sy % sx:
                return False
            py.appendleft((sy // sx, True))
    return not px and not py


# ---------------------------------------------------------------------------------------------
# Pass-1 records


@dataclass(frozen=True)
class _D:
    """An attribute naming the dim of one atom (``many``: the dims of several); resolved to
    names when the graph is emitted."""

    atoms: tuple[int, ...]
    many: bool = False


@dataclass
class _Rec:
    """One future IR node: its output atoms and its inputs as (record, atoms it is read as)."""

    kind: OpKind
    atoms: list[int]
    inputs: list[tuple[int, list[int]]]
    dtype: str
    path: str
    stem: str
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Val:
    """A traced tensor: atoms per torch axis (``[]`` for size 1), the record holding its data,
    and the atoms that only this broadcast view has (``expand``), which the record lacks."""

    axes: list[list[int]]
    rec: int
    dtype: str
    aux: bool  # not derived from parameters: inputs, buffers, constants, index tensors
    bcast: frozenset[int] = frozenset()
    deps: frozenset[str] = frozenset()  # user inputs an aux tensor derives from
    empty: bool = False  # has a zero-sized axis (never becomes a node)
    own: list[int] = field(default_factory=list)  # aux broadcast view: its own input record

    def like(self, axes: list[list[int]], dtype: str | None = None, bcast: frozenset[int] | None = None) -> _Val:
        """A view of the same data with other axes."""
        return _Val(axes, self.rec, dtype or self.dtype, self.aux, self.bcast if bcast is None else bcast,
                    self.deps, self.empty, self.own)


@dataclass
class _SNode:
    """An emitted node whose dims are still atoms: (atom, size)."""

    id: str
    kind: OpKind
    inputs: list[str]
    dims: list[tuple[int, int]]
    dtype: str
    path: str
    attrs: dict[str, Any]
    layer: str | None = None


def _flat(axes: Iterable[Iterable[int]]) -> list[int]:
    return [a for ax in axes for a in ax]


def _block(path: str) -> str | None:
    """``model.layers.3`` for ``model.layers.3.mlp.fc1``: the path through its first index."""
    parts = path.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return None


def _flatten(x: Any) -> list[Any]:
    if isinstance(x, list | tuple):
        return [y for item in x for y in _flatten(item)]
    return [x]


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _is_fx_node(x: Any) -> bool:
    return hasattr(x, "op") and hasattr(x, "all_input_nodes")


def _strip(path: str) -> str:
    """Drop the wrapper's ``inner`` prefix from a module path or parameter name."""
    if path == "inner":
        return ""
    return path[len("inner."):] if path.startswith("inner.") else path


def _stack_paths(node: Any) -> list[str]:
    """Module paths of a node's ``nn_module_stack``, outermost first."""
    return [_strip(v[0] if isinstance(v, tuple) else str(v)) for v in (node.meta.get("nn_module_stack") or {}).values()]


# ---------------------------------------------------------------------------------------------
# Public entry point


def trace_module(
    module: Any,
    example_inputs: tuple[Any, ...] | Mapping[str, Any],
    name: str = "traced",
    *,
    dim_names: Mapping[int, str] | None = None,
    float_dtype: str | None = None,
) -> Graph:
    """Trace ``module`` (ideally built on the meta device) on ``example_inputs`` into a Graph.

    ``example_inputs`` are positional tensors or keyword tensors (other keyword values are passed
    through). ``dim_names`` maps sizes of input axes to names (``{8: "batch", 2048: "seq"}``).
    ``float_dtype`` (e.g. ``"bf16"``) overrides the dtype of floating-point tensors; by default
    the traced dtypes are kept. Raises :class:`ConfigError` when torch is missing, the export
    fails, or an operator cannot be mapped.
    """
    torch = _import_torch()
    if float_dtype is not None and float_dtype not in DTYPE_BYTES:
        raise ConfigError(f"unknown float_dtype {float_dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"trace_module needs a torch.nn.Module, got {type(module).__name__}")
    args, kwargs = _split_inputs(torch, module, example_inputs)
    try:
        ep = torch.export.export(_wrap(torch, module), args, kwargs, strict=False)
    except ConfigError:
        raise
    except Exception as e:  # torch.export raises many exception types
        raise ConfigError(f"torch.export could not trace {type(module).__name__}: {type(e).__name__}: {e}") from e
    tracer = _Tracer(torch, module, ep, _input_names(module, args, kwargs), dim_names or {}, float_dtype)
    return tracer.build(name)


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise ConfigError("tracing PyTorch modules needs torch: install parplan[torch]") from e
    return torch


def _split_inputs(torch: Any, module: Any, example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(example_inputs, Mapping):
        args: tuple[Any, ...] = ()
        kwargs = dict(example_inputs)
    elif isinstance(example_inputs, torch.Tensor):
        args, kwargs = (example_inputs,), {}
    else:
        args, kwargs = tuple(example_inputs), {}
    meta = any(p.device.type == "meta" for p in module.parameters())

    def move(x: Any) -> Any:
        return x.to("meta") if meta and isinstance(x, torch.Tensor) else x

    return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}


def _input_names(module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[str]:
    """Names of the tensor inputs in export order: forward's parameter names, then keywords."""
    try:
        params = [p.name for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # pragma: no cover - forward without a signature
        params = []
    names = [params[i] if i < len(params) else f"input{i}" for i, a in enumerate(args) if _is_tensor(a)]
    return names + [k for k, v in kwargs.items() if _is_tensor(v)]


def _wrap(torch: Any, module: Any) -> Any:
    """A module returning the flat tuple of tensors that ``module`` returns (drops KV caches)."""

    def tensors(out: Any) -> list[Any]:
        if isinstance(out, torch.Tensor):
            return [out]
        if isinstance(out, Mapping):
            return [t for v in out.values() for t in tensors(v)]
        if isinstance(out, list | tuple):
            return [t for v in out for t in tensors(v)]
        return []

    class _Wrapped(torch.nn.Module):  # type: ignore[misc]
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
            out = tuple(tensors(self.inner(*args, **kwargs)))
            if not out:
                raise ConfigError(f"{type(self.inner).__name__} returned no tensor")
            return out

    return _Wrapped(module)


# ---------------------------------------------------------------------------------------------
# The tracer


Handler = Callable[["_Tracer", Any, dict[str, Any], str], Any]


class _Tracer:
    """Pass 1 (:meth:`build` -> :meth:`_run`) maps the exported graph to records over atoms;
    pass 2 (:meth:`_emit`) turns the live records into nodes and names the atoms."""

    def __init__(self, torch: Any, module: Any, ep: Any, input_names: list[str], dim_names: Mapping[int, str],
                 float_dtype: str | None) -> None:
        self.torch = torch
        self.module = module
        self.ep = ep
        self.input_names = input_names
        self.dim_names = dim_names
        self.float_dtype = float_dtype
        self.A = _Atoms()
        self.recs: list[_Rec] = []
        self.node_path = ""  # module path of the node being mapped (errors, ids, layer tags)
        self.node_name = ""
        self.vocab_named = False
        self._collapsible_cache: dict[str, tuple[str, Any] | None] = {}
        self.param_vals: dict[str, _Val] = {}
        self.param_of: dict[str, str] = {}  # exported target -> canonical parameter name
        self.user_inputs: list[int] = []
        self._split_cache: dict[tuple[Any, ...], _Val] = {}
        self.router: tuple[_Val, int] | None = None  # the last top-k router's (probabilities, k)
        canon: dict[int, str] = {}
        for n, p in module.named_parameters():
            canon[id(p)] = n
            self.param_vals[n] = self._leaf(OpKind.PARAMETER, n, list(p.shape), self._dtype(p.dtype),
                                            path=n.rpartition(".")[0], aux=False)
        for n, p in module.named_parameters(remove_duplicate=False):
            self.param_of["inner." + n] = canon[id(p)]

    # -- small helpers ---------------------------------------------------------------------

    def _dtype(self, tdtype: Any) -> str:
        s = str(tdtype).removeprefix("torch.")
        d = _TORCH_DTYPE.get(s)
        if d is None:
            raise self._err(f"unsupported dtype {s}")
        if self.float_dtype is not None and d in _FLOAT:
            return self.float_dtype
        return d

    def _err(self, what: str) -> ConfigError:
        return ConfigError(f"{what} at module '{self.node_path or '<root>'}' (node {self.node_name})")

    def _size(self, atoms: Iterable[int]) -> int:
        return math.prod(self.A.size[a] for a in atoms)

    def _leaf(self, kind: OpKind, stem: str, shape: list[int], dtype: str, *, path: str, aux: bool,
              attrs: dict[str, Any] | None = None, deps: frozenset[str] = frozenset()) -> _Val:
        """A parameter / input record with fresh atoms (an empty tensor gets no record)."""
        if any(s == 0 for s in shape):
            return _Val([[] for _ in shape], -1, dtype, aux, deps=deps, empty=True)
        axes = [[self.A.new(s)] if s > 1 else [] for s in shape]
        rec = self._add(_Rec(kind, _flat(axes), [], dtype, path, stem, dict(attrs or {})))
        return _Val(axes, rec, dtype, aux, deps=deps)

    def _add(self, rec: _Rec) -> int:
        if not self.A.register(rec.atoms):
            raise self._err(f"cannot name the dims of {rec.kind.value} {rec.stem!r}: two of its axes are one axis")
        for _, exp in rec.inputs:
            self.A.register(exp)
        self.recs.append(rec)
        return len(self.recs) - 1

    def _rec(self, kind: OpKind, atoms: list[int], inputs: list[tuple[int, list[int]]], dtype: str,
             suffix: str | None = None, **attrs: Any) -> int:
        """A record for the node being mapped (``suffix`` for its intermediate records)."""
        stem = self.node_name if suffix is None else f"{self.node_name}.{suffix}"
        return self._add(_Rec(kind, atoms, inputs, dtype, self.node_path,
                              f"{self.node_path}.{stem}" if self.node_path else stem, attrs))

    def _spec(self, v: _Val, expected: list[int] | None = None) -> tuple[int, list[int]]:
        """An input slot reading ``v`` as ``expected`` atoms (default: all its axes; atoms its record
        lacks are materialised at emission)."""
        if v.empty:
            raise self._err("an empty tensor feeds a mapped operator")
        exp = _flat(v.axes) if expected is None else expected
        if v.aux and v.bcast:  # a broadcast constant: its own input record
            if not v.own:
                base = self.recs[v.rec]
                v.own.append(self._add(_Rec(OpKind.INPUT, _flat(v.axes), [], v.dtype, base.path,
                                            base.stem + ".expanded", dict(base.attrs))))
            return v.own[0], exp
        return v.rec, exp

    def _single(self, v: _Val, axis: int) -> tuple[int, list[int]]:
        """The one atom of ``v.axes[axis]`` (pinned: it stays one dim), or a fresh atom standing
        for the whole axis when it has several; and the atoms ``v`` is then read as."""
        lv = self.A.leaves(v.axes[axis])
        if len(lv) == 1:
            self.A.pinned.add(lv[0])
            return lv[0], _flat(v.axes)
        m = self.A.new(self._size(lv))
        if not lv:
            self.A.keep.add(m)
        self.A.pinned.add(m)
        return m, [*_flat(v.axes[:axis]), m, *_flat(v.axes[axis + 1:])]

    def _hint(self, atoms: Sequence[int], name: str, priority: int) -> None:
        lv = self.A.leaves(atoms)
        if len(lv) == 1:
            self.A.hint(lv[0], name, priority)

    def _fresh_like(self, atoms: Sequence[int]) -> int:
        """A new atom of the size of ``atoms`` (a second copy of an axis, e.g. ``kv_seq``)."""
        f = self.A.new(self._size(atoms))
        lv = self.A.leaves(atoms)
        h = self.A.hints.get(lv[0]) if len(lv) == 1 else None
        if h is not None:
            self.A.hint(f, "kv_seq" if h[2] == "seq" else h[2] + "_2", h[0] + 1)
        return f

    def _bcast_leaves(self, v: _Val) -> set[int]:
        return set(self.A.leaves(v.bcast)) if v.bcast else set()

    # -- pass 1 ----------------------------------------------------------------------------

    def build(self, name: str) -> Graph:
        ep = self.ep
        users = [s for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        names = self.input_names if len(self.input_names) == len(users) else [s.arg.name for s in users]
        placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
        bindings: dict[Any, Any] = {}
        ui = 0
        for spec in ep.graph_signature.input_specs:
            node = placeholders.get(spec.arg.name)
            if node is None:
                continue
            kind = spec.kind.name
            if kind == "PARAMETER":
                bindings[node] = self.param_vals[self.param_of[spec.target]]
                continue
            val = node.meta.get("val")
            if not _is_tensor(val):
                bindings[node] = val
                if kind == "USER_INPUT":
                    ui += 1
                continue
            shape, dtype = [int(s) for s in val.shape], self._dtype(val.dtype)
            if kind == "USER_INPUT":
                ident = names[ui]
                ui += 1
                v = self._leaf(OpKind.INPUT, ident, shape, dtype, path="", aux=True, deps=frozenset({ident}))
                if v.rec >= 0:
                    self.user_inputs.append(v.rec)
                for i, ax in enumerate(v.axes):
                    if shape[i] in self.dim_names:
                        self._hint(ax, self.dim_names[shape[i]], _P_USER)
                    elif i == 0 and len(shape) >= 2:
                        self._hint(ax, "batch", _P_INPUT)
                    elif i == 1 and len(shape) == 2 and not val.dtype.is_floating_point:
                        self._hint(ax, "seq", _P_INPUT)
            else:  # buffers and lifted constants
                ident = _strip(spec.target or node.name)
                v = self._leaf(OpKind.INPUT, ident, shape, dtype, path=ident.rpartition(".")[0], aux=True,
                               attrs={"constant": True})
            bindings[node] = v
        outs = self._run(ep.graph_module, ep.graph, bindings)
        return self._emit(name, outs)

    def _run(self, gm: Any, graph: Any, bindings: dict[Any, Any]) -> list[Any]:
        live = _live(graph)
        env: dict[Any, Any] = dict(bindings)
        regions = self._regions(graph)
        done: set[Any] = set()
        tried: set[int] = set()
        for node in graph.nodes:
            if node not in live or node in done:
                continue
            if node.op == "placeholder":
                if node not in env:
                    raise ConfigError(f"unbound graph input {node.name}")
            elif node.op == "get_attr":
                env[node] = getattr(gm, node.target)
            elif node.op == "call_function":
                region = regions.get(node)
                if region is not None and id(region) not in tried:
                    tried.add(id(region))
                    if self._collapse(region, env, live):
                        done.update(region)
                        continue
                env[node] = self._call(node, env)
            elif node.op == "output":
                return [self._resolve(a, env) for a in _flatten(node.args[0])]
        raise ConfigError("the exported graph has no output")

    def _resolve(self, raw: Any, env: dict[Any, Any]) -> Any:
        if _is_fx_node(raw):
            return env[raw]
        if isinstance(raw, list | tuple):
            return [self._resolve(r, env) for r in raw]
        return raw

    def _set_where(self, node: Any) -> None:
        paths = _stack_paths(node)
        self.node_path = paths[-1] if paths else ""
        self.node_name = node.name

    def _call(self, node: Any, env: dict[Any, Any]) -> Any:
        self._set_where(node)
        target = node.target
        if target is operator.getitem:
            seq = self._resolve(node.args[0], env)
            return seq[node.args[1]] if isinstance(seq, list | tuple) else None
        if isinstance(target, self.torch._ops.HigherOrderOperator):
            return self._hop(node, env)
        if not isinstance(target, self.torch._ops.OpOverload):
            raise self._err(f"unsupported call {getattr(target, '__name__', target)!r}")
        op = target.overloadpacket.__name__
        if op.endswith("_") and not op.endswith("__"):
            op = op[:-1]
        args = self._bind(node, env)
        tensors = [v for v in _flatten(list(args.values())) if isinstance(v, _Val)]
        meta = node.meta.get("val")
        if _is_tensor(meta) and any(int(s) == 0 for s in meta.shape):  # no data: never a node
            return _Val([[] for _ in meta.shape], -1, self._dtype(meta.dtype), True, empty=True)
        if all(v.aux for v in tensors) or op in _CREATE:
            return self._aux(node, op, args, [v for v in tensors if v.aux], meta)
        if _is_tensor(meta) and not (meta.dtype.is_floating_point or meta.dtype.is_complex):
            return self._aux_new(node, tensors, meta)  # an index tensor computed from activations
        handler = _HANDLERS.get(op)
        if handler is None or target.namespace != "aten":
            raise self._err(f"unsupported operator {target.namespace}.{op} on a computed tensor "
                            f"(OP_TABLE lists the mapped ones)")
        return handler(self, node, args, op)

    def _bind(self, node: Any, env: dict[Any, Any]) -> dict[str, Any]:
        """The op's arguments by schema name (defaults filled in), fx nodes resolved to values."""
        out: dict[str, Any] = {}
        for i, a in enumerate(node.target._schema.arguments):
            if i < len(node.args) and not a.kwarg_only:
                raw = node.args[i]
            elif a.name in node.kwargs:
                raw = node.kwargs[a.name]
            elif a.has_default_value():
                raw = a.default_value
            else:
                raw = None
            out[a.name] = self._resolve(raw, env)
        return out

    # -- tensors not derived from parameters ---------------------------------------------------

    def _aux(self, node: Any, op: str, args: dict[str, Any], tensors: list[_Val], meta: Any) -> Any:
        if _is_tensor(meta) and tensors and op in _VIEWS and not tensors[0].empty:
            v = self._view(op, args, tensors[0], meta)
            if v is not None:
                return v
        return self._aux_new(node, tensors, meta)

    def _aux_new(self, node: Any, tensors: list[_Val], meta: Any) -> Any:
        """New input record(s) for the op's output: a constant, or derived from user inputs."""
        deps: frozenset[str] = frozenset().union(*(v.deps for v in tensors)) if tensors else frozenset()
        if deps:
            attrs: dict[str, Any] = {"derived_from": sorted(deps)}
            stem = f"{sorted(deps)[0]}.{node.name}"
        elif any(not v.aux for v in tensors):
            attrs, stem = {"index": True}, f"{self.node_path}.{node.name}" if self.node_path else node.name
        else:
            attrs, stem = {"constant": True}, f"{self.node_path}.{node.name}" if self.node_path else node.name

        def one(m: Any, suffix: str) -> _Val:
            return self._leaf(OpKind.INPUT, stem + suffix, [int(s) for s in m.shape], self._dtype(m.dtype),
                              path=self.node_path, aux=True, attrs=attrs, deps=deps)

        if _is_tensor(meta):
            return one(meta, "")
        if isinstance(meta, list | tuple):
            return [one(m, f".{i}") if _is_tensor(m) else m for i, m in enumerate(meta)]
        return meta

    # -- views -----------------------------------------------------------------------------

    def _view(self, op: str, args: dict[str, Any], x: _Val, meta: Any) -> _Val | None:
        """A view op on atoms (no record); None when the axes cannot be regrouped."""
        shape = [int(s) for s in meta.shape]
        dtype = self._dtype(meta.dtype)
        n = len(x.axes)
        if op in _ALIAS:
            return x.like([list(a) for a in x.axes], dtype)
        if op in _PERMUTE:
            return x.like([list(x.axes[p]) for p in _permutation(op, args, n)], dtype)
        if op in _EXPAND:
            axes: list[list[int]] = []
            new = set(x.bcast)
            for i, s in enumerate(shape):
                j = i - (len(shape) - n)
                if j >= 0 and self._size(x.axes[j]) == s:
                    axes.append(list(x.axes[j]))
                elif s == 1:
                    axes.append([])
                else:
                    a = self.A.new(s)
                    new.add(a)
                    self.A.expanded.add(a)
                    axes.append([a])
            self.A.register(_flat(axes))
            return x.like(axes, dtype, frozenset(new))
        groups = self.A.regroup(self.A.leaves(_flat(x.axes)), [s for s in shape if s > 1])
        if groups is None:
            return None
        it = iter(groups)
        return x.like([next(it) if s > 1 else [] for s in shape], dtype)

    # -- custom norm / activation modules --------------------------------------------------------

    def _collapsible(self, path: str) -> tuple[str, Any] | None:
        """("norm", module) or ("act", fn) for a module mapped as a whole, else None."""
        if path in self._collapsible_cache:
            return self._collapsible_cache[path]
        res: tuple[str, Any] | None = None
        try:
            mod = self.module.get_submodule(path) if path else None
        except AttributeError:
            mod = None
        if mod is not None and not type(mod).__module__.startswith("torch."):
            cls = type(mod).__name__.lower()
            own = dict(mod.named_parameters(recurse=False))
            total = sum(1 for _ in mod.parameters())
            w = own.get("weight")
            if ("norm" in cls and "batch" not in cls and "group" not in cls and w is not None and w.dim() == 1
                    and total == len(own) and set(own) <= {"weight", "bias"}):
                res = ("norm", mod)
            elif is_experts_module(mod):
                res = ("experts", mod)
            elif total == 0 and "squared" not in cls and "glu" not in cls.replace("gelu", ""):
                res = next((("act", fn) for key, fn in _ACT_NAMES if key in cls), None)
        self._collapsible_cache[path] = res
        return res

    def _regions(self, graph: Any) -> dict[Any, list[Any]]:
        """Runs of consecutive nodes inside one call of a collapsible module, by node."""
        regions: dict[Any, list[Any]] = {}
        cur_key: Any = None
        cur: list[Any] = []
        for n in [*graph.nodes, None]:
            key = None
            if n is not None and n.op == "call_function":
                stack = n.meta.get("nn_module_stack") or {}
                for k, path in zip(stack, _stack_paths(n), strict=True):
                    if self._collapsible(path) is not None:
                        key = (k, path)
                        break
            if key != cur_key:
                if cur_key is not None and cur:
                    regions.update(dict.fromkeys(cur, cur))
                cur_key, cur = key, []
            if key is not None:
                cur.append(n)
        return regions

    def _collapse(self, region: list[Any], env: dict[Any, Any], live: set[Any]) -> bool:
        """Map a norm / activation module call as one node; False to map its ops one by one."""
        inside = set(region)
        nodes = [n for n in region if n in live]
        if not nodes:
            return True
        path = next(p for p in _stack_paths(nodes[0]) if self._collapsible(p) is not None)
        info = self._collapsible(path)
        assert info is not None
        ext: list[Any] = []
        for n in nodes:
            ext.extend(a for a in n.all_input_nodes if a not in inside and a not in ext)
        vals = [(a, env.get(a)) for a in ext]
        params = {v.rec for _, v in vals if isinstance(v, _Val) and self._is_param(v)}
        if info[0] == "experts":
            outs = [n for n in nodes if any(u not in inside for u in n.users)]
            return len(outs) == 1 and collapse_experts(self, path, info[1], outs[0], vals, env)
        xs = [(a, v) for a, v in vals if isinstance(v, _Val) and not self._is_param(v)
              and v.dtype in _FLOAT and not v.empty]
        if len(xs) != 1:
            return False
        x_node, x = xs[0]
        outs = [n for n in nodes if any(u not in inside for u in n.users)]
        aliases = [n for n in outs if _alias_chain(n, x_node, inside)]
        mains = [n for n in outs if n not in aliases]
        if len(mains) != 1:
            return False
        main = mains[0]
        mval = main.meta.get("val")
        if not _is_tensor(mval) or [int(s) for s in mval.shape] != [self._size(a) for a in x.axes]:
            return False
        self._set_where(main)
        self.node_path = path
        dtype = self._dtype(mval.dtype)
        kind, what = info
        if kind == "norm":
            w = self.param_vals.get(self._canon(what.weight))
            bias = getattr(what, "bias", None)
            b = self.param_vals.get(self._canon(bias)) if bias is not None else None
            if w is None or not params or not params <= {w.rec, b.rec if b else -1}:
                return False
            eps = next((getattr(what, k) for k in ("eps", "variance_epsilon")
                        if isinstance(getattr(what, k, None), float)), None)
            out = self._norm(OpKind.LAYERNORM if b is not None else OpKind.RMSNORM, x, 1, w, b, dtype,
                             **({"eps": eps} if eps is not None else {}))
        else:
            if params:
                return False
            out = self._ew([x], str(what), str(what), dtype)
            self._hint(out.axes[-1] if out.axes else [], "ffn", _P_FFN)
        env[main] = out
        for a in aliases:
            env[a] = x
        return True

    def _is_param(self, v: _Val) -> bool:
        return not v.aux and v.rec >= 0 and self.recs[v.rec].kind is OpKind.PARAMETER

    def _canon(self, p: Any) -> str:
        return next((n for n, q in self.module.named_parameters() if q is p), "")

    # -- higher-order ops (set_grad_enabled / autocast regions) ---------------------------------

    def _hop(self, node: Any, env: dict[Any, Any]) -> Any:
        resolved = [self._resolve(a, env) for a in node.args]
        sub_i = next((i for i, a in enumerate(resolved) if hasattr(a, "graph") and hasattr(a, "forward")), None)
        if sub_i is None:
            raise self._err(f"unsupported higher-order op {node.target.name()}")
        operands = resolved[sub_i + 1:]
        tensors = [v for v in _flatten(operands) if isinstance(v, _Val)]
        if all(v.aux for v in tensors):
            return self._aux_new(node, tensors, node.meta.get("val"))
        sub = resolved[sub_i]
        ph = [n for n in sub.graph.nodes if n.op == "placeholder"]
        return self._run(sub, sub.graph, dict(zip(ph, operands, strict=False)))

    # -- shared mappings -------------------------------------------------------------------

    def _ew(self, operands: list[Any], fn_tensor: str, fn_scalar: str, dtype: str,
            suffix: str | None = None) -> _Val:
        """An elementwise op broadcasting torch-style; numbers and scalar constants are dropped
        (``fn_scalar`` then names the op, e.g. ``scale`` for a multiplication by a number)."""
        tens = [v for v in operands if isinstance(v, _Val) and not (v.aux and not _flat(v.axes))]
        if not tens:
            raise self._err("elementwise op without a tensor operand")
        fn = fn_scalar if len(tens) == 1 and len(operands) > 1 else fn_tensor
        nd = max(len(v.axes) for v in tens)
        exp = [[list(a) for a in v.axes] for v in tens]
        bl = [self._bcast_leaves(v) for v in tens]
        out: list[list[int]] = []
        seen: set[int] = set()
        for pos in range(nd):
            cands = []
            for ti, v in enumerate(tens):
                ai = pos - (nd - len(v.axes))
                if ai >= 0 and v.axes[ai]:
                    cands.append((set(self.A.leaves(v.axes[ai])) <= bl[ti], ti, ai))
            cands.sort()  # an axis some operand really has first
            ax: list[int] = []
            for k, (_, ti, ai) in enumerate(cands):
                if k == 0:
                    ax = tens[ti].axes[ai]
                elif not self.A.unify(ax, tens[ti].axes[ai]):
                    exp[ti][ai] = ax
            if set(self.A.leaves(ax)) & seen:
                f = self._fresh_like(ax)
                for _, ti, ai in cands:
                    exp[ti][ai] = [f]
                ax = [f]
            seen |= set(self.A.leaves(ax))
            out.append(list(ax))
        inputs = []
        present: set[int] = set()
        for ti, v in enumerate(tens):
            keep = [a for a in self.A.leaves(_flat(exp[ti])) if a not in bl[ti]]
            present.update(keep)
            inputs.append(self._spec(v, keep))
        out_leaves = self.A.leaves(_flat(out))
        rec = self._rec(OpKind.ELEMENTWISE, [a for a in out_leaves if a in present], inputs, dtype, suffix, fn=fn)
        return _Val(out, rec, dtype, False, frozenset(a for a in out_leaves if a not in present))

    def _contract(self, ops: list[tuple[_Val, list[str]]], out: list[str], dtype: str,
                  suffix: str | None = None) -> _Val:
        """An einsum over letters: equal letters are one axis, the output follows ``out``."""
        first: dict[str, list[int]] = {}
        exp = [[list(a) for a in v.axes] for v, _ in ops]
        for oi, (v, letters) in enumerate(ops):
            for i, letter in enumerate(letters):
                if not v.axes[i]:
                    continue
                if letter not in first:
                    first[letter] = v.axes[i]
                elif not self.A.unify(first[letter], v.axes[i]):
                    exp[oi][i] = first[letter]
        used: set[int] = set()
        for letter in list(first):
            lv = set(self.A.leaves(first[letter]))
            if lv & used:  # e.g. q @ k^T with q and k over the same seq: k's becomes kv_seq
                f = self._fresh_like(first[letter])
                for oi, (v, letters) in enumerate(ops):
                    for i, ll in enumerate(letters):
                        if ll == letter and v.axes[i]:
                            exp[oi][i] = [f]
                first[letter] = [f]
                lv = {f}
            used |= lv
        self.A.register(_flat(first.values()))
        out_axes = [list(first.get(letter, [])) for letter in out]
        inputs = [self._spec(v, _flat(e)) for (v, _), e in zip(ops, exp, strict=True)]
        rec = self._rec(OpKind.EINSUM, _flat(out_axes), inputs, dtype, suffix)
        return _Val(out_axes, rec, dtype, False)

    def _norm(self, kind: OpKind, x: _Val, k: int, w: _Val | None, b: _Val | None, dtype: str,
              **attrs: Any) -> _Val:
        """layernorm / rmsnorm over the last ``k`` axes of x (one dim in the IR)."""
        if w is None:
            raise self._err(f"{kind.value} without an affine weight is not representable")
        xm = x.like([*x.axes[: len(x.axes) - k], _flat(x.axes[len(x.axes) - k:])]) if k != 1 else x
        d, exp = self._single(xm, len(xm.axes) - 1)
        self._hint([d], "hidden", _P_NORM)
        ins = [self._spec(x, exp)]
        for p in (w, b):
            if p is not None:
                self.A.unify([d], _flat(p.axes))
                ins.append(self._spec(p, [d]))
        rec = self._rec(kind, exp, ins, dtype, dim=_D((d,)), **attrs)
        return _Val([list(a) for a in x.axes], rec, dtype, False)

    def _select(self, x: _Val, dim: int, index: int, dtype: str, suffix: str | None) -> _Val:
        """Index ``index`` of axis ``dim``: a reduce(op=select) over the axis."""
        out = [list(a) for i, a in enumerate(x.axes) if i != dim]
        if not x.axes[dim]:
            return x.like(out, dtype)
        rec = self._rec(OpKind.REDUCE, _flat(out), [self._spec(x)], dtype, suffix,
                        over=_D(tuple(x.axes[dim]), many=True), op="select", index=index)
        return _Val(out, rec, dtype, False)

    def _pieces(self, x: _Val, dim: int, parts: int, dtype: str, *, refine: bool,
                which: Sequence[int] | None = None) -> list[_Val]:
        """``parts`` equal pieces of axis ``dim`` (only those ``which`` lists), each a select. With
        ``refine`` (split, chunk) the axis itself is split into [parts, piece] everywhere (a fused
        qkv weight gets a ``qkv`` dim); otherwise (slices) a reshape of this tensor makes them."""
        total = self._size(x.axes[dim])
        piece = total // parts
        src = self.A.leaves(x.axes[dim])
        groups = self.A.regroup(src, [parts, piece], refine=refine)
        if groups is not None:
            if refine and len(groups[0]) == 1:
                self.A.hint(groups[0][0], "qkv" if parts == 3 else "parts", _P_MISC)
            base = x.like([*x.axes[:dim], groups[0], groups[1], *x.axes[dim + 1:]], dtype)
        else:
            key = (x.rec, tuple(_flat(x.axes)), dim, parts)
            cached = self._split_cache.get(key)
            if cached is None:
                p, q = self.A.new(parts), [self.A.new(piece)] if piece > 1 else []
                self.A.hint(p, "parts", _P_MISC)
                if q and len(src) == 1:
                    self.A.derived[q[0]] = (src[0], "_half" if parts == 2 else "_piece")
                axes = [*(list(a) for a in x.axes[:dim]), [p], q, *(list(a) for a in x.axes[dim + 1:])]
                rec = self._rec(OpKind.RESHAPE, _flat(axes), [self._spec(x)], dtype, "split")
                cached = self._split_cache[key] = _Val(axes, rec, dtype, False)
            base = cached
        return [self._select(base, dim, i, dtype, f"{i}") for i in (range(parts) if which is None else which)]

    def _strided(self, x: _Val, dim: int, step: int, start: int, dtype: str) -> _Val:
        """Every ``step``-th element of axis ``dim`` from ``start`` (< step), e.g. the even and odd
        halves of an interleaved rotary embedding: the axis as ``[rows, step]`` (a reshape of this
        tensor unless its atoms already split so), and a select of ``start`` over ``step``."""
        rows = self._size(x.axes[dim]) // step
        groups = self.A.regroup(self.A.leaves(x.axes[dim]), [rows, step], refine=False)
        if groups is not None:
            base = x.like([*x.axes[:dim], groups[0], groups[1], *x.axes[dim + 1:]], dtype)
        else:
            key = (x.rec, tuple(_flat(x.axes)), dim, -step)
            cached = self._split_cache.get(key)
            if cached is None:
                r, q = ([self.A.new(rows)] if rows > 1 else []), self.A.new(step)
                self.A.hint(q, "interleave", _P_MISC)
                axes = [*(list(a) for a in x.axes[:dim]), r, [q], *(list(a) for a in x.axes[dim + 1:])]
                rec = self._rec(OpKind.RESHAPE, _flat(axes), [self._spec(x)], dtype, "interleave")
                cached = self._split_cache[key] = _Val(axes, rec, dtype, False)
            base = cached
        return self._select(base, dim + 1, start, dtype, f"{start}")

    def _ranges(self, x: _Val, dim: int, ranges: list[tuple[int, int]], *, refine: bool) -> list[_Val]:
        """Ranges ``[a, b)`` of axis ``dim``: the axis cut into pieces of gcd(bounds) elements
        (see :meth:`_pieces`), and a range of several pieces their concat."""
        total = self._size(x.axes[dim])
        if ranges == [(0, total)]:
            return [x.like([list(a) for a in x.axes])]
        g = math.gcd(total, *(c for r in ranges for c in r))
        parts = total // g
        needed = sorted({i for a, b in ranges for i in range(a // g, b // g)})
        if len(needed) > _MAX_PIECES:
            raise self._err(f"a slice of an axis of {total} into {len(needed)} pieces of {g} is not representable")
        pieces = dict(zip(needed, self._pieces(x, dim, parts, x.dtype, refine=refine, which=needed), strict=True))
        out: list[_Val] = []
        for a, b in ranges:
            sel = [pieces[i] for i in range(a // g, b // g)]
            if not sel:
                out.append(_Val([[] for _ in x.axes], -1, x.dtype, False, empty=True))
            else:
                out.append(sel[0] if len(sel) == 1 else self._concat(sel, dim, x.dtype))
        return out

    def _concat(self, vals: list[_Val], dim: int, dtype: str, *, stack: bool = False) -> _Val:
        """``cat`` (``stack``) of non-empty tensors along ``dim``; each input's concat axis is
        renamed to the output's (inputs of ``stack`` get it as a new size-1 axis)."""
        if not stack and len(vals) == 1:
            return vals[0].like([list(a) for a in vals[0].axes], dtype)  # the rest were empty (a KV cache)
        c = self.A.new(len(vals) if stack else sum(self._size(v.axes[dim]) for v in vals))
        self.A.pinned.add(c)
        others = [list(a) for i, a in enumerate(vals[0].axes) if stack or i != dim]
        specs = []
        for v in vals:
            va = [list(a) for i, a in enumerate(v.axes) if stack or i != dim]
            for i, a in enumerate(va):
                if a and others[i] and not self.A.unify(others[i], a):
                    va[i] = others[i]
            size = 1 if stack else self._size(v.axes[dim])
            ci = self.A.new(size)
            self.A.name_as[ci] = c
            if size == 1:
                self.A.keep.add(ci)
            specs.append(self._spec(v, _flat([*va[:dim], [ci], *va[dim:]])))
        out = [*others[:dim], [c], *others[dim:]]
        rec = self._rec(OpKind.CONCAT, _flat(out), specs, dtype, dim=_D((c,)))
        return _Val(out, rec, dtype, False)

    # -- pass 2: emit nodes, name the atoms ------------------------------------------------------

    def _emit(self, name: str, outs: list[Any]) -> Graph:
        live = {v.rec for v in self.param_vals.values() if v.rec >= 0} | set(self.user_inputs)
        live |= {o.rec for o in _flatten(outs) if isinstance(o, _Val) and not o.empty}
        stack = list(live)
        while stack:
            for i, _ in self.recs[stack.pop()].inputs:
                if i not in live:
                    live.add(i)
                    stack.append(i)
        self._snodes: list[_SNode] = []
        self._by_id: dict[str, _SNode] = {}
        self._ids: dict[int, str] = {}
        self._coerced: dict[tuple[int, tuple[int, ...]], str] = {}
        for j, rec in enumerate(self.recs):
            if j not in live:
                continue
            self.node_path, self.node_name = rec.path, rec.stem
            ins = [self._coerce(i, exp) for i, exp in rec.inputs]
            dims = [(a, self.A.size[a]) for a in self._ir_leaves(rec.atoms)]
            self._ids[j] = self._new(rec.stem, rec.kind, ins, dims, rec.dtype, rec.path, rec.attrs).id
        self._tag_layers()
        names = self._name_atoms()
        nodes = [self._finish(sn, names) for sn in self._snodes]
        units = list(dict.fromkeys(n.layer for n in nodes if n.layer is not None and not n.is_leaf))
        units += [u for u in dict.fromkeys(n.layer for n in nodes if n.layer is not None) if u not in units]
        meta: dict[str, Any] = {"source": "torch.export", "module": type(self.module).__name__,
                                "parameter_count": sum(n.numel for n in nodes if n.is_parameter)}
        for key, dim in (("batch", "batch"), ("seq_len", "seq")):
            size = next((s for n in nodes for d, s in n.dims if d == dim and not n.is_parameter), None)
            if size is not None:
                meta[key] = size
        if units:
            meta["units"] = units
        return Graph.of(name, nodes, meta)

    def _ir_leaves(self, atoms: Iterable[int]) -> list[int]:
        return [a for a in self.A.leaves(atoms) if self.A.size[a] > 1 or a in self.A.keep]

    def _new(self, stem: str, kind: OpKind, inputs: list[str], dims: list[tuple[int, int]], dtype: str,
             path: str, attrs: dict[str, Any]) -> _SNode:
        nid, k = stem, 1
        while nid in self._by_id:
            k += 1
            nid = f"{stem}_{k}"
        sn = _SNode(nid, kind, inputs, dims, dtype, path, attrs)
        self._snodes.append(sn)
        self._by_id[nid] = sn
        return sn

    def _coerce(self, j: int, expected: list[int]) -> str:
        """The id of a node holding record ``j`` with the dims ``expected``: the record itself,
        or broadcast copies (reshape + concat) of it and / or a rename (reshape)."""
        src = self._by_id[self._ids[j]]
        have = [a for a, _ in src.dims]
        want = self._ir_leaves(expected)
        if set(have) == set(want):
            return src.id
        key = (j, tuple(want))
        if key in self._coerced:
            return self._coerced[key]
        if set(have) < set(want):  # broadcast view read whole: materialise the copies
            copies = [a for a in want if a not in set(have)]
        else:  # e.g. repeat_kv's expanded keys read with a renamed (kv_seq) axis: copies, then a rename
            expanded = {self.A.find(e) for e in self.A.expanded}
            copies = [a for a in want if a not in set(have) and self.A.find(a) in expanded]
            if math.prod(s for _, s in src.dims) * self._size(copies) != self._size(want):
                copies = []
        cur = src
        for m in copies:
            n = self.A.size[m]
            if n > _MAX_REPEAT:
                raise self._err(f"an expand by {n} of a computed tensor feeds an op that needs it whole")
            one = self._new(f"{src.id}.unsqueeze", OpKind.RESHAPE, [cur.id], [*cur.dims, (m, 1)], cur.dtype,
                            src.path, {})
            cur = one if n == 1 else self._new(f"{src.id}.repeat", OpKind.CONCAT, [one.id] * n,
                                               [*cur.dims, (m, n)], cur.dtype, src.path, {"dim": _D((m,))})
        if {a for a, _ in cur.dims} != set(want):
            if math.prod(s for _, s in cur.dims) != self._size(want):
                raise self._err(f"internal: {src.id!r} is read with dims of another size")
            cur = self._new(f"{src.id}.view", OpKind.RESHAPE, [cur.id], [(a, self.A.size[a]) for a in want],
                            src.dtype, src.path, {})
        self._coerced[key] = cur.id
        return cur.id

    def _tag_layers(self) -> None:
        """Block tags from module paths; ``embed`` / ``head`` / ``<block>.post`` around them;
        parameters and inputs take their block, else the tag of their first reader."""
        ops = [sn for sn in self._snodes if sn.kind not in (OpKind.PARAMETER, OpKind.INPUT)]
        blocks = [_block(sn.path) for sn in ops]
        if not any(blocks):
            return
        last = max(i for i, b in enumerate(blocks) if b)
        prev: str | None = None
        for i, (sn, b) in enumerate(zip(ops, blocks, strict=True)):
            if b:
                sn.layer = prev = b
            elif prev is None:
                sn.layer = "embed"
            else:
                sn.layer = "head" if i > last else f"{prev}.post"
        readers: dict[str, list[str]] = {}
        for sn in ops:
            for src in sn.inputs:
                if sn.layer is not None and sn.layer not in readers.setdefault(src, []):
                    readers[src].append(sn.layer)
        for sn in self._snodes:
            if sn.kind is OpKind.PARAMETER:
                sn.layer = _block(sn.id) or (readers.get(sn.id) or ["embed"])[0]
            elif sn.kind is OpKind.INPUT:  # an input shared by several blocks (rotary tables, masks): embed
                units = readers.get(sn.id) or ["embed"]
                sn.layer = units[0] if len(units) == 1 else "embed"

    def _name_atoms(self) -> dict[int, str]:
        """A name per atom class: its best hint (``heads``; ``heads_8`` when another size already
        took ``heads``), user names, else ``d<k>``; clashes within one op get a suffix."""
        at = self.A

        def cls(a: int) -> int:
            return at.find(at.name_as[a]) if a in at.name_as else at.find(a)

        order: list[int] = []
        seen: set[int] = set()
        for sn in self._snodes:
            for a, _ in sn.dims:
                c = cls(a)
                if c not in seen:
                    seen.add(c)
                    order.append(c)
        names: dict[int, str] = {}
        by_hint: dict[str, dict[int, str]] = {}
        for c in sorted(order, key=lambda c: at.hints[c][:2] if c in at.hints else (99, 0)):
            if c in at.hints:
                h = at.hints[c][2]
                sizes = by_hint.setdefault(h, {})
                if at.size[c] not in sizes:
                    sizes[at.size[c]] = h if not sizes else f"{h}_{at.size[c]}"
                names[c] = sizes[at.size[c]]
        derived = {at.find(a): v for a, v in at.derived.items()}
        for c in order:
            src = derived.get(c)
            if c not in names and src is not None and at.find(src[0]) not in at.children:
                base = names.get(at.find(src[0]))
                if base is not None:
                    names[c] = base + src[1]
        taken = set(names.values())
        k = 0
        for c in order:
            if c not in names:
                while f"d{k}" in taken:
                    k += 1
                names[c] = f"d{k}"
                taken.add(names[c])
        changed = True
        while changed:
            changed = False
            for sn in self._snodes:
                groups = [sn.dims] + ([] if sn.kind is OpKind.RESHAPE else [self._by_id[i].dims for i in sn.inputs])
                owner: dict[str, int] = {}
                for dims in groups:
                    for a, _ in dims:
                        c = cls(a)
                        nm = names[c]
                        if owner.setdefault(nm, c) != c:
                            k2 = 2
                            while f"{nm}_{k2}" in taken:
                                k2 += 1
                            names[c] = f"{nm}_{k2}"
                            taken.add(names[c])
                            changed = True
        return {a: names[cls(a)] for sn in self._snodes for a, _ in sn.dims}

    def _finish(self, sn: _SNode, names: dict[int, str]) -> Node:
        def res(v: Any) -> Any:
            if isinstance(v, _D):
                lv = self._ir_leaves(v.atoms) if v.many else self.A.leaves(v.atoms)
                if not v.many and len(lv) != 1:
                    raise ConfigError(f"internal: attribute of {sn.id!r} names {len(lv)} dims")
                got = [names[a] for a in lv]
                return got if v.many else got[0]
            return v

        attrs = {k: res(v) for k, v in sn.attrs.items()}
        if sn.kind is OpKind.EINSUM:
            ops = [" ".join(names[a] for a, _ in self._by_id[i].dims) for i in sn.inputs]
            attrs["equation"] = f"{', '.join(ops)} -> {' '.join(names[a] for a, _ in sn.dims)}"
        dims = [(names[a], s) for a, s in sn.dims]
        return make_node(sn.id, sn.kind, sn.inputs, tuple(dims), dtype=sn.dtype, layer=sn.layer, **attrs)


def _live(graph: Any) -> set[Any]:
    """Nodes the graph's output depends on."""
    live: set[Any] = set()
    stack = [n for n in graph.nodes if n.op == "output"]
    while stack:
        n = stack.pop()
        if n not in live:
            live.add(n)
            stack.extend(n.all_input_nodes)
    return live


def _alias_chain(n: Any, x: Any, inside: set[Any]) -> bool:
    """Whether ``n`` is ``x`` through casts and copies only (all inside the region)."""
    while n is not x:
        packet = getattr(getattr(getattr(n, "target", None), "overloadpacket", None), "__name__", None)
        if n not in inside or packet not in _ALIAS or not n.args or not _is_fx_node(n.args[0]):
            return False
        n = n.args[0]
    return True


def _permutation(op: str, args: dict[str, Any], n: int) -> list[int]:
    if op in ("transpose", "swapaxes", "swapdims"):
        k0, k1 = ("axis0", "axis1") if "axis0" in args else ("dim0", "dim1")
        a, b = int(args[k0]) % n, int(args[k1]) % n
        perm = list(range(n))
        perm[a], perm[b] = perm[b], perm[a]
        return perm
    if op == "permute":
        return [int(d) % n for d in args["dims"]]
    if op in ("t", "numpy_T"):  # Tensor.t and Tensor.T: all axes reversed
        return list(range(n))[::-1]
    src_raw, dst_raw = args["source"], args["destination"]
    src = [int(s) % n for s in (src_raw if isinstance(src_raw, list | tuple) else [src_raw])]
    dst = [int(d) % n for d in (dst_raw if isinstance(dst_raw, list | tuple) else [dst_raw])]
    perm = [-1] * n
    for s, d in zip(src, dst, strict=True):
        perm[d] = s
    rest = iter(i for i in range(n) if i not in src)
    return [p if p >= 0 else next(rest) for p in perm]


# ---------------------------------------------------------------------------------------------
# Operator handlers (the explicit table is _HANDLERS, documented by OP_TABLE)


def _out(t: _Tracer, node: Any) -> tuple[list[int], str]:
    meta = node.meta.get("val")
    return [int(s) for s in meta.shape], t._dtype(meta.dtype)


def _h_view(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    x = args.get("self", args.get("input"))
    assert isinstance(x, _Val)
    shape, dtype = _out(t, node)
    v = t._view(op, args, x, node.meta["val"])
    if v is not None:
        return v
    axes = [[t.A.new(s)] if s > 1 else [] for s in shape]  # axes that cannot be regrouped: new ones
    return _Val(axes, t._rec(OpKind.RESHAPE, _flat(axes), [t._spec(x)], dtype), dtype, False)


def _h_linear(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    x, w, b = args["input"], args["weight"], args.get("bias")
    _, dtype = _out(t, node)
    batch = [f"b{i}" for i in range(len(x.axes) - 1)]
    wl, out = (["n", "k"], [*batch, "n"]) if len(w.axes) == 2 else (["k"], batch)
    y = t._contract([(x, [*batch, "k"]), (w, wl)], out, dtype, "mm" if isinstance(b, _Val) else None)
    return t._ew([y, b], "add", "add", dtype) if isinstance(b, _Val) else y


def _mm_letters(n1: int, n2: int) -> tuple[list[str], list[str], list[str]]:
    """torch.matmul's broadcasting as einsum letters."""
    if n1 == 1 and n2 == 1:
        return ["k"], ["k"], []
    nb = max(n1, n2, 2) - 2
    batch = [f"b{i}" for i in range(nb)]
    a = ["k"] if n1 == 1 else [*batch[nb - (n1 - 2):], "m", "k"]
    b = ["k"] if n2 == 1 else [*batch[nb - (n2 - 2):], "k", "n"]
    return a, b, [*batch, *([] if n1 == 1 else ["m"]), *([] if n2 == 1 else ["n"])]


def _h_matmul(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    _, dtype = _out(t, node)
    bias = args["self"] if op in ("addmm", "baddbmm") else None
    if op == "addmm":
        a, b = args["mat1"], args["mat2"]
    elif op == "baddbmm":
        a, b = args["batch1"], args["batch2"]
    else:
        a, b = args["self"], args.get("mat2", args.get("other"))
    la, lb, lo = _mm_letters(len(a.axes), len(b.axes))
    y = t._contract([(a, la), (b, lb)], lo, dtype, "mm" if bias is not None else None)
    return t._ew([y, bias], "add", "add", dtype) if isinstance(bias, _Val) else y


def _h_einsum(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    eq = str(args["equation"]).replace(" ", "")
    tensors = args["tensors"]
    lhs, arrow, rhs = eq.partition("->")
    specs = lhs.split(",")
    if "." in eq or len(specs) != len(tensors):
        raise t._err(f"einsum equation {eq!r} (ellipsis or operand count) is not supported")
    if not arrow:
        rhs = "".join(sorted(c for c in set(lhs) - {","} if lhs.count(c) == 1))
    return t._contract([(v, list(s)) for v, s in zip(tensors, specs, strict=True)], list(rhs), _out(t, node)[1])


_EW_FNS: Mapping[str, tuple[str, str]] = {
    "add": ("add", "add"), "sub": ("sub", "sub"), "rsub": ("sub", "sub"), "mul": ("mul", "scale"),
    "div": ("mul", "scale"), "neg": ("scale", "scale"), "square": ("mul", "mul"), "gelu": ("gelu", "gelu"),
    "silu": ("silu", "silu"), "relu": ("relu", "relu"), "tanh": ("tanh", "tanh"),
    "sigmoid": ("sigmoid", "sigmoid"), "exp": ("exp", "exp"),
}


def _h_pointwise(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    fn_t, fn_s = _EW_FNS[op]
    operands: list[Any] = [args["self"]]
    if op in ("add", "sub", "rsub", "mul", "div"):
        operands.append(args.get("other"))
        if op == "div" and args.get("rounding_mode") is not None:
            raise t._err("div with a rounding_mode is not a mapped elementwise op")
    y = t._ew(operands, fn_t, fn_s, _out(t, node)[1])
    if op in ("gelu", "silu", "relu") and y.axes:
        t._hint(y.axes[-1], "ffn", _P_FFN)
    return y


def _h_pow(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    x, e = args.get("self"), args.get("exponent")
    if not isinstance(x, _Val) or isinstance(e, _Val) or e not in (1, 2, 3):
        raise t._err("unsupported operator aten.pow (only a tensor to the power 2 or 3 maps, to mul)")
    return x if e == 1 else t._ew([x], "mul", "mul", _out(t, node)[1])


def _h_dropout(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    x = args["input"]
    p, train = float(args.get("p") or 0.0), bool(args.get("train", True))
    _, dtype = _out(t, node)
    if not train or p <= 0:
        return x.like([list(a) for a in x.axes], dtype)  # type: ignore[no-any-return]
    rec = t._rec(OpKind.DROPOUT, _flat(x.axes), [t._spec(x)], dtype, p=p)
    return _Val([list(a) for a in x.axes], rec, dtype, False)


def _h_softmax(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    x = args["self"]
    _, dtype = _out(t, node)
    d, exp = t._single(x, int(args["dim"]) % max(len(x.axes), 1))
    attrs: dict[str, Any] = {"dim": _D((d,))}
    if "log" in op:
        attrs["log"] = True
    rec = t._rec(OpKind.SOFTMAX, exp, [t._spec(x, exp)], dtype, **attrs)
    return _Val([list(a) for a in x.axes], rec, dtype, False)


def _h_norm(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    kind = OpKind.LAYERNORM if op == "layer_norm" else OpKind.RMSNORM
    w, b, eps = args.get("weight"), args.get("bias"), args.get("eps")
    return t._norm(kind, args["input"], len(args["normalized_shape"]), w if isinstance(w, _Val) else None,
                   b if isinstance(b, _Val) else None, _out(t, node)[1],
                   **({"eps": float(eps)} if eps is not None else {}))


def _h_embedding(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    w, ids = args["weight"], args["indices"]
    _, dtype = _out(t, node)
    v, exp_w = t._single(w, 0)
    where = t.node_path.rpartition(".")[2].lower()
    if "type" in where or any("type" in d for d in ids.deps):
        t._hint([v], "types", _P_EMBED + 1)
    elif "pos" in where or not ids.deps:
        t._hint([v], "positions", _P_EMBED + 1)
    elif not t.vocab_named:
        t._hint([v], "vocab", _P_EMBED)
        t.vocab_named = True
    for ax in w.axes[1:]:
        t._hint(ax, "hidden", _P_NORM)
    out = [list(a) for a in ids.axes] + [list(a) for a in w.axes[1:]]
    rec = t._rec(OpKind.EMBEDDING, _flat(out), [t._spec(ids), t._spec(w, exp_w)], dtype, index_dim=_D((v,)))
    return _Val(out, rec, dtype, False)


def _h_sdpa(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    q, k, v, mask = args["query"], args["key"], args["value"], args.get("attn_mask")
    _, dtype = _out(t, node)
    if min(len(q.axes), len(k.axes), len(v.axes)) < 2:
        raise t._err("scaled_dot_product_attention needs inputs of rank >= 2")
    if t._size(q.axes[-1]) != t._size(v.axes[-1]):
        raise t._err("attention whose value head size differs from the query's is not representable")
    qa, ka, va = ([list(a) for a in x.axes] for x in (q, k, v))

    def tie(dst: list[list[int]], i: int, src: list[int]) -> None:
        if dst[i] and src and t._size(src) == t._size(dst[i]) and not t.A.unify(src, dst[i]):
            dst[i] = src

    tie(ka, -1, qa[-1])
    tie(va, -1, qa[-1])
    tie(va, -2, ka[-2])
    for j in range(3, max(len(qa), len(ka), len(va)) + 1):
        if j <= len(qa) and j <= len(ka):
            tie(ka, -j, qa[-j])
        if j <= len(ka) and j <= len(va):
            tie(va, -j, ka[-j])
    t._hint(qa[-1], "head_dim", _P_ATTN)
    t._hint(qa[-2], "seq", _P_ATTN)
    if t.A.leaves(qa[-2]) != t.A.leaves(ka[-2]):
        t._hint(ka[-2], "kv_seq", _P_ATTN)
    if len(qa) >= 3:
        hq = t.A.leaves(qa[-3])
        hk = t.A.leaves(ka[-3]) if len(ka) >= 3 else []
        if len(hq) == 1:
            t.A.hint(hq[0], "heads", _P_ATTN)
        elif len(hq) == 2:  # grouped-query heads after repeat_kv: [kv_heads, q_per_kv]
            t.A.hint(hq[0], "kv_heads", _P_ATTN)
            t.A.hint(hq[1], "q_per_kv", _P_ATTN)
        if len(hk) == 1 and hk != hq:
            t.A.hint(hk[0], "kv_heads", _P_ATTN)
    if len(qa) >= 4:
        t._hint(qa[-4], "batch", _P_ATTN)
    out_axes = [list(a) for a in qa]
    hd, _ = t._single(q.like(qa), len(qa) - 1)
    kv, _ = t._single(k.like(ka), len(ka) - 2)
    if t.A.leaves(qa[-1]) != [hd]:  # a head dim split elsewhere: read q, k, v with it whole
        qa[-1], ka[-1], va[-1] = [hd], [hd], [hd]
    if t.A.leaves(ka[-2]) != [kv]:
        ka[-2], va[-2] = [kv], [kv]
    ins = [t._spec(q, _flat(qa)), t._spec(k, _flat(ka)), t._spec(v, _flat(va))]
    if isinstance(mask, _Val):
        ma = [list(a) for a in mask.axes]
        scores = [*qa[:-1], ka[-2]]
        for j in range(min(len(ma), len(scores)), 0, -1):  # batch, heads, seq before kv_seq
            if ma[-j] and t._size(ma[-j]) == t._size(scores[-j]):
                t.A.unify(scores[-j], ma[-j])
        if len(ma) >= 2 and ma[-1] and t.A.leaves(ma[-1]) != t.A.leaves(ka[-2]):
            t._hint(ma[-1], "kv_seq", _P_ATTN + 1)
        ins.append(t._spec(mask, _flat(ma)))
    attrs: dict[str, Any] = {"causal": bool(args.get("is_causal")), "dropout": float(args.get("dropout_p") or 0.0),
                             "head_dim": _D((hd,)), "kv_seq_dim": _D((kv,))}
    if args.get("scale") is not None:
        attrs["scale"] = float(args["scale"])
    rec = t._rec(OpKind.ATTENTION, _flat(qa), ins, dtype, **attrs)
    return _Val(out_axes, rec, dtype, False)


def _h_loss(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    x, target = args["self"], args["target"]
    cls = 1 if len(x.axes) >= 2 else 0
    c, exp_x = t._single(x, cls)
    t._hint([c], "vocab", _P_CLASS)
    xa = [list(a) for i, a in enumerate(x.axes) if i != cls]
    ta = [list(a) for a in target.axes]
    if [t._size(a) for a in xa] != [t._size(a) for a in ta]:
        raise t._err(f"{op}: the labels' shape does not match the logits'")
    for i in range(len(ta)):
        if xa[i] and not t.A.unify(xa[i], ta[i]):
            ta[i] = xa[i]
    attrs: dict[str, Any] = {"class_dim": _D((c,)), "ignore_index": int(args.get("ignore_index", -100))}
    if args.get("label_smoothing"):
        attrs["label_smoothing"] = float(args["label_smoothing"])
    if op != "cross_entropy_loss":
        attrs["log_probs_input"] = True
    reduction = int(args.get("reduction", 1))
    rec = t._rec(OpKind.CROSS_ENTROPY, _flat(xa), [t._spec(x, exp_x), t._spec(target, _flat(ta))], "fp32",
                 "tokens" if reduction and _flat(xa) else None, **attrs)
    if reduction == 0 or not _flat(xa):
        return _Val(xa, rec, "fp32", False)
    red = t._rec(OpKind.REDUCE, [], [(rec, _flat(xa))], "fp32", over=_D(tuple(_flat(xa)), many=True),
                 op="mean" if reduction == 1 else "sum")
    return _Val([], red, "fp32", False)


def _h_reduce(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    x = args["self"]
    dims, n = args.get("dim"), len(x.axes)
    which = set(range(n)) if not dims else {int(d) % max(n, 1) for d in dims}
    keepdim = bool(args.get("keepdim", False))
    red = _flat(x.axes[i] for i in sorted(which))
    out = [([] if i in which else list(a)) for i, a in enumerate(x.axes) if keepdim or i not in which]
    _, dtype = _out(t, node)
    if not red:
        return x.like(out, dtype)  # type: ignore[no-any-return]
    rec = t._rec(OpKind.REDUCE, _flat(out), [t._spec(x)], dtype, over=_D(tuple(red), many=True), op=op)
    return _Val(out, rec, dtype, False)


def _h_cat(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    shape, dtype = _out(t, node)
    vals = [v for v in args["tensors"] if isinstance(v, _Val) and not v.empty]
    if not vals:
        raise t._err(f"{op} of empty tensors")
    return t._concat(vals, int(args.get("dim", 0)) % len(shape), dtype, stack=op == "stack")


def _h_split(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> Any:
    x = args.get("self", args.get("input"))
    assert isinstance(x, _Val)
    dim = int(args.get("dim", 0)) % len(x.axes)
    if op == "unbind":
        return [t._select(x, dim, i, x.dtype, f"{i}") for i in range(len(node.meta["val"]))]
    total = t._size(x.axes[dim])
    if op in ("slice", "narrow"):
        if op == "slice":
            step = int(args.get("step") or 1)
            start = 0 if args.get("start") is None else int(args["start"])
            end = total if args.get("end") is None else int(args["end"])
            start, end = (start + total if start < 0 else start), (end + total if end < 0 else end)
            start, end = max(0, min(start, total)), max(0, min(end, total))
        else:
            step, start = 1, int(args["start"]) % total
            end = start + int(args["length"])
        if step != 1:
            if total % step or start >= step or -(-(end - start) // step) != total // step:
                raise t._err(f"unsupported operator aten.{op}: a strided slice of {start}:{end}:{step} over "
                             f"{total} elements is not representable")
            return t._strided(x, dim, step, start, x.dtype)
        return t._ranges(x, dim, [(start, end)], refine=False)[0]
    bounds = [0]
    for m in node.meta["val"]:
        bounds.append(bounds[-1] + int(m.shape[dim]))
    return t._ranges(x, dim, list(itertools.pairwise(bounds)), refine=True)


def _h_select(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> _Val:
    x = args["self"]
    dim = int(args["dim"]) % len(x.axes)
    return t._select(x, dim, int(args["index"]) % t._size(x.axes[dim]), _out(t, node)[1], None)


def _h_topk(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> list[Any]:
    return map_topk(t, node, args)


def _h_gather(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> Any:
    return map_gather(t, node, args)


def _h_masked_fill(t: _Tracer, node: Any, args: dict[str, Any], op: str) -> Any:
    return map_masked_fill(t, node, args)


_HANDLERS: Mapping[str, Handler] = {
    "linear": _h_linear,
    **dict.fromkeys(("addmm", "baddbmm", "mm", "bmm", "matmul"), _h_matmul),
    "einsum": _h_einsum,
    **dict.fromkeys(_EW_FNS, _h_pointwise),
    "pow": _h_pow,
    **dict.fromkeys(("dropout", "feature_dropout", "alpha_dropout"), _h_dropout),
    **dict.fromkeys(("layer_norm", "rms_norm"), _h_norm),
    **dict.fromkeys(("softmax", "_softmax", "log_softmax", "_log_softmax"), _h_softmax),
    "embedding": _h_embedding,
    "scaled_dot_product_attention": _h_sdpa,
    **dict.fromkeys(("cross_entropy_loss", "nll_loss", "nll_loss_nd"), _h_loss),
    **dict.fromkeys(("mean", "sum"), _h_reduce),
    **dict.fromkeys(("cat", "stack"), _h_cat),
    **dict.fromkeys(_VIEWS, _h_view),
    **dict.fromkeys(("split", "split_with_sizes", "unsafe_split", "chunk", "unbind", "slice", "narrow"), _h_split),
    "select": _h_select,
    "topk": _h_topk,
    "gather": _h_gather,
    "masked_fill": _h_masked_fill,
}
