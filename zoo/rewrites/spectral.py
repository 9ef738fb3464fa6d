"""STFT / iSTFT as fixed convolutions.

torch.stft / torch.istft have no lowering in litert-torch ("Unsupported ir element type: complex<f32>";
Core AI: no aten._fft_r2c), so a model using them fails before any GPU check. A DFT is a fixed linear
map, so both are plain convolutions with baked kernels:
- STFT: centre padding (reflect, via `pad_edges` — a rank-3 reflect F.pad would be GATHER_ND), then a
  Conv1d whose 2F output channels are window·cos and -window·sin rows, stride = hop. Output uses
  torch.view_as_real's layout [B, F, T, 2].
- iSTFT: the inverse one-sided DFT times the window is a ConvTranspose1d kernel [2F, 1, n_fft] with
  stride hop, which *is* the overlap-add; it runs as zero-stuffing + a plain conv (no TRANSPOSE_CONV),
  then a constant 1/envelope (sum of squared shifted windows) and the centre trim.
The seed warns that a library STFT-as-conv stack mis-converted (corr 0.83) while its op list looked
clean, so the tests compare the *converted* model's output with torch.stft/istft, not just torch.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from zoo.rewrites import inspect as tfl
from zoo.rewrites.base import COREAI, LITERT, LITERT_GPU, NEEDED, Demo, Lambda, Rewrite, const_like, seeded
from zoo.rewrites.resampling import conv_weight_from_transposed, zero_stuff_conv_transpose2d
from zoo.rewrites.slicing import pad_edges


def _full_window(window: torch.Tensor | None, n_fft: int) -> np.ndarray:
    """The window as torch.stft uses it: ones if None, centre-padded with zeros to n_fft."""
    if window is None:
        return np.ones(n_fft)
    w = window.detach().double().numpy()
    left = (n_fft - len(w)) // 2
    return np.pad(w, (left, n_fft - len(w) - left))


def _dft_angles(n_fft: int) -> np.ndarray:
    """[F, n_fft] angles 2πkn/N, with kn reduced mod N first so large products lose no precision."""
    k = np.arange(n_fft // 2 + 1)[:, None]
    n = np.arange(n_fft)[None, :]
    return 2.0 * math.pi * ((k * n) % n_fft) / n_fft


def stft_kernel(n_fft: int, window: np.ndarray, normalized: bool = False) -> np.ndarray:
    """Conv1d weight [2F, 1, n_fft]: rows window·cos (real parts) then -window·sin (imaginary)."""
    ang = _dft_angles(n_fft)
    w = np.concatenate([np.cos(ang) * window, -np.sin(ang) * window])
    if normalized:
        w = w / math.sqrt(n_fft)
    return w[:, None, :]


def istft_kernel(n_fft: int, window: np.ndarray, normalized: bool = False) -> np.ndarray:
    """ConvTranspose1d weight [2F, 1, n_fft]: one-sided inverse DFT of one frame, times the window.

    x[n] = (1/N) Σ_k c_k (Re X_k cos(2πkn/N) - Im X_k sin(2πkn/N)), c_0 = c_{N/2} = 1, else 2. The
    imaginary parts of DC and Nyquist get zero weight (sin 0 = sin πn = 0), as in irfft.
    """
    ang = _dft_angles(n_fft)
    c = np.full((n_fft // 2 + 1, 1), 2.0)
    c[0] = 1.0
    if n_fft % 2 == 0:
        c[-1] = 1.0
    w = np.concatenate([c * np.cos(ang), -c * np.sin(ang)]) * window / n_fft
    if normalized:
        w = w * math.sqrt(n_fft)
    return w[:, None, :]


class STFTConv(nn.Module):
    """torch.view_as_real(torch.stft(x, n_fft, hop, window=..., return_complex=True)) for x [B, L]."""

    def __init__(
        self,
        n_fft: int,
        hop_length: int,
        window: torch.Tensor | None = None,
        center: bool = True,
        pad_mode: str = "reflect",
        normalized: bool = False,
    ):
        super().__init__()
        self.n_fft, self.hop, self.center, self.pad_mode = n_fft, hop_length, center, pad_mode
        kernel = stft_kernel(n_fft, _full_window(window, n_fft), normalized)
        self.register_buffer("kernel", torch.from_numpy(kernel).float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        x = x.unsqueeze(1)  # [B, 1, L]
        if self.center:
            half = self.n_fft // 2
            x = (
                pad_edges(x, (half, half), self.pad_mode)
                if self.pad_mode != "constant"
                else nn.functional.pad(x, (half, half))
            )
        spec = nn.functional.conv1d(x, self.kernel.to(x.dtype), stride=self.hop)  # [B, 2F, T]
        f = self.n_fft // 2 + 1
        return spec.reshape(b, 2, f, -1).permute(0, 2, 3, 1)  # [B, F, T, 2]


def _overlap_envelope(n_fft: int, hop: int, frames: int, window: np.ndarray) -> np.ndarray:
    env = np.zeros(n_fft + hop * (frames - 1))
    for t in range(frames):
        env[t * hop : t * hop + n_fft] += window**2
    return env


class ISTFTConv(nn.Module):
    """torch.istft(torch.view_as_complex(spec), n_fft, hop, window=...) for spec [B, F, T, 2]."""

    def __init__(
        self,
        n_fft: int,
        hop_length: int,
        window: torch.Tensor | None = None,
        center: bool = True,
        normalized: bool = False,
        length: int | None = None,
    ):
        super().__init__()
        self.n_fft, self.hop, self.center, self.length = n_fft, hop_length, center, length
        self.window = _full_window(window, n_fft)
        kernel = torch.from_numpy(istft_kernel(n_fft, self.window, normalized)).float()
        # Overlap-add is ConvTranspose1d(stride=hop); keep it a plain conv (zero-stuffed) on [B, 2F, 1, T].
        self.register_buffer("conv_kernel", conv_weight_from_transposed(kernel.unsqueeze(2), groups=1))

    def forward(self, spec: torch.Tensor) -> torch.Tensor:
        b, f, frames, _ = spec.shape
        x = spec.permute(0, 3, 1, 2).reshape(b, 2 * f, 1, frames)
        y = zero_stuff_conv_transpose2d(x, self.conv_kernel.to(x.dtype), None, stride=(1, self.hop), padding=(0, 0))
        y = y.reshape(b, -1)  # [B, n_fft + hop*(T-1)]
        start = self.n_fft // 2 if self.center else 0
        total = y.shape[-1]
        length = self.length if self.length is not None else total - 2 * start
        env = _overlap_envelope(self.n_fft, self.hop, frames, self.window)[start : start + length]
        if np.any(env < 1e-11):
            raise ValueError("window overlap-add envelope has zeros (NOLA fails), as torch.istft would")
        return y.narrow(-1, start, length) * const_like(1.0 / env, y)


# --- demos -----------------------------------------------------------------------------------------

N_FFT, HOP = 32, 8


# --- complex multiplication by a constant (complex rotary embeddings) -----------------------------------
#
# Llama-style RoPE: view_as_complex(x.reshape(..., D/2, 2)) * freqs_cis, then view_as_real(...).flatten.
# litert-torch has no complex<f32> lowering. The same rotation in real arithmetic on the interleaved
# pairs (a, b) of x: (a + ib)(c + id) = (ac - bd) + i(ad + bc), i.e. x * C + rotate_pairs(x) * S with
# C = (c, c), S = (d, d) per pair and rotate_pairs(a, b) = (-b, a) as a matmul with a signed permutation
# (one nonzero product per output: exact in fp32), so no rank-5 pair axis and no strided interleave.


def pair_rotation(d: int) -> torch.Tensor:
    """[D, D] with (x @ P)[2i] = -x[2i+1], (x @ P)[2i+1] = x[2i]."""
    p = torch.zeros(d, d)
    idx = torch.arange(0, d, 2)
    p[idx + 1, idx] = -1.0
    p[idx, idx + 1] = 1.0
    return p


def interleaved_tables(freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A complex table [..., D/2] -> its real and imaginary parts repeated per pair: two [..., D] tables."""
    return (torch.repeat_interleave(freqs.real.float(), 2, dim=-1).contiguous(),
            torch.repeat_interleave(freqs.imag.float(), 2, dim=-1).contiguous())


