"""UMA's edge operators: their hand-written backward passes against finite differences,
their Triton kernels against the torch code on a GPU, and UMA's forces on a GPU
against ASE's finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.calculators.fd import calculate_numerical_forces, calculate_numerical_stress

from fastcalc.bench.upstream import build_checkpoint, default_backbone
from fastcalc.uma import BucketedCalculator
from fastcalc.uma.edge_ops import (
    compact_rotations,
    dense_rotations,
    edge_pairs,
    edge_pairs_backward,
    edge_to_nodes,
    edge_to_nodes_backward,
    order_sizes,
    radial_rows,
)
from fastcalc.uma.so3 import m_major_order

# (lmax, mmax, channels): UMA-S's layout, one whose m-major order drops components, and
# the m = 0 rows alone (the edge-degree embedding's messages)
LAYOUTS = [(2, 2, 5), (3, 1, 4), (2, 0, 3)]


def operands(lmax: int, mmax: int, channels: int, device: str = "cpu", dtype=torch.float64):
    """Random node features, compact rotations, radial scales, messages, envelope and
    edges."""
    gen = torch.Generator().manual_seed(lmax * 10 + mmax)
    atoms, edges, k, m = 5, 13, (lmax + 1) ** 2, len(m_major_order(lmax, mmax))
    blocks = sum((2 * l + 1) ** 2 for l in range(lmax + 1))
    rows = radial_rows(lmax, mmax)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device, dtype)

    return dict(
        x=rand(atoms, k, channels),
        rotation=rand(edges, blocks),
        radial=rand(edges, (max(rows) + 1) * 2 * channels),
        messages=rand(edges, m, channels),
        envelope=rand(edges).abs(),
        neighbour=torch.randint(atoms, (edges,), generator=gen).to(device),
        centre=torch.randint(atoms, (edges,), generator=gen).to(device),
        mmax=mmax,
    )


def blocks_of(o: dict, edge: torch.Tensor) -> list[torch.Tensor]:
    """Edge-frame features (E, M, ...) split by order, as the operators take them."""
    lmax = math.isqrt(o["x"].shape[1]) - 1
    return list(edge.split(order_sizes(lmax, o["mmax"]), dim=1))


def pairs_of(o: dict, x, rotation, radial):
    """:func:`edge_pairs`' blocks joined into one (E, M, 2C) tensor."""
    blocks = edge_pairs(x, rotation, radial, o["neighbour"], o["centre"], o["mmax"], False)
    return torch.cat(blocks, dim=1)


def nodes_of(o: dict, x, messages, rotation, envelope):
    """:func:`edge_to_nodes` of ``messages`` (E, M, C) split by order."""
    return edge_to_nodes(x, blocks_of(o, messages), rotation, envelope, o["centre"], o["mmax"])


def test_order_blocks_partition_the_edge_frame_order():
    """Block m holds the components of order m: m = 0 for every degree, then +m and -m."""
    order, degree_major = m_major_order(3, 2), [(l, m) for l in range(4) for m in range(-l, l + 1)]
    start = 0
    for m, rows in enumerate(order_sizes(3, 2)):
        orders = {abs(degree_major[k][1]) for k in order[start:start + rows]}
        assert orders == {m}
        start += rows
    assert start == len(order)


def test_edge_pairs_gives_each_order_its_own_contiguous_block():
    o = operands(2, 2, 3)
    blocks = edge_pairs(o["x"], o["rotation"], o["radial"], o["neighbour"], o["centre"], 2, False)
    assert [b.shape for b in blocks] == [(13, 3, 6), (13, 4, 6), (13, 2, 6)]
    assert all(b.is_contiguous() for b in blocks)


def test_radial_rows_follow_the_layout_of_the_radial_networks():
    """UMA-S (lmax = mmax = 2) and a layout dropping |m| > 1: m = 0 rows by degree, then
    each m > 0 row shared by its +m and -m components."""
    assert radial_rows(2, 2) == [0, 1, 2, 3, 4, 3, 4, 5, 5]
    assert radial_rows(3, 1) == [0, 1, 2, 3, 4, 5, 6, 4, 5, 6]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_edge_pairs_gradients_match_finite_differences(layout):
    o = operands(*layout)
    inputs = [o[name].requires_grad_() for name in ("x", "rotation", "radial")]
    assert torch.autograd.gradcheck(lambda *args: pairs_of(o, *args), inputs)


def test_gradients_of_one_block_alone_match_finite_differences():
    """The blocks a loss does not use count as zero gradient in the backward pass."""
    o = operands(2, 2, 3)
    inputs = [o[name].requires_grad_() for name in ("x", "rotation", "radial")]
    assert torch.autograd.gradcheck(
        lambda *args: edge_pairs(*args, o["neighbour"], o["centre"], o["mmax"], False)[1], inputs
    )


