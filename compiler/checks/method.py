"""``method:``: a key or section written for another method (S257), located at that key and naming the spec's
method and the methods that read it (:data:`sailrl.spec.methods.METHOD_KEYS`); reward rules that an SFT spec of
whole conversations could not use (S266)."""

from __future__ import annotations

from sailrl.compiler.checks.reader import SpecReader
from sailrl.spec.methods import METHOD_KEYS, METHOD_WORDS, METHODS


def check_method(spec: SpecReader) -> None:
    method = spec.get(("method",), "rl")
    if method not in METHODS:
        return  # the schema names the allowed values
    for path, methods in METHOD_KEYS.items():
        if method in methods or spec.get(path) is None:
            continue
        key = ".".join(path)
        owners = " and ".join(sorted(methods))
        spec.add(path, "S257", f"{key} is read only by method {owners}; this spec's method is {method} "
                 f"({METHOD_WORDS[method]}): remove {key}",
                 f"Or set method: {sorted(methods)[0]} if that is the run you mean.")
    if method == "dpo" and spec.get(("reward",)) is not None:
        spec.add(("reward",), "S257", "method dpo learns from the chosen/rejected pairs, not from reward rules: "
                 "remove the reward: section",
                 "To train on reward rules use method: rl; to start RL from the DPO run's weights, write a second "
                 "spec with training.init_from (docs/methods.md).")
    if method == "sft" and spec.get(("reward",)) is not None and spec.get(("prompt",)) is None \
            and spec.get(("sft", "messages_field")) is not None:
        spec.add(("reward",), "S266", "an SFT spec whose rows hold whole conversations (sft.messages_field) has no "
                 "prompt to sample a held-out reply from, so these reward rules would score nothing: remove the "
                 "reward: section",
                 "To score one sample per held-out row, write the rows as prompt.user and sft.completion instead "
                 "(docs/methods.md).")
