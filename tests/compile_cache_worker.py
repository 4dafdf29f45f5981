"""One process of the compile cache tests: compile the Morse graph of a copper crystal
with the disk cache in ``sys.argv[1]`` and print its results, stats and the number of shared
libraries inductor built from C++ (``cpp_builds``; not its preprocessing of a header,
which inductor repeats in each process) as JSON (and fastcalc's INFO log to standard
error)."""

import json
import logging
import sys

import torch
import torch._inductor.cpp_builder

from pair_potential import crystal, graph_inputs, morse_efs
from fastcalc.compile_cache import CacheKey, CompileCache
from fastcalc.tracing import GraphRunner

KEY = CacheKey.create("morse-test", torch.device("cpu"), torch.float64, "float32", "default")


def key() -> CacheKey:
    """The cache key of the Morse graph."""
    return KEY


def counted(build, builds: list):
    """``CppBuilder.build`` that also counts in ``builds`` the shared libraries it builds."""
    def build_and_count(self, *args, **kwargs):
        if self.get_target_file_path().endswith(".so"):
            builds.append(1)
        return build(self, *args, **kwargs)
    return build_and_count


if __name__ == "__main__":
    builds: list = []
    builder = torch._inductor.cpp_builder.CppBuilder
    builder.build = counted(builder.build, builds)
    logging.basicConfig(format="%(message)s")
    logging.getLogger("fastcalc").setLevel(logging.INFO)
    runner = GraphRunner(morse_efs, "default", CompileCache(sys.argv[1]), key)
    energy, forces, stress = runner(*graph_inputs(crystal((2, 2, 2))))
    print(json.dumps({
        "energy": float(energy), "forces": forces.tolist(), "stress": stress.tolist(),
        "stats": runner.stats, "cpp_builds": len(builds),
    }))
