"""Compiled kernels carried in a compile cache entry: the kernels a compilation added to
its compiler's cache folder (Triton's kernel folders on CUDA, inductor's C++ libraries on
the CPU) are stored with the entry and put back, where missing, by a process that loads
it (``tests/test_compile_cache.py`` checks that such a process on the CPU builds no C++,
and on CUDA ``tests/pet/test_pet_cuda.py`` that it compiles no Triton kernel)."""

from __future__ import annotations

import os
import shutil
from functools import partial
from pathlib import Path

import pytest
import torch

from pair_potential import assert_ase_morse, crystal, graph_inputs, morse_efs
from fastcalc import kernel_bundle, tracing
from fastcalc.compile_cache import CacheKey, CompileCache
from fastcalc.kernel_bundle import KernelFolder, kernel_folder
from fastcalc.tracing import GraphRunner


def kernel(folder, name: str, payload: bytes) -> None:
    """A kernel folder as Triton writes one: a few files named after the kernel."""
    (folder / name).mkdir(parents=True)
    (folder / name / "kernel.cubin").write_bytes(payload)
    (folder / name / "__grp__kernel.json").write_text('{"child_paths": {}}')


def files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_pack_holds_the_kernel_folders_added_since_the_listing(tmp_path):
    compiled, fresh = tmp_path / "compiled", tmp_path / "fresh"
    kernel(compiled, "OLD", b"\x00old")
    before = KernelFolder(compiled, triton=True).listing()
    kernel(compiled, "NEW1", b"\x01new")
    kernel(compiled, "NEW2", bytes(range(256)))
    data = KernelFolder(compiled, triton=True).pack(before)
    assert KernelFolder(fresh, triton=True).unpack(data) == 2
    assert files(fresh) == {k: v for k, v in files(compiled).items() if not k.startswith("OLD")}


def test_unpack_keeps_kernel_folders_already_there(tmp_path):
    compiled, other = tmp_path / "compiled", tmp_path / "other"
    kernel(compiled, "A", b"from the entry")
    kernel(compiled, "B", b"from the entry")
    kernel(other, "A", b"compiled here")
    data = KernelFolder(compiled, triton=True).pack(set())
    assert KernelFolder(other, triton=True).unpack(data) == 1
    assert (other / "A" / "kernel.cubin").read_bytes() == b"compiled here"
    assert (other / "B" / "kernel.cubin").read_bytes() == b"from the entry"
    assert sorted(p.name for p in other.iterdir()) == ["A", "B"]  # no staging left behind


def test_a_kernel_put_back_in_another_cache_folder_is_a_hit_for_triton(tmp_path, monkeypatch):
    """Triton's own cache manager writes a kernel as a compilation does (each stage, the
    metadata and a group file naming them by path); the packed folder, put back in another
    node's cache folder with the first one gone, is found by Triton's cache manager there,
    with its metadata and binary (the other stages are not carried)."""
    cache = pytest.importorskip("triton.runtime.cache")
    stages = {"source": "def k(): pass", "ttir": "module {}", "ptx": ".version 8.0",
              "cubin": b"\x7fELF binary", "json": '{"name": "k"}'}
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(first))
    manager = cache.FileCacheManager("KEY")
    group = {f"k.{stage}": manager.put(data, f"k.{stage}") for stage, data in stages.items()}
    manager.put_group("k.json", group)
    data = KernelFolder(first, triton=True).pack(set())
    shutil.rmtree(first)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(second))
    assert KernelFolder(second, triton=True).unpack(data) == 1
    found = cache.FileCacheManager("KEY").get_group("k.json")
    assert found == {"k.json": str(second / "KEY" / "k.json"),
                     "k.cubin": str(second / "KEY" / "k.cubin")}
    assert Path(found["k.cubin"]).read_bytes() == stages["cubin"]


def test_another_process_s_staging_folder_is_not_a_kernel(tmp_path):
    kernel(tmp_path, "KERNEL", b"\x7fELF")
    kernel(tmp_path, ".fastcalc-staging", b"\x7fELF being put back")
    assert KernelFolder(tmp_path, triton=True).listing() == {"KERNEL"}


def library(folder, name: str, payload: bytes) -> None:
    """A C++ kernel as inductor builds one: source and shared library in a sub-folder
    named by the first characters of its hash."""
    (folder / name[:2]).mkdir(parents=True, exist_ok=True)
    (folder / name[:2] / f"{name}.cpp").write_text("extern \"C\" void kernel() {}")
    (folder / name[:2] / f"{name}.main.so").write_bytes(payload)


def test_pack_holds_the_cpp_libraries_added_since_the_listing(tmp_path):
    compiled, other = tmp_path / "compiled", tmp_path / "other"
    library(compiled, "cold", b"\x7fELF old")
    before = KernelFolder(compiled, triton=False).listing()
    library(compiled, "cnew1", b"\x7fELF new")
    library(compiled, "cnew2", bytes(range(256)))
    library(other, "cnew1", b"\x7fELF built here")
    data = KernelFolder(compiled, triton=False).pack(before)
    assert KernelFolder(other, triton=False).unpack(data) == 1
    assert files(other) == {
        "cn/cnew1.cpp": files(compiled)["cn/cnew1.cpp"],  # what was there stays
        "cn/cnew1.main.so": b"\x7fELF built here",
        "cn/cnew2.main.so": bytes(range(256)),  # the library only: a hit needs no source
    }


