"""fastcalc.neighbors.neighbor_list returns exactly ASE's ``neighbor_list("ijS")`` edges."""

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, fcc111, molecule
from ase.neighborlist import neighbor_list as ase_neighbor_list
from hypothesis import given
from hypothesis import strategies as st

from fastcalc.neighbors import (
    MAX_DENSITY,
    MAX_IMAGES,
    NeighborOverflowError,
    estimate_crowding,
    neighbor_list,
)
from fastcalc.testing import structures


def ours(atoms: Atoms, cutoff: float, **kwargs) -> list[tuple]:
    edge_index, shifts = neighbor_list(
        torch.tensor(atoms.positions),
        torch.tensor(atoms.cell.array),
        torch.tensor(atoms.pbc),
        cutoff,
        **kwargs,
    )
    assert edge_index.dtype == shifts.dtype == torch.int64
    assert edge_index.shape[0] == 2 and shifts.shape == (edge_index.shape[1], 3)
    return sorted(zip(*edge_index.tolist(), *shifts.T.tolist()))


def ase_edges(atoms: Atoms, cutoff: float) -> list[tuple]:
    i, j, shifts = ase_neighbor_list("ijS", atoms, cutoff)
    return sorted(zip(i.tolist(), j.tolist(), *shifts.T.tolist()))


def rattled(atoms: Atoms, seed: int = 0) -> Atoms:
    atoms.rattle(0.1, seed=seed)
    return atoms


def triclinic(pbc) -> Atoms:
    rng = np.random.default_rng(3)
    cell = np.eye(3) * 4 + rng.normal(scale=1.2, size=(3, 3))
    return Atoms("Cu7", scaled_positions=rng.random((7, 3)), cell=cell, pbc=pbc)


STRUCTURES = {
    "fcc bulk": lambda: rattled(bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)),
    "primitive cell smaller than cutoff": lambda: bulk("Cu", "fcc", a=3.6),
    "single atom, periodic": lambda: Atoms("Cu", cell=np.eye(3) * 2.5, pbc=True),
    "single atom, isolated": lambda: Atoms("Cu", positions=[[1.0, 2.0, 3.0]]),
    "triclinic": lambda: triclinic(True),
    "left-handed": lambda: Atoms(triclinic(True).numbers, positions=triclinic(True).positions,
                                 cell=-triclinic(True).cell.array, pbc=True),
    "positions outside the cell": lambda: Atoms(
        triclinic(True).numbers, positions=triclinic(True).positions + [13.0, -9.0, 21.0],
        cell=triclinic(True).cell, pbc=True),
    "mixed pbc": lambda: triclinic([True, False, True]),
    "molecule, zero cell": lambda: molecule("CH3CH2OH"),
    "molecule in a cell": lambda: Atoms(molecule("C6H6"), cell=np.eye(3) * 3, pbc=False),
    "slab, zero vacuum vector": lambda: Atoms(
        fcc111("Cu", (2, 2, 3), vacuum=None, periodic=False).symbols,
        positions=fcc111("Cu", (2, 2, 3)).positions,
        cell=np.vstack([fcc111("Cu", (2, 2, 3)).cell.array[:2], np.zeros(3)]),
        pbc=[True, True, False]),
    "wire, one periodic axis": lambda: Atoms(
        "Cu3", positions=[[0, 0, 0], [1.2, 1.3, 0.4], [0.3, -1.8, 1.1]],
        cell=[[0, 0, 0], [0, 0, 0], [0, 0, 2.4]], pbc=[False, False, True]),
}


@pytest.mark.parametrize("name", STRUCTURES)
@pytest.mark.parametrize("cutoff", [2.0, 5.0])
def test_matches_ase(name, cutoff):
    atoms = STRUCTURES[name]()
    assert ours(atoms, cutoff) == ase_edges(atoms, cutoff)


@pytest.mark.parametrize("positions, cell", [(torch.float32, torch.float64),
                                             (torch.float64, torch.float32)])
def test_a_cell_of_another_dtype_than_the_positions_is_searched(positions, cell):
    """torch.tensor(atoms.cell.array) is float64 next to float32 positions."""
    atoms = rattled(bulk("Cu", cubic=True).repeat(2))
    edge_index, shifts = neighbor_list(
        torch.tensor(atoms.positions, dtype=positions), torch.tensor(atoms.cell.array, dtype=cell),
        torch.tensor(atoms.pbc), 3.0,
    )
    assert sorted(zip(*edge_index.tolist(), *shifts.T.tolist())) == ase_edges(atoms, 3.0)


def test_a_search_leaves_the_inputs_gradients_alone():
    """Positions and cell that require gradients (a model's inputs) get none from the
    search: nvalchemiops' Warp arrays would otherwise make their ``.grad``."""
    atoms = rattled(bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2))
    positions = torch.tensor(atoms.positions, requires_grad=True)
    cell = torch.tensor(atoms.cell.array, requires_grad=True)
    edge_index, shifts = neighbor_list(positions, cell, torch.tensor(atoms.pbc), 5.0)
    assert positions.grad is None and cell.grad is None
    found = sorted(zip(*edge_index.tolist(), *shifts.T.tolist()))
    assert found == ase_edges(atoms, 5.0)