def complex_rotate_interleaved(x: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor,
                               rotation: torch.Tensor) -> torch.Tensor:
    """flatten(view_as_real(view_as_complex(x.reshape(..., D/2, 2)) * freqs)) for x [..., D], in real
    arithmetic (tables from interleaved_tables(freqs), rotation = pair_rotation(D))."""
    return x * cos_table + (x @ rotation) * sin_table


def _demo_stft() -> Demo:
    window = torch.hann_window(N_FFT)
    before = Lambda(
        lambda x: torch.view_as_real(torch.stft(x, N_FFT, HOP, window=window, center=True, return_complex=True)),
        "torch.stft",
    )
    return Demo(before, STFTConv(N_FFT, HOP, window), (torch.randn(1, 128, generator=seeded(23)),))


def _demo_istft() -> Demo:
    window = torch.hann_window(N_FFT)
    signal = torch.randn(1, 128, generator=seeded(24))
    spec = torch.view_as_real(torch.stft(signal, N_FFT, HOP, window=window, return_complex=True))
    before = Lambda(
        lambda s: torch.istft(torch.view_as_complex(s.contiguous()), N_FFT, HOP, window=window, center=True),
        "torch.istft",
    )
    return Demo(before, ISTFTConv(N_FFT, HOP, window), (spec,))


_SPECTRAL = dict(
    family="spectral",
    targets=(LITERT, LITERT_GPU, COREAI),
    exactness="approximate",
    status=NEEDED,
    detect=lambda p: tfl.gpu_lint(p),  # nothing to detect before: conversion itself fails
    failure="conversion",
    max_rel_error=1e-5,
    notes="Verified to 1e-5 against torch on the converted .tflite (CPU interpreter), not only in torch.",
)

REWRITES = [
    Rewrite(
        id="stft_conv",
        fixes="Lowering not found: aten._fft_r2c / 'Unsupported ir element type: complex<f32>' (torch.stft)",
        demo=_demo_stft,
        function=STFTConv,
        **_SPECTRAL,
    ),
    Rewrite(
        id="istft_conv",
        fixes="Lowering not found for torch.istft (complex input, aten._fft_c2r)",
        demo=_demo_istft,
        function=ISTFTConv,
        **_SPECTRAL,
    ),
]