def test_three_parts_hold_the_plus_rows_the_minus_rows_and_their_sum():
    """With ``three``, order m > 0's block (E, 2R, 2C) comes as (3, E, R, 2C): its +m rows,
    its -m rows, and their sum; m = 0 comes as without."""
    o = operands(3, 2, 3)
    args = (o["x"], o["rotation"], o["radial"], o["neighbour"], o["centre"], 2)
    blocks, parts = edge_pairs(*args, False), edge_pairs(*args, True)
    torch.testing.assert_close(parts[0], blocks[0], rtol=0, atol=0)
    for block, part in zip(blocks[1:], parts[1:]):
        plus, minus = block.chunk(2, dim=1)
        torch.testing.assert_close(part, torch.stack((plus, minus, plus + minus)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_edge_pairs_in_three_parts_gradients_match_finite_differences(layout):
    o = operands(*layout)
    inputs = [o[name].requires_grad_() for name in ("x", "rotation", "radial")]
    assert torch.autograd.gradcheck(
        lambda *args: torch.cat([block.flatten() for block in edge_pairs(
            *args, o["neighbour"], o["centre"], o["mmax"], True)]),
        inputs,
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_edge_to_nodes_gradients_match_finite_differences(layout):
    o = operands(*layout)
    inputs = [o[name].requires_grad_() for name in ("x", "messages", "rotation", "envelope")]
    assert torch.autograd.gradcheck(lambda *args: nodes_of(o, *args), inputs)


def test_pairs_with_identity_rotations_are_the_gathered_features_scaled():
    """Identity rotations give both atoms' features in the edge-frame order (component
    ``order[i]`` in row ``i``), each component times its radial row."""
    lmax, mmax, channels = 3, 1, 4
    o = operands(lmax, mmax, channels)
    order = m_major_order(lmax, mmax)
    edges = len(o["rotation"])
    identity = compact_rotations(
        [torch.eye(2 * l + 1, dtype=torch.float64).expand(edges, -1, -1) for l in range(lmax + 1)]
    )
    scales = o["radial"].view(edges, -1, 2 * channels)[:, radial_rows(lmax, mmax)]
    expected = torch.cat((o["x"][o["neighbour"]][:, order], o["x"][o["centre"]][:, order]), dim=2)
    torch.testing.assert_close(pairs_of(o, o["x"], identity, o["radial"]), expected * scales)


def test_edge_to_nodes_adds_the_back_rotated_messages_to_the_centre_atoms():
    o = operands(2, 2, 3)
    rotation = dense_rotations(o["rotation"], 2, 2)
    expected = o["x"].clone()
    for e, atom in enumerate(o["centre"].tolist()):
        expected[atom] += o["envelope"][e] * rotation[e].T @ o["messages"][e]
    got = nodes_of(o, o["x"], o["messages"], o["rotation"], o["envelope"])
    torch.testing.assert_close(got, expected)


# ------------------------------------------------------------------ CUDA
@pytest.mark.parametrize("three", [False, True], ids=["blocks", "three parts"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layout", [(2, 2, 128), (3, 1, 4), (2, 0, 128)])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_kernels_match_the_torch_code(layout, dtype, three):
    """Forward and backward of both operators on CUDA (Triton) equal the same operators
    on the CPU (torch), in float64 to round-off and in float32 to its round-off."""
    on_gpu = operands(*layout, device="cuda", dtype=dtype)
    on_cpu = {k: v.cpu() if torch.is_tensor(v) else v for k, v in on_gpu.items()}
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)

    def outputs(o):
        pairs_args = (o["x"], o["rotation"], o["radial"], o["neighbour"], o["centre"], o["mmax"])
        pairs = edge_pairs(*pairs_args, three)
        grad_pairs = [torch.ones_like(block).cumsum(-1).sin() for block in pairs]
        nodes = nodes_of(o, o["x"], o["messages"], o["rotation"], o["envelope"])
        backward = edge_pairs_backward(grad_pairs, *pairs_args, three)
        nodes_backward = edge_to_nodes_backward(
            nodes.cos(), blocks_of(o, o["messages"]), o["rotation"], o["envelope"], o["centre"],
            o["mmax"]
        )
        return [*pairs, nodes, *backward, *nodes_backward]

    for got, expected in zip(outputs(on_gpu), outputs(on_cpu), strict=True):
        torch.testing.assert_close(got.cpu(), expected, **tol)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_uma_forces_and_stress_on_cuda_match_finite_differences(tmp_path):
    """Eager float64 on CUDA (the Triton kernels), on a checkpoint whose stress is the
    strain derivative of its energy: forces and stress against ASE's central differences."""
    path = tmp_path / "consistent.pt"
    build_checkpoint(path, default_backbone(), "UMA-S-1.2", seed=3, consistent_stress=True)
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 1, 1))
    atoms.numbers[1] = 79
    atoms.rattle(0.05, seed=7)
    atoms.calc = BucketedCalculator(
        path, task_name="omat", device="cuda", dtype="float64", compile_mode="eager"
    )
    np.testing.assert_allclose(atoms.get_forces(), calculate_numerical_forces(atoms, 1e-4),
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(atoms.get_stress(), calculate_numerical_stress(atoms, 1e-5),
                               rtol=1e-6, atol=1e-8)
