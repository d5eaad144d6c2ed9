"""The studio's JSON endpoints (all under ``/api/``; :mod:`sailrl.studio.security` guards every one).

Spec text travels with each request (the page holds the text being edited), so every answer is about exactly what
the user sees; the server caches validation, reward functions, rows and preflight reports by content.

- ``GET /api/spec``: the spec file as on disk, validated. ``GET /api/disk``: its sha256 now (the page polls it and
  reloads a file changed on disk, or says so when it has unsaved edits).
- ``POST /api/check {text}``: every problem (``sailrl validate``'s words and codes), the rules and examples.
- ``POST /api/patch {text, rules, examples?}``: the text with those sections replaced (ruamel round trip), checked.
- ``POST /api/try {text, completion, fields, truncated, num_tokens}``: every rule's verdict and the total (a judge
  rule whose judge is not called -- a remote one without ``sailrl studio --judge`` -- is "not checked", with
  ``passed`` and ``score`` null, and the total is then null, ``total_note`` says why).
- ``POST /api/examples {text}``: the worked examples, scored. ``POST /api/examples/new-scores {text}``: the
  examples with the scores the rules give them now, and what changes per example (a guard flagged). ``POST /api/rows``, ``/api/row``, ``/api/preflight``.
- ``POST /api/save {text, base_sha}``: write the spec (see :meth:`sailrl.studio.session.Studio.save`).
- ``GET /api/source?path=``: a file of the spec's folder (a python rule's module), read-only.
- ``POST /api/runs {text}``; ``GET /api/run/metrics?run=&after=&file=`` (``after``: a byte offset, the ``next``
  of the last answer, so a poll reads only what was appended), ``/api/run/steps?run=``,
  ``/api/run/rollouts?run=&step=&kind=``.
- ``POST /api/labels {text, labels}``: per rule, which labelled replies it gets right, and proposed rules that get
  them all right (:mod:`sailrl.studio.proposals`). ``GET /api/starters``: new rules offered as sentences.
- ``POST /api/run/plan {text, overrides}``: preflight's verdict and the cost before a start;
  ``/api/run/start {text, mode: new|resume, overrides}``; ``/api/run/stop {run}`` (SIGINT, only a run this studio
  started); ``GET /api/run/status?run=``: progress, time left, the outcome in words, gaming warnings, the log's tail
  (:mod:`sailrl.studio.runner`).
- ``POST /api/run/sample {run, fields, n}``: the trained model on a new question, every rule's verdict;
  ``/api/run/export {run, format}``; ``GET /api/run/download?run=&format=``: the export as a zip.
"""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sailrl.runtime.sandbox.redact import redact
from sailrl.studio.security import BodyTooLarge
from sailrl.studio.session import Studio, StudioError
from sailrl.studio.yaml_patch import PatchError, replace_sections


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        raise StudioError("the request body is not valid JSON") from None
    except RecursionError:
        raise StudioError("the request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise StudioError("the request body must be a JSON object")
    return data


def _int(value: Any, name: str, default: int | None = None) -> int | None:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: JSON's Infinity
        raise StudioError(f"{name} must be a whole number, got {value!r}") from None


def _text(data: dict[str, Any]) -> str:
    text = data.get("text")
    if not isinstance(text, str):
        raise StudioError("text (the spec's YAML) is missing")
    return text


class _RedactedJSON(JSONResponse):
    """A JSON answer without a secret of the server's environment (:func:`sailrl.runtime.sandbox.redact.redact`): what a
    run wrote, a rule printed or a tool answered is shown with a marker in the key's place."""

    def render(self, content: Any) -> bytes:
        return redact(super().render(content).decode("utf-8")).encode("utf-8")


def endpoint(fn: Callable[[Studio, Request, dict[str, Any]], Any], *, redacted: bool = True
             ) -> Callable[[Request], Any]:
    """An async Starlette endpoint around ``fn(studio, request, body)``, run in the thread pool (scoring,
    validation and data loading block), its errors answered as ``{"error": ...}`` with their status. Its answers
    are ``redacted`` (every endpoint but those that carry the spec's own text, which the page edits and saves)."""

    async def handle(request: Request) -> Response:
        studio: Studio = request.app.state.studio
        try:
            body = await _body(request) if request.method == "POST" else {}
            result = await run_in_threadpool(fn, studio, request, body)
        except StudioError as exc:
            return _error(str(exc), exc.status)
        except BodyTooLarge as exc:
            return _error(f"refused: {exc}", 413)
        except RecursionError:  # a hostile request (rules nested a thousand deep): bounded like validate's own
            return _error("refused: the request is nested too deeply", 400)
        except Exception as exc:  # noqa: BLE001 -- never a traceback page; the server log keeps it
            traceback.print_exc()
            return _error(f"internal error (a bug in sailrl, not a problem in your files): {type(exc).__name__}: "
                          f"{redact(str(exc))}", 500)
        return _json(result, _RedactedJSON if redacted else JSONResponse)

    return handle


def _finite(value: Any) -> Any:
    """``value`` with NaN / infinity as None and lone surrogates as ``?``, so it encodes as strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_finite(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json(result: Any, kind: type[JSONResponse] = JSONResponse) -> JSONResponse:
    """A JSON answer; a value strict JSON cannot carry (NaN in a hand-edited metrics.jsonl, a lone surrogate in a
    pasted completion) is sent as null / ``?`` instead of failing the request."""
    try:
        return kind(result)
    except (ValueError, UnicodeEncodeError):
        return kind(_finite(result))


def _spec(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.load()


def _disk(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    _, digest, problems = studio.disk()
    return {"disk_sha": digest, "read_problems": problems}


def _check(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.check(_text(body)).as_json()


def _patch(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    rules = body.get("rules")
    examples = body.get("examples")
    if not isinstance(rules, list) or (examples is not None and not isinstance(examples, list)):
        raise StudioError("rules (a list) and examples (a list, optional) are needed")
    try:
        text = replace_sections(_text(body), rules=rules, examples=examples)
    except PatchError as exc:
        raise StudioError(str(exc), 422) from None
    return {"text": text, "check": studio.check(text).as_json()}


def _try(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    fields = body.get("fields") or {}
    if not isinstance(fields, dict):
        raise StudioError("fields must be an object")
    return studio.score(_text(body), body.get("completion", ""), fields, bool(body.get("truncated")),
                        _int(body.get("num_tokens"), "num_tokens"))


def _examples(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.examples(_text(body))


def _new_scores(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.new_scores(_text(body))


def _rows(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.row_list(_text(body), str(body.get("q") or ""), _int(body.get("offset"), "offset", 0),
                           _int(body.get("limit"), "limit", 20))


def _row(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.row(_text(body), _int(body.get("index"), "index"), bool(body.get("random")))


def _preflight(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.preflight(_text(body))


def _save(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.save(_text(body), body.get("base_sha"))


def _source(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.source(request.query_params.get("path", ""))


def _runs(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    text = body.get("text")
    return studio.runs(text if isinstance(text, str) else None)


def _run(request: Request) -> str:
    run = request.query_params.get("run")
    if not run:
        raise StudioError("run is missing")
    return run


def _metrics(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.metrics(_run(request), max(0, _int(request.query_params.get("after"), "after", 0) or 0),
                          request.query_params.get("file") or None)


def _steps(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.steps(_run(request))


def _rollouts(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    step = _int(request.query_params.get("step"), "step")
    if step is None:
        raise StudioError("step is missing")
    return studio.rollouts(_run(request), step, request.query_params.get("kind", "train"))


def _labels(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.labels(_text(body), body.get("labels"))


def _starters(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.starters()


def _body_run(body: dict[str, Any]) -> str:
    run = body.get("run")
    if not isinstance(run, str) or not run:
        raise StudioError("run is missing")
    return run


def _run_plan(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.run_plan(_text(body), body.get("overrides"))


def _run_start(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.run_start(_text(body), str(body.get("mode") or "new"), body.get("overrides"))


def _run_stop(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.run_stop(_body_run(body))


def _run_status(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.run_status(_run(request))


def _run_sample(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.sample(_body_run(body), body.get("fields"), _int(body.get("n"), "n", 4) or 4)


def _run_export(studio: Studio, request: Request, body: dict[str, Any]) -> Any:
    return studio.export(_body_run(body), str(body.get("format") or "peft"))


async def _download(request: Request) -> Response:
    """The export folder as a zip (``GET /api/run/download?run=&format=``)."""
    studio: Studio = request.app.state.studio
    try:
        name, data = await run_in_threadpool(studio.export_zip, _run(request),
                                             request.query_params.get("format", "peft"))
    except StudioError as exc:
        return _error(str(exc), exc.status)
    return Response(data, media_type="application/zip",
                    headers={"content-disposition": f'attachment; filename="{name}"'})


ROUTES = [
    Route("/api/spec", endpoint(_spec, redacted=False), methods=["GET"]),
    Route("/api/disk", endpoint(_disk, redacted=False), methods=["GET"]),
    Route("/api/check", endpoint(_check, redacted=False), methods=["POST"]),
    Route("/api/patch", endpoint(_patch, redacted=False), methods=["POST"]),
    Route("/api/try", endpoint(_try), methods=["POST"]),
    Route("/api/examples", endpoint(_examples), methods=["POST"]),
    Route("/api/examples/new-scores", endpoint(_new_scores), methods=["POST"]),
    Route("/api/rows", endpoint(_rows), methods=["POST"]),
    Route("/api/row", endpoint(_row), methods=["POST"]),
    Route("/api/preflight", endpoint(_preflight), methods=["POST"]),
    Route("/api/save", endpoint(_save, redacted=False), methods=["POST"]),
    Route("/api/source", endpoint(_source), methods=["GET"]),
    Route("/api/runs", endpoint(_runs), methods=["POST"]),
    Route("/api/run/metrics", endpoint(_metrics), methods=["GET"]),
    Route("/api/run/steps", endpoint(_steps), methods=["GET"]),
    Route("/api/run/rollouts", endpoint(_rollouts), methods=["GET"]),
    Route("/api/labels", endpoint(_labels), methods=["POST"]),
    Route("/api/starters", endpoint(_starters), methods=["GET"]),
    Route("/api/run/plan", endpoint(_run_plan), methods=["POST"]),
    Route("/api/run/start", endpoint(_run_start), methods=["POST"]),
    Route("/api/run/stop", endpoint(_run_stop), methods=["POST"]),
    Route("/api/run/status", endpoint(_run_status), methods=["GET"]),
    Route("/api/run/sample", endpoint(_run_sample), methods=["POST"]),
    Route("/api/run/export", endpoint(_run_export), methods=["POST"]),
    Route("/api/run/download", _download, methods=["GET"]),
]
