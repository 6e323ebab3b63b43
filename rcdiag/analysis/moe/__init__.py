"""Mixture of experts: route agreement, router confidence and how much of the gap routing explains."""
