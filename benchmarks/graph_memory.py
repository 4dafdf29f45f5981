"""Peak memory of UMA's traced energy-forces-stress graph, by liveness in program order.

Builds a random-weight UMA-S-shaped checkpoint (or reads ``--checkpoint``), the padded
inputs of rattled fcc copper as ``BucketedCalculator.evaluate`` makes them, and traces
``UMACore.energy_and_gradients`` with :func:`fastcalc.tracing.trace` (one graph, forward
and backward). Nothing runs: every node's shape is the traced size, read from the
symbolic trace, so 1008 atoms cost no memory. Each tensor that allocates (views,
in-place ops and ``getitem`` share their base's storage) lives from the node that makes
it to the last node reading it or a view of it (reading its size does not count); each
output of a multi-output operator is an allocation of its own, from that operator to its
output's last reader. The report gives the peak of the sum,
the tensors alive there (grouped by the source line that made them) and what the
forward pass leaves for the backward one. Dead code (a recomputed output that only its
gradient needed) is removed first; inputs and weights are counted apart.

This is a proxy for the compiled graph on a GPU: inductor fuses pointwise chains (whose
intermediates then never exist) and may reorder, so the GPU peak differs, but what the
forward pass must keep for the backward one is the same.

    python benchmarks/graph_memory.py --atoms 1008 --checkpoint /tmp/uma-s.pt
"""

from __future__ import annotations

import argparse
import inspect
import operator
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import guarding_hint_or_throw
from torch.fx.proxy import _register_stack_trace_anchor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import fastcalc.geometry  # noqa: E402
import fastcalc.uma.core  # noqa: E402
import fastcalc.uma.layers  # noqa: E402
import fastcalc.uma.radial  # noqa: E402
import fastcalc.uma.so3  # noqa: E402
from fastcalc.bench.suite import UMA_S  # noqa: E402
from fastcalc.bench.timing import COPPER_REPEATS, copper  # noqa: E402
from fastcalc.bench.upstream import build_checkpoint, default_backbone  # noqa: E402
from fastcalc.buckets import atom_mask, pad_atoms, pad_edges, padded_size  # noqa: E402
from fastcalc.tracing import trace  # noqa: E402
from fastcalc.uma.calculator import ATOM_STEP  # noqa: E402
from fastcalc.uma.checkpoint import load_checkpoint  # noqa: E402
from fastcalc.uma.core import UMACore  # noqa: E402
from fastcalc.uma.graph import build_topology  # noqa: E402

GIB = 2.0**30
MIB = 2.0**20
#: Modules whose functions name a node's source line (make_fx keeps only ``forward``
#: frames unless a function is registered as an anchor).
SOURCE_MODULES = (
    fastcalc.geometry, fastcalc.uma.core, fastcalc.uma.layers, fastcalc.uma.radial,
    fastcalc.uma.so3,
)


def anchor_source_functions() -> None:
    """Register the functions and methods of :data:`SOURCE_MODULES` as stack-trace
    anchors, so that ``node.meta["stack_trace"]`` names the lines inside them."""
    for module in SOURCE_MODULES:
        for obj in vars(module).values():
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj):
                _register_stack_trace_anchor(obj)
            elif inspect.isclass(obj):
                for member in vars(obj).values():
                    if inspect.isfunction(member):
                        _register_stack_trace_anchor(member)


def copper_inputs(core: UMACore, natoms: int) -> tuple[torch.Tensor, ...]:
    """The padded graph inputs of rattled fcc copper, as ``BucketedCalculator.evaluate``
    makes them (same topology, padding and masks), on the CPU in the core's dtype."""
    atoms = copper(natoms)
    numbers = torch.as_tensor(atoms.numbers)
    core.prepare(numbers)
    edge_index, unit_shifts = build_topology(
        atoms.positions, atoms.cell.array, atoms.pbc, core.cutoff, core.max_neighbors
    )
    dtype = core.system.dtype
    cell = torch.as_tensor(atoms.cell.array, dtype=dtype)
    padded = padded_size(natoms, ATOM_STEP)
    edges = pad_edges(edge_index, unit_shifts, cell, core.cutoff, bucket_size=256)
    return (
        pad_atoms(torch.as_tensor(atoms.positions, dtype=dtype), padded),
        cell,
        torch.cat([numbers, numbers[:1].expand(padded - natoms)]),
        edges.edge_index,
        edges.unit_shifts,
        edges.edge_mask,
        atom_mask(natoms, padded, cell.device),
    )


