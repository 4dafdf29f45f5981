"""The examples run to completion (a few steps each)."""

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parents[1] / "examples"


def test_pair_potential_md_conserves_energy():
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "pair_potential_md.py"), "20"],
        capture_output=True, text=True, check=True,
    )
    drift = float(result.stdout.split("energy drift")[1].split()[0])
    assert abs(drift) < 0.1, result.stdout