def test_the_cpu_kernels_are_inductor_s_libraries(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    assert kernel_folder(torch.device("cpu")) == KernelFolder(tmp_path, triton=False)


def test_nothing_to_pack_from_a_missing_folder_or_to_unpack_from_nothing(tmp_path):
    for triton in (True, False):
        assert KernelFolder(tmp_path / "missing", triton).pack(set()) == b""
        assert KernelFolder(tmp_path / "missing", triton).unpack(b"") == 0


def test_a_loaded_entry_puts_back_the_kernels_its_first_process_made(tmp_path, monkeypatch):
    """A graph runner whose compilation adds a kernel folder (here: a stand-in for a Triton
    kernel, made while the function is traced) stores it with the entry; a second runner
    with an empty Triton folder loads the entry and finds the kernel folder back."""
    triton = tmp_path / "triton"
    monkeypatch.setattr(tracing, "kernel_folder", lambda device: KernelFolder(triton, True))

    def with_a_kernel(*inputs):
        if not (triton / "MORSE").exists():
            kernel(triton, "MORSE", b"\x7fELF kernel")
        return morse_efs(*inputs)

    key = CacheKey.create("morse-kernels", torch.device("cpu"), torch.float64, "float32", "default")
    inputs = graph_inputs(crystal((2, 2, 2)))
    GraphRunner(with_a_kernel, "default", CompileCache(tmp_path / "cache"), lambda: key)(*inputs)
    made = files(triton)
    shutil.rmtree(triton)
    runner = GraphRunner(with_a_kernel, "default", CompileCache(tmp_path / "cache"), lambda: key)
    runner(*inputs)
    assert runner.stats["from_cache"] == 1 and runner.stats["compilations"] == 0
    assert files(triton) == made


def test_a_graph_compiled_after_another_carries_the_kernels_they_share(tmp_path, monkeypatch):
    """A process compiles two graphs (the single and the batched function, say) that share
    a kernel, made while the first compiled: the second's entry carries it too, so that a
    process loading only the second finds it."""
    triton = tmp_path / "triton"
    monkeypatch.setattr(tracing, "kernel_folder", lambda device: KernelFolder(triton, True))
    monkeypatch.setattr(tracing, "_KERNELS_BEFORE", {})

    def with_a_kernel(*inputs):
        if not (triton / "SHARED").exists():
            kernel(triton, "SHARED", b"\x7fELF kernel")
        return morse_efs(*inputs)

    cache = CompileCache(tmp_path / "cache")
    keys = [CacheKey.create("morse-shared", torch.device("cpu"), torch.float64, "float32",
                            "default", graph) for graph in ("single", "batch")]
    inputs = graph_inputs(crystal((2, 2, 2)))
    for key in keys:
        GraphRunner(with_a_kernel, "default", cache, partial(lambda k: k, key))(*inputs)
    made = files(triton)
    shutil.rmtree(triton)
    monkeypatch.setattr(tracing, "_KERNELS_BEFORE", {})  # another process
    runner = GraphRunner(with_a_kernel, "default", cache, partial(lambda k: k, keys[1]))
    runner(*inputs)
    assert runner.stats["from_cache"] == 1
    assert files(triton) == made


def test_kernels_that_cannot_be_packed_leave_the_first_call_right(tmp_path, monkeypatch):
    """Storing is not the user's result: a failure while storing is one warning, the first
    call's results are right (ASE's Morse numbers), and nothing half-stored is left."""
    def unreadable(self, before):
        raise PermissionError("a kernel file cannot be read")

    monkeypatch.setattr(KernelFolder, "pack", unreadable)
    key = CacheKey.create("morse-unpacked", torch.device("cpu"), torch.float64, "float32",
                          "default")
    inputs = graph_inputs(crystal((2, 2, 2)))
    cache = CompileCache(tmp_path / "cache")
    with pytest.warns(UserWarning, match="cannot be stored .*cannot be read"):
        outputs = GraphRunner(morse_efs, "default", cache, lambda: key)(*inputs)
    assert_ase_morse(*outputs, crystal((2, 2, 2)))
    assert cache.entries() == []


def fake_torch_with_ptxas(tmp_path, monkeypatch) -> Path:
    """torch's install folder moved to ``tmp_path``, with an executable ``bin/ptxas``."""
    ptxas = tmp_path / "bin" / "ptxas"
    ptxas.parent.mkdir()
    ptxas.write_text("#!/bin/sh\n")
    ptxas.chmod(0o755)
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "__init__.py"))
    return ptxas


def test_torchs_ptxas_is_named_for_triton_where_torch_ships_one(tmp_path, monkeypatch):
    ptxas = fake_torch_with_ptxas(tmp_path, monkeypatch)
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    kernel_bundle.use_torchs_ptxas()
    assert Path(os.environ["TRITON_PTXAS_PATH"]) == ptxas


def test_a_ptxas_the_user_named_is_kept(tmp_path, monkeypatch):
    fake_torch_with_ptxas(tmp_path, monkeypatch)
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/opt/cuda/bin/ptxas")
    kernel_bundle.use_torchs_ptxas()
    assert os.environ["TRITON_PTXAS_PATH"] == "/opt/cuda/bin/ptxas"