@dataclass
class Storage:
    """One allocation: its bytes, the node that made it and the last node using it."""

    node: torch.fx.Node
    nbytes: int
    born: int
    dies: int


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def _nbytes(tensor: torch.Tensor) -> int:
    numel = 1
    for size in tensor.shape:
        numel *= int(guarding_hint_or_throw(size)) if isinstance(size, torch.SymInt) else size
    return numel * tensor.element_size()


def concrete_shape(node: torch.fx.Node) -> str:
    """The traced size of the node's (first) tensor, as ``a x b x c``."""
    tensors = _tensors(node.meta.get("val"))
    if not tensors:
        return ""
    sizes = [guarding_hint_or_throw(s) if isinstance(s, torch.SymInt) else s for s in tensors[0].shape]
    return " x ".join(map(str, sizes)) or "scalar"


def _aliases_input(node: torch.fx.Node) -> bool:
    """Whether the node's output shares its first input's storage (a view, an in-place
    op, ``_unsafe_view`` of a fresh tensor, an element of a multi-output node)."""
    if node.target is operator.getitem:
        return True
    if node.target is torch.ops.aten._unsafe_view.default:
        return True
    schema = getattr(node.target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def storages(graph: torch.fx.Graph) -> tuple[list[Storage], int, int]:
    """Allocations of the graph's call_function nodes with their lifetimes (node
    positions), plus the bytes of its inputs and of its attributes (weights)."""
    nodes = list(graph.nodes)
    owner: dict[torch.fx.Node, Storage | None] = {}
    born_together: dict[torch.fx.Node, int] = {}  # multi-output nodes and their positions
    made: list[Storage] = []
    inputs = weights = 0
    for i, node in enumerate(nodes):
        size = sum(_nbytes(t) for t in _tensors(node.meta.get("val")))
        if node.op == "placeholder":
            inputs += size
            owner[node] = None
        elif node.op == "get_attr":
            weights += size
            owner[node] = None
        elif node.op == "call_function":
            base = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
            if base in born_together:  # one of several outputs, each allocated apart
                owner[node] = Storage(node, size, born_together[base], i)
                made.append(owner[node])
            elif _aliases_input(node) and base is not None:
                owner[node] = owner.get(base)
            elif isinstance(node.meta.get("val"), (list, tuple)):
                born_together[node] = i
                owner[node] = None
            elif size:
                owner[node] = Storage(node, size, i, i)
                made.append(owner[node])
            else:
                owner[node] = None
    end = len(nodes) - 1
    for i, node in enumerate(nodes):
        if isinstance(node.meta.get("val"), (torch.SymInt, int)):
            continue  # reads a size, not the data
        for used in node.all_input_nodes:
            storage = owner.get(used)
            if storage is not None:
                storage.dies = end if node.op == "output" else max(storage.dies, i)
    return made, inputs, weights


def source_line(node: torch.fx.Node, depth: int = 2) -> str:
    """The innermost ``depth`` fastcalc frames that made the node (``backward`` for the
    nodes autograd made)."""
    trace_text = node.meta.get("stack_trace") or ""
    if "autograd.grad" in trace_text:
        return "backward"
    lines = trace_text.strip().splitlines()
    frames = []
    for line in lines:
        line = line.strip()
        if line.startswith('File "'):
            path, _, rest = line[len('File "'):].partition('", line ')
            number, _, function = rest.partition(", in ")
            frames.append(f"{Path(path).name}:{number} {function}")
    return " <- ".join(reversed(frames[-depth:])) or node.op


def report(graph: torch.fx.Graph, top: int) -> str:
    """Peak live bytes in program order, what is alive there, and what crosses into
    the backward pass."""
    made, inputs, weights = storages(graph)
    nodes = list(graph.nodes)
    delta = [0] * (len(nodes) + 1)
    for storage in made:
        delta[storage.born] += storage.nbytes
        delta[storage.dies + 1] -= storage.nbytes
    live, peak, at = 0, 0, 0
    for i in range(len(nodes)):
        live += delta[i]
        if live > peak:
            peak, at = live, i
    alive = sorted(
        (s for s in made if s.born <= at <= s.dies), key=lambda s: s.nbytes, reverse=True
    )
    first_backward = next(
        (i for i, node in enumerate(nodes) if source_line(node) == "backward"), len(nodes)
    )
    saved = [s for s in made if s.born < first_backward <= s.dies]
    out = [
        f"graph: {len(nodes)} nodes, backward from node {first_backward}; "
        f"inputs {inputs / MIB:.1f} MiB and weights {weights / MIB:.1f} MiB not counted",
        f"peak live: {peak / GIB:.2f} GiB at node {at} ({nodes[at].name}, "
        f"{'backward' if at >= first_backward else 'forward'}), {len(alive)} tensors",
        f"forward tensors kept for the backward pass: {len(saved)}, "
        f"{sum(s.nbytes for s in saved) / GIB:.2f} GiB",
        "",
        "alive at the peak, by source line:",
    ]
    groups: dict[str, list[Storage]] = defaultdict(list)
    for storage in alive:
        groups[source_line(storage.node)].append(storage)
    ranked = sorted(groups.items(), key=lambda item: -sum(s.nbytes for s in item[1]))
    for where, members in ranked[:top]:
        total = sum(s.nbytes for s in members)
        shapes = sorted({concrete_shape(s.node) for s in members})
        out.append(
            f"  {total / MIB:9.1f} MiB {len(members):3d}x  {where}  [{'; '.join(shapes[:2])}]"
        )
    out += ["", "largest tensors alive at the peak:"]
    for storage in alive[:top]:
        node = storage.node
        out.append(
            f"  {storage.nbytes / MIB:9.1f} MiB  {node.name:<22} {str(node.target):<34} "
            f"{concrete_shape(node):<16} {source_line(node, depth=1)}"
        )
    return "\n".join(out)


def traced_core(
    checkpoint: Path | None, natoms: int, dtype: torch.dtype
) -> tuple[UMACore, tuple[torch.Tensor, ...], torch.fx.GraphModule]:
    """The UMA core of ``checkpoint`` (a UMA-S-shaped random one written there, or in a
    temporary folder, if missing) in ``dtype``, the padded inputs of ``natoms`` copper
    atoms, and its energy-forces-stress graph traced on them with source lines."""
    with tempfile.TemporaryDirectory() as folder:
        path = checkpoint or Path(folder) / "uma-s.pt"
        if not path.exists():
            build_checkpoint(path, default_backbone(**UMA_S), "UMA-S-1.2.1", seed=0)
        core = UMACore(load_checkpoint(path), "omat", dtype=dtype)
    core.requires_grad_(False)
    inputs = copper_inputs(core, natoms)
    anchor_source_functions()
    return core, inputs, trace(core.energy_and_gradients, inputs, record_stack_traces=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--atoms", type=int, default=1008, choices=sorted(COPPER_REPEATS))
    parser.add_argument(
        "--checkpoint", type=Path, help="UMA checkpoint; a UMA-S-shaped one is written here if missing"
    )
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--top", type=int, default=12, help="rows per table")
    args = parser.parse_args()
    core, inputs, graph = traced_core(args.checkpoint, args.atoms, getattr(torch, args.dtype))
    graph.graph.eliminate_dead_code()  # as the compiler does: results nothing reads
    print(
        f"UMA core ({len(core.blocks)} layers, {core.channels} channels, lmax {core.lmax}, "
        f"mmax {core.mmax}), {args.atoms} Cu atoms padded to {len(inputs[0])}, "
        f"{inputs[3].shape[1]} padded edges, {args.dtype}"
    )
    print(report(graph.graph, args.top))


if __name__ == "__main__":
    main()
