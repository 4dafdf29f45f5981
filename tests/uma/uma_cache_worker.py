"""One process of the CUDA disk-cache test: a UMA calculator on CUDA with the disk cache
in ``sys.argv[2]`` evaluates one copper cell and prints results, stats and seconds as JSON."""

import json
import sys
import time

from ase.build import bulk

from fastcalc.uma import BucketedCalculator

if __name__ == "__main__":
    start = time.perf_counter()
    calc = BucketedCalculator(sys.argv[1], task_name="omat", device="cuda", bucket_size=512,
                              cache_dir=sys.argv[2])
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    atoms.rattle(0.02, seed=9)
    atoms.calc = calc
    energy, forces, stress = atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()
    print(json.dumps({
        "energy": float(energy), "forces": forces.tolist(), "stress": stress.tolist(),
        "stats": calc.compile_stats, "seconds": time.perf_counter() - start,
    }))
