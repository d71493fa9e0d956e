"""Sinkhorn accuracy and speed: ours (old and new stopping rule) against POT.

Runs the Sinkhorn protocols (``sinkhorn_pca``, ``sinkhorn_top_k``) of ``calibrate``
on the Norman subset of ``perturbench_devel.h5ad`` and records every pair of point
clouds that reaches the solver, in the protocols' own spaces. For each pair it
computes the debiased Sinkhorn divergence

- with the annealing alone (``tol=None``: the old default, geomloss's values),
- with the new default (annealing, then iterations at ``eps = blur^2``),
- with POT (Python Optimal Transport) in float64: ``ot.bregman.sinkhorn_log`` on
  ``OT_eps(a, b)``, ``OT_eps(a, a)``, ``OT_eps(b, b)``, the temperature halved from
  the largest cost down to ``blur^2`` (each stage warm-started from the previous),
  the last stage to a marginal error below 1e-13 or 100,000 iterations;

and prints the relative difference of ``sqrt(2 S)`` (the protocols' value) to POT
per pair, and our solver's time, old vs new, with the ratio (best of three).

POT is installed into its own virtualenv under
``~/.cache/scperteval-bench/pot`` on first use and runs there with ``python -I``::

    python benchmarks/bench_sinkhorn.py [--pairs 12] [--data PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

POT_REQUIREMENT = "pot>=0.9.5,<0.10"
DEFAULT_VENV = Path.home() / ".cache" / "scperteval-bench" / "pot"
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "perturbench_devel.h5ad"
PROTOCOLS = ("sinkhorn_pca", "sinkhorn_top_k")

#: Run inside the POT virtualenv: reads the pairs, writes S per pair.
POT_SCRIPT = r"""
import json, sys
import numpy as np
import ot

def entropic_ot(x, y, eps):
    cost = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1) / 2.0
    a = np.full(len(x), 1.0 / len(x))
    b = np.full(len(y), 1.0 / len(y))
    stage = max(float(cost.max()), eps)
    start = None
    while True:
        final = stage == eps
        _, log = ot.bregman.sinkhorn_log(
            a, b, cost, stage, numItermax=100_000 if final else 5_000,
            stopThr=1e-13 if final else 1e-9, log=True, warn=False, warmstart=start,
        )
        if final:
            # log_u, log_v are the scalings' logs: f = eps log_u, g = eps log_v.
            return float(a @ (eps * log["log_u"]) + b @ (eps * log["log_v"]))
        # The potentials carry over; their logs of scalings scale with 1 / eps.
        following = max(stage / 2.0, eps)
        start = (log["log_u"] * stage / following, log["log_v"] * stage / following)
        stage = following

source, target = sys.argv[1], sys.argv[2]
data = np.load(source)
out = []
for k in range(int(data["count"])):
    x, y, eps = data[f"x{k}"], data[f"y{k}"], float(data[f"eps{k}"])
    out.append(entropic_ot(x, y, eps) - (entropic_ot(x, x, eps) + entropic_ot(y, y, eps)) / 2)
