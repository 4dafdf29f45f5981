"""``import fastcalc`` loads nvalchemiops' neighbour list without the rest of
``nvalchemiops.torch`` and ``nvalchemiops.math``, which still offer all they normally do;
each case runs in a fresh interpreter, since this one has imported the packages already."""

import json
import subprocess
import sys
import textwrap

import pytest

from fastcalc.nvalchemiops_import import _reexports

_PUBLIC = """
import json, sys
import {package} as package
names = sorted(n for n in package.__all__ if getattr(package, n, None) is not None)
print(json.dumps({{"names": names, "loaded": sorted(m for m in sys.modules
                  if m.startswith("{package}"))}}))
"""


def _run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_fastcalc_skips_nvalchemiops_optimisers_and_math_kernels():
    loaded = _run("import json, sys, fastcalc\n"
                  "print(json.dumps(sorted(sys.modules)))")
    assert "nvalchemiops.torch.neighbors" in loaded
    assert not {"nvalchemiops.torch.fire2", "nvalchemiops.torch.lbfgs",
                "nvalchemiops.dynamics", "nvalchemiops.math.spline",
                "nvalchemiops.math.gto"} & set(loaded)


@pytest.mark.parametrize(("package", "module", "name"), [
    ("nvalchemiops.torch", "nvalchemiops.torch.fire2", "fire2_step_coord"),
    ("nvalchemiops.math", "nvalchemiops.math.spline", "spline_spread"),
])
def test_a_deferred_package_offers_what_a_plain_import_does(package, module, name):
    plain = _run(_PUBLIC.format(package=package))
    after = _run("import fastcalc\n" + _PUBLIC.format(package=package))
    assert after["names"] == plain["names"]
    assert name in after["names"]
    assert module in after["loaded"]


def test_a_name_the_init_imports_comes_from_its_module_alone():
    """``from nvalchemiops.torch import fire2_step_coord`` after fastcalc imports the
    FIRE2 module, not the L-BFGS one, and gives the same function as the module."""
    code = ("import json, sys, fastcalc\n"
            "from nvalchemiops.torch import fire2_step_coord\n"
            "from nvalchemiops.torch.fire2 import fire2_step_coord as direct\n"
            "print(json.dumps([fire2_step_coord is direct,\n"
            "                  'nvalchemiops.torch.lbfgs' in sys.modules]))")
    assert _run(code) == [True, False]


def test_names_the_init_binds_more_than_once_are_not_taken_from_one_import(tmp_path):
    init = tmp_path / "demo" / "__init__.py"
    init.parent.mkdir()
    init.write_text(textwrap.dedent("""
        from demo.parts import once, twice
        from .other import alias as renamed
        twice = wrap(twice)
        def defined(): pass
        from demo.more import defined
    """))
    spec = type("Spec", (), {"origin": str(init), "name": "demo"})()
    assert _reexports(spec) == {"once": ("demo.parts", "once"),
                                "renamed": ("demo.other", "alias")}


def test_fastcalc_uses_the_same_neighbor_list_whichever_package_came_first():
    code = ("import json, nvalchemiops.torch.neighbors as n, fastcalc.neighbors as f\n"
            "print(json.dumps(f._nvalchemi_neighbor_list is n.neighbor_list))")
    assert _run(code) is True
    assert _run("import fastcalc\n" + code) is True


def test_threads_completing_the_package_at_once_all_get_their_names():
    code = ("import json, fastcalc\nfrom concurrent.futures import ThreadPoolExecutor\n"
            "import nvalchemiops.torch as package\n"
            "names = ['fire2_step_coord', 'segmented_sum', 'lbfgs_step_coord', 'LBFGSState'] * 4\n"
            "with ThreadPoolExecutor(8) as pool:\n"
            "    got = list(pool.map(lambda name: getattr(package, name) is not None, names))\n"
            "print(json.dumps(all(got)))")
    assert _run(code) is True


def test_a_package_without_an_init_file_has_no_names_to_take_from_one_import():
    spec = type("Spec", (), {"origin": None, "name": "demo"})()
    assert _reexports(spec) == {}


def test_an_uncompiled_first_result_does_not_import_torch_s_compiler():
    """The first call of any torch custom operator imports dynamo (a second or more);
    fastcalc's neighbour search of one system calls none of nvalchemiops' operators, so
    PET's uncompiled first result (what a calculator answers while its compiled model is
    read) does not wait for that import."""
    loaded = _run(textwrap.dedent("""
        import json, sys
        from ase.build import bulk
        from fastcalc.models import load_calculator
        atoms = bulk("Cu", cubic=True).repeat(2)
        atoms.calc = load_calculator("pet-demo-cu", device="cpu", compile_mode="eager")
        atoms.get_forces()
        print(json.dumps(sorted(sys.modules)))
    """))
    assert "fastcalc.pet.calculator" in loaded and "torch._dynamo" not in loaded
