"""Any architecture transformers can build: a ``config.json`` without a hand-written mapper
(:mod:`parplan.solver.frontends.hf`) is built by transformers on the meta device (no weights,
no download) and traced into a graph by :mod:`parplan.solver.frontends.torch_trace`.

Needs the optional ``hf`` extra (``pip install 'parplan[hf]'``: transformers and torch). Every
failure (extra missing, a config transformers cannot build, an operator the tracer cannot map)
is a one-line :class:`ConfigError`.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from parplan.solver.errors import ConfigError
from parplan.solver.frontends import trace_cache
from parplan.solver.frontends.graph_repeat import expand_graph
from parplan.solver.frontends.layer_pattern import cut_to_pattern, find_pattern
from parplan.solver.ir import Graph

#: The extra that installs what tracing needs.
HF_EXTRA = "parplan[hf]"
#: Samples per traced micro-batch: more than one, so the batch dim exists (the graph is resized to
#: the planned micro-batch afterwards).
TRACE_BATCH = 2
#: Floating-point dtype of traced tensors: mixed-precision training computes in bf16 (a model built
#: by ``from_config`` is fp32; the loss stays fp32, as the tracer declares it).
TRAIN_FLOAT_DTYPE = "bf16"
#: Sizes a config must give when its transformers config class has them (a default is another model's).
REQUIRED_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
#: Longest message kept from a library's exception (characters).
_MAX_DETAIL = 300


def one_line(e: BaseException) -> str:
    """An exception as ``Type: message`` on one line, at most ``_MAX_DETAIL`` characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    text = text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."
    return f"{type(e).__name__}: {text}"


def import_torch_and_transformers() -> tuple[Any, Any]:
    """``(torch, transformers)``; ConfigError naming the ``hf`` extra when either is missing."""
    try:
        torch = importlib.import_module("torch")
        transformers = importlib.import_module("transformers")
    except ImportError as e:
        raise ConfigError(f"planning a config.json without a hand-written mapper traces it with transformers "
                          f"and torch ({e.name or 'a module'} is missing): pip install '{HF_EXTRA}'") from None
    return torch, transformers


def import_torch() -> Any:
    """``torch``; ConfigError naming the ``hf`` extra when it is missing."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise ConfigError(f"tracing a PyTorch model needs torch: pip install '{HF_EXTRA}'") from None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence transformers' and torch's warnings (config hints, export notes) for a while."""
    transformers = sys.modules.get("transformers")
    level = transformers.logging.get_verbosity() if transformers is not None else None
    if transformers is not None:
        transformers.logging.set_verbosity_error()
    torch_logger = logging.getLogger("torch")
    torch_level = torch_logger.level
    torch_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if transformers is not None and level is not None:
            transformers.logging.set_verbosity(level)
        torch_logger.setLevel(torch_level)


def _model_type(cfg: Mapping[str, Any]) -> str:
    mt = cfg.get("model_type")
    if not isinstance(mt, str) or not mt:
        raise ConfigError("HF config has no model_type, so transformers cannot build it")
    return mt


def build_meta_model(cfg: Mapping[str, Any]) -> tuple[Any, bool]:
    """The transformers model of ``cfg`` built on the meta device, and whether it is a causal LM
    (``AutoModelForCausalLM``; else the bare ``AutoModel``). One-line ConfigError when it cannot be built."""
    torch, transformers = import_torch_and_transformers()
    mt = _model_type(cfg)
    fields = {k: v for k, v in cfg.items() if k not in ("model_type", "transformers_version", "architectures")}
    if mt not in transformers.CONFIG_MAPPING:
        raise ConfigError(f"HF config: model_type {mt!r} is unknown to transformers {transformers.__version__} "
                          f"(a typo, or a model newer than this transformers: upgrade it)")
    with _quiet():
        try:
            config = transformers.AutoConfig.for_model(mt, **fields)
        except Exception as e:  # transformers raises ValueError, KeyError, TypeError ... on bad configs
            raise ConfigError(f"HF config (model_type {mt!r}): transformers {transformers.__version__} cannot read "
                              f"it: {one_line(e)}") from None
        _check_sizes_given(cfg, config, mt)
        errors = []
        for auto, causal in (("AutoModelForCausalLM", True), ("AutoModel", False)):
            try:
                with torch.device("meta"):
                    return getattr(transformers, auto).from_config(config), causal
            except Exception as e:  # an unsupported config class, or a shape error inside __init__
                errors.append(f"{auto}: {one_line(e)}")
    raise ConfigError(f"HF config (model_type {mt!r}): transformers {transformers.__version__} cannot build it "
                      f"({'; '.join(errors)})")


