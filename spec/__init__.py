"""The spec language: schema (``schema``, ``rewards``), YAML loading with locations (``loader``), errors."""
