"""A tool for the environment golden (tests/goldens/environment.yaml)."""


def double(n: int) -> int:
    """Twice n."""
    return 2 * n
