"""scripts.bench.scale: starting at scale (`python -m scripts.bench.scale`)."""
