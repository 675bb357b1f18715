"""The ``shardstream-plan`` command: how a dataset splits over a job's ranks and workers,
what each reader fetches, the layout that job reads best, and the index saved once.

Installed as ``shardstream.plan``: `cli` (the command: arguments in `args`, output per
rank in `workers` and `rank`, the layout advice in `advice`), and the plans it can print
besides: `mixture` (several streams), `pack` (token blocks), `cache` (a node cache over
epochs), `plot` (``--plot``); `load` and `index` reach the loader only when a SOURCE is
indexed (a simulation never imports torch). One way: cli -> the others -> shardstream.
"""
