"""Pure-torch UMA inference core: energy, forces and stress from geometry + topology.

Topology outside, geometry inside
---------------------------------
The caller supplies integer topology; the core computes edge vectors itself so
that forces and stress come from one autograd pass.

* ``edge_index`` (2, E) int64: **row 0 = centre atom i** (the atom that
  receives the message), **row 1 = neighbour j**;
* ``unit_shifts`` (E, 3) int64: lattice shifts ``S``; the edge vector is
  ``r_ij = positions[j] - positions[i] + S @ cell`` (ASE ``"ijS"`` convention).
  (fairchem stores the same edge as ``edge_index = [[j], [i]]``, source first.)
  No edge may have zero length (coincident atoms): its direction is undefined and its
  gradient NaN. fairchem's graphs leave such pairs out, and so do
  :func:`fastcalc.uma.graph.build_topology` and the calculator's neighbour list.
* ``edge_mask`` (E,) bool, optional: False marks padding.  A padded edge is
  given a fixed vector longer than the cutoff, so the smooth envelope makes its
  contribution exactly zero and no zero-length vector ever reaches autograd.

Conditioning on the system
--------------------------
Task, charge, spin and composition only enter through the system embedding
and the mixture of linear experts.  :meth:`UMACore.prepare` merges the experts
for the current system *in place* into preallocated weight buffers, and only
when the system actually changed.  :meth:`UMACore.forward` and
:meth:`UMACore.energy_and_gradients` read those buffers and do no conditioning,
so a traced or compiled graph of them stays valid across re-merges;
:meth:`UMACore.compute` does both steps eagerly.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..geometry import batch_energies_forces_stress, edge_vectors, energy_forces_stress
from ..plain_torch import is_plain
from .checkpoint import TaskSpec, UMACheckpoint
from .edge_ops import (
    compact_rotations,
    edge_pairs,
    edge_to_nodes,
    torch_edge_pairs,
    torch_edge_to_nodes,
)
from .experts import ExpertRouter, SystemEmbedding
from .graph import edges_within
from .layers import (
    EdgeGate,
    MixedLinear,
    RMSNormSH,
    SO2Convolution,
    SpectralFeedForward,
    mixed_linear,
)
from .radial import RadialNetworks
from .so3 import (
    WignerFromSamples,
    edge_frame_rotation,
)

logger = logging.getLogger(__name__)

# option: (fairchem's default when the config omits it, values we implement)
_SUPPORTED = {
    "norm_type": ("rms_norm_sh", ("rms_norm_sh",)),
    "act_type": ("gate", ("gate",)),
    "ff_type": ("grid", ("spectral",)),
    "distance_function": ("gaussian", ("gaussian",)),
    "moe_type": ("so2", ("so2",)),
}
_ENVELOPE_EXPONENT = 5
_EDGE_DEGREE_RESCALE = 5.0  # fairchem's fixed "sqrt average degree"


def check_supported(backbone: dict) -> None:
    """Raise ``NotImplementedError`` for UMA variants this core does not implement."""
    for key, (default, allowed) in _SUPPORTED.items():
        value = backbone.get(key, default)
        if value not in allowed:
            raise NotImplementedError(
                f"UMA option {key}={value!r} is not supported (supported: {allowed})"
            )
    if backbone.get("direct_forces", False):
        raise NotImplementedError(
            "direct_forces=True UMA models are not supported (forces must be -dE/dx)"
        )
    for key in ("charge_balanced_channels", "spin_balanced_channels"):
        if backbone.get(key):
            raise NotImplementedError(f"UMA option {key} is not supported")
    if backbone.get("mmax", 2) > backbone.get("lmax", 2):
        raise ValueError("UMA checkpoint has mmax > lmax")


class EdgeFrames:
    """Per-edge rotations into the edge frame and back, and the envelope.

    ``rotation`` (E, S) is each edge's Wigner-D matrix, its blocks by degree stored
    compactly (:func:`fastcalc.uma.edge_ops.compact_rotations`; the operators take its
    rows in the edge-frame order of :func:`fastcalc.uma.so3.m_major_order`, m up to ``mmax``); the envelope
    (E,) scales the messages on their way back to the atoms. The edge work itself runs in the operators of
    :mod:`fastcalc.uma.edge_ops`, which keep no edge-sized features for the backward
    pass but the messages; within :func:`fastcalc.plain_torch.plain_torch`, in their
    torch code.
    """

    def __init__(self, blocks: list[torch.Tensor], envelope: torch.Tensor, mmax: int) -> None:
        self.rotation = compact_rotations(blocks)
        self.mmax = mmax
        self.envelope = envelope
        plain = is_plain()
        self._pairs = torch_edge_pairs if plain else edge_pairs
        self._to_nodes = torch_edge_to_nodes if plain else edge_to_nodes

    def messages(
        self,
        x: torch.Tensor,
        neighbour: torch.Tensor,
        centre: torch.Tensor,
        radial: torch.Tensor,
        three: bool,
    ) -> list[torch.Tensor]:
        """Edge-frame pairs ``[x_neighbour, x_centre]`` of node features ``x`` by order
        (m up to ``mmax``; :func:`fastcalc.uma.edge_ops.order_sizes`), each (E, rows, 2C),
        each component times its row of ``radial`` (E, rows * 2C; see
        :func:`fastcalc.uma.edge_ops.radial_rows`); with ``three``, orders m > 0 in three
        parts (:func:`fastcalc.uma.edge_ops.three_parts`)."""
        return self._pairs(x, self.rotation, radial, neighbour, centre, self.mmax, three)

    def add_to_nodes(
        self, x: torch.Tensor, centre: torch.Tensor, messages: list[torch.Tensor]
    ) -> torch.Tensor:
        """``x`` plus the edge-frame ``messages`` (by order, each (E, rows, C)) rotated back
        to the node frame, times the envelope, summed at each edge's centre atom."""
        return self._to_nodes(x, messages, self.rotation, self.envelope, centre, self.mmax)

    def add_m0_to_nodes(
        self, x: torch.Tensor, centre: torch.Tensor, m0: torch.Tensor
    ) -> torch.Tensor:
        """``x`` plus messages with only ``m = 0`` components (E, lmax+1, C) rotated back to
        the node frame, times the envelope, summed at each edge's centre atom."""
        return self._to_nodes(x, [m0], self.rotation, self.envelope, centre, 0)


