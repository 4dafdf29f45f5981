"""Rotations of real spherical-harmonic features (pure torch).

UMA stores node features as real spherical-harmonic coefficients in the basis
used by e3nn (degree-major, ``m = -l..l``, with **y as the polar axis**; for
``l = 1`` the components are ``(x, y, z)``).  Before an edge message is formed
the features are rotated into a frame in which the edge points along +y, where
the SO(2) convolution acts.

Design (our own):

* real spherical harmonics are polynomials in the components of a unit
  vector (Horner's rule), so autograd through them is exact;
* the edge frame is built with Rodrigues' formula from two charts (one for
  edges in the upper half-sphere, one for the lower), so no chart is ever used
  near its singular point and gradients are finite everywhere except for
  zero-length edges; the roll around the edge axis is arbitrary, which is fine
  because UMA is invariant to it;
* Wigner-D matrices come from the defining identity ``Y(R p) = D(R) Y(p)``
  evaluated on a fixed set of sample points ``p`` and solved once with a
  pseudo-inverse: ``D(R) = Y(R P) @ pinv(Y(P))``.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch


def _legendre_derivative_coeffs(degree: int, order: int) -> np.ndarray:
    """Power-series coefficients (ascending) of ``d^order/dz^order P_degree(z)``."""
    series = np.polynomial.legendre.leg2poly([0] * degree + [1])
    return np.polynomial.polynomial.polyder(series, order) if order else series


@lru_cache(maxsize=None)
def _sh_table(lmax: int) -> list[list[tuple[int, float, list[float]]]]:
    """For each degree, per component ``m = -l..l``: ``(m, norm, z-polynomial)``."""
    table = []
    for degree in range(lmax + 1):
        row = []
        for m in range(-degree, degree + 1):
            am = abs(m)
            norm = math.sqrt(
                (2 * degree + 1) * math.factorial(degree - am) / math.factorial(degree + am)
            )
            if m != 0:
                norm *= math.sqrt(2.0)
            row.append((m, norm, list(_legendre_derivative_coeffs(degree, am))))
        table.append(row)
    return table


def real_spherical_harmonics(lmax: int, unit: torch.Tensor) -> torch.Tensor:
    """Real spherical harmonics of unit vectors ``(..., 3)`` -> ``(..., (lmax+1)^2)``.

    e3nn ("component") normalisation and ordering, y polar axis: the polar
    coordinate is ``y`` and the azimuthal plane is ``(z, x)`` so that
    ``l = 1`` gives ``sqrt(3) * (x, y, z)``.
    """
    x, y, z = unit.unbind(-1)
    # Standard z-polar formula evaluated at the permuted point (a, b, c) = (z, x, y).
    a, b, c = z, x, y
    re_pow = [torch.ones_like(a)]
    im_pow = [torch.zeros_like(a)]
    for _ in range(lmax):
        re_prev, im_prev = re_pow[-1], im_pow[-1]
        re_pow.append(re_prev * a - im_prev * b)
        im_pow.append(re_prev * b + im_prev * a)
    out = []
    for row in _sh_table(lmax):
        for m, norm, coeffs in row:
            poly = torch.full_like(c, coeffs[-1])
            for coeff in reversed(coeffs[:-1]):
                poly = poly * c + coeff
            azimuth = re_pow[m] if m > 0 else (im_pow[-m] if m < 0 else 1.0)
            out.append(norm * poly * azimuth)
    return torch.stack(out, dim=-1)


def _cross_matrix(k: torch.Tensor) -> torch.Tensor:
    """Skew matrices ``[k]_x`` for ``k`` of shape ``(E, 3)``."""
    zero = torch.zeros_like(k[:, 0])
    kx, ky, kz = k.unbind(-1)
    return torch.stack(
        (
            torch.stack((zero, -kz, ky), -1),
            torch.stack((kz, zero, -kx), -1),
            torch.stack((-ky, kx, zero), -1),
        ),
        dim=1,
    )


def edge_frame_rotation(unit: torch.Tensor) -> torch.Tensor:
    """Rotations ``R`` (E, 3, 3) with ``R @ unit = +y``; roll around y arbitrary.

    Upper chart (``y >= 0``): Rodrigues rotation taking ``u`` to ``+y``.
    Lower chart (``y < 0``): Rodrigues rotation taking ``u`` to ``-y``, then a
    half turn about ``z``.  Each chart is evaluated away from its singularity
    (the denominator ``1 + |u_y|`` is at least 1).
    """
    sign = torch.where(unit[:, 1] >= 0, 1.0, -1.0).to(unit.dtype)
    target = torch.zeros_like(unit)
    target[:, 1] = sign
    k = torch.cross(unit, target, dim=-1)
    kx = _cross_matrix(k)
    denom = (1.0 + unit[:, 1] * sign).view(-1, 1, 1)
    eye = torch.eye(3, dtype=unit.dtype, device=unit.device)
    rot = eye + kx + (kx @ kx) / denom
    flip = torch.stack((sign, sign, torch.ones_like(sign)), dim=-1).unsqueeze(-1)
    return rot * flip


class WignerFromSamples(torch.nn.Module):
    """Block-diagonal Wigner-D matrices of rotations, up to degree ``lmax``."""

    def __init__(self, lmax: int, num_points: int | None = None) -> None:
        super().__init__()
        self.lmax = lmax
        size = (lmax + 1) ** 2
        count = num_points or 4 * size
        gen = torch.Generator().manual_seed(1234)
        points = torch.nn.functional.normalize(
            torch.randn(count, 3, generator=gen, dtype=torch.float64), dim=-1
        )
        basis = real_spherical_harmonics(lmax, points)  # (P, size)
        blocks = torch.zeros(size, count, dtype=torch.float64)
        # Fit each degree separately so that D is exactly block diagonal.
        for degree in range(lmax + 1):
            sl = slice(degree * degree, (degree + 1) ** 2)
            blocks[sl] = torch.linalg.pinv(basis[:, sl])
        self.register_buffer("points", points)
        self.register_buffer("pinv", blocks)

    def blocks(self, rot: torch.Tensor) -> list[torch.Tensor]:
        """``rot`` (E, 3, 3) -> one Wigner-D block (E, 2l+1, 2l+1) per degree ``l``."""
        moved = torch.einsum("eab,pb->epa", rot, self.points.to(rot.dtype))
        values = real_spherical_harmonics(self.lmax, moved)  # (E, P, size)
        pinv = self.pinv.to(rot.dtype)
        return [
            torch.einsum("kp,epn->enk", pinv[_degree_slice(l)], values[:, :, _degree_slice(l)])
            for l in range(self.lmax + 1)
        ]

    def forward(self, rot: torch.Tensor) -> torch.Tensor:
        """``rot`` (E, 3, 3) -> D (E, (lmax+1)^2, (lmax+1)^2), block diagonal."""
        size = (self.lmax + 1) ** 2
        out = rot.new_zeros(rot.shape[0], size, size)
        for degree, block in enumerate(self.blocks(rot)):
            sl = _degree_slice(degree)
            out[:, sl, sl] = block
        return out


def _degree_slice(degree: int) -> slice:
    return slice(degree * degree, (degree + 1) ** 2)


def m_major_order(lmax: int, mmax: int) -> list[int]:
    """Indices (into degree-major coefficients) of the edge-frame layout.

    Order: ``m = 0`` for ``l = 0..lmax``; then for each ``m = 1..mmax`` the
    ``+m`` components for ``l = m..lmax`` followed by the ``-m`` components.
    Components with ``|m| > mmax`` are dropped.
    """
    order = [l * l + l for l in range(lmax + 1)]
    for m in range(1, mmax + 1):
        order += [l * l + l + m for l in range(m, lmax + 1)]
        order += [l * l + l - m for l in range(m, lmax + 1)]
    return order


def coefficient_degrees(lmax: int) -> list[int]:
    """Degree ``l`` of each degree-major coefficient."""
    return [l for l in range(lmax + 1) for _ in range(2 * l + 1)]
