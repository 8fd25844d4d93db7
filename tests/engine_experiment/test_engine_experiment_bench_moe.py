"""bench/ on Mixture-of-Experts models: the roofline's bytes (only the experts a batch selects),
the gpt-fast-style MoE peer and HF's own MoE model against the reference forward, and decode.py's
rows for a MoE shape on CPU."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine_support.builds import forward
from polymorph_engine.runtime.checkpoint import load_model, weight_shapes
from polymorph_engine.runtime.config import SHAPES

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import decode  # noqa: E402  (a script beside the others in bench/)
from hot_vs_cold import decode_bytes_per_step, expected_experts  # noqa: E402


def test_moe_roofline_reads_the_dense_weights_and_the_experts_the_batch_selects() -> None:
    c = SHAPES["qwen3-30b-a3b"]
    assert expected_experts(128, 8, 1) == pytest.approx(8)
    assert expected_experts(128, 8, 1000) == pytest.approx(128)
    assert 8 * 1.9 < expected_experts(128, 8, 2) < 16  # two rows rarely pick the same expert
    total = sum(math.prod(s) for s in weight_shapes(c).values())
    experts = c.num_hidden_layers * c.num_experts * 3 * c.hidden_size * c.moe_intermediate_size
    embed_rows = c.vocab_size * c.hidden_size - c.hidden_size  # an untied table: one row per sequence
    one = decode_bytes_per_step(c, 2, 0, batch=1)
    assert one == 2 * (total - embed_rows - experts + experts * 8 / 128)
    assert 6.0e9 < one < 6.2e9  # about 3.0B weights a token, in bf16
    # Large batches approach every weight once; the KV cache is the dense formula's.
    assert decode_bytes_per_step(c, 2, 0, batch=4096) == pytest.approx(
        2 * (total - c.vocab_size * c.hidden_size + 4096 * c.hidden_size), rel=1e-6
    )
    kv = decode_bytes_per_step(c, 2, 100, batch=2) - decode_bytes_per_step(c, 2, 0, batch=2)
    assert kv == 2 * 2 * 48 * 4 * 128 * 100 * 2
    dense = SHAPES["llama-1b"]  # unchanged for a dense model
    assert decode_bytes_per_step(dense, 2, 0) == 2 * sum(math.prod(s) for s in weight_shapes(dense).values())


@pytest.mark.parametrize("shape", ["qwen3-moe-tiny", "mixtral-tiny"])
def test_the_moe_peer_and_hfs_model_match_the_reference_forward(shape: str) -> None:
    model = load_model(shape, seed=2)
    tokens = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    want = torch.stack([forward(model, row)[-1] for row in tokens])
    peer = decode.peer_for(model, 2, 16)
    assert isinstance(peer, decode.MoePeer)
    with torch.no_grad():
        torch.testing.assert_close(peer.forward(tokens, torch.arange(9)), want, atol=1e-4, rtol=1e-4)
    pytest.importorskip("transformers")
    hf = decode.hf_model(model)
    with torch.no_grad():
        got = hf(input_ids=tokens).logits[:, -1].float()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_decode_runs_a_moe_shape_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "decode.json"
    cmd = [sys.executable, str(BENCH / "decode.py"), "--device", "cpu", "--models", "qwen3-moe-tiny"]
    cmd += ["--batches", "2", "--engines", "polymorph,hf-eager", "--steps", "2", "--warmup", "1"]
    cmd += [
        "--prompt",
        "8",
        "--knobs",
        "kv_cache=static,decode_step=fused,moe_experts=grouped",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["engine"] for r in rows} == {"polymorph", "hf-eager"}
    assert all(r["tok_s"] and r["tok_s"] > 0 and "error" not in r for r in rows), rows
    assert all(r["roofline_tok_s"] > 0 for r in rows)
