"""Edge buckets: few shapes, padded edges beyond the cutoff, results unchanged by padding."""

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, molecule
from pair_potential import CUTOFF, ase_morse, morse_energy

from fastcalc import PotentialCalculator
from fastcalc.buckets import EDGE_FRACTION, pad_edges, padded_size, padding_cell
from fastcalc.geometry import edge_vectors
from fastcalc.neighbors import neighbor_list


def test_small_counts_round_up_to_a_multiple_of_the_step():
    sizes = [padded_size(n, 1024, EDGE_FRACTION) for n in (0, 1, 1024, 1025, 3000)]
    assert sizes == [1024, 1024, 1024, 2048, 3072]


@pytest.mark.parametrize("fraction", [8, 64])
def test_padding_stays_below_the_step_or_the_fraction(fraction):
    for count in range(1, 200_000, 97):
        size = padded_size(count, 64, fraction)
        assert count <= size < count + max(64, count / fraction)


def test_each_doubling_has_fraction_buckets():
    sizes = {padded_size(n, 1, 32) for n in range(4097, 8193)}
    assert len(sizes) == 32


def test_returning_to_a_size_reuses_its_bucket():
    sizes = [padded_size(n, 1024, EDGE_FRACTION) for n in (1000, 1100, 1000)]
    assert sizes[0] == sizes[2] != sizes[1]


@pytest.mark.parametrize(
    "atoms",
    [bulk("Cu", "fcc", a=3.6), molecule("H2O"), Atoms("Cu2", positions=[[0, 0, 0], [0, 0, 2]],
                                                       cell=[[2.0, 0, 0], [0, 0, 0], [0, 0, 0]],
                                                       pbc=[True, False, False])],
    ids=["tiny periodic cell", "molecule", "wire"],
)
def test_padded_edges_lie_beyond_the_cutoff(atoms):
    cutoff = 5.0
    cell = padding_cell(torch.tensor(atoms.cell.array), cutoff)
    edge_index, shifts = neighbor_list(
        torch.tensor(atoms.positions), torch.tensor(atoms.cell.array), torch.tensor(atoms.pbc),
        cutoff,
    )
    edges = pad_edges(edge_index, shifts, cell, cutoff, bucket_size=64)
    assert edges.edge_index.shape[1] % 64 == 0
    assert edges.n_real == edge_index.shape[1]
    lengths = edge_vectors(torch.tensor(atoms.positions), cell, edges.edge_index,
                           edges.unit_shifts).norm(dim=1)
    assert (lengths[~edges.edge_mask] > cutoff).all()
    assert (lengths[edges.edge_mask] < cutoff).all()


@pytest.mark.parametrize("periodic", [True, False], ids=["bulk", "cluster"])
def test_padding_changes_nothing(periodic):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    atoms.rattle(0.1, seed=4)
    atoms.pbc = periodic
    results = []
    for bucket_size in (1, 64, 4096):
        calc = PotentialCalculator(morse_energy, CUTOFF, dtype="float64", device="cpu",
                                   bucket_size=bucket_size)
        calc.calculate(atoms, ["energy", "forces"])
        results.append(calc.results)
    for padded in results[1:]:
        assert padded["energy"] == pytest.approx(results[0]["energy"], rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(padded["forces"], results[0]["forces"], rtol=0, atol=1e-12)
        if periodic:
            np.testing.assert_allclose(padded["stress"], results[0]["stress"], rtol=0, atol=1e-12)
    reference = atoms.copy()
    reference.calc = ase_morse()
    np.testing.assert_allclose(results[-1]["forces"], reference.get_forces(), atol=1e-10)
