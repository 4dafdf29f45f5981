"""A fresh process for tests/uma/test_interpreted_kernels.py: ``CALLS OUT`` runs the
Triton kernels of :mod:`fastcalc.uma.edge_kernels` on the CPU in Triton's interpreter
(which ``TRITON_INTERPRET=1`` selects only if set before Triton is imported, hence a
process of its own): CALLS holds a list of (function name, arguments), and each
function's result is saved, in that order, to OUT."""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from fastcalc.uma import edge_kernels  # noqa: E402

calls = torch.load(sys.argv[1])
torch.save([getattr(edge_kernels, name)(*args) for name, args in calls], sys.argv[2])