def test_many_neighbours_are_all_found():
    """A dense cluster overflows the initial matrix width; no edge may be lost."""
    rng = np.random.default_rng(1)
    atoms = Atoms("H300", positions=rng.random((300, 3)) * 4.0, cell=np.eye(3) * 20, pbc=True)
    edges = ours(atoms, 4.0)
    assert len(edges) > 300 * 200
    assert edges == ase_edges(atoms, 4.0)


def test_overflow_beyond_the_limit_is_an_error():
    """About 45 neighbours per atom: searched (the estimate is not twice the limit),
    then refused on the exact count."""
    atoms = rattled(bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2))
    with pytest.raises(NeighborOverflowError, match="has 4[2-9] neighbours within 5 Å"):
        ours(atoms, 5.0, max_neighbors=40)


def test_far_beyond_the_limit_is_refused_before_searching():
    """fcc copper's 4 / 3.6³ atoms/Å³ times 4/3 π 5³ is 44.9 neighbours per atom."""
    atoms = rattled(bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2))
    with pytest.raises(NeighborOverflowError, match=r"before the neighbour search: about 45 "
                       r"neighbours within 5 Å .*limit of 20 .*over 2 times the limit"):
        ours(atoms, 5.0, max_neighbors=20)


AWKWARD = {**STRUCTURES, **{f"check_calculator's {name}": lambda atoms=atoms: atoms
                            for name, atoms in structures([29, 79]).items()}}


@pytest.mark.parametrize("name", AWKWARD)
def test_the_estimate_never_refuses_a_sensible_structure(name):
    """Far below every limit at a search radius of 6.5 Å (UMA's cutoff plus the skin), so
    the default limits are safe for all of them."""
    atoms = AWKWARD[name]()
    crowding = estimate_crowding(atoms.positions, atoms.cell.array, atoms.pbc, 6.5)
    assert crowding.neighbors < 250
    assert crowding.density < MAX_DENSITY / 10
    assert crowding.images < MAX_IMAGES / 100
    ours(atoms, 6.5, max_neighbors=250)  # and the search with that limit passes


@pytest.mark.parametrize("cutoff", [4.0, 6.0, 8.0])
def test_the_estimate_is_about_the_mean_count_and_vacuum_does_not_raise_it(cutoff):
    """Within 30 % of a crystal's mean number of neighbours per atom (which jumps by whole
    shells); for a slab of the same crystal, at most about the crystal's estimate."""
    crystal = rattled(bulk("Cu", "fcc", a=3.6, cubic=True).repeat(3))
    found = len(ours(crystal, cutoff)) / len(crystal)
    estimate = estimate_crowding(crystal.positions, crystal.cell.array, crystal.pbc, cutoff)
    assert estimate.neighbors == pytest.approx(found, rel=0.3)
    slab = fcc111("Cu", (3, 3, 4), a=3.6, vacuum=6.0)
    slab.pbc = [True, True, False]
    in_slab = estimate_crowding(slab.positions, slab.cell.array, slab.pbc, cutoff)
    assert in_slab.neighbors < 1.1 * estimate.neighbors


def test_a_thin_cell_names_its_heights_and_the_images():
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.cell[2] = atoms.cell[0] + atoms.cell[1] + [0, 0, 1e-3]
    with pytest.raises(NeighborOverflowError, match=r"nearly degenerate: its heights are "
                       r"0\.001, 0\.001, 0\.001 Å.* about 1e\+12 periodic images"):
        ours(atoms, 5.0, max_neighbors=4096)


def test_degenerate_periodic_cell_is_an_error():
    atoms = Atoms("Cu2", positions=[[0, 0, 0], [1, 1, 1]], cell=[[3, 0, 0], [6, 0, 0], [0, 0, 3]],
                  pbc=True)
    with pytest.raises(ValueError, match="linearly dependent"):
        ours(atoms, 3.0)


def test_batch_equals_systems_one_by_one():
    systems = [STRUCTURES["fcc bulk"](), STRUCTURES["triclinic"](), STRUCTURES["mixed pbc"]()]
    positions = torch.tensor(np.concatenate([a.positions for a in systems]))
    cells = torch.tensor(np.stack([a.cell.array for a in systems]))
    pbcs = torch.tensor(np.stack([a.pbc for a in systems]))
    system_index = torch.repeat_interleave(torch.arange(3), torch.tensor([len(a) for a in systems]))
    edge_index, shifts = neighbor_list(positions, cells, pbcs, 4.0, system_index=system_index)
    got = sorted(zip(*edge_index.tolist(), *shifts.T.tolist()))
    expected, offset = [], 0
    for atoms in systems:
        expected += [(i + offset, j + offset, *s) for i, j, *s in ase_edges(atoms, 4.0)]
        offset += len(atoms)
    assert got == sorted(expected)


