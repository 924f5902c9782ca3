"""Provisioning: what a run needs before it trains, apart from the algorithms (recipes/): the
tiny models, the gold demonstrations (`gold.py`) and the warm-ups that train the tiny models on
them (`warmup.py`, `rose-ray warmup`)."""
