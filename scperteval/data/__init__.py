"""Reading a perturbation dataset: files, matrices, validation and cell groups.

This layer owns everything between a user's AnnData (in memory, an ``.h5ad``
file read out of core, or a dask array) and the rows of its expression matrix:
:class:`~scperteval.data.dataset.Dataset` validates the input and streams the
matrix in chunks, :mod:`~scperteval.data.halves` splits each perturbation's cells
into a seeded truth half and duplicate, and :mod:`~scperteval.data.layout`
assigns every cell to its statistic group. It may import the compiled kernels
(:mod:`scperteval.kernels`) and the package's foundation (errors, registry).
"""