def test_a_batch_names_the_system_it_refuses():
    """Each system is estimated on its own: a dense cluster (1500 atoms in a 3 Å cube, no
    periodic axis) after a sensible mixed-pbc system, with the batch's limit."""
    cluster = Atoms("H1500", positions=np.random.default_rng(2).random((1500, 3)) * 3.0)
    systems = [STRUCTURES["mixed pbc"](), cluster]
    positions = torch.tensor(np.concatenate([a.positions for a in systems]))
    cells = torch.tensor(np.stack([a.cell.array for a in systems]))
    pbcs = torch.tensor(np.stack([a.pbc for a in systems]))
    system_index = torch.repeat_interleave(torch.arange(2), torch.tensor([len(a) for a in systems]))
    neighbor_list(positions[:7], cells[:1], pbcs[:1], 4.0, system_index=system_index[:7],
                  max_neighbors=4096)  # the first system alone passes
    # neighbours: a 3 Å extent widened to 2 x 4 Å per axis, 1500 / 8³ times 4/3 π 4³; density:
    # the extent and 1 Å beyond it on each side, 1500 / 5³
    with pytest.raises(NeighborOverflowError, match=r"in system 1: about 785 neighbours "
                       r"within 4 Å expected per atom \(a mean density of 12 atoms/Å³\)"):
        neighbor_list(positions, cells, pbcs, 4.0, system_index=system_index, max_neighbors=4096)


@pytest.mark.parametrize("pbc", [True, False], ids=["periodic", "cluster"])
def test_atoms_in_the_wrong_units_are_refused_whether_periodic_or_not(pbc):
    """400 atoms in a 3 Å cube: 15 atoms/Å³ in the cell; as a cluster, 400 / 5³ = 3.2
    atoms/Å³ of its extent and 1 Å beyond it on each side (few neighbours are expected:
    the neighbour estimate widens a cluster to a sphere's width)."""
    atoms = Atoms("Cu400", positions=np.random.default_rng(0).random((400, 3)) * 3.0,
                  cell=np.eye(3) * 3.0, pbc=pbc)
    with pytest.raises(NeighborOverflowError, match="no matter is denser than about 2 atoms/Å³"):
        ours(atoms, 5.5, max_neighbors=4096)


def thin(atoms):
    atoms.cell[2] = atoms.cell[0] + atoms.cell[1] + [0, 0, 1e-3]
    return atoms


def shrunk(atoms):
    atoms.set_cell(atoms.cell * 0.3, scale_atoms=True)  # as if read in nm
    return atoms


@pytest.mark.parametrize("spoil", [thin, shrunk])
def test_a_batch_of_periodic_systems_refuses_the_one_refused_alone(spoil):
    """Fully periodic systems are estimated together: the spoilt third is refused with the
    message it gets alone, naming it, and the batch without it passes."""
    good = rattled(bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2))
    systems = [good, rattled(bulk("Cu", "fcc", a=3.6).repeat(4)), spoil(good.copy())]
    with pytest.raises(NeighborOverflowError) as alone:
        ours(systems[2], 5.0, max_neighbors=60)
    positions = torch.tensor(np.concatenate([a.positions for a in systems]))
    cells = torch.tensor(np.stack([a.cell.array for a in systems]))
    pbcs = torch.tensor(np.stack([a.pbc for a in systems]))
    system_index = torch.repeat_interleave(torch.arange(3), torch.tensor([len(a) for a in systems]))
    expected = str(alone.value).replace("search:", "search in system 2:")
    with pytest.raises(NeighborOverflowError) as batch:
        neighbor_list(positions, cells, pbcs, 5.0, system_index=system_index, max_neighbors=60)
    assert str(batch.value) == expected
    first = system_index < 2
    neighbor_list(positions[first], cells[:2], pbcs[:2], 5.0, system_index=system_index[first],
                  max_neighbors=60)


@st.composite
def random_systems(draw):
    n_atoms = draw(st.integers(1, 12))
    pbc = draw(st.lists(st.booleans(), min_size=3, max_size=3))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    cell = np.diag(rng.uniform(1.5, 7.0, 3)) + rng.uniform(-1.5, 1.5, (3, 3))
    if draw(st.booleans()):
        cell = cell[[1, 0, 2]]  # left-handed
    positions = rng.uniform(-0.5, 1.5, (n_atoms, 3)) @ cell
    for axis in range(3):
        if not pbc[axis] and draw(st.booleans()):
            cell[axis] = 0.0
    return Atoms(numbers=[1] * n_atoms, positions=positions, cell=cell, pbc=pbc)


@given(atoms=random_systems(), cutoff=st.floats(0.5, 6.0))
def test_random_systems_match_ase(atoms, cutoff):
    assert ours(atoms, cutoff) == ase_edges(atoms, cutoff)
