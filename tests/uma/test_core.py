"""Core-level checks against independent references: finite differences,
rotation identities, e3nn's Wigner-D, fairchem's graph builder."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from uma_reference import structures
from fastcalc.uma import UMACore, load_checkpoint
from fastcalc.precision import FrozenLinear
from fastcalc.buckets import pad_edges, padding_cell
from fastcalc.uma.graph import build_topology
from fastcalc.uma.so3 import (
    WignerFromSamples,
    edge_frame_rotation,
    m_major_order,
    real_spherical_harmonics,
)
from fastcalc.uma.edge_ops import compact_rotations, dense_rotations


@pytest.fixture(scope="module")
def cores(uma_checkpoints) -> dict[str, UMACore]:
    return {kind: UMACore(load_checkpoint(b.path), "omat") for kind, b in uma_checkpoints.items()}


def inputs(core: UMACore, atoms) -> dict:
    edge_index, unit_shifts = build_topology(
        atoms.positions, atoms.cell.array, atoms.pbc, core.cutoff, core.max_neighbors
    )
    return dict(
        positions=torch.tensor(atoms.positions, dtype=torch.float64),
        cell=torch.tensor(atoms.cell.array, dtype=torch.float64),
        numbers=torch.tensor(atoms.numbers),
        edge_index=edge_index,
        unit_shifts=unit_shifts,
    )


def random_rotation(generator: torch.Generator) -> torch.Tensor:
    q = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64, generator=generator))[0]
    return q * torch.linalg.det(q)  # proper rotation


def energy(core: UMACore, args: dict) -> float:
    return float(core.compute(**args, stress=False)["energy"])


@pytest.mark.parametrize("kind", ["main", "variant"])
def test_forces_and_stress_match_central_differences(cores, kind):
    core = cores[kind]
    atoms = structures()["tiny"][1]
    args = inputs(core, atoms)
    out = core.compute(**args)
    task = core.task  # task normalisers map raw derivatives to outputs
    h = 1e-5
    for atom, axis in [(0, 0), (1, 1), (1, 2)]:
        plus, minus = dict(args), dict(args)
        plus["positions"] = args["positions"].clone()
        minus["positions"] = args["positions"].clone()
        plus["positions"][atom, axis] += h
        minus["positions"][atom, axis] -= h
        raw = -(energy(core, plus) - energy(core, minus)) / (2 * h) / task.energy.rmsd
        numeric = raw * task.forces.rmsd + task.forces.mean
        assert math.isclose(float(out["forces"][atom, axis]), numeric, rel_tol=1e-6, abs_tol=1e-7)
    volume = abs(np.linalg.det(atoms.cell.array))
    for a, b in [(0, 0), (1, 2), (0, 1)]:
        strain = torch.zeros(3, 3, dtype=torch.float64)
        strain[a, b] += h / 2
        strain[b, a] += h / 2
        values = []
        for sign in (1, -1):
            deform = torch.eye(3, dtype=torch.float64) + sign * strain
            moved = dict(args, positions=args["positions"] @ deform, cell=args["cell"] @ deform)
            values.append(energy(core, moved))
        raw = (values[0] - values[1]) / (2 * h) / volume / task.energy.rmsd
        numeric = raw * task.stress.rmsd + task.stress.mean
        assert math.isclose(float(out["stress"][a, b]), numeric, rel_tol=1e-6, abs_tol=1e-7)


def test_padding_contributes_exactly_zero(cores):
    """Padding edges change nothing: fastcalc's long self-loops (with or without
    the mask), and zero-length self-loops, which only the mask makes harmless."""
    core = cores["main"]
    args = inputs(core, structures()["bulk"][1])
    reference = core.compute(**args)
    cell = padding_cell(args["cell"], core.cutoff)
    edges = pad_edges(args["edge_index"], args["unit_shifts"], cell, core.cutoff, bucket_size=64)
    assert not edges.edge_mask.all()
    long_loops = dict(args, edge_index=edges.edge_index, unit_shifts=edges.unit_shifts)
    zero_loops = dict(long_loops, unit_shifts=edges.unit_shifts * edges.edge_mask.unsqueeze(-1))
    for padded in (
        core.compute(**long_loops),
        core.compute(**long_loops, edge_mask=edges.edge_mask),
        core.compute(**zero_loops, edge_mask=edges.edge_mask),
    ):
        for key in reference:
            assert torch.isfinite(padded[key]).all()
            torch.testing.assert_close(padded[key], reference[key], rtol=1e-13, atol=1e-13)


def test_independent_of_roll_around_edges(cores, monkeypatch):
    """fairchem draws a random roll angle per edge; the model must not care."""
    import fastcalc.uma.core as core_module

    core = cores["main"]
    args = inputs(core, structures()["slab"][1])
    reference = core.compute(**args)
    gen = torch.Generator().manual_seed(0)

    def rolled(unit):
        angle = torch.rand(unit.shape[0], generator=gen, dtype=unit.dtype) * 2 * math.pi
        c, s = torch.cos(angle), torch.sin(angle)
        zero, one = torch.zeros_like(c), torch.ones_like(c)
        roll = torch.stack((c, zero, s, zero, one, zero, -s, zero, c), dim=-1).view(-1, 3, 3)
        return roll @ edge_frame_rotation(unit)

    monkeypatch.setattr(core_module, "edge_frame_rotation", rolled)
    rolled_out = core.compute(**args)
    for key in reference:
        torch.testing.assert_close(rolled_out[key], reference[key], rtol=1e-10, atol=1e-10)


def test_every_layer_but_the_last_takes_three_products(cores, monkeypatch):
    """IEEE float32 and float64 take Gauss's three products in the first convolution of
    each layer but the last, whose backward pass, the first to run, is the memory peak
    (the forces of both forms are checked by the finite-difference and fairchem tests)."""
    import fastcalc.uma.core as core_module

    taken = []
    messages = core_module.EdgeFrames.messages

    def recording(self, x, neighbour, centre, radial, three):
        taken.append(three)
        return messages(self, x, neighbour, centre, radial, three)

    monkeypatch.setattr(core_module.EdgeFrames, "messages", recording)
    core = cores["main"]
    core.compute(**inputs(core, structures()["tiny"][1]), stress=False)
    assert len(core.blocks) >= 2
    assert taken == [True] * (len(core.blocks) - 1) + [False]


def test_rotating_the_system_rotates_forces(cores):
    core = cores["variant"]
    atoms = structures()["molecule"][1]
    args = inputs(core, atoms)
    reference = core.compute(**args, stress=False)
    rotation = random_rotation(torch.Generator().manual_seed(3))
    turned = core.compute(**dict(args, positions=args["positions"] @ rotation.T), stress=False)
    torch.testing.assert_close(turned["energy"], reference["energy"], rtol=1e-11, atol=1e-11)
    expected = reference["forces"] @ rotation.T
    torch.testing.assert_close(turned["forces"], expected, rtol=1e-10, atol=1e-10)


def edge_set(centre, neighbour, vectors) -> set:
    rounded = np.round(vectors.tolist(), 6)
    return {(int(i), int(j), *v) for i, j, v in zip(centre, neighbour, rounded)}


def test_neighbour_limit_matches_fairchem_graph(uma_checkpoints):
    """Our max_neighbors filter keeps exactly the edges fairchem's graph builder keeps."""
    from fairchem.core.datasets.atomic_data import AtomicData
    from fairchem.core.graph.compute import generate_graph

    backbone = uma_checkpoints["variant"].backbone
    atoms = structures()["tiny"][1].repeat((2, 1, 1))
    edge_index, shifts = build_topology(
        atoms.positions, atoms.cell.array, atoms.pbc, backbone["cutoff"], backbone["max_neighbors"]
    )
    unlimited, _ = build_topology(
        atoms.positions, atoms.cell.array, atoms.pbc, backbone["cutoff"], 0
    )
    assert unlimited.shape[1] > edge_index.shape[1]  # the rule is active here
    data = AtomicData.from_ase(atoms, task_name="omat")
    data.pos = data.pos.double()
    data.cell = data.cell.double()
    graph = generate_graph(
        data,
        cutoff=backbone["cutoff"],
        max_neighbors=backbone["max_neighbors"],
        enforce_max_neighbors_strictly=False,
        radius_pbc_version=2,
        pbc=data.pbc,
    )
    # fairchem wraps positions into the cell, so compare edge vectors, not shifts
    theirs = edge_set(graph["edge_index"][1], graph["edge_index"][0], graph["edge_distance_vec"])
    pos = torch.tensor(atoms.positions)
    lattice = torch.tensor(atoms.cell.array)
    vectors = pos[edge_index[1]] - pos[edge_index[0]] + shifts.double() @ lattice
    ours = edge_set(edge_index[0], edge_index[1], vectors)
    assert ours == theirs


