"""sailrl's version, in the lowest stage so every stage can read it (``sailrl.__version__`` re-exports it; the
compiled script's header, a run's config.json and an export's model card print it). Keep it equal to
``pyproject.toml``'s ``version``."""

__version__ = "0.2.0"
