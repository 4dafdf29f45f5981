"""Smooth cutoff functions and the adaptive per-atom cutoff of PET.

The adaptive cutoff r_i of atom i is the root of

    n_i(r) = sum_j bump(d_ij; r, w) + N (r / r_max)^3 = N

(N = target neighbour count, w = adaptive taper width). The root is found on
detached distances by a fixed number of safeguarded Newton steps, once per call
while the layout is built; inside the model, gradients are attached by one
implicit-function step r - (n_i(r) - N) / n_i'(r), whose
value is r (up to round-off) and whose derivative is the implicit-function theorem's.
"""

from __future__ import annotations

import math

import torch

# Keeps the bump's cot() away from its poles; part of the model definition.
_BUMP_EPS = 1e-6
# Floor on dn/dr in the Newton and implicit-function steps.
_MIN_SLOPE = 1e-6
# Safeguarded Newton iterations; fixed, so results are reproducible bit-for-bit.
_NEWTON_STEPS = 10
# Adapted cutoffs are kept in [r_max / 16, r_max].
_MIN_CUTOFF_FRACTION = 1.0 / 16.0


def _taper_coordinate(
    distances: torch.Tensor, cutoff: torch.Tensor | float, width: float
) -> torch.Tensor:
    """0 where the taper starts (cutoff - width), 1 at the cutoff."""
    return (distances - (cutoff - width)) / width


def bump_cutoff(
    distances: torch.Tensor, cutoff: torch.Tensor | float, width: float
) -> torch.Tensor:
    """C-infinity switch from 1 to 0 over [cutoff - width, cutoff]: (1 + tanh(cot(pi s))) / 2."""
    s = _taper_coordinate(distances, cutoff, width).clamp(_BUMP_EPS, 1.0 - _BUMP_EPS)
    return 0.5 * (1.0 + torch.tanh(1.0 / torch.tan(math.pi * s)))


def cosine_cutoff(
    distances: torch.Tensor, cutoff: torch.Tensor | float, width: float
) -> torch.Tensor:
    """Cosine switch from 1 to 0 over [cutoff - width, cutoff]."""
    s = _taper_coordinate(distances, cutoff, width).clamp(0.0, 1.0)
    return 0.5 * (1.0 + torch.cos(math.pi * s))


CUTOFF_FUNCTIONS = {"Bump": bump_cutoff, "Cosine": cosine_cutoff}


def _smoothed_count(
    radii: torch.Tensor, distances: torch.Tensor, target: float, max_cutoff: float, width: float
) -> torch.Tensor:
    """n_i(r_i) - N for every atom (row of ``distances``), differentiable in the distances."""
    count = bump_cutoff(distances, radii[:, None], width).sum(dim=1)
    return count + target * (radii * (1.0 / max_cutoff)) ** 3 - target


def _count_and_slope(
    radii: torch.Tensor, distances: torch.Tensor, target: float, max_cutoff: float, width: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """n_i(r_i) - N and dn_i/dr_i in closed form (no autograd)."""
    s = _taper_coordinate(distances, radii[:, None], width)
    inside = (s > 0.0) & (s < 1.0)
    angle = math.pi * s.clamp(_BUMP_EPS, 1.0 - _BUMP_EPS)
    sin = torch.sin(angle)
    tanh_cot = torch.tanh(torch.cos(angle) / sin)
    value = torch.where(inside, 0.5 * (1.0 + tanh_cot), (s <= 0.0).to(s.dtype))
    slope = torch.where(
        inside, (0.5 * math.pi / width) * (1.0 - tanh_cot * tanh_cot) / (sin * sin), 0.0
    )
    inverse = 1.0 / max_cutoff
    x = radii * inverse
    count = value.sum(dim=1) + target * x**3 - target
    return count, slope.sum(dim=1) + 3.0 * target * x**2 * inverse


@torch.no_grad()
def solve_adaptive_cutoffs(
    distances: torch.Tensor, target: float, max_cutoff: float, width: float
) -> torch.Tensor:
    """The Newton root r_i (n,) on detached distances, before the implicit step.

    ``distances`` (n, R) holds, row by row, each atom's distance to every candidate
    within ``max_cutoff`` (entries beyond it count nothing, so rows may be padded).
    """
    fixed = distances.detach()
    low = fixed.new_zeros(fixed.shape[0])
    high = torch.full_like(low, max_cutoff)
    radii = 0.5 * high
    for _ in range(_NEWTON_STEPS):
        excess, slope = _count_and_slope(radii, fixed, target, max_cutoff, width)
        below = excess <= 0
        low = torch.where(below, radii, low)
        high = torch.where(below, high, radii)
        newton = radii - excess / slope.clamp_min(_MIN_SLOPE)
        in_bracket = (newton >= low) & (newton <= high)
        radii = torch.where(in_bracket, newton, 0.5 * (low + high))
    return radii


def implicit_step(
    radii: torch.Tensor, distances: torch.Tensor, target: float, max_cutoff: float, width: float
) -> torch.Tensor:
    """Adaptive cutoffs from the root ``radii`` of :func:`solve_adaptive_cutoffs`,
    differentiable in ``distances`` (n, R) by the implicit-function theorem, clamped to range."""
    radii = radii.detach()
    with torch.no_grad():
        _, slope = _count_and_slope(radii, distances.detach(), target, max_cutoff, width)
    excess = _smoothed_count(radii, distances, target, max_cutoff, width)
    corrected = radii - excess / slope.clamp_min(_MIN_SLOPE)
    return corrected.clamp(max_cutoff * _MIN_CUTOFF_FRACTION, max_cutoff)
