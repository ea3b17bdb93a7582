"""RoPE frequency tables for every scaling type transformers knows (its modeling_rope_utils is the
reference, computed with the same float32 ops so the tables are bit-identical).

``rope_tables`` returns the cos and sin of each position's angles, [max_position, head_dim // 2],
attention factor (yarn, longrope) included. Two types depend on the sequence length in
transformers, which recomputes its frequencies per forward call from ``max(position_ids) + 1``:

- dynamic (NTK): here position p is rotated with the frequencies of length ``max(p + 1,
  max_position_embeddings)``, as if every token were its own forward call;
- longrope: position p with the long factors from ``original_max_position_embeddings`` on, the
  short ones before (vLLM's table does the same).

That equals transformers' generate for a prompt no longer than the original context (its prefill
then runs unscaled, and each decode step's length is p + 1); for a longer prompt transformers
rotates the whole prompt with the frequencies of the prompt's length, which no per-position table
can do (a token's rotation would depend on the request, and prefix-cache blocks could not be
shared), so there the two differ.
"""

from __future__ import annotations

import math

import torch


def _default_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def _llama3(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor = s["factor"]
    low_freq_factor = s.get("low_freq_factor", 1.0)
    high_freq_factor = s.get("high_freq_factor", 4.0)
    old_context_len = s["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def _yarn(head_dim: int, base: float, s: dict, max_position: int) -> tuple[torch.Tensor, float]:
    original = s["original_max_position_embeddings"]
    factor = s.get("factor") or max_position / original
    attention_factor = s.get("attention_factor")
    mscale, mscale_all_dim = s.get("mscale"), s.get("mscale_all_dim")

    def get_mscale(scale, m=1):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        attention_factor = (float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
                            if mscale and mscale_all_dim else get_mscale(factor))
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(num_rotations):
        return (head_dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, head_dim, 2).to(dtype=torch.float) / head_dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # the share of each frequency extrapolated (left as trained)
    return interpolation * (1 - keep) + extrapolation * keep, attention_factor


def _dynamic_angles(head_dim: int, base: float, s: dict, max_position: int) -> torch.Tensor:
    """[max_position, head_dim // 2] angles: position p with the frequencies of length
    max(p + 1, original) (module docstring)."""
    original, factor = s["original_max_position_embeddings"], s["factor"]
    positions = torch.arange(max_position, dtype=torch.float32)
    angles = torch.outer(positions, _default_inv_freq(head_dim, base))
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    for p in range(original, max_position):  # transformers' ops on a 0-d length tensor
        seq_len = torch.tensor(p + 1)
        scaled = base * ((factor * seq_len / original) - (factor - 1)) ** (head_dim / (head_dim - 2))
        angles[p] = positions[p] * (1.0 / (scaled ** exponents))
    return angles


def _longrope_angles(head_dim: int, base: float, s: dict, max_position: int
                     ) -> tuple[torch.Tensor, float]:
    original = s["original_max_position_embeddings"]
    factor = s.get("factor") or max_position / original
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    shape = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    short = 1.0 / (torch.tensor(s["short_factor"], dtype=torch.float32) * base ** shape)
    long = 1.0 / (torch.tensor(s["long_factor"], dtype=torch.float32) * base ** shape)
    positions = torch.arange(max_position, dtype=torch.float32)
    angles = torch.outer(positions, short)
    angles[original:] = torch.outer(positions[original:], long)
    return angles, attention_factor


ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")


def rope_type_of(scaling: dict | None) -> str:
    return (scaling or {}).get("rope_type", (scaling or {}).get("type", "default")) or "default"


def rope_tables(head_dim: int, max_position: int, base: float, scaling: dict | None = None,
                freq_factors: list[float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [max_position, head_dim // 2] float32, attention factor applied.

    freq_factors: a GGUF's ``rope_freqs`` (llama.cpp divides each frequency by its factor)."""
    rope_type = rope_type_of(scaling)
    attention_factor = 1.0
    angles = None
    inv_freq = _default_inv_freq(head_dim, base)
    if rope_type == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif rope_type == "llama3":
        inv_freq = _llama3(inv_freq, scaling)
    elif rope_type == "yarn":
        inv_freq, attention_factor = _yarn(head_dim, base, scaling, max_position)
    elif rope_type == "dynamic":
        angles = _dynamic_angles(head_dim, base, scaling, max_position)
    elif rope_type == "longrope":
        angles, attention_factor = _longrope_angles(head_dim, base, scaling, max_position)
    elif rope_type != "default":
        raise ValueError(f"unsupported rope_scaling type {rope_type!r}; supported: "
                         f"{', '.join(ROPE_TYPES)}")
    if freq_factors is not None:
        inv_freq = inv_freq / torch.tensor(freq_factors, dtype=torch.float32)
    if angles is None:
        angles = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    cos, sin = angles.cos(), angles.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos, sin
