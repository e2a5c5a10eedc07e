"""docs/design.md stays the map of the code: every package and top-level module of ``parplan`` is
named in its package list, and every path it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = (ROOT / "docs" / "design.md").read_text()


def test_every_package_of_parplan_is_in_the_design() -> None:
    pkg = ROOT / "parplan"
    names = sorted(p.name for p in pkg.iterdir() if (p / "__init__.py").exists())
    assert {"solver", "service", "workers", "agent"} <= set(names)
    for name in names:
        assert f"parplan/{name}/" in DESIGN, f"docs/design.md does not say what parplan/{name}/ is"
    assert "parplan/server.py" in DESIGN and "parplan/cli" in DESIGN


def test_the_files_the_design_names_exist() -> None:
    named = set(re.findall(r"`((?:service|solver|cost|ilp|dp)/[\w/]+\.py|[\w]+\.py)`", DESIGN))
    assert len(named) > 10
    found = {p.relative_to(ROOT / "parplan").as_posix() for p in (ROOT / "parplan").rglob("*.py")}
    missing = [n for n in named if not any(f == n or f.endswith("/" + n) for f in found)]
    assert not missing, f"docs/design.md names files that do not exist: {missing}"
