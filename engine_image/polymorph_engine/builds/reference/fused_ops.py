"""The operations of the fused decode step, one class per ``kernels`` knob value (see fused.py).

- ``TorchOps``: the reference twins, the reference build's own layer functions in graph-safe
  shapes (also what ``kernels = "compile"`` compiles).
- ``TritonOps``: kernels.py, gemv_kernels.py (for up to ``GEMV_MAX_ROWS`` rows, cuBLAS above) and
  attention_kernels.py; ``gemv``, ``pdl`` and ``residual`` as build.toml says.

Each method of ``TritonOps`` computes what the ``TorchOps`` method of the same name computes;
``tests/engine_builds/test_fast_knobs.py`` compares them. It knows nothing about layers' order,
caches beyond their layout, capture or scheduling.
Shapes: B = rows (a bucket), H = hidden, I = intermediate, V = vocab, D = head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import layers as L
from .kvcache import StaticCache

GEMV_MAX_ROWS = 1
"""Rows up to which ``gemv = "triton"`` runs the Triton GEMV; cuBLAS above. At 2 and 4 rows cuBLAS
won on an H200 against both a program per row (each weight tile loaded once per row) and a
program for all rows (8B at 4 rows: 866 against 450 tok/s), so the Triton GEMV is a batch-1 kernel."""
RopeFn = Callable[[torch.Tensor, torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Shape:
    nh: int
    nkv: int
    d: int
    eps: float


class TorchOps:
    """The reference twins: the reference build's own layer functions, graph-safe shapes."""

    def __init__(self, shape: Shape, rope: RopeFn, attention: str) -> None:
        self.s, self.rope = shape, rope
        self.attend_fn = L.attention_sdpa if attention == "sdpa" else L.attention_manual

    def norm_linear(
        self, x: torch.Tensor, nw: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """x [B, K] -> linear(rms_norm(x)) [B, N]."""
        return F.linear(L.rms_norm(x, nw, self.s.eps), w, bias)

    def linear_residual(
        self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, res: torch.Tensor
    ) -> torch.Tensor:
        """res + linear(x): x [B, K], res [B, N]."""
        return res + F.linear(x, w, bias)

    def silu_linear_residual(self, gu: torch.Tensor, w: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
        """res + down(silu(gate) * up): gu [B, 2I] = [gate | up], w [H, I]."""
        gate, up = gu.chunk(2, dim=-1)
        return res + F.linear(F.silu(gate) * up, w)

    def rope_store(
        self,
        qkv: torch.Tensor,
        kc: torch.Tensor,
        vc: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
        inv_freq: torch.Tensor,
        q_norm: torch.Tensor | None,
        k_norm: torch.Tensor | None,
    ) -> torch.Tensor:
        """qkv [B, (nh+2nkv)*D] -> rotated q [B, nh, D]; rotated k and v written at
        (slots, lengths[slots]) of kc, vc [S, nkv, L, D]."""
        s = self.s
        b = qkv.shape[0]
        q, k, v = qkv.split([s.nh * s.d, s.nkv * s.d, s.nkv * s.d], dim=-1)
        q, k, v = q.reshape(b, s.nh, s.d), k.reshape(b, s.nkv, s.d), v.reshape(b, s.nkv, s.d)
        if q_norm is not None and k_norm is not None:
            q, k = L.rms_norm(q, q_norm, s.eps), L.rms_norm(k, k_norm, s.eps)
        positions = lengths[slots].clamp(max=kc.shape[2] - 1)  # [B]; padded rows stay in bounds
        cos, sin = self.rope(inv_freq, positions, qkv.dtype)  # [B, D]
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, D]
        q = q * cos + L.rotate_half(q) * sin
        k = k * cos + L.rotate_half(k) * sin
        kc[slots, :, positions] = k  # advanced indices first: [B, nkv, D]
        vc[slots, :, positions] = v
        return q

    def attend(
        self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """q [B, nh, D] over all of kc, vc [S, nkv, L, D] masked to 0..lengths[slot] -> [B, nh*D]."""
        b = q.shape[0]
        positions = lengths[slots].clamp(max=kc.shape[2] - 1)
        mask = StaticCache.decode_mask(positions, kc.shape[2])  # [B, 1, 1, L]
        out = self.attend_fn(q[:, :, None], kc[slots], vc[slots], mask)  # [B, nh, 1, D]
        return out.reshape(b, -1)

    def head(self, x: torch.Tensor, nw: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x [B, H] -> float32 logits [B, V]."""
        return (L.rms_norm(x, nw, self.s.eps) @ w.T).float()

    # The deferred-residual flow (``residual = "norm"``): projections return plain outputs, and
    # each residual add happens in the next norm.

    def add_norm(
        self, x: torch.Tensor, y: torch.Tensor | None, nw: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y [B, H] -> (x + y, rms_norm(x + y)); y None: (x, rms_norm(x))."""
        if y is not None:
            x = x + y
        return x, L.rms_norm(x, nw, self.s.eps)

    def linear(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [B, K] -> [B, N]."""
        return F.linear(x, w, bias)

    def silu_linear(self, gu: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """gu [B, 2I] = [gate | up] -> down(silu(gate) * up) [B, H]."""
        gate, up = gu.chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, w)

    def logits(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Normed h [B, H] -> float32 logits [B, V]."""
        return (h @ w.T).float()


class TritonOps(TorchOps):
    """kernels.py, gemv_kernels.py and attention_kernels.py for batch <= GEMV_MAX_ROWS; cuBLAS (the
    torch twin) above it."""

    def __init__(
        self,
        shape: Shape,
        rope: RopeFn,
        attention: str,
        gemv: str = "cublas",
        pdl: bool = False,
        residual: str = "projection",
    ) -> None:
        super().__init__(shape, rope, attention)
        # optional extra: triton only when this knob value is chosen
        from . import attention_kernels, gemv_kernels, kernels

        self.k, self.g, self.attn = kernels, gemv_kernels, attention_kernels
        self.gemv = gemv
        self.pdl = pdl
        self.deferred = residual == "norm"  # the step then uses add_norm / linear / silu_linear / logits

    def _fused_gemv(self, x: torch.Tensor) -> bool:
        return self.gemv == "triton" and x.shape[0] <= GEMV_MAX_ROWS

    def norm_linear(
        self, x: torch.Tensor, nw: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if self._fused_gemv(x):
            out = x.new_empty(x.shape[0], w.shape[0])
            return self.g.gemv(x, w, out, bias=bias, norm_weight=nw, eps=self.s.eps, pdl=self.pdl)
        return F.linear(self.k.rms_norm(x, nw, self.s.eps, self.pdl), w, bias)  # one norm launch, then cuBLAS

    def linear_residual(
        self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, res: torch.Tensor
    ) -> torch.Tensor:
        if self._fused_gemv(x):
            return self.g.gemv(x, w, torch.empty_like(res), bias=bias, res=res, pdl=self.pdl)
        if bias is not None:
            res = res + bias
        return torch.addmm(res, x, w.T)  # the residual add in cuBLAS's epilogue

    def silu_linear_residual(self, gu: torch.Tensor, w: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
        if self._fused_gemv(gu):
            return self.g.gemv(gu, w, torch.empty_like(res), res=res, silu_mul=True, pdl=self.pdl)
        return torch.addmm(res, self.k.silu_mul(gu, self.pdl), w.T)

    def rope_store(
        self,
        qkv: torch.Tensor,
        kc: torch.Tensor,
        vc: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
        inv_freq: torch.Tensor,
        q_norm: torch.Tensor | None,
        k_norm: torch.Tensor | None,
    ) -> torch.Tensor:
        s = self.s
        q = qkv.new_empty(qkv.shape[0], s.nh, s.d)
        self.k.rope_store(qkv, q, kc, vc, slots, lengths, inv_freq, q_norm, k_norm, s.eps, self.pdl)
        return q

    def attend(
        self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        b, nh, d = q.shape
        splits = self.attn.attention_splits(kc.shape[2], b, kc.shape[1], self.k.sm_count(q.device))
        scratch = (
            q.new_empty(b, nh, splits, dtype=torch.float32),
            q.new_empty(b, nh, splits, dtype=torch.float32),
            q.new_empty(b, nh, splits, d, dtype=torch.float32),
        )
        return self.attn.decode_attention(
            q, kc, vc, slots, lengths, q.new_empty(b, nh * d), scratch, self.pdl
        )

    def head(self, x: torch.Tensor, nw: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self._fused_gemv(x):
            out = x.new_empty(x.shape[0], w.shape[0], dtype=torch.float32)
            return self.g.gemv(x, w, out, norm_weight=nw, eps=self.s.eps, pdl=self.pdl)
        return F.linear(self.k.rms_norm(x, nw, self.s.eps, self.pdl), w).float()

    def add_norm(
        self, x: torch.Tensor, y: torch.Tensor | None, nw: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if y is None:
            return x, self.k.rms_norm(x, nw, self.s.eps, self.pdl)
        return self.k.add_rms_norm(x, y, nw, self.s.eps, self.pdl)  # one launch: the add, then the norm

    def linear(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self._fused_gemv(x):
            return self.g.gemv(x, w, x.new_empty(x.shape[0], w.shape[0]), bias=bias, pdl=self.pdl)
        return F.linear(x, w, bias)

    def silu_linear(self, gu: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self._fused_gemv(gu):
            out = gu.new_empty(gu.shape[0], w.shape[0])
            return self.g.gemv(gu, w, out, silu_mul=True, pdl=self.pdl)
        return F.linear(self.k.silu_mul(gu, self.pdl), w)

    def logits(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self._fused_gemv(h):
            out = h.new_empty(h.shape[0], w.shape[0], dtype=torch.float32)
            return self.g.gemv(h, w, out, pdl=self.pdl)
        return F.linear(h, w).float()
