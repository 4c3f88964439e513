"""Development and test harnesses of gaudi-cluster (installed in the dev venv only, never in the image).

``localcluster``: a simulated cluster of containers on one Docker host, driven by `make demo`, the
cluster tests and the benchmarks.
"""
