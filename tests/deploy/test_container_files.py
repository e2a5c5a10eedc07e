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
STATE_STORES = ("PARPLAN_DATABASE_URL", "PARPLAN_BROKER_URL")


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


def test_dockerfile_serves_by_default_with_a_health_check() -> None:
    ins = _dockerfile()
    assert json.loads(next(rest for word, rest in ins if word == "CMD")) == ["serve"]
    health = next(rest for word, rest in ins if word == "HEALTHCHECK")
    assert "/healthz" in health and "CMD" in health
    assert any(word == "EXPOSE" and "8000" in rest for word, rest in ins)
    run = next(rest for word, rest in ins if word == "RUN" and "pip install" in rest)
    assert "${EXTRAS}" in run and ("ARG", "EXTRAS=service") in ins


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return doc


def _command(svc: dict[str, Any]) -> list[str]:
    command = svc.get("command", [])
    return list(command) if isinstance(command, list) else shlex.split(command)


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
            build_parser().parse_args(_command(svc))


def test_compose_runs_the_service() -> None:
    services = _compose()["services"]
    assert {"api", "worker", "postgres", "redis", "agent"} <= set(services)
    for name in ("api", "worker", "postgres", "redis"):
        assert "test" in services[name]["healthcheck"], name
        assert "agent" not in (services[name].get("profiles") or [])
    api, worker, agent = services["api"], services["worker"], services["agent"]
    assert _command(api)[0] == "serve" and "--migrate" in _command(api)  # migrations run on start
    assert "0.0.0.0" in _command(api) and any(str(p).endswith(":8000") for p in api["ports"])
    assert "/readyz" in " ".join(api["healthcheck"]["test"])
    assert _command(worker)[0] == "worker" and "--ping" in worker["healthcheck"]["test"]
    assert worker["depends_on"]["api"]["condition"] == "service_healthy"  # schema migrated first
    assert agent["profiles"] == ["agent"] and _command(agent)[0] == "agent"
    assert agent["depends_on"]["api"]["condition"] == "service_healthy"
    assert "http://api:8000" in _command(agent)


@pytest.mark.parametrize("var", STATE_STORES)
def test_compose_wires_the_state_stores(var: str) -> None:
    services = _compose()["services"]
    built = [s for name, s in services.items() if s.get("build") and name != "agent"]
    assert built and all(var in s.get("environment", {}) for s in built)
    assert services["api"]["environment"]["PARPLAN_AUTH"] == "required"
