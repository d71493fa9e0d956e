"""Scoring models: predictions, baselines, calibrated scores, tests and leaderboards."""
