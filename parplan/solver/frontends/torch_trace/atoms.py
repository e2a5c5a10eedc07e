"""Axes ("atoms") of traced tensors: a union-find with refinement and per-tensor distinctness.

Contractions, broadcasts and norms unify axes, views regroup them (splitting an axis into
sub-axes where a view needs it), and no tensor may hold one axis twice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence


class Atoms:
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
    """Dry run of :meth:`Atoms.regroup` on (size, refinable) items."""
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
    """Dry run of the alignment in :meth:`Atoms.unify`."""
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
