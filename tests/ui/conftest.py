"""Browser tests of the dashboard: a real headless Chromium (the system's, driven by Playwright)
against a real `parplan serve` (SQLite, in-process executor, tokens required). Without a browser
the tests are skipped, except under ``CI=true``, where that is a failure (scripts/test installs
Debian's ``chromium``). Screenshots go to ``test-artifacts/`` (git-ignored)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.service import service_env, start_server

ARTIFACTS = Path(__file__).parents[2] / "test-artifacts"


def _missing(what: str) -> None:
    msg = f"{what}; scripts/test installs it"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{msg} (CI=true: a missing browser is a failure)")
    pytest.skip(msg)


def chromium_path() -> str | None:
    found = os.environ.get("PARPLAN_TEST_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    return found if found and os.access(found, os.X_OK) else None


@dataclass(frozen=True)
class Dashboard:
    base: str
    writer: str  # a plans:write token
    agent: str   # an agent token
    env: dict[str, str]


def _token(env: dict[str, str], scope: str) -> str:
    out = subprocess.run([sys.executable, "-m", "parplan.cli", "token", "create", "--scope", scope],
                         env=env, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    data = tmp_path_factory.mktemp("dashboard")
    env = service_env({"PARPLAN_DATA_DIR": str(data), "PARPLAN_AUTH": "required", "PARPLAN_EXECUTOR_WORKERS": "2"})
    server, base = start_server(env)
    try:
        yield Dashboard(base, _token(env, "plans:write"), _token(env, "agent"), env)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = chromium_path()
    if path is None:
        _missing("no chromium executable (set PARPLAN_TEST_CHROMIUM or install Debian's chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed (the dev extra has it)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, dashboard: Dashboard, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh tab (empty sessionStorage) that records console errors; after the test, a screenshot
    in test-artifacts/ and a check that the page broke no rule of its Content-Security-Policy."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    problems: list[str] = []
    pg.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
    pg.console_problems = problems
    yield pg
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    context.close()
    assert not [p for p in problems if "Content Security Policy" in p or p.startswith("uncaught")], problems


def _login(pg: Any, url: str, token: str) -> None:
    """Open ``url``; the page asks for the token once and keeps it in sessionStorage."""
    pg.goto(url)
    pg.wait_for_selector("#auth:not([hidden])")
    pg.fill("#auth-token", token)
    pg.click("#auth button[type=submit]")
    pg.wait_for_selector("#who:has-text('plans:write'), #who:has-text('agent')")


@pytest.fixture
def login() -> Callable[[Any, str, str], None]:
    return _login


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
