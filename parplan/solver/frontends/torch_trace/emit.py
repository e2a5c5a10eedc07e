"""Pass 2 of the tracer: the live records become IR nodes (with broadcast copies and renames where
a reader needs them), blocks get layer tags from module paths, and atoms get dim names."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from parplan.solver.errors import ConfigError
from parplan.solver.frontends.torch_trace.constants import MAX_REPEAT
from parplan.solver.frontends.torch_trace.fx import block_of, flatten
from parplan.solver.frontends.torch_trace.records import DimRef, PendingNode, Value
from parplan.solver.ir import Graph, Node, OpKind, make_node
from parplan.solver.strategy import TP_SPLIT_DIMS

if TYPE_CHECKING:
    from parplan.solver.frontends.torch_trace.recorder import Recorder


class Emitter:
    """Emits the graph of one finished pass 1 (``r``: its recorder)."""

    def __init__(self, r: Recorder) -> None:
        self.r = r
        self.A = r.A
        self._snodes: list[PendingNode] = []
        self._by_id: dict[str, PendingNode] = {}
        self._ids: dict[int, str] = {}
        self._coerced: dict[tuple[int, tuple[int, ...]], str] = {}

    def graph(self, name: str, outs: list[Any]) -> Graph:
        """The graph named ``name`` whose outputs are the traced values ``outs``."""
        live = {v.rec for v in self.r.param_vals.values() if v.rec >= 0} | set(self.r.user_inputs)
        live |= {o.rec for o in flatten(outs) if isinstance(o, Value) and not o.empty}
        stack = list(live)
        while stack:
            for i, _ in self.r.recs[stack.pop()].inputs:
                if i not in live:
                    live.add(i)
                    stack.append(i)
        for j, rec in enumerate(self.r.recs):
            if j not in live:
                continue
            self.r.node_path, self.r.node_name = rec.path, rec.stem
            ins = [self._coerce(i, exp) for i, exp in rec.inputs]
            dims = [(a, self.A.size[a]) for a in self._ir_leaves(rec.atoms)]
            self._ids[j] = self._new(rec.stem, rec.kind, ins, dims, rec.dtype, rec.path, rec.attrs).id
        self._tag_layers()
        names = self._name_atoms()
        nodes = [self._finish(sn, names) for sn in self._snodes]
        units = units_in_order(nodes)
        meta: dict[str, Any] = {"source": "torch.export", "module": type(self.r.module).__name__,
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
             path: str, attrs: dict[str, Any]) -> PendingNode:
        nid, k = stem, 1
        while nid in self._by_id:
            k += 1
            nid = f"{stem}_{k}"
        sn = PendingNode(nid, kind, inputs, dims, dtype, path, attrs)
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
            if math.prod(s for _, s in src.dims) * self.r.size_of(copies) != self.r.size_of(want):
                copies = []
        cur = src
        for m in copies:
            n = self.A.size[m]
            if n > MAX_REPEAT:
                raise self.r.error(f"an expand by {n} of a computed tensor feeds an op that needs it whole")
            one = self._new(f"{src.id}.unsqueeze", OpKind.RESHAPE, [cur.id], [*cur.dims, (m, 1)], cur.dtype,
                            src.path, {})
            cur = one if n == 1 else self._new(f"{src.id}.repeat", OpKind.CONCAT, [one.id] * n,
                                               [*cur.dims, (m, n)], cur.dtype, src.path, {"dim": DimRef((m,))})
        if {a for a, _ in cur.dims} != set(want):
            if math.prod(s for _, s in cur.dims) != self.r.size_of(want):
                raise self.r.error(f"internal: {src.id!r} is read with dims of another size")
            cur = self._new(f"{src.id}.view", OpKind.RESHAPE, [cur.id], [(a, self.A.size[a]) for a in want],
                            src.dtype, src.path, {})
        self._coerced[key] = cur.id
        return cur.id

    def _tag_layers(self) -> None:
        """Block tags from module paths; ``embed`` / ``head`` / ``<block>.post`` around them;
        parameters and inputs take their block, else the tag of their first reader."""
        ops = [sn for sn in self._snodes if sn.kind not in (OpKind.PARAMETER, OpKind.INPUT)]
        blocks = [block_of(sn.path) for sn in ops]
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
                sn.layer = block_of(sn.id) or (readers.get(sn.id) or ["embed"])[0]
            elif sn.kind is OpKind.INPUT:  # an input shared by several blocks (rotary tables, masks): embed
                units = readers.get(sn.id) or ["embed"]
                sn.layer = units[0] if len(units) == 1 else "embed"

    def _name_atoms(self) -> dict[int, str]:
        """A name per atom class: its best hint (``hidden``; ``hidden_96`` when another size already
        took ``hidden``; the dims TP splits keep theirs), user names, else ``d<k>``; clashes within one
        op get a suffix."""
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
                if at.size[c] not in sizes:  # a dim TP splits keeps its name at every size (dense and expert ffn)
                    sizes[at.size[c]] = h if not sizes or h in TP_SPLIT_DIMS else f"{h}_{at.size[c]}"
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

    def _finish(self, sn: PendingNode, names: dict[int, str]) -> Node:
        def res(v: Any) -> Any:
            if isinstance(v, DimRef):
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


def units_in_order(nodes: Sequence[Node]) -> list[str]:
    """Layer tags of operators in graph order, then those only leaves carry (``meta["units"]``)."""
    units = list(dict.fromkeys(n.layer for n in nodes if n.layer is not None and not n.is_leaf))
    return units + [u for u in dict.fromkeys(n.layer for n in nodes if n.layer is not None) if u not in units]
