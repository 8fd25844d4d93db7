"""The operator's log policy (issue 17): an exception is one ``error`` field in one JSON line.

Each case logs an exception the way its source does (kopf and the kubernetes client through
stdlib logging, the handlers through structlog) in a real process configured by
``configure_logging``, and reads back what it wrote on stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

PROGRAM = """
import logging, sys
from polymorph.handlers.observability import configure_logging, object_log
configure_logging(sys.argv[1])
{raise_and_log}
"""

CASES = {
    "kopf-stdlib": (
        "try:\n    raise ConnectionRefusedError(111, 'Connect call failed (127.0.0.1, 1)')\n"
        "except OSError:\n    logging.getLogger('kopf._core.reactor').exception('Request attempt #1/9 failed')",
        "ConnectionRefusedError: [Errno 111] Connect call failed (127.0.0.1, 1)",
    ),
    "aiohttp-connector": (
        "import aiohttp\nfrom aiohttp.client_reqrep import ConnectionKey\n"
        "key = ConnectionKey('127.0.0.1', 1, False, True, None, None, None)\n"
        "try:\n    raise aiohttp.ClientConnectorError(key, OSError(111, 'Connection refused'))\n"
        "except Exception:\n    logging.getLogger('kopf.objects').error('watch failed', exc_info=True)",
        "ClientConnectorError: Cannot connect to host 127.0.0.1:1",
    ),
    "structlog-handler": (
        "log = object_log('inference', 'chat', 'ModelDeployment')\n"
        "try:\n    raise RuntimeError('the first line\\nand a second\\nand a third')\n"
        "except RuntimeError:\n    log.exception('reconcile failed')",
        "RuntimeError: the first line and a second and a third",
    ),
    "nested-cause": (
        "try:\n    try:\n        {}['x']\n    except KeyError as e:\n        raise ValueError('bad spec') from e\n"
        "except ValueError as exc:\n    logging.getLogger('polymorph').warning('skipped', exc_info=exc)",
        "ValueError: bad spec",
    ),
    "huge-message": (
        "try:\n    raise ValueError('x' * 100000)\nexcept ValueError:\n    logging.getLogger('kopf').exception('bad')",
        "ValueError: xxxxxxxx",
    ),
}


def _run(case: str, level: str) -> list[str]:
    code = PROGRAM.format(raise_and_log=textwrap.dedent(CASES[case][0]))
    done = subprocess.run([sys.executable, "-c", code, level], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr.strip().splitlines()


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_exception_is_one_json_line_with_an_error_field(case: str) -> None:
    lines = _run(case, "info")
    assert len(lines) == 1, lines
    record = json.loads(lines[0])
    assert "Traceback" not in lines[0] and "exception" not in record
    assert record["error"].startswith(CASES[case][1]), record
    assert len(record["error"]) <= 300


def test_debug_keeps_the_traceback() -> None:
    lines = _run("structlog-handler", "debug")
    record = json.loads(lines[0])
    assert "Traceback" in record["exception"]
