"""Fit a small UMA-architecture model (fairchem eSCN-MD MoLE backbone) to EMT copper.

The model is fairchem's own ``HydraModel`` with an ``eSCNMDMoeBackbone`` (MoLE experts)
and an ``MLP_EFS_Head`` (energy; forces and stress by autograd) inside a
``DatasetSpecificSingleHeadWrapper``, laid out like the released UMA checkpoints. It is
trained with a plain torch loop on the ``omat`` task and saved as a fairchem inference
checkpoint (a pickled ``MLIPInferenceCheckpoint``) that
``fairchem.core.units.mlip_unit.load_predict_unit(path)`` and ``FAIRChemCalculator`` load:

- ``model_config``: the hydra config of the ``HydraModel`` (``_target_``, ``backbone``,
  ``heads``, ``pass_through_head_outputs: True``, ``otf_graph: True``);
- ``ema_state_dict`` (an ``AveragedModel`` state dict: keys prefixed ``module.`` plus
  ``n_averaged``; fairchem infers with the EMA weights) and ``model_state_dict`` (the same
  EMA tensors without the prefix, stored once in the file);
- ``tasks_config``: three hydra ``Task`` configs, ``omat_energy``, ``omat_forces``,
  ``omat_stress`` (dataset ``omat``), each with a ``Normalizer(mean=0, rmsd=R)`` (R = the
  RMS of the training forces) and, for the energy, ``ElementReferences`` holding the
  least-squares per-atom energy of Cu (index 29) and zeros elsewhere.

Run ``python scripts/demo/make_dataset.py`` first. Then::

    OMP_NUM_THREADS=1 python scripts/demo/fit_uma.py --minutes 22

Training stops after ``--epochs`` or ``--minutes`` (whichever comes first; the cosine
learning-rate schedule is laid over the time budget); everything is seeded.
"""

from __future__ import annotations

import argparse
import copy
import math
import pathlib
import time

import numpy as np
import torch
from ase.io import read

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
TARGET = REPO / "fastcalc" / "demo_models" / "uma-demo-cu.pt"
TASK = "omat"
MODEL_ID = "fastcalc-demo-uma-cu-1"

BACKBONE = {
    "model": "fairchem.core.models.uma.escn_moe.eSCNMDMoeBackbone",
    "max_num_elements": 100,
    "sphere_channels": 32,
    "hidden_channels": 32,
    "edge_channels": 32,
    "num_distance_basis": 64,
    "lmax": 2,
    "mmax": 2,
    "num_layers": 2,
    "cutoff": 5.0,
    "max_neighbors": 300,
    "otf_graph": True,
    "use_pbc": True,
    "use_pbc_single": True,
    "always_use_pbc": False,
    "direct_forces": False,
    "regress_forces": True,
    "regress_stress": True,
    "norm_type": "rms_norm_sh",
    "act_type": "gate",
    "ff_type": "spectral",
    "chg_spin_emb_type": "rand_emb",
    "cs_emb_grad": False,
    "dataset_emb_grad": False,
    "dataset_list": [TASK],
    "use_dataset_embedding": True,
    "num_experts": 4,
    "use_composition_embedding": True,
    "moe_layer_type": "pytorch",
}
HEADS = {
    "energyandforcehead": {
        "module": "fairchem.core.models.uma.escn_moe.DatasetSpecificSingleHeadWrapper",
        "head_cls": "fairchem.core.models.uma.escn_md.MLP_EFS_Head",
        "dataset_names": [TASK],
        "head_kwargs": {"wrap_property": False},
    }
}


def model_config():
    return {
        "_target_": "fairchem.core.models.base.HydraModel",
        "backbone": copy.deepcopy(BACKBONE),
        "heads": copy.deepcopy(HEADS),
        "pass_through_head_outputs": True,
        "otf_graph": True,
        # a model_id marks a tagged (non-legacy) UMA checkpoint for fairchem's loader
        "model_id": MODEL_ID,
    }


def tasks_config(rmsd: float, cu_reference: float):
    refs = [0.0] * 101
    refs[29] = cu_reference
    normalizer = {
        "_target_": "fairchem.core.modules.normalization.normalizer.Normalizer",
        "mean": 0.0,
        "rmsd": float(rmsd),
    }

    def task(prop, level, dim, element_references=None):
        return {
            "_target_": "fairchem.core.units.mlip_unit.mlip_unit.Task",
            "name": f"{TASK}_{prop}",
            "level": level,
            "property": prop,
            "out_spec": {
                "_target_": "fairchem.core.units.mlip_unit.mlip_unit.OutputSpec",
                "dim": dim,
                "dtype": "float32",
            },
            "normalizer": dict(normalizer),
            "element_references": element_references,
            "datasets": [TASK],
            "loss_fn": None,
            "metrics": [],
            "train_on_free_atoms": True,
            "eval_on_free_atoms": True,
        }

    energy_refs = {
        "_target_": "fairchem.core.modules.normalization.element_references.ElementReferences",
        "element_references": {"_target_": "torch.DoubleTensor", "_args_": [refs]},
    }
    return [
        task("energy", "system", [1], energy_refs),
        task("forces", "atom", [3]),
        task("stress", "system", [1, 9]),
    ]


def load_frames(path):
    frames = read(path, ":")
    for atoms in frames:
        atoms.info["charge"] = 0
        atoms.info["spin"] = 0
    return frames


def to_data(atoms):
    from fairchem.core.datasets.atomic_data import AtomicData

    plain = atoms.copy()
    plain.calc = None
    return AtomicData.from_ase(plain, task_name=TASK, r_edges=False, radius=6.0)


