"""fastcalc's Triton kernels compile for the GPUs it runs on (sm_90: H100, H200) on a
machine without one. Triton's interpreter (``test_interpreted_*``) runs a kernel as Python,
so it checks what a kernel computes but not what only the compiler rejects (a constexpr
used as a value, a variable defined in one branch of a runtime ``if``, a type mismatch
in a loop); this test compiles each kernel to a cubin ahead of time, as the GPU would at
its first launch."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from fastcalc import tf32x3_kernel  # noqa: E402
from fastcalc.uma import edge_kernels  # noqa: E402
from fastcalc.uma.edge_ops import radial_rows  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)
#: Arguments that point to atom indices (int64); every other pointer is to features.
INDEX_POINTERS = {"src_ptr", "centre_ptr"}


def compile_for_sm90(kernel, ints: set[str], constants: dict, dtype: str, **options: int):
    """``kernel`` (a ``triton.jit`` function) compiled for sm_90 with ``options`` (warps,
    stages): ``ints`` are its int32 arguments, ``constants`` its constexpr values, its
    other pointers to ``dtype``."""
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in ints:
            signature[name] = "i32"
        else:
            signature[name] = "*i64" if name in INDEX_POINTERS else f"*{dtype}"
    constexprs = {(kernel.arg_names.index(name),): value for name, value in constants.items()}
    return triton.compile(ASTSource(kernel, signature, constexprs), target=SM90, options=options)


#: (lmax, mmax, channels): UMA-S's layout and one whose m-major order drops components.
LAYOUTS = [(2, 2, 128), (3, 1, 4)]
EDGE_KERNELS = ["_pairs_kernel", "_pairs_backward_kernel", "_to_nodes_kernel",
                "_to_nodes_backward_kernel"]
GATE_KERNELS = ["_gate_kernel", "_gate_backward_kernel"]


def launch_layout(layout: tuple[int, int, int], gate: bool, three: bool) -> dict:
    """The constexprs and warps the kernel wrappers launch with for (lmax, mmax, channels),
    orders m > 0 in three parts or not (shapes are all they read)."""
    lmax, mmax, channels = layout
    if gate:
        return edge_kernels._gate_layout(channels, mmax, lmax, three)
    rotations = torch.empty(1, sum((2 * l + 1) ** 2 for l in range(lmax + 1)))
    return dict(edge_kernels._layout(torch.empty(1, (lmax + 1) ** 2, channels), rotations, mmax),
                NR=max(radial_rows(lmax, mmax)) + 1, THREE=three)


def compile_uma_kernel(name: str, layout: tuple[int, int, int], dtype: str, gate: bool,
                       three: bool = False):
    """UMA's kernel ``name`` compiled for sm_90 as its wrapper launches it for ``layout``."""
    kernel = getattr(edge_kernels, name)
    constants = launch_layout(layout, gate, three)
    warps = constants.pop("num_warps")
    constants = {k: v for k, v in constants.items() if k in kernel.arg_names}
    return compile_for_sm90(kernel, {"E", "C"}, constants, dtype, num_warps=warps)


@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("name, three", [*((name, False) for name in EDGE_KERNELS),
                                         *((name, True) for name in EDGE_KERNELS[:2])])
def test_uma_edge_kernels_compile_for_sm90(name, three, layout, dtype):
    """Each kernel; the edge pairs' also writing orders m > 0 in three parts."""
    assert compile_uma_kernel(name, layout, dtype, gate=False, three=three).asm["cubin"]


@pytest.mark.parametrize("three", [False, True], ids=["blocks", "three parts"])
@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("name", GATE_KERNELS)
def test_uma_gate_kernels_compile_for_sm90(name, layout, dtype, three):
    assert compile_uma_kernel(name, layout, dtype, gate=True, three=three).asm["cubin"]


@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("config", range(len(tf32x3_kernel.CONFIGS)))
def test_three_tf32_product_compiles_for_sm90_with_each_tile(config, has_bias):
    kernel = tf32x3_kernel._matmul_kernel.fn
    ints = {name for name in kernel.arg_names if name in ("M", "N", "K") or name.startswith("stride")}
    tile = tf32x3_kernel.CONFIGS[config]
    compiled = compile_for_sm90(kernel, ints, dict(tile.kwargs, HAS_BIAS=has_bias), "fp32",
                                num_warps=tile.num_warps, num_stages=tile.num_stages)
    assert compiled.asm["cubin"]
