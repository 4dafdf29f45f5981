"""``import fastcalc`` loads nvalchemiops' neighbour list without the rest of
``nvalchemiops.torch``, which still offers all it normally does; each case runs in a
fresh interpreter, since this one has imported both packages already."""

import json
import subprocess
import sys

_PUBLIC = """
import json, sys
import nvalchemiops.torch as package
names = sorted(n for n in package.__all__ if getattr(package, n, None) is not None)
print(json.dumps({"names": names, "loaded": sorted(m for m in sys.modules
                  if m.startswith("nvalchemiops.torch"))}))
"""


def _run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_fastcalc_skips_nvalchemiops_optimisers():
    loaded = _run("import json, sys, fastcalc\n"
                  "print(json.dumps(sorted(sys.modules)))")
    assert "nvalchemiops.torch.neighbors" in loaded
    assert not {"nvalchemiops.torch.fire2", "nvalchemiops.torch.lbfgs",
                "nvalchemiops.dynamics"} & set(loaded)


def test_nvalchemiops_torch_after_fastcalc_offers_what_a_plain_import_does():
    plain = _run(_PUBLIC)
    after = _run("import fastcalc\n" + _PUBLIC)
    assert after["names"] == plain["names"]
    assert "fire2_step_coord" in after["names"]
    assert "nvalchemiops.torch.fire2" in after["loaded"]


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