class _Block(nn.Module):
    """One eSCN-MD layer: norm, edge-wise SO(2) message passing, norm, atom-wise FFN.

    With ``three_products`` its first convolution multiplies its orders m > 0 as three
    products where that is faster (:meth:`SO2Convolution.three_products`)."""

    def __init__(
        self, weights: dict, prefix: str, lmax: int, mmax: int, channels: int, hidden: int,
        three_products: bool,
    ) -> None:
        super().__init__()
        self.three_products = three_products
        edge = f"{prefix}edge_wise."
        self.norm_1 = RMSNormSH(weights, f"{prefix}norm_1.", lmax)
        self.channels = channels
        self.conv_1 = SO2Convolution(weights, f"{edge}so2_conv_1.", mmax)
        self.gate = EdgeGate(lmax)
        self.conv_2 = SO2Convolution(weights, f"{edge}so2_conv_2.", mmax)
        self.norm_2 = RMSNormSH(weights, f"{prefix}norm_2.", lmax)
        self.feed_forward = SpectralFeedForward(weights, f"{prefix}atom_wise.", lmax, hidden)

    def forward(
        self,
        x: torch.Tensor,
        system: torch.Tensor,
        radial: torch.Tensor,
        centre: torch.Tensor,
        neighbour: torch.Tensor,
        frames: EdgeFrames,
    ) -> torch.Tensor:
        """Node features ``x`` after the layer; ``radial`` (E, ...) is the output of this
        layer's radial network (see :class:`fastcalc.uma.radial.RadialNetworks`)."""
        residual = x
        x = self.norm_1(x)
        x = torch.cat((x[:, :1] + system, x[:, 1:]), dim=1)
        three = self.three_products and self.conv_1.three_products(x)
        gated = self.gate(self.conv_1(frames.messages(x, neighbour, centre, radial, three)))
        messages = [block.unflatten(1, (-1, self.channels)) for block in self.conv_2(gated)]
        x = frames.add_to_nodes(residual, centre, messages)
        return x + self.feed_forward(self.norm_2(x))


