"""There is no Docker engine on CI machines: check Dockerfile and docker-compose.yml by parsing."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from parplan.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _dockerfile() -> list[tuple[str, str]]:
    lines, buf = [], ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        buf += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            word, _, rest = buf.partition(" ")
            lines.append((word.upper(), rest.strip()))
            buf = ""
    return lines


def test_dockerfile_installs_the_package_and_runs_the_cli() -> None:
    ins = _dockerfile()
    assert ins[0][0] == "FROM" and ins[0][1].startswith("python:3.11")
    copied = [rest for word, rest in ins if word == "COPY"]
    for path in ("pyproject.toml", "parplan"):
        assert any(path in c.split() for c in copied), f"{path} not copied"
        assert (ROOT / path).exists()
    assert any(word == "RUN" and "pip install" in rest and "." in rest for word, rest in ins)
    assert ("ENTRYPOINT", '["parplan"]') in ins
    cmd = next(rest for word, rest in ins if word == "CMD")
    build_parser().parse_args(json.loads(cmd))  # the default command must be a real subcommand
    assert any(word == "USER" for word, _ in ins), "the image must not run as root"


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return doc


def test_compose_services_have_health_checks_and_valid_commands() -> None:
    services = _compose()["services"]
    assert {"postgres", "redis"} <= set(services)
    for name in ("postgres", "redis"):
        assert "test" in services[name]["healthcheck"]
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert cond["condition"] == "service_healthy"
        if svc.get("build"):
            command = svc.get("command", [])
            words = command if isinstance(command, list) else shlex.split(command)
            build_parser().parse_args(words)


@pytest.mark.parametrize("var", ["PARPLAN_DATABASE_URL", "PARPLAN_BROKER_URL"])
def test_compose_wires_the_state_stores(var: str) -> None:
    services = _compose()["services"]
    built = [s for s in services.values() if s.get("build")]
    assert built and all(var in s.get("environment", {}) for s in built)
