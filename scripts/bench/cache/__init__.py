"""scripts.bench.cache: epochs with a node cache (`python -m scripts.bench.cache`; one
process: `python -m scripts.bench.cache.epochs`)."""
