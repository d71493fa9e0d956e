"""Drawing, writing and reading cross-validation splits of a dataset's perturbations."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pandas as pd
import pytest

from scperteval.cli import main
from scperteval.data.dataset import Dataset
from scperteval.errors import SpecError
from scperteval.simulation import simulate
from scperteval.splits import Split, make_folds, read_split, split_record, write_split


@pytest.fixture(scope="module")
def two_lines() -> Dataset:
    """Eight perturbations (two of them combinations) in each of two cell lines."""
    adata = simulate(
        n_perturbations=6,
        n_genes=20,
        cells_per_perturbation=8,
        n_covariates=2,
        n_combinations=2,
        seed=0,
    )
    return Dataset(adata, covariate_key="cell_line")


def _pairs(dataset: Dataset) -> set[tuple[str, str]]:
    return {(c.covariate, c.perturbation) for c in dataset.conditions}


# ------------------------------------------------------------------ make_folds


@pytest.mark.parametrize("folds", [2, 3, 5, 8])
def test_every_perturbation_is_held_out_by_exactly_one_fold(two_lines, folds):
    split = make_folds(two_lines, folds=folds, seed=7)
    everything = _pairs(two_lines)
    assert split.folds == tuple(str(k) for k in range(folds))
    tests = [split.test[fold] for fold in split.folds]
    assert set().union(*tests) == everything
    assert sum(map(len, tests)) == len(everything)
    for first, second in itertools.combinations(tests, 2):
        assert not first & second
    for fold in split.folds:
        assert split.train[fold] == everything - split.test[fold]


@pytest.mark.parametrize("folds", [2, 3, 5])
def test_fold_sizes_differ_by_at_most_one_in_every_group_and_overall(two_lines, folds):
    split = make_folds(two_lines, folds=folds, seed=3)
    for covariate in two_lines.covariates:
        sizes = [sum(1 for cov, _ in split.test[fold] if cov == covariate) for fold in split.folds]
        assert max(sizes) - min(sizes) <= 1, (covariate, sizes)
    overall = [len(split.test[fold]) for fold in split.folds]
    assert max(overall) - min(overall) <= 1


def test_the_same_seed_gives_the_same_split_and_another_seed_another(two_lines):
    first = make_folds(two_lines, folds=4, seed=11)
    assert make_folds(two_lines, folds=4, seed=11).digest() == first.digest()
    digests = {make_folds(two_lines, folds=4, seed=seed).digest() for seed in range(11, 17)}
    assert len(digests) > 1


def test_the_deal_is_the_documented_one():
    """Redrawn by hand: one generator, a permutation per group in sorted order, dealt on."""
    labels = [("b", f"P{i}") for i in range(5)] + [("a", f"Q{i}") for i in range(4)]
    split = make_folds(labels, folds=3, seed=42)
    rng = np.random.default_rng(42)
    expected = {}
    position = 0
    for covariate in ("a", "b"):
        names = sorted(label for cov, label in labels if cov == covariate)
        for index in rng.permutation(len(names)):
            expected[(covariate, names[index])] = str(position % 3)
            position += 1
    assert {p: split.fold_of(p) for p in expected} == expected
    assert split.seed == 42


def test_plain_labels_get_the_covariate_all():
    split = make_folds(["A", "B", "C", "D"], folds=2, seed=0)
    assert split.held_out() == {("all", label) for label in "ABCD"}


@pytest.mark.parametrize(
    "folds, seed, pattern",
    [
        (1, 0, "at least 2"),
        (0, 0, "at least 2"),
        (2.5, 0, "whole number"),
        (True, 0, "whole number"),
        (9, 0, r"9 folds but only 8 perturbation\(s\) in covariate group 'cell_line_0'"),
        (2, -1, "seed must be a whole number of at least 0"),
        (2, 1.5, "seed must be a whole number"),
    ],
)
def test_unusable_folds_and_seeds_are_refused(two_lines, folds, seed, pattern):
    with pytest.raises(SpecError, match=pattern):
        make_folds(two_lines, folds=folds, seed=seed)


@pytest.mark.parametrize("labels", ["ABC", [], [1, 2], 5])
def test_make_folds_refuses_what_is_not_a_list_of_perturbations(labels):
    with pytest.raises(SpecError, match="make_folds"):
        make_folds(labels, folds=2)


# ------------------------------------------------------------------ categories


def _toy() -> Split:
    """Singles A, B, C and combinations A+B, A+C, held out as fold 0: A, A+B; 1: B, A+C; 2: C."""
    fold_of = {"A": "0", "A+B": "0", "B": "1", "A+C": "1", "C": "2"}
    return Split.from_folds({("all", label): fold for label, fold in fold_of.items()})


@pytest.mark.parametrize(
    "fold, label, seen",
    [
        # fold 0 trains on B, C, A+C: of A+B only B, of A+C only C.
        ("0", "A+B", 1),
        ("0", "A+C", 1),
        # fold 1 trains on A, C, A+B: both singles of A+C, only A of A+B.
        ("1", "A+C", 2),
        ("1", "A+B", 1),
        # fold 2 trains on A, B, A+B, A+C.
        ("2", "A+B", 2),
        ("2", "A+C", 1),
        ("0", "A", None),
    ],
)
def test_combination_categories_count_the_singles_a_fold_trains_on(fold, label, seen):
    assert _toy().category(fold, ("all", label)) == seen


def test_a_combination_whose_singles_are_all_held_out_has_seen_zero():
    split = Split.from_folds(
        {("all", "A"): "0", ("all", "B"): "0", ("all", "A+B"): "0", ("all", "C"): "1"}
    )
    assert split.category("0", ("all", "A+B")) == 0
    with pytest.raises(SpecError, match="no fold '7'"):
        split.category("7", ("all", "A+B"))


def test_the_table_holds_each_combinations_categories(tmp_path):
    table = write_split(_toy(), tmp_path / "toy.csv")
    rows = table.set_index("perturbation")
    assert rows.loc["A+B", "seen"] == 1 and rows.loc["A+C", "seen"] == 2
    assert [rows.loc["A+B", f"seen_{k}"] for k in "012"] == [1, 1, 2]
    assert [rows.loc["A+C", f"seen_{k}"] for k in "012"] == [1, 2, 1]
    assert rows.loc[["A", "B", "C"], "seen"].isna().all()


# ------------------------------------------------------------- writing, reading


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".parquet"])
def test_a_written_split_reads_back_equal(two_lines, tmp_path, suffix):
    split = make_folds(two_lines, folds=3, seed=5)
    path = tmp_path / f"split{suffix}"
    write_split(split, path, _pairs(two_lines))
    again = read_split(path, two_lines)
    assert again.digest() == split.digest()
    assert again.origin == str(path)
    assert again.test == split.test and again.train == split.train


def test_a_role_split_reads_back_equal_and_keeps_validation_out(two_lines, tmp_path):
    pairs = sorted(_pairs(two_lines))
    roles = {p: ("train", "val", "test")[i % 3] for i, p in enumerate(pairs)}
    split = Split.from_roles(roles)
    path = tmp_path / "roles.csv"
    table = write_split(split, path, pairs)
    assert list(table.columns[:3]) == ["covariate", "perturbation", "role"]
    again = read_split(path, two_lines)
    assert again.digest() == split.digest()
    assert again.test["test"] == {p for p, r in roles.items() if r == "test"}
    assert again.train["test"] == {p for p, r in roles.items() if r == "train"}


def test_a_split_given_fold_by_fold_reads_back_equal(two_lines, tmp_path):
    pairs = sorted(_pairs(two_lines))
    # Two folds that each keep a validation perturbation out of training.
    test = {"a": frozenset(pairs[0::2]), "b": frozenset(pairs[1::2])}
    train = {"a": frozenset(pairs[1::2][1:]), "b": frozenset(pairs[0::2][1:])}
    split = Split(test=test, train=train)
    path = tmp_path / "long.parquet"
    table = write_split(split, path, pairs)
    assert set(table["role"]) == {"train", "val", "test"}
    assert read_split(path, two_lines).digest() == split.digest()


def test_labels_without_a_covariate_column_apply_in_every_group(two_lines):
    labels = sorted({c.perturbation for c in two_lines.conditions})
    frame = pd.DataFrame({"perturbation": labels, "fold": [str(i % 2) for i in range(len(labels))]})
    split = read_split(frame, two_lines)
    for covariate, label in _pairs(two_lines):
        assert split.fold_of((covariate, label)) == str(labels.index(label) % 2)


def test_an_obs_column_gives_each_perturbation_its_cells_fold(two_lines):
    adata = two_lines.adata.copy()
    labels = adata.obs["perturbation"].astype(str)
    fold = np.where(labels.str.len() % 2 == 0, "even", "odd")
    adata.obs["fold"] = np.where(labels == "control", "", fold)
    dataset = Dataset(adata, covariate_key="cell_line")
    split = read_split("obs:fold", dataset)
    for covariate, label in _pairs(dataset):
        assert split.fold_of((covariate, label)) == ("even" if len(label) % 2 == 0 else "odd")
    adata.obs["role"] = np.where(labels == "G0", "test", "train")
    roles = read_split("obs:role", Dataset(adata, covariate_key="cell_line"))
    assert roles.test["test"] == {(cov, "G0") for cov in dataset.covariates}
    cells = adata.obs["role"].to_numpy().copy()
    cells[np.flatnonzero(labels == "G2")[0]] = "test"
    adata.obs["role"] = cells
    with pytest.raises(SpecError, match=r"the cells of 'G2' \(cell_line_\d\) are in folds"):
        read_split("obs:role", Dataset(adata, covariate_key="cell_line"))
    with pytest.raises(SpecError, match="split column 'nope' not found in obs"):
        read_split("obs:nope", dataset)


def test_perturbations_left_out_for_too_few_cells_may_be_listed():
    adata = simulate(n_perturbations=4, n_genes=20, cells_per_perturbation=6, seed=1)
    labels = adata.obs["perturbation"].astype(str)
    rare = sorted(set(labels) - {"control"})[0]
    keep = ~(labels == rare).to_numpy()
    keep[np.flatnonzero(labels == rare)[:2]] = True
    dataset = Dataset(adata[keep].copy(), min_cells=4)
    assert rare in {c.perturbation for c, _ in dataset.dropped}
    everything = sorted(set(labels) - {"control"})
    frame = pd.DataFrame({"perturbation": everything, "fold": ["0", "1"] * 2})
    split = read_split(frame, dataset)
    assert ("all", rare) not in split.held_out()
    assert len(split.held_out()) == 3


# ------------------------------------------------------------------ refusals


def _frame(two_lines, change):
    split = make_folds(two_lines, folds=2, seed=0)
    rows = [
        {"covariate": cov, "perturbation": label, "fold": split.fold_of((cov, label))}
        for cov, label in sorted(_pairs(two_lines))
    ]
    return change(pd.DataFrame(rows))


@pytest.mark.parametrize(
    "change, pattern",
    [
        (lambda f: f.iloc[2:], r"misses 2 of the data's 16 perturbations: 'G0' \(cell_line_0\)"),
        (
            lambda f: pd.concat([f, f.iloc[:1].assign(perturbation="G00")]),
            r"perturbation 'G00' in covariate group 'cell_line_0' is not in the data "
            r"\(nearest label in the data: 'G0'\)",
        ),
        (
            lambda f: pd.concat([f, f.iloc[:1].assign(perturbation="control")]),
            r"'control' is the control label",
        ),
        (
            lambda f: pd.concat(
                [f, f.iloc[:1].assign(fold="1" if f.iloc[0]["fold"] == "0" else "0")]
            ),
            r"'G0' \(cell_line_0\) is in folds '\d' and '\d'; each perturbation belongs to one",
        ),
        (lambda f: f.assign(fold="0"), r"fold '0' has no training perturbations in covariate"),
        (lambda f: f.drop(columns="fold"), r"no fold or role column \(columns: covariate, "),
        (lambda f: f.drop(columns="perturbation"), r"no perturbation column"),
        (lambda f: f.assign(fold=[None] + list(f["fold"][1:])), r"row 1 has no fold"),
        (lambda f: f.rename(columns={"fold": "role"}), r"has role '\d'; roles are 'train'"),
        (
            lambda f: f.rename(columns={"fold": "role"}).assign(role="train"),
            r"holds no perturbation out",
        ),
    ],
)
def test_bad_user_splits_are_refused_with_the_mistake_and_the_fix(two_lines, change, pattern):
    with pytest.raises(SpecError, match=pattern):
        read_split(_frame(two_lines, change), two_lines)


def test_a_split_of_other_perturbations_is_refused(two_lines):
    foreign = make_folds(["X1", "X2"], folds=2)
    with pytest.raises(SpecError, match=r"'X1' is not in the data"):
        read_split(foreign, two_lines)
    assert read_split(make_folds(two_lines, folds=2), two_lines).folds == ("0", "1")


@pytest.mark.parametrize(
    "name, content, pattern",
    [
        ("split.xlsx", "x", r"unknown file type '\.xlsx'"),
        ("absent.csv", None, r"split table '.*absent\.csv' not found"),
        ("broken.parquet", "not parquet", r"cannot read as \.parquet"),
    ],
)
def test_unreadable_split_files_are_refused(two_lines, tmp_path, name, content, pattern):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(SpecError, match=pattern):
        read_split(path, two_lines)


# ------------------------------------------------------------------ run.json record


def test_the_record_of_a_split_says_its_layout_folds_seed_and_digest(two_lines):
    split = make_folds(two_lines, folds=4, seed=9)
    record = split_record(split)
    assert record is not None
    assert record["layout"] == "k-fold" and record["seed"] == 9
    assert record["sha256"] == split.digest()
    assert record["folds"] == {fold: len(split.test[fold]) for fold in split.folds}
    assert sum(record["folds"].values()) == 16
    assert record["train"] == {fold: 16 - record["folds"][fold] for fold in split.folds}
    assert split_record(None) is None
    roles = Split.from_roles({("all", "A"): "train", ("all", "B"): "test", ("all", "C"): "val"})
    assert split_record(roles)["layout"] == "train/val/test"


# ------------------------------------------------------------------ command line


def test_the_split_command_writes_the_table_and_says_what_is_in_it(tmp_path, capsys):
    out = tmp_path / "split.csv"
    assert main(["split", "--example", "--folds", "4", "--seed", "2", "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    table = pd.read_csv(out, dtype={"fold": str})
    sizes = table.groupby("fold").size()
    combos = table[table["perturbation"].str.contains("+", regex=False)]
    counts = combos["seen"].astype(int).value_counts()
    found = re.fullmatch(
        r"wrote (.+): (\d+) fold\(s\) holding out (\d+) perturbations \((\d+)-(\d+) per fold\), "
        r"seed (\d+); combinations whose test fold trains on ([\d, ]+) of their singles: "
        r"([\d, ]+); sha256 ([0-9a-f]{12})",
        line,
    )
    assert found, line
    assert found[1] == str(out) and int(found[2]) == 4 == len(sizes)
    assert int(found[3]) == len(table)
    assert (int(found[4]), int(found[5])) == (sizes.min(), sizes.max())
    assert found[6] == "2"
    values = [int(v) for v in found[7].split(", ")]
    assert [int(v) for v in found[8].split(", ")] == [int(counts.get(v, 0)) for v in values]
    assert sum(int(v) for v in found[8].split(", ")) == len(combos)

    again = tmp_path / "again.parquet"
    assert main(["split", "--example", "--from", str(out), "--out", str(again)]) == 0
    assert capsys.readouterr().out.split("sha256 ")[1] == line.split("sha256 ")[1] + "\n"
    assert (
        pd.read_parquet(again)
        .astype(str)
        .equals(pd.read_csv(out, dtype=str, keep_default_na=False).astype(str).replace("", "<NA>"))
    )


def test_a_split_written_for_data_without_a_covariate_is_read_back_by_the_runs(tmp_path):
    """`split` names the one group "all" in its covariate column; the runs accept it."""
    adata = simulate(n_perturbations=6, n_genes=30, cells_per_perturbation=20, seed=3)
    data = tmp_path / "screen.h5ad"
    adata.write_h5ad(data)
    table = tmp_path / "split.csv"
    assert main(["split", str(data), "--folds", "3", "--seed", "1", "--out", str(table)]) == 0
    assert set(pd.read_csv(table)["covariate"]) == {"all"}
    dataset = Dataset(adata)
    assert read_split(table, dataset).digest() == make_folds(dataset, folds=3, seed=1).digest()
    out = tmp_path / "run"
    assert (
        main(["calibrate", str(data), "-p", "mse", "--split", str(table), "--out", str(out)]) == 0
    )
