"""Metrics: the metric table, compute_metrics / analyze under every convention, the bootstrap, the peers' always-logged numbers and the noise floor."""
