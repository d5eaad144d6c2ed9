"""The services a run talks to: the backend chosen from the spec and the keys (``backend``), tokenizers and
renderers (``models``, ``chat_template``, ``role_colon_tools``), the Tinker service client (``tinker_service``), judge
clients (``judge_clients``), service faults as against bugs (``faults``); Sail (``sail/``) and the embedded backend
(``local/``, the heavy one: torch).
"""
