"""Triton kernels carried in a compile cache entry: the kernel folders a compilation added
to Triton's cache are stored with the entry and put back, where missing, by a process
that loads it (on CUDA, ``tests/pet/test_pet_cuda.py`` checks that such a process
compiles no Triton kernel)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from test_tracing import crystal, graph_inputs, morse_efs

from fastcalc import triton_bundle
from fastcalc.compile_cache import CacheKey, CompileCache
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
    before = triton_bundle.listing(compiled)
    kernel(compiled, "NEW1", b"\x01new")
    kernel(compiled, "NEW2", bytes(range(256)))
    assert triton_bundle.unpack(fresh, triton_bundle.pack(compiled, before)) == 2
    assert files(fresh) == {k: v for k, v in files(compiled).items() if not k.startswith("OLD")}


def test_unpack_keeps_kernel_folders_already_there(tmp_path):
    compiled, other = tmp_path / "compiled", tmp_path / "other"
    kernel(compiled, "A", b"from the entry")
    kernel(compiled, "B", b"from the entry")
    kernel(other, "A", b"compiled here")
    assert triton_bundle.unpack(other, triton_bundle.pack(compiled, set())) == 1
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
    data = triton_bundle.pack(first, set())
    shutil.rmtree(first)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(second))
    assert triton_bundle.unpack(second, data) == 1
    found = cache.FileCacheManager("KEY").get_group("k.json")
    assert found == {"k.json": str(second / "KEY" / "k.json"),
                     "k.cubin": str(second / "KEY" / "k.cubin")}
    assert Path(found["k.cubin"]).read_bytes() == stages["cubin"]


def test_nothing_to_pack_or_unpack_without_a_triton_folder(tmp_path):
    assert triton_bundle.cache_folder(torch.device("cpu")) is None
    assert triton_bundle.pack(None, set()) == b""
    assert triton_bundle.unpack(None, b"") == 0


def test_a_loaded_entry_puts_back_the_kernels_its_first_process_made(tmp_path, monkeypatch):
    """A graph runner whose compilation adds a kernel folder (here: a stand-in for a Triton
    kernel, made while the function is traced) stores it with the entry; a second runner
    with an empty Triton folder loads the entry and finds the kernel folder back."""
    triton = tmp_path / "triton"
    monkeypatch.setattr(triton_bundle, "cache_folder", lambda device: triton)

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
    triton_bundle.use_torchs_ptxas()
    assert Path(os.environ["TRITON_PTXAS_PATH"]) == ptxas


def test_a_ptxas_the_user_named_is_kept(tmp_path, monkeypatch):
    fake_torch_with_ptxas(tmp_path, monkeypatch)
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/opt/cuda/bin/ptxas")
    triton_bundle.use_torchs_ptxas()
    assert os.environ["TRITON_PTXAS_PATH"] == "/opt/cuda/bin/ptxas"
