"""How often one corrupted protocol column flips a two-model ranking, per aggregation rule.

Two models are scored on K trusted protocols; model A's protocol columns are
drawn around 1.0 and model B's around 0.8 (spread 0.15). Then one column of one
model (chosen at random) is replaced by an outlier (-8, the size of a clipped
noise model's mae column on Norman; or a draw from N(0, 5)). A flip is a
ranking different from the one of the uncorrupted columns. Prints, per rule,
the share of flips over the simulated leaderboards.

Run: python benchmarks/headline_rule.py
"""

from __future__ import annotations

import numpy as np
from scipy import stats

RULES = {
    "mean": lambda x: x.mean(axis=-1),
    "trimmed mean 10%": lambda x: stats.trim_mean(x, 0.1, axis=-1),
    "trimmed mean 20%": lambda x: stats.trim_mean(x, 0.2, axis=-1),
    "median": lambda x: np.median(x, axis=-1),
}


def flips(n_protocols: int, outlier: str, n_boards: int = 20000, seed: int = 0) -> dict:
    """Share of boards whose ranking one corrupted column changes, per rule."""
    rng = np.random.default_rng(seed)
    columns = np.stack(
        [
            rng.normal(1.0, 0.15, (n_boards, n_protocols)),
            rng.normal(0.8, 0.15, (n_boards, n_protocols)),
        ],
        axis=1,
    )
    corrupted = columns.copy()
    model = rng.integers(0, 2, n_boards)
    column = rng.integers(0, n_protocols, n_boards)
    value = np.full(n_boards, -8.0) if outlier == "-8" else rng.normal(0.0, 5.0, n_boards)
    corrupted[np.arange(n_boards), model, column] = value
    result = {}
    for name, rule in RULES.items():
        clean = rule(columns)
        dirty = rule(corrupted)
        result[name] = float(np.mean((clean[:, 0] > clean[:, 1]) != (dirty[:, 0] > dirty[:, 1])))
    return result


def main() -> None:
    """Print the table of the documentation."""
    print("| protocols | outlier | " + " | ".join(RULES) + " |")
    print("|---:|---|" + "---:|" * len(RULES))
    for n_protocols in (5, 10, 20, 30):
        for outlier in ("-8", "N(0, 5)"):
            shares = flips(n_protocols, outlier)
            cells = " | ".join(f"{100 * shares[r]:.1f}%" for r in RULES)
            print(f"| {n_protocols} | {outlier} | {cells} |")


if __name__ == "__main__":
    main()