json.dump(out, open(target, "w"))
"""


def ensure_pot(venv: Path) -> Path:
    """The ``python`` of a virtualenv with POT, created on first use.

    Parameters
    ----------
    venv
        Folder of the virtualenv.

    Returns
    -------
    Path
        Its interpreter.

    """
    python = venv / "bin" / "python"
    if python.exists():
        found = subprocess.run([str(python), "-I", "-c", "import ot"], capture_output=True)
        if found.returncode == 0:
            return python
    print(f"installing POT into {venv}", flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", POT_REQUIREMENT, "numpy"], check=True
    )
    return python


def protocol_pairs(data: Path, protocol: str) -> list[dict]:
    """The point clouds a ``calibrate`` run of one Sinkhorn protocol hands to the solver.

    Parameters
    ----------
    data
        ``perturbench_devel.h5ad``.
    protocol
        A Sinkhorn protocol of the default suite.

    Returns
    -------
    list of dict
        ``x``, ``y``, ``blur``, ``scaling``, ``diameter`` per call.

    """
    import scperteval.kernels.sinkhorn as kernel
    from scperteval.workflows.calibrate import calibrate

    solver = kernel.debiased_sinkhorn
    pairs: list[dict] = []
    lock = threading.Lock()

    def recording(x, y, blur, scaling, diameter=None, **options):
        with lock:
            pairs.append(
                {"x": x.copy(), "y": y.copy(), "blur": blur}
                | {"scaling": scaling, "diameter": diameter}
            )
        return solver(x, y, blur, scaling, diameter, **options)

    kernel.debiased_sinkhorn = recording
    try:
        calibrate(
            str(data),
            protocol,
            perturbation_key="condition",
            subset={"dataset": "norman19"},
            workers=1,
            progress=False,
        )
    finally:
        kernel.debiased_sinkhorn = solver
    return pairs


def best_time(function, repeats: int = 3) -> float:
    """Best wall-clock time of ``function()`` over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    """Measure and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--pairs", type=int, default=12, help="pairs per protocol sent to POT")
    parser.add_argument("--venv", default=str(DEFAULT_VENV))
    args = parser.parse_args()
    from scperteval.kernels.sinkhorn import debiased_sinkhorn
    from scperteval.metrics.population import DEFAULT_MAX_ITER

    python = ensure_pot(Path(args.venv))
    for protocol in PROTOCOLS:
        pairs = protocol_pairs(Path(args.data), protocol)

        def run(tol, pairs=pairs):
            return [
                debiased_sinkhorn(
                    p["x"],
                    p["y"],
                    p["blur"],
                    p["scaling"],
                    p["diameter"],
                    tol=tol,
                    max_iter=DEFAULT_MAX_ITER,
                )
                for p in pairs
            ]

        run(None)  # compile and warm up
        old_time, new_time = best_time(lambda: run(None)), best_time(lambda: run(1e-7))
        old, new = np.array(run(None)), np.array(run(1e-7))
        chosen = np.linspace(0, len(pairs) - 1, min(args.pairs, len(pairs))).astype(int)
        with tempfile.TemporaryDirectory() as folder:
            source, target = Path(folder) / "pairs.npz", Path(folder) / "pot.json"
            arrays = {"count": np.array(len(chosen))}
            for k, index in enumerate(chosen):
                arrays[f"x{k}"] = pairs[index]["x"]
                arrays[f"y{k}"] = pairs[index]["y"]
                arrays[f"eps{k}"] = np.array(pairs[index]["blur"] ** 2)
            np.savez(source, **arrays)
            script = Path(folder) / "pot_sinkhorn.py"
            script.write_text(POT_SCRIPT)
            started = time.perf_counter()
            subprocess.run([str(python), "-I", str(script), str(source), str(target)], check=True)
            pot_time = time.perf_counter() - started
            reference = np.sqrt(2.0 * np.array(json.loads(target.read_text())))
        print(f"\n{protocol}: {len(pairs)} pairs; POT on {len(chosen)} ({pot_time:.1f} s)")
        print(f"{'pair':>5} {'cells':>9} {'POT sqrt(2S)':>14} {'old rel':>10} {'new rel':>10}")
        old_rel, new_rel = [], []
        for k, index in enumerate(chosen):
            ours_old = np.sqrt(2.0 * max(old[index], 0.0))
            ours_new = np.sqrt(2.0 * max(new[index], 0.0))
            old_rel.append(ours_old / reference[k] - 1.0)
            new_rel.append(ours_new / reference[k] - 1.0)
            cells = f"{len(pairs[index]['x'])}x{len(pairs[index]['y'])}"
            print(
                f"{index:>5} {cells:>9} {reference[k]:>14.9f} "
                f"{old_rel[-1]:>10.2e} {new_rel[-1]:>10.2e}"
            )
        worst_old, worst_new = np.max(np.abs(old_rel)), np.max(np.abs(new_rel))
        print(f"max |rel| vs POT: old {worst_old:.2e}, new {worst_new:.2e}")
        print(
            f"our time, all {len(pairs)} pairs: old {old_time:.3f} s, new {new_time:.3f} s, "
            f"ratio {new_time / old_time:.2f}"
        )


if __name__ == "__main__":
    main()
