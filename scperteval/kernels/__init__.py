"""Compiled inner loops (numba) and the thread pool that runs them.

This layer owns every hot loop whose speed the rest of the package depends on:
group moments of CSR rows, merges of group statistics, distances, the tiled sums
over pairs of cells and the median heuristic (:mod:`~scperteval.kernels.pairs`), RBF sums,
Sinkhorn iterations, Student t tails, Benjamini-Hochberg and the weights of a
fuzzy neighbourhood graph, plus the shared thread pool that splits them into
ranges. Its modules take and return plain
NumPy arrays and import nothing from scperteval, so any layer may use them.
Importing the subpackage does not import numba; each module does, on first use.
"""
