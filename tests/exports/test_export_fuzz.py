"""Exports of hand-edited plan documents: written, or refused with reasons; never another error."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from plan_docs import doc_for

from parplan.exports import EXPORT_TARGETS, NotExpressibleError, export_plan

BASE = doc_for("llama-3-8b", 8, {"tp": 2, "pp": 2, "dp": 2, "zero": 1, "sequence_parallel": True,
                                 "num_microbatches": 4})
VALUES = st.one_of(st.none(), st.integers(-3, 5), st.text(max_size=5), st.booleans(), st.just([]), st.just({}))


@settings(max_examples=150, deadline=None)
@given(target=st.sampled_from(EXPORT_TARGETS), section=st.sampled_from(["strategy", "model", "cluster"]),
       edits=st.lists(st.tuples(st.integers(0, 30), VALUES, st.booleans()), min_size=1, max_size=3))
def test_an_edited_document_is_exported_or_refused(target: str, section: str,
                                                   edits: list[tuple[int, Any, bool]]) -> None:
    doc = copy.deepcopy(BASE)
    part = doc[section]
    for index, value, drop in edits:
        keys = sorted(part)
        key = keys[index % len(keys)]
        if drop:
            part.pop(key)
        else:
            part[key] = value
        if not part:
            break
    reasons: list[str] = []
    try:
        out = export_plan(doc, target)
    except NotExpressibleError as e:
        reasons = e.reasons
    else:
        assert out.files and out.launch
        return
    assert reasons and all(isinstance(r, str) and r for r in reasons)
