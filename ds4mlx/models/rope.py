"""Rotary position embeddings with YaRN, as ggml's ``ggml_rope_ext`` / ``ggml_rope_ext_back`` do.

Angles are computed on the host in float64 from the integer positions (always known there), so
they are at least as accurate as ggml's float32 recurrence ``theta *= theta_scale``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from ds4mlx.kernels import norm_rotary, rotary
from ds4mlx.models.norms import rms_norm

import mlx.core as mx
import numpy as np


@dataclass(frozen=True)
class RopeConfig:
    """The parameters of one ``ggml_rope_ext`` call.

    ``interleaved`` selects GGML_ROPE_TYPE_NORMAL (rotate the pairs ``(x[2i], x[2i+1])``), as
    DeepSeek uses; ``False`` is GGML_ROPE_TYPE_NEOX (pairs ``(x[i], x[i + n_dims/2])``).
    """

    n_dims: int
    base: float
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0
    interleaved: bool = True


def yarn_corr_dims(
    n_dims: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float
) -> tuple[float, float]:
    """The rotary pair range over which YaRN ramps from interpolation to extrapolation."""

    def corr_dim(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low = math.floor(corr_dim(beta_fast))
    high = math.ceil(corr_dim(beta_slow))
    return max(0.0, low), min(n_dims - 1.0, high)


@dataclass(frozen=True)
class RopeAngles:
    """cos and sin (already multiplied by the YaRN magnitude scale), each [T, n_dims / 2]: host
    arrays, or MLX arrays where they enter a compiled step as inputs (``on_device``)."""

    cos: np.ndarray | mx.array
    sin: np.ndarray | mx.array

    @cached_property
    def on_device(self) -> tuple[mx.array, mx.array]:
        """(cos, sin) as MLX arrays, the inputs a compiled step takes them as (made once: the
        layers that share a RoPE share these angles, ``RoPE.angles``)."""
        return _device(self.cos), _device(self.sin)

    def row(self, r: int) -> RopeAngles:
        """The angles of row ``r`` alone."""
        return RopeAngles(self.cos[r : r + 1], self.sin[r : r + 1])


# RoPE.angles' recent answers by (config, positions), oldest first.
_RECENT_ANGLES: dict[tuple[RopeConfig, bytes], RopeAngles] = {}
_RECENT_ANGLES_KEPT = 64


class RoPE:
    """Rotates ``n_dims`` channels starting at a channel offset, by token position."""

    def __init__(self, config: RopeConfig):
        if config.n_dims % 2:
            raise ValueError(f"RoPE needs an even number of rotated dims, got {config.n_dims}")
        self.config = config
        half = config.n_dims // 2
        pair = np.arange(half, dtype=np.float64)
        theta_extrap = config.base ** (-2.0 * pair / config.n_dims)
        theta_interp = config.freq_scale * theta_extrap
        mscale = config.attn_factor
        if config.ext_factor != 0.0:
            low, high = yarn_corr_dims(
                config.n_dims, config.n_ctx_orig, config.base, config.beta_fast, config.beta_slow
            )
            y = (pair - low) / max(0.001, high - low)
            ramp_mix = (1.0 - np.clip(y, 0.0, 1.0)) * config.ext_factor
            inv_freq = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix
            # ggml multiplies the magnitude by this whenever YaRN extrapolation is on.
            mscale *= 1.0 + 0.1 * math.log(1.0 / config.freq_scale)
        else:
            inv_freq = theta_interp
        self._inv_freq = inv_freq
        self._mscale = mscale

    @property
    def n_dims(self) -> int:
        return self.config.n_dims

    def angles(self, positions: np.ndarray) -> RopeAngles:
        """The angles at integer ``positions``. Every layer with the same RoPE asks for the
        same positions in a step: the last few answers are kept (read-only) and shared."""
        positions = np.asarray(positions, dtype=np.int64)
        key = (self.config, positions.tobytes())
        found = _RECENT_ANGLES.get(key)
        if found is not None:
            return found
        theta = positions.astype(np.float64)[:, None] * self._inv_freq[None, :]
        cos = (np.cos(theta) * self._mscale).astype(np.float32)
        sin = (np.sin(theta) * self._mscale).astype(np.float32)
        cos.flags.writeable = sin.flags.writeable = False
        found = _RECENT_ANGLES[key] = RopeAngles(cos, sin)
        if len(_RECENT_ANGLES) > _RECENT_ANGLES_KEPT:
            del _RECENT_ANGLES[next(iter(_RECENT_ANGLES))]
        return found

    def apply(
        self,
        x: mx.array,
        angles: RopeAngles,
        *,
        offset: int = 0,
        inverse: bool = False,
        shape: tuple[int, ...] | None = None,
    ) -> mx.array:
        """Rotate channels ``[offset, offset + n_dims)`` of x ([T, ..., D], token axis first);
        ``shape``: the result reshaped to it (on the GPU the launch writes that layout).

        ``inverse`` is ``ggml_rope_ext_back``: the transposed rotation (sin negated) with the same
        magnitude scale. On the CPU one native primitive computes it (``kernels.rotary``); this
        formula is its twin.

        Each rotated pair ``(a, b)`` becomes ``(a cos - b sin, a sin + b cos)``, computed as
        ``r * C + (r @ P) * S`` on the rotated channels r: P swaps each pair's members (an exact
        permutation matmul), C holds cos and S the signed sin, both built on the host. That is
        five primitives (the slices, the matmul, one fused kernel, the concatenation) where
        splitting pairs and stacking them back was fifteen; the products are the same.
        """
        n = self.config.n_dims
        if n == 0:
            return x if shape is None else x.reshape(shape)
        dim = x.shape[-1]
        if offset < 0 or offset + n > dim:
            raise ValueError(f"RoPE channels [{offset}, {offset + n}) do not fit in {dim}")
        native = rotary(x, *angles.on_device, offset, n, self.config.interleaved, inverse, shape)
        out = self.twin(x, angles, offset, inverse) if native is None else native
        return out if shape is None or tuple(out.shape) == tuple(shape) else out.reshape(shape)

    def apply_normed(
        self,
        x: mx.array,
        weight: mx.array | None,
        eps: float,
        angles: RopeAngles,
        *,
        offset: int,
        heads: int | None = None,
    ) -> mx.array:
        """``apply`` of x RMS-normalised over its last axis (times ``weight``); with ``heads``,
        x [T, heads * D] is taken as [T, heads, D] (a product's heads). One Metal launch in
        inference on the GPU (``kernels.norm_rotary``), the norm then ``apply`` else."""
        config = self.config
        if config.n_dims:
            fused = norm_rotary(
                x, weight, eps, *angles.on_device, offset, config.n_dims, config.interleaved, heads
            )
            if fused is not None:
                return fused
        if heads is not None:
            x = x.reshape(x.shape[0], heads, -1)
        return self.apply(rms_norm(x, weight, eps), angles, offset=offset)

    def twin(self, x: mx.array, angles: RopeAngles, offset: int, inverse: bool) -> mx.array:
        """``apply`` in MLX operations (the native primitive's twin)."""
        n, tokens, dim = self.config.n_dims, x.shape[0], x.shape[-1]
        # Host tables are built with numpy (no primitives); device ones (a compiled step's
        # inputs) with the same operations in MLX.
        xp = np if isinstance(angles.cos, np.ndarray) else mx
        cos = (
            xp.repeat(angles.cos, 2, axis=-1)
            if self.config.interleaved
            else xp.concatenate([angles.cos, angles.cos], axis=-1)
        )
        sin = -angles.sin if inverse else angles.sin
        # S's signs: the first member of a pair takes -sin, the second +sin.
        signed = (
            xp.stack([-sin, sin], axis=-1).reshape(tokens, n)
            if self.config.interleaved
            else xp.concatenate([-sin, sin], axis=-1)
        )
        bshape = (tokens,) + (1,) * (x.ndim - 2) + (n,)
        part = x if n == dim else x[..., offset : offset + n]
        rotated = _rotate(
            part, part @ self._swap, _device(cos.reshape(bshape)), _device(signed.reshape(bshape))
        )
        pieces = [x[..., :offset], rotated, x[..., offset + n :]]
        pieces = [p for p in pieces if p.shape[-1] > 0]
        return pieces[0] if len(pieces) == 1 else mx.concatenate(pieces, axis=-1)

    @cached_property
    def _swap(self) -> mx.array:
        """The permutation [n, n] that swaps the members of each rotated pair."""
        n = self.config.n_dims
        index = np.arange(n)
        if self.config.interleaved:
            partner = index ^ 1
        else:
            partner = (index + n // 2) % n
        swap = np.zeros((n, n), np.float32)
        swap[partner, index] = 1.0
        return mx.array(swap)


def _device(a: np.ndarray | mx.array) -> mx.array:
    return a if isinstance(a, mx.array) else mx.array(a)


@mx.compile
def _rotate(x: mx.array, swapped: mx.array, cos: mx.array, signed_sin: mx.array) -> mx.array:
    return x * cos + swapped * signed_sin
