"""The rotary (RoPE) table of a Llama-family model: cos and sin of every position's angles, as transformers' default
rotary embedding computes them (fp32 angles, cos and sin cast to the model's dtype), made once and read by every
later step. It knows torch alone.

Made once, a wrong element stays wrong for the life of the process. On a CPU, torch's cos over a whole [1024, 64]
table (two OpenMP threads, each half the elements) came back wrong in the worker thread's half in 5 of 300 fresh
processes on a 2-core Xeon (rows 512-1023 off by up to 1e-4; only a process's first cos, never the calling thread's
half, never the sin after it), and in none of 150 with a one-element cos first: a server that met it answered
otherwise than every other (docs/LOG.md, 2026-12-06, night; `benchmarks/first_cos.py` counts it). So the first calls
are small ones on this thread (`first_trig_calls`, which model loading also makes before any model runs), and the
table goes piece by piece, each piece this thread's alone: the values a whole call gives when it goes right, bit for
bit."""

from __future__ import annotations

import torch

# Elements one cos or sin call of `cos_sin` takes: under ATen's grain for these ops (2048), so the calling thread
# computes them all
TRIG_ELEMENTS = 1024


def first_trig_calls() -> None:
    """A cos and a sin of one element on this thread: the process's first, where nothing asked before."""
    torch.zeros(1).cos(), torch.zeros(1).sin()


def cos_sin(angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of `angles` [P, D], elementwise as torch computes them; on a CPU every element on this thread."""
    if angles.device.type != "cpu":
        return angles.cos(), angles.sin()
    first_trig_calls()
    flat = angles.reshape(-1)
    cos = torch.cat([flat[i : i + TRIG_ELEMENTS].cos() for i in range(0, flat.numel() or 1, TRIG_ELEMENTS)])
    sin = torch.cat([flat[i : i + TRIG_ELEMENTS].sin() for i in range(0, flat.numel() or 1, TRIG_ELEMENTS)])
    return cos.reshape(angles.shape), sin.reshape(angles.shape)


def table(theta: float, head_dim: int, positions: int, dtype: torch.dtype,
          device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [positions, head_dim] in `dtype`, sin's first half negated (the lean engine's `rotate` rolls the
    halves instead of negating one)."""
    d = head_dim
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    pos = torch.arange(positions, device=device).float()
    freqs = pos[:, None] * inv_freq[None, :]  # [P, D/2]
    cos, sin = cos_sin(torch.cat([freqs, freqs], dim=-1))  # [P, D] each
    sign = torch.ones(d, device=device)
    sign[: d // 2] = -1
    return cos.to(dtype), (sin * sign).to(dtype)
