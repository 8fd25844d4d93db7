"""Running ``polymorph`` in process the way a refused command must end: one ``error:`` line, exit 2."""

from __future__ import annotations

import pytest

from polymorph.cli import main


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one ``error:`` line ``polymorph argv`` prints on stderr, asserting exit 2 and no traceback."""
    code = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, captured.err)
    return lines[0]
