"""Facts of the spec language that several stages use, each defined once.

Tables: :data:`LOCAL_DATA_SUFFIXES` (a ``dataset.source`` ending in one is a local file), :data:`REGEX_FLAGS`
(the flag names a rule may list), :data:`COMPLETION_WINDOWS` / :data:`RETIRED_WINDOWS` (Sail completion
windows). Limits: what the loader and the validation stage accept before they refuse an input, each stated in
the error that enforces it.
"""

from __future__ import annotations

#: A ``dataset.source`` ending in one of these (any case) is a local file, read by suffix.
LOCAL_DATA_SUFFIXES: tuple[str, ...] = (".jsonl", ".json", ".csv", ".parquet")

#: Regex flag names a rule's or extractor's ``flags:`` may list; each is the ``regex`` module's flag of that name.
REGEX_FLAGS: tuple[str, ...] = ("DOTALL", "IGNORECASE", "MULTILINE", "VERBOSE", "ASCII")

#: Completion windows ``sail.SailTokenCompleter`` (sail 0.17) accepts.
COMPLETION_WINDOWS: tuple[str, ...] = ("balanced", "flex")
#: Window names the sail SDK refuses, with why (the Sail guide's ``priority`` predates the SDK change).
RETIRED_WINDOWS: dict[str, str] = {
    "priority": "retired",
    "15m": "retired",
    "asap": "not supported by sail.SailTokenCompleter",
}

# -- limits ---------------------------------------------------------------------------------------------------
#: Largest spec file (bytes). Specs are a few kilobytes, and reading YAML is slow (``benchmarks/limits.md``).
MAX_SPEC_BYTES = 256 * 1024
#: Deepest nesting of mappings and lists (a spec needs about 7 levels).
MAX_NESTING = 50
#: Most values a document may expand to, counting every node an alias repeats (stops YAML alias bombs).
MAX_VALUES = 20_000
#: Most digits of an integer (Python's own limit for converting decimal text, sys.get_int_max_str_digits()).
MAX_INT_DIGITS = 4300
#: Most problems one report lists; the rest are counted.
MAX_REPORTED = 50
#: Longest file or directory name (bytes, UTF-8) and whole path (bytes) a spec may name (Linux NAME_MAX/PATH_MAX).
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
#: Deepest group nesting in a regular expression.
MAX_REGEX_NESTING = 100
#: Largest product of nested repeat counts in a regular expression (``(?:a{1000}){1000}`` is 10**6).
MAX_REGEX_REPEAT = 100_000
