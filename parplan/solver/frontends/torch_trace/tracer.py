"""The tracer's driver: export the module, walk the exported graph, dispatch each ATen op to its
handler (:mod:`.table`), map custom norm / activation / experts modules as a whole, and emit."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from parplan.solver.errors import ConfigError
from parplan.solver.frontends.torch_trace.constants import ACT_NAMES, CREATE, FLOAT, P_FFN, P_INPUT, P_USER, VIEWS
from parplan.solver.frontends.torch_trace.emit import Emitter
from parplan.solver.frontends.torch_trace.fx import (
    alias_chain,
    export_failure,
    export_input_names,
    fill_by_copies,
    flatten,
    import_torch,
    is_fx_node,
    is_tensor,
    live_nodes,
    no_stack_traces,
    split_inputs,
    stack_paths,
    strip,
    wrap,
)
from parplan.solver.frontends.torch_trace.handlers_moe import collapse_experts, is_experts_module
from parplan.solver.frontends.torch_trace.recorder import Recorder
from parplan.solver.frontends.torch_trace.records import Value
from parplan.solver.frontends.torch_trace.table import HANDLERS
from parplan.solver.ir import DTYPE_BYTES, Graph, OpKind


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
    torch = import_torch()
    if float_dtype is not None and float_dtype not in DTYPE_BYTES:
        raise ConfigError(f"unknown float_dtype {float_dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"trace_module needs a torch.nn.Module, got {type(module).__name__}")
    args, kwargs = split_inputs(torch, module, example_inputs)
    try:
        with no_stack_traces():
            ep = torch.export.export(wrap(torch, module), args, kwargs, strict=False)
    except ConfigError:
        raise
    except Exception as e:  # torch.export raises many exception types
        raise ConfigError(export_failure(module, args, kwargs, e)) from e
    fill_by_copies(torch, ep.graph)
    tracer = Tracer(torch, module, ep, export_input_names(module, args, kwargs), dim_names or {}, float_dtype)
    try:
        return tracer.build(name)
    except ConfigError:
        raise
    except Exception as e:  # a case the tracer does not foresee: still one line, naming where
        raise tracer.error(f"cannot map {type(e).__name__}: {e}") from e



class Tracer(Recorder):
    """Pass 1 (:meth:`build` -> :meth:`_run`) maps the exported graph to records over atoms;
    pass 2 (:class:`~.emit.Emitter`) turns the live records into nodes and names the atoms."""

    def __init__(self, torch: Any, module: Any, ep: Any, input_names: list[str], dim_names: Mapping[int, str],
                 float_dtype: str | None) -> None:
        super().__init__(module, float_dtype)
        self.torch = torch
        self.ep = ep
        self.input_names = input_names
        self.dim_names = dim_names
        self._collapsible_cache: dict[str, tuple[str, Any] | None] = {}

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
            if not is_tensor(val):
                bindings[node] = val
                if kind == "USER_INPUT":
                    ui += 1
                continue
            shape, dtype = [int(s) for s in val.shape], self.ir_dtype(val.dtype)
            if kind == "USER_INPUT":
                ident = names[ui]
                ui += 1
                v = self.leaf(OpKind.INPUT, ident, shape, dtype, path="", aux=True, deps=frozenset({ident}))
                if v.rec >= 0:
                    self.user_inputs.append(v.rec)
                for i, ax in enumerate(v.axes):
                    if shape[i] in self.dim_names:
                        self.hint(ax, self.dim_names[shape[i]], P_USER)
                    elif i == 0 and len(shape) >= 2:
                        self.hint(ax, "batch", P_INPUT)
                    elif i == 1 and len(shape) == 2 and not val.dtype.is_floating_point:
                        self.hint(ax, "seq", P_INPUT)
            else:  # buffers and lifted constants
                ident = strip(spec.target or node.name)
                v = self.leaf(OpKind.INPUT, ident, shape, dtype, path=ident.rpartition(".")[0], aux=True,
                              attrs={"constant": True})
            bindings[node] = v
        outs = self._run(ep.graph_module, ep.graph, bindings)
        return Emitter(self).graph(name, outs)

    def _run(self, gm: Any, graph: Any, bindings: dict[Any, Any]) -> list[Any]:
        live = live_nodes(graph)
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
                return [self._resolve(a, env) for a in flatten(node.args[0])]
        raise ConfigError("the exported graph has no output")

    def _resolve(self, raw: Any, env: dict[Any, Any]) -> Any:
        if is_fx_node(raw):
            return env[raw]
        if isinstance(raw, list | tuple):
            return [self._resolve(r, env) for r in raw]
        return raw

    def _call(self, node: Any, env: dict[Any, Any]) -> Any:
        self.set_where(node)
        target = node.target
        if target is operator.getitem:
            seq = self._resolve(node.args[0], env)
            return seq[node.args[1]] if isinstance(seq, list | tuple) else None
        if isinstance(target, self.torch._ops.HigherOrderOperator):
            return self._hop(node, env)
        if not isinstance(target, self.torch._ops.OpOverload):
            raise self.error(f"unsupported call {getattr(target, '__name__', target)!r}")
        op = target.overloadpacket.__name__
        if op.endswith("_") and not op.endswith("__"):
            op = op[:-1]
        args = self._bind(node, env)
        tensors = [v for v in flatten(list(args.values())) if isinstance(v, Value)]
        meta = node.meta.get("val")
        if is_tensor(meta) and any(int(s) == 0 for s in meta.shape):  # no data: never a node
            return Value([[] for _ in meta.shape], -1, self.ir_dtype(meta.dtype), True, empty=True)
        if all(v.aux for v in tensors) or op in CREATE:
            return self._aux(node, op, args, [v for v in tensors if v.aux], meta)
        if is_tensor(meta) and not (meta.dtype.is_floating_point or meta.dtype.is_complex):
            return self._aux_new(node, tensors, meta)  # an index tensor computed from activations
        handler = HANDLERS.get(op)
        if handler is None or target.namespace != "aten":
            raise self.error(f"unsupported operator {target.namespace}.{op} on a computed tensor "
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

    def _aux(self, node: Any, op: str, args: dict[str, Any], tensors: list[Value], meta: Any) -> Any:
        if is_tensor(meta) and tensors and op in VIEWS and not tensors[0].empty:
            v = self.view(op, args, tensors[0], meta)
            if v is not None:
                return v
        return self._aux_new(node, tensors, meta)

    def _aux_new(self, node: Any, tensors: list[Value], meta: Any) -> Any:
        """New input record(s) for the op's output: a constant, or derived from user inputs."""
        deps: frozenset[str] = frozenset().union(*(v.deps for v in tensors)) if tensors else frozenset()
        if deps:
            attrs: dict[str, Any] = {"derived_from": sorted(deps)}
            stem = f"{sorted(deps)[0]}.{node.name}"
        elif any(not v.aux for v in tensors):
            attrs, stem = {"index": True}, f"{self.node_path}.{node.name}" if self.node_path else node.name
        else:
            attrs, stem = {"constant": True}, f"{self.node_path}.{node.name}" if self.node_path else node.name

        def one(m: Any, suffix: str) -> Value:
            return self.leaf(OpKind.INPUT, stem + suffix, [int(s) for s in m.shape], self.ir_dtype(m.dtype),
                             path=self.node_path, aux=True, attrs=attrs, deps=deps)

        if is_tensor(meta):
            return one(meta, "")
        if isinstance(meta, list | tuple):
            return [one(m, f".{i}") if is_tensor(m) else m for i, m in enumerate(meta)]
        return meta

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
                res = next((("act", fn) for key, fn in ACT_NAMES if key in cls), None)
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
                for k, path in zip(stack, stack_paths(n), strict=True):
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
        path = next(p for p in stack_paths(nodes[0]) if self._collapsible(p) is not None)
        info = self._collapsible(path)
        assert info is not None
        ext: list[Any] = []
        for n in nodes:
            ext.extend(a for a in n.all_input_nodes if a not in inside and a not in ext)
        vals = [(a, env.get(a)) for a in ext]
        params = {v.rec for _, v in vals if isinstance(v, Value) and self.is_param(v)}
        if info[0] == "experts":
            outs = [n for n in nodes if any(u not in inside for u in n.users)]
            return len(outs) == 1 and collapse_experts(self, path, info[1], outs[0], vals, env)
        xs = [(a, v) for a, v in vals if isinstance(v, Value) and not self.is_param(v)
              and v.dtype in FLOAT and not v.empty]
        if len(xs) != 1:
            return False
        x_node, x = xs[0]
        outs = [n for n in nodes if any(u not in inside for u in n.users)]
        aliases = [n for n in outs if alias_chain(n, x_node, inside)]
        mains = [n for n in outs if n not in aliases]
        if len(mains) != 1:
            return False
        main = mains[0]
        mval = main.meta.get("val")
        if not is_tensor(mval) or [int(s) for s in mval.shape] != [self.size_of(a) for a in x.axes]:
            return False
        self.set_where(main)
        self.node_path = path
        dtype = self.ir_dtype(mval.dtype)
        kind, what = info
        if kind == "norm":
            w = self.param_vals.get(self.canonical_name(what.weight))
            bias = getattr(what, "bias", None)
            b = self.param_vals.get(self.canonical_name(bias)) if bias is not None else None
            if w is None or not params or not params <= {w.rec, b.rec if b else -1}:
                return False
            eps = next((getattr(what, k) for k in ("eps", "variance_epsilon")
                        if isinstance(getattr(what, k, None), float)), None)
            out = self.norm(OpKind.LAYERNORM if b is not None else OpKind.RMSNORM, x, 1, w, b, dtype,
                            **({"eps": eps} if eps is not None else {}))
        else:
            if params:
                return False
            out = self.elementwise([x], str(what), str(what), dtype)
            self.hint(out.axes[-1] if out.axes else [], "ffn", P_FFN)
        env[main] = out
        for a in aliases:
            env[a] = x
        return True


    def _hop(self, node: Any, env: dict[Any, Any]) -> Any:
        resolved = [self._resolve(a, env) for a in node.args]
        sub_i = next((i for i, a in enumerate(resolved) if hasattr(a, "graph") and hasattr(a, "forward")), None)
        if sub_i is None:
            raise self.error(f"unsupported higher-order op {node.target.name()}")
        operands = resolved[sub_i + 1:]
        tensors = [v for v in flatten(operands) if isinstance(v, Value)]
        if all(v.aux for v in tensors):
            return self._aux_new(node, tensors, node.meta.get("val"))
        sub = resolved[sub_i]
        ph = [n for n in sub.graph.nodes if n.op == "placeholder"]
        return self._run(sub, sub.graph, dict(zip(ph, operands, strict=False)))