def _check_sizes_given(cfg: Mapping[str, Any], config: Any, mt: str) -> None:
    """ConfigError when ``cfg`` leaves out a size of the model that transformers would fill in with
    its default (a model of another size than the user's)."""
    aliases = getattr(type(config), "attribute_map", {}) or {}
    for name in REQUIRED_SIZES:
        if hasattr(config, name) and name not in cfg and aliases.get(name) not in cfg:
            raise ConfigError(f"HF config (model_type {mt!r}) is missing required field {name!r} (transformers "
                              f"would use its default, {getattr(config, name)!r}, another model's size)")


def default_seq_len(cfg: Mapping[str, Any]) -> int:
    """The sequence length a config's model is traced at when none is given: its maximum positions
    (as the hand-written mappers default to), else 2,048 tokens."""
    for key in ("max_position_embeddings", "n_positions", "seq_length", "max_seq_len"):
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return value
    return 2048


def trace_hf_config(cfg: Mapping[str, Any], name: str, seq_len: int | None = None,
                    batch: int = TRACE_BATCH, *, every_layer: bool = False) -> Graph:
    """The traced graph of the model ``cfg`` describes, for ``batch`` samples of ``seq_len`` tokens
    (default: :func:`default_seq_len`); a causal LM is traced with its loss (labels = the ids).

    Unless ``every_layer``, a model whose decoder layers repeat a pattern (:mod:`.layer_pattern`)
    is traced on its first few layers and the graph grown to the full depth (:mod:`.graph_repeat`),
    which gives the same graph node for node in a fraction of the time; when the traced periods do
    not repeat exactly, every layer is traced. Graphs are kept in :mod:`.trace_cache`: the same
    config traced again is read back without importing torch."""
    if seq_len is not None and seq_len < 1:
        raise ConfigError(f"seq_len must be positive, got {seq_len}")
    if batch < 2:
        raise ConfigError(f"trace with batch >= 2 (a batch of 1 has no batch dim), got {batch}")
    seq = seq_len or default_seq_len(cfg)
    batch = batch + 1 if batch == seq else batch  # two axes of one size could not be told apart by name
    key = trace_cache.entry_key(cfg, name, seq, batch, every_layer)
    graph = trace_cache.load(key)
    if graph is None:
        graph = _trace(cfg, name, seq, batch, every_layer)
        trace_cache.store(key, graph)
    return graph


def _trace(cfg: Mapping[str, Any], name: str, seq: int, batch: int, every_layer: bool) -> Graph:
    model, causal = build_meta_model(cfg)
    torch = import_torch()
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    inputs = {"input_ids": ids, "labels": ids} if causal else {"input_ids": ids}
    dims = {batch: "batch", seq: "seq"}
    pattern = None if every_layer else find_pattern(model, model.config)
    if pattern is None:
        return trace_model(model, inputs, name, dim_names=dims)
    cut_to_pattern(model, model.config, pattern)
    grown = expand_graph(trace_model(model, inputs, name, dim_names=dims), pattern)
    if grown is not None:
        return grown
    model, _ = build_meta_model(cfg)
    return trace_model(model, inputs, name, dim_names=dims)


def trace_model(model: Any, inputs: Any, name: str, dim_names: Mapping[int, str] | None = None,
                float_dtype: str | None = TRAIN_FLOAT_DTYPE) -> Graph:
    """:func:`~parplan.solver.frontends.torch_trace.trace_module` in training mode, quietly, with
    floating-point tensors as ``float_dtype`` (None: as traced) and errors on one line."""
    from parplan.solver.frontends.torch_trace import trace_module

    import_torch()
    model.train()
    with _quiet():
        try:
            return trace_module(model, inputs, name, dim_names=dim_names, float_dtype=float_dtype)
        except ConfigError as e:
            text = " ".join(str(e).split())
            raise ConfigError(text if len(text) <= 2 * _MAX_DETAIL else text[: 2 * _MAX_DETAIL - 3] + "...") from None
