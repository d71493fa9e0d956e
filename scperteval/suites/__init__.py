"""Protocol suites shipped with scperteval (TOML data, installed as ``scperteval.suites``)."""
