"""``sailrl studio``: a local web page for writing reward rules, trying them on dataset rows and reading runs.

The page is served by :mod:`sailrl.studio.app` (Starlette on uvicorn) from the static files in ``static/``
(plain JavaScript modules, no build step, no CDN). Everything it shows comes from the same code the command
line uses: the validation stage (``sailrl.compiler.validate``), the reward engine (``sailrl.runtime.rewards.rules``),
data loading and prompt rendering (``sailrl.runtime.data``, ``sailrl.runtime.prompts``), preflight's report
(``sailrl.preflight``) and the run files (``sailrl.runtime.rundir.rollout_log``, ``metrics.jsonl``).

Modules: ``security`` (session token, Host / Origin checks, confined paths), ``yaml_patch`` (round-trip
edits of the rules and examples with ruamel.yaml), ``session`` (the studio's state: the spec file, caches, save),
``api`` (the JSON endpoints), ``app`` (the ASGI application).
"""
