"""Trace a PyTorch ``nn.Module`` into a parplan :class:`~parplan.solver.ir.Graph`.

:func:`trace_module` exports the module with ``torch.export`` (non-strict; works on the meta
device, so no weights are allocated) and maps the ATen graph onto the IR:

- every ``nn.Parameter`` becomes one ``parameter`` node named by its qualified name (tied
  parameters once, as ``module.parameters()`` counts them); user inputs become ``input`` nodes;
  buffers, constants and integer tensors computed from the inputs (position ids, shifted labels,
  masks) become ``input`` nodes when a mapped operator reads them (``attrs.constant`` /
  ``attrs.derived_from`` say which);
- operators are mapped by the handlers the ``handlers_*`` modules declare (:data:`OP_TABLE` lists
  them); any other operator applied to a tensor that depends on the parameters raises
  :class:`ConfigError` naming the op and the module;
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
``[rows, step]`` reshape and a select. MoE: see :mod:`.handlers_moe`. Not mapped
(they raise): ``scatter``, ``index_select``, ``where`` on activations,
convolutions, other strided slices.
Attention masks the model computes are kept as the attention's bias input (``causal`` is then
false, as the exported call says).

Modules: :mod:`.atoms` (axes), :mod:`.records` (pass-1 records and traced values), :mod:`.recorder`
(state and the mappings handlers share), :mod:`.tracer` (export and dispatch), :mod:`.fx` (export
plumbing), :mod:`.emit` (pass 2), :mod:`.op` (what a handler is), ``handlers_*`` (operators by
family), :mod:`.table` (the dispatch table built from them) and :mod:`.constants`.
"""

from parplan.solver.frontends.torch_trace.table import OP_TABLE
from parplan.solver.frontends.torch_trace.tracer import trace_module

__all__ = ["OP_TABLE", "trace_module"]
