"""`parplan serve | worker | db | token`: arguments, exit codes, start-up messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from parplan.cli import build_parser, main
from parplan.service.auth.service import hash_token
from parplan.service.models import ApiToken


@pytest.fixture
def embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for k in list(os.environ):
        if k.startswith("PARPLAN_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("PARPLAN_DATA_DIR", str(tmp_path))
    return tmp_path


def test_subcommands_are_registered() -> None:
    p = build_parser()
    for argv in (["serve"], ["serve", "--host", "0.0.0.0", "--port", "9000", "--migrate"], ["worker", "--ping"],
                 ["db", "upgrade"], ["db", "current"], ["token", "create", "--scope", "plans:write"]):
        assert callable(p.parse_args(argv).handler)


def test_db_upgrade_and_current(embedded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade"]) == 0
    assert (embedded / "parplan.db").exists()
    assert main(["db", "current"]) == 0
    assert json.loads(capsys.readouterr().out)["up_to_date"] is True


def test_token_create_prints_the_secret_once_and_stores_its_hash(embedded: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "create", "--scope", "plans:read,plans:write", "--scope", "agent", "--name", "ci",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scopes"] == ["agent", "plans:read", "plans:write"] and out["token"].startswith("ppt_")
    engine = create_engine(f"sqlite:///{embedded / 'parplan.db'}")
    with Session(engine) as s:
        row = s.scalars(select(ApiToken)).one()
        assert row.token_hash == hash_token(out["token"]) and row.name == "ci"
    engine.dispose()
    assert main(["token", "create", "--scope", "plans:write"]) == 0
    assert capsys.readouterr().out.strip().startswith("ppt_")


def test_token_create_rejects_unknown_scopes(embedded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "create", "--scope", "root"]) == 2
    assert "unknown scope 'root'" in capsys.readouterr().err


def test_worker_needs_a_broker(embedded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker"]) == 2
    assert "PARPLAN_BROKER_URL" in capsys.readouterr().err


def test_serve_refuses_disabled_auth_off_loopback(embedded: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PARPLAN_AUTH", "disabled")
    assert main(["serve", "--host", "0.0.0.0"]) == 2
    assert "loopback" in capsys.readouterr().err


def test_the_cli_stays_usable_without_importing_the_service() -> None:
    code = ("import sys, parplan.cli as c; c.build_parser(); "
            "print(sorted(m for m in sys.modules if m.startswith(('fastapi', 'sqlalchemy', 'celery'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
