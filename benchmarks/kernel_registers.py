"""Registers, spills and resident warps of UMA's edge kernels on an H100/H200, without a GPU.

Compiles each Triton kernel of :mod:`fastcalc.uma.edge_kernels` for sm_90 at the UMA-S sizes (lmax = mmax = 2, 128
channels) for each number of edges per program and warps, runs Triton's bundled ptxas with
``-v`` on the PTX and prints what it reports, with the warps one SM can hold at that
register count (65,536 registers, at most 32 programs). A kernel at 255 registers holds 8
warps per SM: too few to hide the latency of its loads.

    python benchmarks/kernel_registers.py
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fastcalc.uma import edge_kernels  # noqa: E402

F32, I64, I32 = "*fp32", "*i64", "i32"
BLOCKS = ("0", "1", "2")  # one pointer per order's block of edge-frame features
PAIRS = dict(x_ptr=F32, w_ptr=F32, radial_ptr=F32, src_ptr=I64,
             **{f"out{m}": F32 for m in BLOCKS}, E=I32, C=I32)
PAIRS_BACKWARD = dict(**{f"g{m}": F32 for m in BLOCKS}, x_ptr=F32, w_ptr=F32, radial_ptr=F32,
                      src_ptr=I64, grad_x_ptr=F32, grad_w_ptr=F32, grad_radial_ptr=F32, E=I32,
                      C=I32)
NODES = dict(**{f"msg{m}": F32 for m in BLOCKS}, w_ptr=F32, env_ptr=F32, centre_ptr=I64,
             out_ptr=F32, E=I32, C=I32)
NODES_BACKWARD = dict(grad_ptr=F32, **{f"msg{m}": F32 for m in BLOCKS}, w_ptr=F32, env_ptr=F32,
                      centre_ptr=I64, **{f"grad_msg{m}": F32 for m in BLOCKS}, grad_w_ptr=F32,
                      grad_env_ptr=F32, E=I32, C=I32)
#: UMA-S: lmax = mmax = 2, 128 channels, 35 rotation entries per edge, 6 radial rows
SIZES = dict(LMAX=2, MMAX=2, K=9, S=35, NR=6, KB=8, BLOCK_C=128)
KERNELS = {
    "pairs": (edge_kernels._pairs_kernel, PAIRS),
    "pairs backward": (edge_kernels._pairs_backward_kernel, PAIRS_BACKWARD),
    "nodes": (edge_kernels._to_nodes_kernel, NODES),
    "nodes backward": (edge_kernels._to_nodes_backward_kernel, NODES_BACKWARD),
}


def ptxas() -> Path:
    """Triton's bundled ptxas that reads the PTX version Triton writes."""
    folder = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    newest = folder / "ptxas-blackwell"
    return newest if newest.exists() else folder / "ptxas"


def registers(kernel, signature: dict, constants: dict, warps: int) -> tuple[int, int]:
    """Registers per thread and bytes spilled of ``kernel`` compiled for sm_90."""
    constants = {name: value for name, value in constants.items()
                 if name in kernel.arg_names}
    source = ASTSource(fn=kernel, signature={**signature, **dict.fromkeys(constants, "constexpr")},
                       constexprs=constants)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps})
    with tempfile.TemporaryDirectory() as folder:
        ptx = Path(folder) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        report = subprocess.run(
            [str(ptxas()), "-v", "--gpu-name", "sm_90a", str(ptx), "-o", str(ptx.with_suffix(".cubin"))],
            capture_output=True, text=True, check=True,
        ).stderr
    used = int(re.search(r"Used (\d+) registers", report).group(1))
    spilled = int(re.search(r"(\d+) bytes spill stores", report).group(1))
    return used, spilled


def main() -> None:
    for name, (kernel, signature) in KERNELS.items():
        for edges in (1, 2, 4):
            for warps in (1, 2, 4):
                used, spilled = registers(kernel, signature, {**SIZES, "BLOCK_E": edges}, warps)
                resident = min(32, 65536 // (used * 32 * warps)) * warps
                print(f"{name:24s} {edges} edges/program, {warps} warps: {used:3d} registers, "
                      f"{spilled:5d} bytes spilled, {resident:2d} warps per SM", flush=True)


if __name__ == "__main__":
    main()
