"""The spec language: schema (``schema``, ``rewards``, ``base``), YAML loading with locations and limits
(``loader``), errors and their codes (``errors``, ``codes``, ``messages``), shared tables (``constants``,
``patterns``, ``models``, ``renderers``, ``pricing``). Imports nothing of sailrl above it."""
