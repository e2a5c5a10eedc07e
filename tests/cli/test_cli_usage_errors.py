"""A bad argument is one line on standard error and exit status 2; the usage comes with --help only."""

from __future__ import annotations

import pytest

from parplan.cli import main


@pytest.mark.parametrize(("argv", "says"), [
    (["plan", "--model", "gpt-1.7b", "--gpus", "0"], "argument --gpus: expected a positive integer, got 0"),
    (["memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "-1"], "argument --tp: expected a positive integer"),
    (["plan", "--gpus", "8"], "the following arguments are required: --model"),
    (["plan", "--model", "gpt-1.7b", "--gpus", "8", "--objective", "fast"], "argument --objective: invalid choice"),
    (["bogus"], "argument COMMAND: invalid choice"),
])
def test_a_bad_argument_is_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    assert err.count("\n") == 1 and says in err and "usage:" not in err, err
    assert err.startswith("parplan"), err


def test_help_still_prints_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["plan", "--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: parplan plan")
