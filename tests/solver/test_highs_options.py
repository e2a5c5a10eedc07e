"""The ILP solver's settings keep HiGHS inside its time limit.

``tests/data/highs_presolve_hang.mps.gz`` is the memory solve of gpt-3.6b on 8 A100s at global batch
64 (min-memory with the time limit at 1.1x Megatron-LM's step), written by HiGHS from parplan's
formulation. Under HiGHS's defaults for sub-MIPs it never returned: RENS inside RINS's sub-MIP ran
presolve, whose inequality strengthening loops without checking the time limit. The solve runs in a
child process so that a hang fails the test instead of stopping the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

MODEL = Path(__file__).resolve().parent.parent / "data" / "highs_presolve_hang.mps.gz"

_SOLVE = """
import sys
from parplan.solver.ilp.model import configured_highs
h = configured_highs(20.0)
h.readModel(sys.argv[1])
h.run()
print("RESULT", h.modelStatusToString(h.getModelStatus()), h.getInfo().objective_function_value)
"""


def test_the_model_that_hung_highs_solves_within_its_time_limit() -> None:
    try:
        done = subprocess.run([sys.executable, "-c", _SOLVE, str(MODEL)], capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("HiGHS ran past its 20 s time limit by more than 100 s on the model that hung it")
    assert done.returncode == 0, done.stderr
    status, objective = done.stdout.split("RESULT", 1)[1].split()
    assert status == "Optimal"
    # HiGHS with presolve on (another path through the solver) finds 16.162 for this model
    assert float(objective) == pytest.approx(16.162, rel=2e-3)
