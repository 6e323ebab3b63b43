"""Distributions: tails, strata, the report's scan kernel and whole next-token distributions."""
