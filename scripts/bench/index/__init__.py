"""scripts.bench.index: the index build benchmark (`python -m scripts.bench.index`)."""
