"""The world side: one package per world, reached by name through `worlds.py`, what every world
shares, the `env:` config and pools of games. Never imports torch."""

DEFAULT_WORLD = "sciworld"  # the world of a game, an eval or a dataset that names none
