"""The world side: one package per world (`sciworld/`, `discoveryworld/`: catalogue, protocol,
game), reached by name through `worlds.py`; what every world shares (`catalogue.py`,
`protocol.py`, `base.py`), the `env:` config (`config.py`) and pools of games (`pool.py`).
Never imports torch."""

DEFAULT_WORLD = "sciworld"  # the world of a game, an eval or a dataset that names none
