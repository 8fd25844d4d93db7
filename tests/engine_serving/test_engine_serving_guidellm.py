"""A load generator from PyPI as a client: GuideLLM (the ``bench`` extra) drives ``polymorph engine
serve --model tiny`` over chat completions through ``bench/serve_guidellm.py``, for a short bounded
run, and its report is checked: every request succeeded, on the chat endpoint, at a non-zero
throughput, each answer exactly as long as GuideLLM asked (``max_completion_tokens`` with vLLM's
``ignore_eos``, which GuideLLM sends), and the engine's own ``/metrics`` counted the same requests
and tokens as GuideLLM did, a chat prompt as its rendered length.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from polymorph_engine.runtime.tokenizer import ByteTokenizer
from polymorph_engine.serving.chat import chat_messages, render_chat

BENCH = Path(__file__).resolve().parents[2] / "bench"

pytestmark = pytest.mark.slow


def test_guidellm_drives_chat_completions_on_the_served_engine(tmp_path: Path) -> None:
    requests, prompt_tokens, output_tokens = 12, 16, 8
    out = tmp_path / "result.json"
    done = subprocess.run(
        [
            sys.executable, str(BENCH / "serve_guidellm.py"), "--endpoints", "chat",
            "--requests", str(requests), "--concurrency", "4", "--max-seconds", "60",
            "--prompt-tokens", str(prompt_tokens), "--output-tokens", str(output_tokens),
            "--report-dir", str(tmp_path / "reports"), "--out", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert list(doc["results"]) == ["chat"]
    chat = doc["results"]["chat"]
    assert chat["endpoint"] == "/v1/chat/completions"
    report = chat["guidellm"]
    assert report["requests"] == {"successful": requests, "errored": 0, "incomplete": 0, "total": requests}
    assert report["chat_bodies"] is True and report["response_ids"] == ["chatcmpl"]
    assert report["requests_per_s"] > 0 and report["output_tokens_per_s"] > 0
    assert report["ttft_ms_median"] > 0 and report["latency_s_median"] > 0
    assert report["output_tokens_per_request_median"] == output_tokens  # ignore_eos: never cut short
    assert report["output_tokens_sum"] == requests * output_tokens

    # GuideLLM's user message is prompt_tokens bytes; the engine's prompt is it rendered by the chat template.
    template = ByteTokenizer(512).chat_format
    assert template is not None
    overhead = len(render_chat(template, chat_messages([{"role": "user", "content": ""}])).encode())
    assert report["prompt_tokens_per_request_median"] == prompt_tokens + overhead
    assert chat["engine_counted"] == {
        "requests_ok": requests,
        "prompt_tokens": requests * (prompt_tokens + overhead),
        "generation_tokens": requests * output_tokens,
    }
    assert report["prompt_tokens_sum"] == chat["engine_counted"]["prompt_tokens"]

    # GuideLLM's own report is kept, and says it spoke to the chat endpoint.
    raw = json.loads((tmp_path / "reports" / "guidellm-chat.json").read_text())
    assert raw["benchmarks"][0]["config"]["backend"]["request_format"] == "/v1/chat/completions"
    assert doc["engine"]["exit_status"] == 0 and doc["engine"]["traceback_in_log"] is False
    assert doc["versions"]["guidellm"] and doc["device"] == "cpu"
