# file: rewards.py
def brevity(completion, fields):
    """1.0 for at most 20 words, falling to 0.0 at 100 words."""
    words = len(completion.split())
    return max(0.0, min(1.0, (100 - words) / 80))


def style(completion, fields):
    """Two named parts, logged as reward/style/polite and reward/style/calm; the rule scores their sum."""
    return {
        "polite": 0.1 if "please" in completion.lower() else 0.0,
        "calm": 0.0 if "!" in completion else 0.1,
    }


def uses_unit(completion, fields):
    """True when the completion names the unit the row asks for (the dataset field 'unit')."""
    return fields["unit"] in completion