def e3nn_float64(function):
    """Evaluate an e3nn reference with float64 as default dtype (its constants follow it)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return function()
    finally:
        torch.set_default_dtype(previous)


def test_edge_rotations_are_e3nn_wigner_matrices_in_edge_frame_order():
    """Compact rotations, made dense, are the rows of e3nn's Wigner matrix ``D`` in the
    m-major order (degree 0 exactly 1, components with |m| > mmax left out)."""
    o3 = pytest.importorskip("e3nn.o3")
    lmax, mmax = 3, 2
    wigner = WignerFromSamples(lmax)
    gen = torch.Generator().manual_seed(3)
    rotations = torch.stack([random_rotation(gen) for _ in range(4)])
    degrees = range(lmax + 1)
    dense = torch.stack([
        torch.block_diag(*(e3nn_float64(lambda: o3.Irrep(l, 1).D_from_matrix(r)) for l in degrees))
        for r in rotations
    ])
    blocks = wigner.blocks(rotations)
    order = m_major_order(lmax, mmax)
    rotation = dense_rotations(compact_rotations(blocks), lmax, mmax)
    close = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rotation, dense[:, order], **close)
    assert (rotation[:, 0, 0] == 1).all()


def test_wigner_matches_e3nn_and_group_law():
    o3 = pytest.importorskip("e3nn.o3")
    lmax = 4
    wigner = WignerFromSamples(lmax)
    gen = torch.Generator().manual_seed(7)
    r1, r2 = random_rotation(gen), random_rotation(gen)
    d1, d2, d12 = wigner(torch.stack((r1, r2, r1 @ r2)))
    torch.testing.assert_close(d12, d1 @ d2, rtol=1e-12, atol=1e-12)
    identity = torch.eye((lmax + 1) ** 2, dtype=torch.float64)
    torch.testing.assert_close(d1 @ d1.T, identity, rtol=1e-12, atol=1e-12)
    for degree in range(lmax + 1):
        block = slice(degree * degree, (degree + 1) ** 2)
        expected = e3nn_float64(lambda: o3.Irrep(degree, 1).D_from_matrix(r1))
        torch.testing.assert_close(d1[block, block], expected, rtol=1e-12, atol=1e-12)
        points = torch.randn(5, 3, dtype=torch.float64, generator=gen)
        points = points / points.norm(dim=-1, keepdim=True)
        sh = e3nn_float64(
            lambda: o3.spherical_harmonics(degree, points, True, normalization="component")
        )
        ours = real_spherical_harmonics(lmax, points)[:, block]
        torch.testing.assert_close(ours, sh, rtol=1e-12, atol=1e-12)


def test_edge_frame_maps_edges_to_y_with_finite_gradients():
    directions = torch.tensor(
        [[0.0, 1.0, 0.0], [0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.3, -0.2, 0.9], [1e-9, -1.0, 0.0]],
        dtype=torch.float64,
        requires_grad=True,
    )
    unit = directions / directions.norm(dim=-1, keepdim=True)
    rotation = edge_frame_rotation(unit)
    mapped = torch.einsum("eab,eb->ea", rotation, unit)
    y_axis = torch.tensor([[0.0, 1.0, 0.0]] * 5, dtype=torch.float64)
    torch.testing.assert_close(mapped, y_axis, rtol=0, atol=1e-14)
    torch.testing.assert_close(torch.linalg.det(rotation), torch.ones(5, dtype=torch.float64))
    rotation.sum().backward()
    assert torch.isfinite(directions.grad).all()


def test_experts_stay_off_the_module_state_and_merge_in_its_current_dtype(uma_checkpoints):
    """``Module.to`` moves the merged weights only (on a GPU, no expert weight takes device
    memory); a merge after a dtype change gives the weights of a core built in that dtype."""
    checkpoint = load_checkpoint(uma_checkpoints["main"].path)
    converted = UMACore(checkpoint, "omat", dtype=torch.float64).to(torch.float32)
    direct = UMACore(checkpoint, "omat", dtype=torch.float32)
    assert not [name for name in converted.state_dict() if "experts" in name]
    numbers = torch.tensor([29, 29, 79])
    for core in (converted, direct):
        core.prepare(numbers)
    layers = [[*core.mixed_layers(), *core.head] for core in (converted, direct)]
    for ours, built in zip(*layers, strict=True):
        for name in ("weight", "weight_t", "bias"):
            weight = getattr(built, name)
            if weight is not None:
                assert getattr(ours, name).dtype == weight.dtype
                assert torch.equal(getattr(ours, name), weight), name


def test_linear_maps_keep_their_transposed_copy_through_dtype_changes_and_merges(
    uma_checkpoints,
):
    """Forward products read ``weight_t``, backward ones ``weight``: they must stay equal."""
    checkpoint = load_checkpoint(uma_checkpoints["main"].path)
    core = UMACore(checkpoint, "omat", dtype=torch.float64).to(torch.float32)
    for numbers in ([29, 29, 79], [29, 79, 79, 79]):
        core.prepare(torch.tensor(numbers))
        maps = [m for m in core.modules() if isinstance(m, FrozenLinear)]
        assert len(maps) > len(core.mixed_layers())
        for layer in maps:
            assert torch.equal(layer.weight_t, layer.weight.t())


def test_experts_move_to_the_device_from_the_second_merge_on(uma_checkpoints, monkeypatch):
    """One system, however often prepared, keeps the experts in host memory (an MD run);
    a second system with other expert coefficients moves them to the model's device (a
    screening); one whose coefficients are those already merged is not merged again."""
    from fastcalc.uma.layers import MixedLinear

    moved, merged = [], []
    monkeypatch.setattr(MixedLinear, "keep_experts_on_device", lambda layer: moved.append(layer))
    merge = MixedLinear.merge
    monkeypatch.setattr(MixedLinear, "merge", lambda layer, c: merged.append(layer) or merge(layer, c))
    copper, alloy = torch.tensor([29, 29, 29]), torch.tensor([29, 29, 79])
    core = UMACore(load_checkpoint(uma_checkpoints["main"].path), "omat")  # composition-routed
    layers = core.mixed_layers()
    merged.clear()  # plain layers and the task head merge at construction
    for numbers in (copper, copper, copper):
        core.prepare(numbers)
    assert moved == [] and len(merged) == len(layers) > 0
    for numbers in (alloy, copper):
        core.prepare(numbers)
    assert set(map(id, moved)) == set(map(id, layers)) and len(merged) == 3 * len(layers)
    # the variant routes by charge, spin and task only: a new composition, same coefficients
    core = UMACore(load_checkpoint(uma_checkpoints["variant"].path), "omat")
    moved.clear()
    merged.clear()
    for numbers in (copper, alloy, copper):
        core.prepare(numbers)
    assert moved == [] and len(merged) == len(core.mixed_layers()) > 0


def test_routing_depends_on_the_composition_not_the_size_to_the_bit(uma_checkpoints):
    """Equal fractions at any atom count give identical float32 expert coefficients (for
    routers without UMA-S-1.2's extra zero row; a per-atom sum rounds differently with the
    count), so no merge is redone for them."""
    from fastcalc.uma.experts import ExpertRouter

    checkpoint = load_checkpoint(uma_checkpoints["main"].path)
    router = ExpertRouter(checkpoint.weights, checkpoint.backbone, "UMA-S-1.2.1").float()
    system = torch.randn(router.mlp[0].weight.shape[1] - router.composition.shape[1])
    for numbers in ([29], [29, 29, 79], [8, 1, 1, 26]):
        small, large = torch.tensor(numbers), torch.tensor(numbers * 137)
        route = [router(*torch.unique(n, return_counts=True), system) for n in (small, large)]
        assert torch.equal(*route)
