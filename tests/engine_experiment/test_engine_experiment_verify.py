"""Verification: the reference and its knob variants pass; wrong builds are rejected with values."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine_support.builds import patched_build, sensitive_model, wrapping_build
from polymorph.contract.api import Gates
from polymorph.contract.builds import REFERENCE_BUILD
from polymorph_engine.experiment.verify import Golden, default_prompts, golden, verify
from polymorph_engine.runtime.hotpath import HotPath
from polymorph_engine.runtime.loader import load_hotpath
from polymorph_engine.runtime.model import LoadedModel

GATES = Gates(tokenAgreement=0.98, logitTolerance=0.05)


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return sensitive_model()


@pytest.fixture(scope="module")
def reference(model: LoadedModel) -> Golden:
    return golden(model, default_prompts(model.config.vocab_size), steps=8)


def _verify(model: LoadedModel, build: Path, reference: Golden, knobs: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    hotpath, _, _ = load_hotpath(model, build, knobs)
    try:
        return verify(hotpath, reference, GATES, device=model.device)
    finally:
        hotpath.close()


def test_golden_is_the_reference_greedy_continuation(model: LoadedModel, reference: Golden) -> None:
    assert reference.tokens.shape == (4, 8) and reference.logits.shape == (4, 8, model.config.vocab_size)
    assert torch.equal(reference.tokens, reference.logits.argmax(-1))
    assert len(set(reference.tokens.flatten().tolist())) > 8, "a degenerate golden set would test nothing"


def test_golden_round_trips_through_a_file(reference: Golden, tmp_path: Path) -> None:
    reference.save(tmp_path / "golden.pt")
    again = Golden.load(tmp_path / "golden.pt")
    assert again.prompts == reference.prompts
    assert torch.equal(again.tokens, reference.tokens) and torch.equal(again.logits, reference.logits)


def test_the_reference_passes_against_itself(model: LoadedModel, reference: Golden) -> None:
    result = _verify(model, REFERENCE_BUILD, reference)
    assert result.passed and result.tokenAgreement == 1.0 and result.logitError == 0.0 and result.finite


@pytest.mark.parametrize(
    "knobs",
    [
        {"kv_cache": "static"},
        {"fused_qkv": True, "fused_gate_up": True},
        {"attention": "sdpa", "sampling": "device"},
    ],
)
def test_correct_knob_variants_pass(model: LoadedModel, reference: Golden, knobs: dict[str, object]) -> None:
    result = _verify(model, REFERENCE_BUILD, reference, knobs)
    assert result.passed, result
    assert result.logitError < 1e-3


# Wrong builds: small patches of the reference, each a bug class that must never ship.
WRONG: dict[str, tuple[str, list[tuple[str, str]]]] = {
    # name -> (the reference build's file, its patches)
    # RoPE positions off by one in decode only: prefill is right, every decode step is wrong.
    "rope-off-by-one": (
        "hotpath.py",
        [("positions[:, None], mask, kv)", "positions[:, None] + 1, mask, kv)")],
    ),
    # The MLP's RMSNorm is skipped.
    "missing-norm": ("model.py", [("h = rms_norm(x, lw.mlp_norm, self.eps)", "h = x")]),
    # Logits perturbed by noise of 5% of their scale.
    "noise": (
        "model.py",
        [
            (
                "return (rms_norm(x, self.final_norm, self.eps) @ self.lm_head.T).float()",
                "logits = (rms_norm(x, self.final_norm, self.eps) @ self.lm_head.T).float()\n"
                "        return logits + 0.05 * logits.abs().amax(-1, keepdim=True) * torch.randn_like(logits)",
            )
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_builds_are_rejected_with_the_measured_values(
    model: LoadedModel, reference: Golden, tmp_path: Path, name: str
) -> None:
    build = patched_build(tmp_path / name, name, WRONG[name][1], file=WRONG[name][0])
    result = _verify(model, build, reference)
    assert not result.passed
    assert result.finite
    assert result.logitError > GATES.logitTolerance, result


def test_a_build_returning_nan_is_rejected_as_non_finite(
    model: LoadedModel, reference: Golden, tmp_path: Path
) -> None:
    build = wrapping_build(tmp_path / "nan", "nan", "decode", "        return original(*args) * float('nan')")
    result = _verify(model, build, reference)
    assert not result.passed and not result.finite
    # The prefill step is still right; the NaN decode steps fail agreement too.
    assert result.tokenAgreement < GATES.tokenAgreement


def test_teacher_forcing_keeps_one_bad_step_from_cascading(
    model: LoadedModel, reference: Golden, tmp_path: Path
) -> None:
    # Decode step 3 (the 4th token) of every prompt is forced to a wrong token; all others are right.
    body = """        logits = original(*args)
        self_steps.append(1)
        if len(self_steps) == 3:
            logits = logits.clone()
            logits[:, :] = 0
            logits[:, 0] = 1
        return logits"""
    build = wrapping_build(tmp_path / "one-bad-step", "one-bad-step", "decode", body)
    hotpath_py = build / "hotpath.py"
    hotpath_py.write_text(
        hotpath_py.read_text().replace(
            "    original = hotpath.decode\n", "    original = hotpath.decode\n    self_steps = []\n"
        )
    )
    result = _verify(model, build, reference)
    wrong = int((reference.tokens[:, 3] != 0).sum())
    assert result.tokenAgreement == pytest.approx(1 - wrong / reference.tokens.numel())
    assert not result.passed


def test_shape_mismatch_is_an_error_not_a_pass(model: LoadedModel, reference: Golden, tmp_path: Path) -> None:
    build = wrapping_build(tmp_path / "short", "short", "decode", "        return original(*args)[:, :-1]")
    hotpath: HotPath
    hotpath, _, _ = load_hotpath(model, build)
    with pytest.raises(ValueError, match="shape"):
        verify(hotpath, reference, GATES, device=model.device)


@pytest.fixture(scope="module")
def demo_model() -> LoadedModel:
    from polymorph_engine.runtime.checkpoint import load_model

    return load_model("tiny")


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_builds_are_rejected_by_both_gates_on_the_demo_model(
    demo_model: LoadedModel, tmp_path: Path, name: str
) -> None:
    """``tiny`` is what ``polymorph compile`` and agents run by default: its gates must be sharp
    there too, with a margin, not only on the test model above."""
    demo_golden = golden(demo_model, default_prompts(demo_model.config.vocab_size), steps=16)
    result = _verify(
        demo_model, patched_build(tmp_path / name, name, WRONG[name][1], file=WRONG[name][0]), demo_golden
    )
    assert not result.passed
    assert result.tokenAgreement < GATES.tokenAgreement, result
    assert result.logitError > 2 * GATES.logitTolerance, result