class UMACore(nn.Module):
    """UMA (eSCN-MD + mixture of linear experts) energy model for one task at a time."""

    def __init__(
        self, checkpoint: UMACheckpoint, task: str, dtype: torch.dtype = torch.float64
    ) -> None:
        super().__init__()
        backbone = checkpoint.backbone
        check_supported(backbone)
        w = {
            key[len("backbone."):]: value
            for key, value in checkpoint.weights.items()
            if key.startswith("backbone.")
        }
        self.lmax = int(backbone.get("lmax", 2))
        self.mmax = int(backbone.get("mmax", 2))
        self.channels = int(backbone.get("sphere_channels", 128))
        hidden = int(backbone.get("hidden_channels", 128))
        self.cutoff = float(backbone.get("cutoff", 5.0))
        self.max_neighbors = int(backbone.get("max_neighbors", 300))
        self._checkpoint = checkpoint

        self.register_buffer("element_embedding", w["sphere_embedding.weight"].clone())
        layers = int(backbone.get("num_layers", 2))
        # The last layer's backward pass runs first, while every tensor the forward pass
        # kept is still alive: the peak of memory. There the three products' gradients,
        # (3, E, K) per order instead of (E, 2K), would raise it (by 0.23 GiB for UMA-S at
        # 1008 atoms, past fairchem's peak), so that layer keeps the block product.
        self.blocks = nn.ModuleList(
            _Block(w, f"blocks.{i}.", self.lmax, self.mmax, self.channels, hidden,
                   three_products=i < layers - 1)
            for i in range(layers)
        )
        # the edge-degree embedding's radial network first, then each block's
        self.radial = RadialNetworks(
            w,
            ["edge_degree_embedding.rad_func.net."]
            + [f"blocks.{i}.edge_wise.so2_conv_1.rad_func.net." for i in range(layers)],
            basis_size=int(backbone.get("num_distance_basis", 512)),
            cutoff=self.cutoff,
        )
        self.final_norm = RMSNormSH(w, "norm.", self.lmax)
        self.system_embedding = SystemEmbedding(checkpoint.weights, backbone)
        self.router = (
            ExpertRouter(checkpoint.weights, backbone, checkpoint.model_id)
            if "routing_mlp.0.weight" in w
            else None
        )
        self.wigner = WignerFromSamples(self.lmax)
        self.register_buffer("system", torch.zeros(self.channels, dtype=torch.float64))
        self._build_head(checkpoint)
        self.to(dtype)
        # fairchem divides the edge-degree embedding by a fixed 5: folded into its radial
        # network in the model's dtype (so float64 stays exact to its round-off)
        self.radial.scale_output(0, 1.0 / _EDGE_DEGREE_RESCALE)
        self._context: tuple | None = None
        self._merged: torch.Tensor | None = None  # the expert coefficients last merged
        self._reference_energy = torch.zeros((), dtype=torch.float64)
        self.set_task(task)

    # ------------------------------------------------------------------ setup
    def _build_head(self, checkpoint: UMACheckpoint) -> None:
        """Energy MLP; per-dataset experts become one-hot mixtures (merged on set_task)."""
        if len(checkpoint.heads) != 1:
            raise NotImplementedError(f"expected one output head, found {sorted(checkpoint.heads)}")
        (name, config), = checkpoint.heads.items()
        module = str(config.get("module", ""))
        head_cls = str(config.get("head_cls", module))
        if not head_cls.endswith("MLP_EFS_Head"):
            raise NotImplementedError(f"output head {head_cls!r} is not supported")
        reduce = (config.get("head_kwargs") or config).get("reduce", "sum")
        if reduce != "sum":  # fairchem's "mean" differentiates the sum: not a potential
            raise NotImplementedError(f"energy head reduce={reduce!r} is not supported")
        inner = "head." if "Wrapper" in module else ""
        prefix = f"output_heads.{name}.{inner}energy_block."
        self.head = nn.ModuleList(
            mixed_linear(checkpoint.weights, f"{prefix}{index}.") for index in (0, 2, 4)
        )
        self.head_experts: dict[str, int] = {}
        if module.endswith("DatasetSpecificMoEWrapper"):
            mapping = config.get("dataset_mapping") or {n: n for n in config["dataset_names"]}
            targets = sorted(set(mapping.values()))
            self.head_experts = {name: targets.index(target) for name, target in mapping.items()}

    @property
    def supports_single_atoms(self) -> bool:
        """Whether the checkpoint declares the model fit for one atom without periodic
        boundaries (fairchem evaluates it only then)."""
        return self._checkpoint.supports_single_atoms

    @property
    def task(self) -> TaskSpec:
        """The task set by :meth:`set_task`: its name, normalisers and element references."""
        return self._task

    def set_task(self, task: str) -> None:
        """Select the task (dataset) whose head, embedding and normalisers are used."""
        spec = self._checkpoint.task(task)
        if self.head_experts:
            one_hot = self.system.new_zeros(self.head[0].experts.shape[0])
            one_hot[self.head_experts[task]] = 1.0
            for layer in self.head:
                layer.merge(one_hot)
        self._task = spec
        self._context = None

    def mixed_layers(self) -> list[MixedLinear]:
        """The backbone's linear maps that have experts (``layers_moe`` may leave some plain)."""
        convs = [conv for block in self.blocks for conv in (block.conv_1, block.conv_2)]
        layers = [layer for conv in convs for layer in conv.mixed_layers()]
        return [layer for layer in layers if layer.experts.shape[0] > 1]

    @torch.no_grad()
    def prepare(self, numbers: torch.Tensor, charge: int = 0, spin: int = 0) -> None:
        """Condition the model on (task, charge, spin, composition); cheap if unchanged.

        Recomputes the system embedding and re-merges the experts in place only
        when one of those changed since the last call and the expert coefficients with
        it. ``numbers`` may be on any device; on the CPU, an unchanged system costs no
        device transfer. The experts wait in host memory until a second set of
        coefficients is merged; from then on they stay on the model's device (two host
        copies at most: one MD run holds no experts on its GPU, a screening copies none
        per structure).
        """
        species, counts = torch.unique(numbers.detach().cpu(), return_counts=True)
        composition = (tuple(species.tolist()), tuple(counts.tolist()))
        key = (self._task.name, int(charge), int(spin), composition)
        if key == self._context:
            return
        references = self._task.element_references
        self._reference_energy = (
            torch.zeros((), dtype=torch.float64)
            if references is None
            else (references[species] * counts).sum()  # float64 on the CPU, like fairchem's
        )
        system = self.system_embedding(int(charge), int(spin), self._task.name)
        self.system.copy_(system)
        if self.router is not None:
            coefficients = self.router(species, counts, system)
            if self._merged is None or not torch.equal(coefficients, self._merged):
                if self._merged is not None:
                    self._keep_experts_on_device()
                for layer in self.mixed_layers():
                    layer.merge(coefficients)
                self._merged = coefficients
        self._context = key

    def _keep_experts_on_device(self) -> None:
        """A second system whose expert coefficients differ from the first's (a screening,
        not one MD run, nor one composition at two sizes): the experts move to the model's
        device, where merges need no host copy."""
        layers = self.mixed_layers()
        device = self.system.device
        moving = [layer for layer in layers if layer.experts.device != device]
        if moving:
            size = sum(layer.experts.nbytes for layer in moving) / 2**30
            logger.info("UMA: a second system to merge the experts for; their %.2f GiB now "
                        "stay on %s so that merges copy nothing from host memory", size, device)
        for layer in layers:
            layer.keep_experts_on_device()

    # ---------------------------------------------------------------- forward
    def forward(
        self,
        positions: torch.Tensor,
        cell: torch.Tensor,
        numbers: torch.Tensor,
        edge_index: torch.Tensor,
        unit_shifts: torch.Tensor,
        edge_mask: torch.Tensor | None = None,
        atom_mask: torch.Tensor | None = None,
        edge_system: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Raw (normalised, reference-free) per-atom energies (N,) in the model's dtype,
        differentiable in ``positions`` and ``cell``, for the system last given to
        :meth:`prepare`; the raw energy is their sum. Atoms where ``atom_mask`` (N,) is
        False are padding: their energy is zero (they must have no edges). For a batch of
        systems of that same composition, charge and spin, ``cell`` is (B, 3, 3) and
        ``edge_system`` (E,) gives each edge's system.

        Free of host synchronisation and data-dependent control flow, so it can be
        traced; use :meth:`compute` for physical outputs."""
        centre, neighbour = edge_index[0], edge_index[1]
        vectors = edge_vectors(positions, cell, edge_index, unit_shifts, edge_system)
        if edge_mask is not None:
            padding = vectors.new_full((3,), self.cutoff)  # length sqrt(3) * cutoff
            vectors = torch.where(edge_mask.unsqueeze(-1), vectors, padding)
        lengths = torch.linalg.vector_norm(vectors, dim=-1)
        frames = EdgeFrames(
            blocks=self.wigner.blocks(edge_frame_rotation(vectors / lengths.unsqueeze(-1))),
            envelope=self._envelope(lengths),
            mmax=self.mmax,
        )

        edge_degree, *radial = self.radial(lengths, numbers[neighbour], numbers[centre])
        x = self._initial_features(numbers, edge_degree, centre, frames)
        for block, block_radial in zip(self.blocks, radial):
            x = block(x, self.system, block_radial, centre, neighbour, frames)
        x = self.final_norm(x)
        atom_energy = x[:, 0]
        for index, layer in enumerate(self.head):
            atom_energy = layer(atom_energy)
            if index < len(self.head) - 1:
                atom_energy = nn.functional.silu(atom_energy)
        atom_energy = atom_energy[:, 0]
        if atom_mask is not None:
            atom_energy = torch.where(atom_mask, atom_energy, 0.0)
        return atom_energy

    def _envelope(self, lengths: torch.Tensor) -> torch.Tensor:
        """Polynomial envelope (exponent 5) of ``d / cutoff``; exactly 0 beyond the cutoff."""
        p = _ENVELOPE_EXPONENT
        d = lengths / self.cutoff
        value = 1 + d**p * (-(p + 1) * (p + 2) / 2 + d * (p * (p + 2) - p * (p + 1) / 2 * d))
        return torch.where(d < 1, value, torch.zeros_like(value))

    def _initial_features(
        self,
        numbers: torch.Tensor,
        edge_degree: torch.Tensor,
        centre: torch.Tensor,
        frames: EdgeFrames,
    ) -> torch.Tensor:
        """Element + system embedding on l=0, plus the edge-degree embedding (from the
        output (E, (lmax+1) * channels) of its radial network, already divided by
        ``_EDGE_DEGREE_RESCALE``)."""
        atoms = numbers.shape[0]
        scalar = (self.element_embedding[numbers] + self.system).unsqueeze(1)
        rest = scalar.new_zeros(atoms, (self.lmax + 1) ** 2 - 1, self.channels)
        x = torch.cat((scalar, rest), dim=1)
        radial = edge_degree.unflatten(1, (self.lmax + 1, self.channels))
        return frames.add_m0_to_nodes(x, centre, radial)

    # ---------------------------------------------------------------- outputs
    def energy_and_gradients(
        self,
        positions: torch.Tensor,
        cell: torch.Tensor,
        numbers: torch.Tensor,
        edge_index: torch.Tensor,
        unit_shifts: torch.Tensor,
        edge_mask: torch.Tensor | None = None,
        atom_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Raw energy (float64), ``-dE/dpositions``, ``(1/V) dE/dstrain`` (3x3) and the raw
        per-atom energies (N,), from one forward and one backward pass.

        Traceable (the function fastcalc compiles); call :meth:`prepare` first. The
        energy is the per-atom energies summed in float64, as fairchem does.
        """
        per_atom: list[torch.Tensor] = []

        def energy(deformed_positions: torch.Tensor, deformed_cell: torch.Tensor) -> torch.Tensor:
            per_atom.append(
                self(deformed_positions, deformed_cell, numbers, edge_index, unit_shifts,
                     edge_mask, atom_mask)
            )
            return per_atom[0].sum(dtype=torch.float64)

        total, forces, stress = energy_forces_stress(energy, positions, cell, compute_stress=True)
        return total, forces, stress, per_atom[0].detach()

    def energy_and_gradients_within(
        self,
        positions: torch.Tensor,
        cell: torch.Tensor,
        numbers: torch.Tensor,
        candidate_index: torch.Tensor,
        candidate_shifts: torch.Tensor,
        slots: torch.Tensor,
        padding_shift: torch.Tensor,
        atom_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`energy_and_gradients` on the edges that
        :func:`fastcalc.uma.graph.edges_within` picks from a Verlet list's candidates,
        padded to ``len(slots)``, and last the count of those edges: the results hold
        only if it is at most ``len(slots)``. Traceable (the function fastcalc compiles
        for one structure): the edge count never reaches the host before the model runs."""
        edges, count = edges_within(
            positions, cell, candidate_index, candidate_shifts, slots, padding_shift, self.cutoff
        )
        results = self.energy_and_gradients(
            positions, cell, numbers, edges.edge_index, edges.unit_shifts, edges.edge_mask,
            atom_mask,
        )
        return (*results, count)

    def batch_energies_and_gradients(
        self,
        positions: torch.Tensor,
        cells: torch.Tensor,
        numbers: torch.Tensor,
        edge_index: torch.Tensor,
        unit_shifts: torch.Tensor,
        edge_mask: torch.Tensor,
        atom_mask: torch.Tensor,
        system_index: torch.Tensor,
        edge_system: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`energy_and_gradients` for B systems of one composition, charge and spin
        (``cells`` (B, 3, 3), atom and edge systems ``system_index`` (N,) and
        ``edge_system`` (E,)): raw energies (B,) float64, forces, stresses (B, 3, 3) and the
        raw per-atom energies, from one forward and one backward pass. Traceable."""

        def atom_energies(deformed_positions: torch.Tensor, deformed_cells: torch.Tensor) -> torch.Tensor:
            return self(deformed_positions, deformed_cells, numbers, edge_index, unit_shifts,
                        edge_mask, atom_mask, edge_system)

        return batch_energies_forces_stress(atom_energies, positions, cells, system_index)

    def outputs(
        self,
        raw: torch.Tensor,
        raw_forces: torch.Tensor,
        raw_stress: torch.Tensor,
        raw_energies: torch.Tensor,
        numbers: torch.Tensor,
        stress: bool = True,
    ) -> dict[str, torch.Tensor]:
        """Energy (eV), per-atom energies (eV), forces (eV/A) and, if asked, stress
        (eV/A^3, 3x3) for the task, from :meth:`energy_and_gradients`' outputs.

        The raw forces and the symmetrised raw stress each go through their task
        normaliser (``value * rmsd + mean``); the energy gets the element references of
        the composition given to :meth:`prepare`, as fairchem post-processes its
        outputs. fairchem has no per-atom energies; here atom i of the N ``numbers``
        gets ``raw_i * rmsd + mean / N + reference[Z_i]``: the normaliser's mean shared
        equally, so that they sum to the energy and each is unchanged by a translation.
        """
        task = self._task
        energy = raw * task.energy.rmsd + task.energy.mean + self._reference_energy.to(raw.device)
        references = task.element_references
        atom_references = (
            torch.zeros((), dtype=torch.float64)
            if references is None
            else references[numbers.detach().cpu()]
        )
        energies = (
            raw_energies * task.energy.rmsd
            + task.energy.mean / len(raw_energies)
            + atom_references.to(raw_energies.device)
        )
        out = {
            "energy": energy,
            "energies": energies,
            "forces": raw_forces * task.forces.rmsd + task.forces.mean,
        }
        if stress:
            symmetric = 0.5 * (raw_stress + raw_stress.T)
            out["stress"] = symmetric * task.stress.rmsd + task.stress.mean
        return out

    def compute(
        self,
        positions: torch.Tensor,
        cell: torch.Tensor,
        numbers: torch.Tensor,
        edge_index: torch.Tensor,
        unit_shifts: torch.Tensor,
        edge_mask: torch.Tensor | None = None,
        charge: int = 0,
        spin: int = 0,
        stress: bool = True,
    ) -> dict[str, torch.Tensor]:
        """Eager :meth:`prepare`, :meth:`energy_and_gradients` and :meth:`outputs`."""
        self.prepare(numbers, charge, spin)
        gradients = self.energy_and_gradients(
            positions, cell, numbers, edge_index, unit_shifts, edge_mask
        )
        return self.outputs(*gradients, numbers, stress)
