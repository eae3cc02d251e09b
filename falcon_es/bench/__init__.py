"""Benchmarks (``falcon-es bench ...``): each reports its figures as ratios against a
raw-database baseline measured in the same run, on the same database."""