def make_batch(datas, frames, idx, rmsd, cu_ref, device="cpu"):
    from fairchem.core.datasets.atomic_data import atomicdata_list_to_batch

    batch = atomicdata_list_to_batch([datas[i].clone() for i in idx]).to(device)
    n = torch.tensor([len(frames[i]) for i in idx], dtype=torch.float32)
    e = torch.tensor([frames[i].info["ref_energy"] for i in idx], dtype=torch.float32)
    e_norm = (e - n * cu_ref) / rmsd
    f = torch.from_numpy(np.concatenate([frames[i].arrays["ref_forces"] for i in idx]))
    s = torch.from_numpy(np.stack([np.asarray(frames[i].info["ref_stress"],
                                              dtype=float).reshape(9) for i in idx]))
    return (batch, n.to(device), e_norm.to(device), (f.float() / rmsd).to(device),
            (s.float() / rmsd).to(device))


def predict(model, batch):
    out = model(batch)
    return (out[f"{TASK}_energy"]["energy"].reshape(-1),
            out[f"{TASK}_forces"]["forces"],
            out[f"{TASK}_stress"]["stress"].reshape(-1, 9))


def losses(model, batch, n, e_t, f_t, s_t, w):
    e, f, s = predict(model, batch)
    le = (((e - e_t) / n) ** 2).mean()
    lf = ((f - f_t) ** 2).mean()
    mask = ~torch.isnan(s_t[:, 0])
    ls = ((s[mask] - s_t[mask]) ** 2).mean() if mask.any() else e.new_zeros(())
    return w[0] * le + w[1] * lf + w[2] * ls, (e, f)


def evaluate(model, datas, frames, rmsd, cu_ref, batch_size=16, device="cpu"):
    """Energy MAE (meV/atom) and force MAE (eV/A) in physical units."""
    model.eval()
    e_err, f_err = [], []
    for start in range(0, len(frames), batch_size):
        idx = list(range(start, min(start + batch_size, len(frames))))
        batch, n, e_t, f_t, _ = make_batch(datas, frames, idx, rmsd, cu_ref, device)
        e, f, _ = predict(model, batch)
        e_err.append(((e - e_t).detach() * rmsd / n).abs())
        f_err.append(((f - f_t).detach() * rmsd).abs().reshape(-1))
    model.train()
    return 1000 * torch.cat(e_err).mean().item(), torch.cat(f_err).mean().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(HERE / "data"))
    parser.add_argument("--out", default=str(TARGET))
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=22.0)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--ema-decay", type=float, default=0.99)
    parser.add_argument("--weights", type=float, nargs=3, default=(20.0, 1.0, 20.0),
                        metavar=("ENERGY", "FORCES", "STRESS"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    import hydra

    from fairchem.core.units.mlip_unit.api.inference import MLIPInferenceCheckpoint

    data = pathlib.Path(args.data)
    train = load_frames(data / "train.xyz")
    val = load_frames(data / "val.xyz")

    # element reference: least squares per-atom energy (one element: the mean E/N)
    cu_ref = float(np.mean([a.info["ref_energy"] / len(a) for a in train]))
    rmsd = float(np.sqrt(np.mean(np.concatenate(
        [a.arrays["ref_forces"].reshape(-1) ** 2 for a in train]))))
    print(f"Cu element reference {cu_ref:.6f} eV, normaliser rmsd {rmsd:.4f}")

    train_data = [to_data(a) for a in train]
    val_data = [to_data(a) for a in val]

    config = model_config()
    model = hydra.utils.instantiate(config)
    model.to(args.device)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters")
    ema = torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(args.ema_decay),
        use_buffers=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-5)
    budget = args.minutes * 60
    warmup = 20  # steps

    def lr_at(step, elapsed):
        frac = min(1.0, elapsed / budget)
        cosine = 0.5 * (1 + math.cos(math.pi * frac))
        return args.lr * min(1.0, (step + 1) / warmup) * (0.02 + 0.98 * cosine)

    start = time.time()
    step = 0
    best = None
    for epoch in range(args.epochs):
        order = rng.permutation(len(train))
        for b in range(0, len(order), args.batch_size):
            idx = order[b:b + args.batch_size]
            batch, n, e_t, f_t, s_t = make_batch(train_data, train, idx, rmsd, cu_ref,
                                                  args.device)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, time.time() - start)
            loss, _ = losses(model, batch, n, e_t, f_t, s_t, args.weights)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            optimizer.step()
            ema.update_parameters(model)
            step += 1
        elapsed = time.time() - start
        e_mae, f_mae = evaluate(ema.module, val_data, val, rmsd, cu_ref,
                                device=args.device)
        print(f"epoch {epoch:3d} step {step:5d} {elapsed / 60:5.1f} min "
              f"lr {optimizer.param_groups[0]['lr']:.2e} loss {loss.item():.4f} | "
              f"val (EMA) energy MAE {e_mae:6.2f} meV/atom force MAE {f_mae:.4f} eV/A",
              flush=True)
        if best is None or e_mae / 15 + f_mae / 0.15 < best[0]:
            best = (e_mae / 15 + f_mae / 0.15, epoch, copy.deepcopy(ema.state_dict()))
        if elapsed > budget:
            break

    score, epoch, ema_state = best
    ema_state = {k: v.cpu() for k, v in ema_state.items()}
    # fairchem infers with the EMA weights; model_state_dict holds the same tensors
    # (torch.save stores shared storages once, so the file carries one copy)
    model_state = {k[len("module."):]: v for k, v in ema_state.items()
                   if k.startswith("module.")}
    print(f"training took {(time.time() - start) / 60:.1f} min; keeping epoch {epoch}")
    checkpoint = MLIPInferenceCheckpoint(
        model_config=config,
        model_state_dict=model_state,
        ema_state_dict=ema_state,
        tasks_config=tasks_config(rmsd, cu_ref),
    )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, out)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
