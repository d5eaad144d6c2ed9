"""The python rule of tests/goldens/python_rule.yaml: 1.0 for an answer of at most 3 characters."""


def short(completion: str, fields: dict) -> float:
    return 1.0 if len(completion.strip()) <= 3 else 0.0
