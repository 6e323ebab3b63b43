"""Across training: per-step trends, drift and step changes, policy lag, weights unchanged, a framework's per-step averaging."""
