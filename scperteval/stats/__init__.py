"""Group statistics and differential expression of every perturbation at once.

This layer owns the additive per-group sufficient statistics
(:class:`~scperteval.stats.groups.GroupStats`), the Welch t-tests, rank tests,
and log fold changes computed from them
(:mod:`~scperteval.stats.diffexp`), the multiple-testing corrections
(:mod:`~scperteval.stats.multiple_testing`), the rounding under which scores are
ranked (:mod:`~scperteval.stats.ranking`), and the registry of DE methods
(:mod:`~scperteval.stats.de_methods`). It reads cells only through the data
layer's :class:`~scperteval.data.dataset.Dataset` and
:class:`~scperteval.data.layout.GroupLayout`; it may import the data layer, the
compiled kernels and the foundation, never the context, engine or entry points.
"""
