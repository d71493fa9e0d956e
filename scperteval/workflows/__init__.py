"""The Python entry points, one module per job: ``de``, ``calibrate``, ``score``, ``report``.

Each job reads top to bottom as named steps shared in :mod:`.steps`: open the
dataset, build the engine, run the protocols, derive calibration and
leaderboards, write the outputs. This is the top layer below the command line:
it may import every other subpackage, and nothing but :mod:`scperteval.cli` and
the package's ``__init__`` imports it.
"""
