"""relax_many on UMA, whose evaluate_many really batches: each structure still follows ASE's
FIRE run on it alone with the same calculator (float64, random weights)."""

import numpy as np
from ase.build import bulk
from ase.optimize import FIRE

from fastcalc import relax_many

STEPS = 4


def copper(repeat, seed):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(repeat)
    atoms.rattle(0.05, seed=seed)
    return atoms


def structures():
    """Three of one composition, which UMA puts in one batched graph, and one of another
    (its own graph)."""
    return [copper((1, 1, 1), 1), copper((2, 1, 1), 2), copper((1, 1, 1), 3),
            copper((1, 1, 1), 4)]


def test_batched_steps_follow_ases_fire(our_calculator, monkeypatch):
    calc = our_calculator("main", "omat")
    batch_sizes = []
    evaluate_batch = calc.evaluate_batch

    def spy(system):
        results = evaluate_batch(system)
        batch_sizes.append(len(results))
        return results

    monkeypatch.setattr(calc, "evaluate_batch", spy)
    results = relax_many(structures(), calc, fmax=1e-3, max_steps=STEPS, progress=False)
    assert batch_sizes == [3, 1] * (STEPS + 1)  # every step: one graph per composition
    monkeypatch.undo()
    for relaxed, atoms in zip(results, structures()):
        atoms.calc = calc
        optimizer = FIRE(atoms, logfile=None)
        optimizer.run(fmax=1e-3, steps=STEPS)
        assert relaxed.steps == optimizer.nsteps == STEPS
        assert not relaxed.converged
        np.testing.assert_allclose(relaxed.atoms.positions, atoms.positions, rtol=0, atol=1e-8)
        assert abs(relaxed.energy - atoms.get_potential_energy()) < 1e-8
        np.testing.assert_allclose(relaxed.stress, atoms.get_stress(), rtol=0, atol=1e-8)
