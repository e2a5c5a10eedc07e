"""The tracer's state and the mappings op handlers share: records over atoms, elementwise ops,
contractions, norms, views, selects, slices and concatenation."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from parplan.solver.errors import ConfigError
from parplan.solver.frontends.torch_trace.atoms import Atoms
from parplan.solver.frontends.torch_trace.constants import (
    ALIAS,
    EXPAND,
    FLOAT,
    MAX_PIECES,
    P_MISC,
    P_NORM,
    PERMUTE,
    TORCH_DTYPE,
)
from parplan.solver.frontends.torch_trace.fx import stack_paths
from parplan.solver.frontends.torch_trace.records import DimRef, Record, Value, flat
from parplan.solver.ir import OpKind


class Recorder:
    """Pass-1 state of one trace: the atoms, the records, the parameters' values, and where in the
    module the node being mapped sits (for errors, ids and layer tags)."""

    def __init__(self, module: Any, float_dtype: str | None) -> None:
        self.module = module
        self.float_dtype = float_dtype
        self.A = Atoms()
        self.recs: list[Record] = []
        self.node_path = ""  # module path of the node being mapped (errors, ids, layer tags)
        self.node_name = ""
        self.vocab_named = False
        self.param_vals: dict[str, Value] = {}
        self.param_of: dict[str, str] = {}  # exported target -> canonical parameter name
        self.user_inputs: list[int] = []
        self._split_cache: dict[tuple[Any, ...], Value] = {}
        self.router: tuple[Value, int] | None = None  # the last top-k router's (probabilities, k)
        canon: dict[int, str] = {}
        for n, p in module.named_parameters():
            canon[id(p)] = n
            self.param_vals[n] = self.leaf(OpKind.PARAMETER, n, list(p.shape), self.ir_dtype(p.dtype),
                                           path=n.rpartition(".")[0], aux=False)
        for n, p in module.named_parameters(remove_duplicate=False):
            self.param_of["inner." + n] = canon[id(p)]

    # -- small helpers ---------------------------------------------------------------------

    def ir_dtype(self, tdtype: Any) -> str:
        s = str(tdtype).removeprefix("torch.")
        d = TORCH_DTYPE.get(s)
        if d is None:
            raise self.error(f"unsupported dtype {s}")
        if self.float_dtype is not None and d in FLOAT:
            return self.float_dtype
        return d

    def error(self, what: str) -> ConfigError:
        return ConfigError(f"{what} at module '{self.node_path or '<root>'}' (node {self.node_name})")

    def size_of(self, atoms: Iterable[int]) -> int:
        return math.prod(self.A.size[a] for a in atoms)

    def leaf(self, kind: OpKind, stem: str, shape: list[int], dtype: str, *, path: str, aux: bool,
             attrs: dict[str, Any] | None = None, deps: frozenset[str] = frozenset()) -> Value:
        """A parameter / input record with fresh atoms (an empty tensor gets no record)."""
        if any(s == 0 for s in shape):
            return Value([[] for _ in shape], -1, dtype, aux, deps=deps, empty=True)
        axes = [[self.A.new(s)] if s > 1 else [] for s in shape]
        rec = self._add(Record(kind, flat(axes), [], dtype, path, stem, dict(attrs or {})))
        return Value(axes, rec, dtype, aux, deps=deps)

    def _add(self, rec: Record) -> int:
        if not self.A.register(rec.atoms):
            raise self.error(f"cannot name the dims of {rec.kind.value} {rec.stem!r}: two of its axes are one axis")
        for _, exp in rec.inputs:
            self.A.register(exp)
        self.recs.append(rec)
        return len(self.recs) - 1

    def record(self, kind: OpKind, atoms: list[int], inputs: list[tuple[int, list[int]]], dtype: str,
               suffix: str | None = None, **attrs: Any) -> int:
        """A record for the node being mapped (``suffix`` for its intermediate records)."""
        stem = self.node_name if suffix is None else f"{self.node_name}.{suffix}"
        return self._add(Record(kind, atoms, inputs, dtype, self.node_path,
                                f"{self.node_path}.{stem}" if self.node_path else stem, attrs))

    def input_slot(self, v: Value, expected: list[int] | None = None) -> tuple[int, list[int]]:
        """An input slot reading ``v`` as ``expected`` atoms (default: all its axes; atoms its record
        lacks are materialised at emission)."""
        if v.empty:
            raise self.error("an empty tensor feeds a mapped operator")
        exp = flat(v.axes) if expected is None else expected
        if v.aux and v.bcast:  # a broadcast constant: its own input record
            if not v.own:
                base = self.recs[v.rec]
                v.own.append(self._add(Record(OpKind.INPUT, flat(v.axes), [], v.dtype, base.path,
                                              base.stem + ".expanded", dict(base.attrs))))
            return v.own[0], exp
        return v.rec, exp

    def single_dim(self, v: Value, axis: int) -> tuple[int, list[int]]:
        """The one atom of ``v.axes[axis]`` (pinned: it stays one dim), or a fresh atom standing
        for the whole axis when it has several; and the atoms ``v`` is then read as."""
        lv = self.A.leaves(v.axes[axis])
        if len(lv) == 1:
            self.A.pinned.add(lv[0])
            return lv[0], flat(v.axes)
        m = self.A.new(self.size_of(lv))
        if not lv:
            self.A.keep.add(m)
        self.A.pinned.add(m)
        return m, [*flat(v.axes[:axis]), m, *flat(v.axes[axis + 1:])]

    def hint(self, atoms: Sequence[int], name: str, priority: int) -> None:
        lv = self.A.leaves(atoms)
        if len(lv) == 1:
            self.A.hint(lv[0], name, priority)

    def fresh_like(self, atoms: Sequence[int]) -> int:
        """A new atom of the size of ``atoms`` (a second copy of an axis, e.g. ``kv_seq``)."""
        f = self.A.new(self.size_of(atoms))
        lv = self.A.leaves(atoms)
        h = self.A.hints.get(lv[0]) if len(lv) == 1 else None
        if h is not None:
            self.A.hint(f, "kv_seq" if h[2] == "seq" else h[2] + "_2", h[0] + 1)
        return f

    def _bcast_leaves(self, v: Value) -> set[int]:
        return set(self.A.leaves(v.bcast)) if v.bcast else set()

    def set_where(self, node: Any) -> None:
        paths = stack_paths(node)
        self.node_path = paths[-1] if paths else ""
        self.node_name = node.name

    def is_param(self, v: Value) -> bool:
        return not v.aux and v.rec >= 0 and self.recs[v.rec].kind is OpKind.PARAMETER

    def canonical_name(self, p: Any) -> str:
        return next((n for n, q in self.module.named_parameters() if q is p), "")

    # -- views -----------------------------------------------------------------------------

    def view(self, op: str, args: dict[str, Any], x: Value, meta: Any) -> Value | None:
        """A view op on atoms (no record); None when the axes cannot be regrouped."""
        shape = [int(s) for s in meta.shape]
        dtype = self.ir_dtype(meta.dtype)
        n = len(x.axes)
        if op in ALIAS:
            return x.like([list(a) for a in x.axes], dtype)
        if op in PERMUTE:
            return x.like([list(x.axes[p]) for p in permutation(op, args, n)], dtype)
        if op in EXPAND:
            axes: list[list[int]] = []
            new = set(x.bcast)
            for i, s in enumerate(shape):
                j = i - (len(shape) - n)
                if j >= 0 and self.size_of(x.axes[j]) == s:
                    axes.append(list(x.axes[j]))
                elif s == 1:
                    axes.append([])
                else:
                    a = self.A.new(s)
                    new.add(a)
                    self.A.expanded.add(a)
                    axes.append([a])
            self.A.register(flat(axes))
            return x.like(axes, dtype, frozenset(new))
        groups = self.A.regroup(self.A.leaves(flat(x.axes)), [s for s in shape if s > 1])
        if groups is None:
            return None
        it = iter(groups)
        return x.like([next(it) if s > 1 else [] for s in shape], dtype)

    # -- shared mappings -------------------------------------------------------------------

    def elementwise(self, operands: list[Any], fn_tensor: str, fn_scalar: str, dtype: str,
                    suffix: str | None = None) -> Value:
        """An elementwise op broadcasting torch-style; numbers and scalar constants are dropped
        (``fn_scalar`` then names the op, e.g. ``scale`` for a multiplication by a number)."""
        tens = [v for v in operands if isinstance(v, Value) and not (v.aux and not flat(v.axes))]
        if not tens:
            raise self.error("elementwise op without a tensor operand")
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
                f = self.fresh_like(ax)
                for _, ti, ai in cands:
                    exp[ti][ai] = [f]
                ax = [f]
            seen |= set(self.A.leaves(ax))
            out.append(list(ax))
        inputs = []
        present: set[int] = set()
        for ti, v in enumerate(tens):
            keep = [a for a in self.A.leaves(flat(exp[ti])) if a not in bl[ti]]
            present.update(keep)
            inputs.append(self.input_slot(v, keep))
        out_leaves = self.A.leaves(flat(out))
        rec = self.record(OpKind.ELEMENTWISE, [a for a in out_leaves if a in present], inputs, dtype, suffix, fn=fn)
        return Value(out, rec, dtype, False, frozenset(a for a in out_leaves if a not in present))

    def contract(self, ops: list[tuple[Value, list[str]]], out: list[str], dtype: str,
                 suffix: str | None = None) -> Value:
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
                f = self.fresh_like(first[letter])
                for oi, (v, letters) in enumerate(ops):
                    for i, ll in enumerate(letters):
                        if ll == letter and v.axes[i]:
                            exp[oi][i] = [f]
                first[letter] = [f]
                lv = {f}
            used |= lv
        self.A.register(flat(first.values()))
        out_axes = [list(first.get(letter, [])) for letter in out]
        inputs = [self.input_slot(v, flat(e)) for (v, _), e in zip(ops, exp, strict=True)]
        rec = self.record(OpKind.EINSUM, flat(out_axes), inputs, dtype, suffix)
        return Value(out_axes, rec, dtype, False)

    def norm(self, kind: OpKind, x: Value, k: int, w: Value | None, b: Value | None, dtype: str,
             **attrs: Any) -> Value:
        """layernorm / rmsnorm over the last ``k`` axes of x (one dim in the IR)."""
        if w is None:
            raise self.error(f"{kind.value} without an affine weight is not representable")
        xm = x.like([*x.axes[: len(x.axes) - k], flat(x.axes[len(x.axes) - k:])]) if k != 1 else x
        d, exp = self.single_dim(xm, len(xm.axes) - 1)
        self.hint([d], "hidden", P_NORM)
        ins = [self.input_slot(x, exp)]
        for p in (w, b):
            if p is not None:
                self.A.unify([d], flat(p.axes))
                ins.append(self.input_slot(p, [d]))
        rec = self.record(kind, exp, ins, dtype, dim=DimRef((d,)), **attrs)
        return Value([list(a) for a in x.axes], rec, dtype, False)

    def select(self, x: Value, dim: int, index: int, dtype: str, suffix: str | None) -> Value:
        """Index ``index`` of axis ``dim``: a reduce(op=select) over the axis."""
        out = [list(a) for i, a in enumerate(x.axes) if i != dim]
        if not x.axes[dim]:
            return x.like(out, dtype)
        rec = self.record(OpKind.REDUCE, flat(out), [self.input_slot(x)], dtype, suffix,
                          over=DimRef(tuple(x.axes[dim]), many=True), op="select", index=index)
        return Value(out, rec, dtype, False)

    def pieces(self, x: Value, dim: int, parts: int, dtype: str, *, refine: bool,
               which: Sequence[int] | None = None) -> list[Value]:
        """``parts`` equal pieces of axis ``dim`` (only those ``which`` lists), each a select. With
        ``refine`` (split, chunk) the axis itself is split into [parts, piece] everywhere (a fused
        qkv weight gets a ``qkv`` dim); otherwise (slices) a reshape of this tensor makes them."""
        total = self.size_of(x.axes[dim])
        piece = total // parts
        src = self.A.leaves(x.axes[dim])
        groups = self.A.regroup(src, [parts, piece], refine=refine)
        if groups is not None:
            if refine and len(groups[0]) == 1:
                self.A.hint(groups[0][0], "qkv" if parts == 3 else "parts", P_MISC)
            base = x.like([*x.axes[:dim], groups[0], groups[1], *x.axes[dim + 1:]], dtype)
        else:
            key = (x.rec, tuple(flat(x.axes)), dim, parts)
            cached = self._split_cache.get(key)
            if cached is None:
                p, q = self.A.new(parts), [self.A.new(piece)] if piece > 1 else []
                self.A.hint(p, "parts", P_MISC)
                if q and len(src) == 1:
                    self.A.derived[q[0]] = (src[0], "_half" if parts == 2 else "_piece")
                axes = [*(list(a) for a in x.axes[:dim]), [p], q, *(list(a) for a in x.axes[dim + 1:])]
                rec = self.record(OpKind.RESHAPE, flat(axes), [self.input_slot(x)], dtype, "split")
                cached = self._split_cache[key] = Value(axes, rec, dtype, False)
            base = cached
        return [self.select(base, dim, i, dtype, f"{i}") for i in (range(parts) if which is None else which)]

    def strided(self, x: Value, dim: int, step: int, start: int, dtype: str) -> Value:
        """Every ``step``-th element of axis ``dim`` from ``start`` (< step), e.g. the even and odd
        halves of an interleaved rotary embedding: the axis as ``[rows, step]`` (a reshape of this
        tensor unless its atoms already split so), and a select of ``start`` over ``step``."""
        rows = self.size_of(x.axes[dim]) // step
        groups = self.A.regroup(self.A.leaves(x.axes[dim]), [rows, step], refine=False)
        if groups is not None:
            base = x.like([*x.axes[:dim], groups[0], groups[1], *x.axes[dim + 1:]], dtype)
        else:
            key = (x.rec, tuple(flat(x.axes)), dim, -step)
            cached = self._split_cache.get(key)
            if cached is None:
                r, q = ([self.A.new(rows)] if rows > 1 else []), self.A.new(step)
                self.A.hint(q, "interleave", P_MISC)
                axes = [*(list(a) for a in x.axes[:dim]), r, [q], *(list(a) for a in x.axes[dim + 1:])]
                rec = self.record(OpKind.RESHAPE, flat(axes), [self.input_slot(x)], dtype, "interleave")
                cached = self._split_cache[key] = Value(axes, rec, dtype, False)
            base = cached
        return self.select(base, dim + 1, start, dtype, f"{start}")

    def ranges(self, x: Value, dim: int, ranges: list[tuple[int, int]], *, refine: bool) -> list[Value]:
        """Ranges ``[a, b)`` of axis ``dim``: the axis cut into pieces of gcd(bounds) elements
        (see :meth:`_pieces`), and a range of several pieces their concat."""
        total = self.size_of(x.axes[dim])
        if ranges == [(0, total)]:
            return [x.like([list(a) for a in x.axes])]
        g = math.gcd(total, *(c for r in ranges for c in r))
        parts = total // g
        needed = sorted({i for a, b in ranges for i in range(a // g, b // g)})
        if len(needed) > MAX_PIECES:
            raise self.error(f"a slice of an axis of {total} into {len(needed)} pieces of {g} is not representable")
        pieces = dict(zip(needed, self.pieces(x, dim, parts, x.dtype, refine=refine, which=needed), strict=True))
        out: list[Value] = []
        for a, b in ranges:
            sel = [pieces[i] for i in range(a // g, b // g)]
            if not sel:
                out.append(Value([[] for _ in x.axes], -1, x.dtype, False, empty=True))
            else:
                out.append(sel[0] if len(sel) == 1 else self.concat(sel, dim, x.dtype))
        return out

    def concat(self, vals: list[Value], dim: int, dtype: str, *, stack: bool = False) -> Value:
        """``cat`` (``stack``) of non-empty tensors along ``dim``; each input's concat axis is
        renamed to the output's (inputs of ``stack`` get it as a new size-1 axis)."""
        if not stack and len(vals) == 1:
            return vals[0].like([list(a) for a in vals[0].axes], dtype)  # the rest were empty (a KV cache)
        c = self.A.new(len(vals) if stack else sum(self.size_of(v.axes[dim]) for v in vals))
        self.A.pinned.add(c)
        others = [list(a) for i, a in enumerate(vals[0].axes) if stack or i != dim]
        specs = []
        for v in vals:
            va = [list(a) for i, a in enumerate(v.axes) if stack or i != dim]
            for i, a in enumerate(va):
                if a and others[i] and not self.A.unify(others[i], a):
                    va[i] = others[i]
            size = 1 if stack else self.size_of(v.axes[dim])
            ci = self.A.new(size)
            self.A.name_as[ci] = c
            if size == 1:
                self.A.keep.add(ci)
            specs.append(self.input_slot(v, flat([*va[:dim], [ci], *va[dim:]])))
        out = [*others[:dim], [c], *others[dim:]]
        rec = self.record(OpKind.CONCAT, flat(out), specs, dtype, dim=DimRef((c,)))
        return Value(out, rec, dtype, False)


def permutation(op: str, args: dict[str, Any], n: int) -> list[int]:
    """The source axis of each output axis of a permuting view op."""
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
