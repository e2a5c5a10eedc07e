"""Traced configs are kept on disk: the same trace is read back (not traced again), other settings
are other entries, a damaged entry is traced again, and ``off`` keeps nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from parplan.solver.frontends.hf_trace import trace_hf_config
from parplan.solver.frontends.trace_cache import CACHE_ENV
from parplan.solver.wire import graph_to_json

CFG = json.loads((Path(__file__).resolve().parent.parent / "data" / "hf" / "gpt_neox.json").read_text())


def test_a_trace_is_read_back_and_other_settings_are_other_entries(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    first = trace_hf_config(CFG, "neox", seq_len=32)
    entries = list(tmp_path.glob("*.json"))
    assert len(entries) == 1
    assert trace_hf_config(CFG, "neox", seq_len=32).nodes == first.nodes
    # what is read is the entry: another graph written there comes back
    other = trace_hf_config(CFG, "neox", seq_len=16)
    assert len(list(tmp_path.glob("*.json"))) == 2
    entries[0].write_text(graph_to_json(other))
    assert trace_hf_config(CFG, "neox", seq_len=32).nodes == other.nodes
    # a damaged entry is traced again (and rewritten)
    entries[0].write_text("{not json")
    assert trace_hf_config(CFG, "neox", seq_len=32).nodes == first.nodes
    assert trace_hf_config(CFG, "neox", seq_len=32).nodes == first.nodes
    assert json.loads(entries[0].read_text())["nodes"]


def test_off_keeps_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    trace_hf_config(CFG, "neox", seq_len=32)
    assert not any(tmp_path.rglob("*.json"))
