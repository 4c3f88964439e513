"""gaudi-cluster benchmarks (`make bench` = `python -m bench`).

Each module measures one thing and returns rows (see ``bench.common.Row``); ``bench.__main__`` runs
them, writes ``bench/results/latest.json`` and ``latest.md`` and prints the table. What every number
means is in ``bench/README.md``.
"""
