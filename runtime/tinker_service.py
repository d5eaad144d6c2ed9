"""The Tinker service a run talks to: Thinking Machines' own, or another server of the Tinker HTTP API.

The tinker SDK reads ``TINKER_BASE_URL`` (unset: Thinking Machines' service). Pointed at another server -- SkyRL's
Tinker API server on your own GPUs, say (docs/tinker-http.md) -- a run needs three things Thinking Machines'
service does not:

- a key: the SDK refuses to start without a ``TINKER_API_KEY`` of its form; a server that checks none gets
  :data:`PLACEHOLDER_KEY` when the variable is unset (:func:`api_key_for`);
- sampling replies without ``sample_sequence_ids``: SDK 0.35 asserts that every sampling promise carries them
  (Thinking Machines' does; SkyRL's, which speaks the SDK 0.25 protocol, does not). :func:`service_client`
  installs :func:`attach_sequence_ids`, which leaves the sequences unnumbered when no ids came and does what the
  SDK does when they did;
- loss functions it offers: SkyRL's has no ``dro``. The request that names one it lacks is refused (HTTP 4xx);
  :func:`refused_loss` turns that refusal into one line naming the loss and the service.

Nothing here imports tinker at module level: ``runtime.backends`` (imported by ``sailrl clean``) and
``runtime.judge_clients`` (imported by ``sailrl validate``) import this module.
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from typing import Any

__all__ = ["DEFAULT_BASE_URL", "PLACEHOLDER_KEY", "THINKING_MACHINES_HOSTS", "api_key_for", "attach_sequence_ids",
           "base_url", "other_server", "refused_loss", "service_client"]

#: The SDK's default (``tinker.lib.base_url.DEFAULT_BASE_URL``, checked by a test against the installed SDK).
DEFAULT_BASE_URL = "https://tinker.thinkingmachines.dev/services/tinker-prod"
#: Host names (and their subdomains) of Thinking Machines' service.
THINKING_MACHINES_HOSTS = ("thinkingmachines.dev", "thinkingmachines.ai")
#: The key the SDK is given for another server when ``TINKER_API_KEY`` is unset: of the form the SDK requires
#: (``tml-...``), and plainly not a real key.
PLACEHOLDER_KEY = "tml-not-a-key-for-another-tinker-server"


def base_url() -> str:
    """The Tinker API the SDK will call: ``TINKER_BASE_URL`` (empty counts as unset, a trailing ``/`` dropped, as
    the SDK does), else :data:`DEFAULT_BASE_URL`."""
    return (os.environ.get("TINKER_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")


def other_server(url: str | None = None) -> str | None:
    """``url`` (default :func:`base_url`) when it names a server other than Thinking Machines', else None."""
    url = base_url() if url is None else url
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if any(host == h or host.endswith("." + h) for h in THINKING_MACHINES_HOSTS):
        return None
    return url


def api_key_for(url: str | None = None) -> str | None:
    """The key to give the SDK: ``TINKER_API_KEY`` when set; for another server without one,
    :data:`PLACEHOLDER_KEY`; else None (the SDK then reports the missing key itself)."""
    key = os.environ.get("TINKER_API_KEY")
    if key:
        return key
    return PLACEHOLDER_KEY if other_server(url) and not os.environ.get("TINKER_CREDENTIAL_CMD") else None


def attach_sequence_ids(response: Any, sample_sequence_ids: list[str] | None) -> Any:
    """The SDK's ``_attach_sequence_ids`` (``tinker.lib.public_interfaces.sampling_client``), tolerant of a
    server that sends no ids: then the response is returned as it came (its sequences' ``sequence_id`` stays
    None; sailrl does not read it)."""
    if sample_sequence_ids is None:
        return response
    if len(sample_sequence_ids) != len(response.sequences):
        raise ValueError(f"{len(sample_sequence_ids)} sequence ids for {len(response.sequences)} sequences")
    return dataclasses.replace(response, sequences=[
        dataclasses.replace(seq, sequence_id=sid) for seq, sid in zip(response.sequences, sample_sequence_ids,
                                                                     strict=True)])


def _tolerate_missing_sequence_ids() -> None:
    # lazy: tinker takes seconds; only a run against another Tinker server reaches this
    from tinker.lib.public_interfaces import sampling_client

    sampling_client._attach_sequence_ids = attach_sequence_ids


def service_client() -> Any:
    """A ``tinker.ServiceClient`` for :func:`base_url`. For another server: the key from :func:`api_key_for`, and
    sampling replies without ``sample_sequence_ids`` accepted (:func:`attach_sequence_ids`)."""
    import tinker  # lazy: tinker takes seconds; `sailrl clean` and `sailrl validate` import this module

    if other_server():
        _tolerate_missing_sequence_ids()
    return tinker.ServiceClient(api_key=api_key_for())


def refused_loss(exc: BaseException, loss_fn: str) -> str | None:
    """One line when ``exc`` is the service refusing a request that named ``loss_fn`` (an HTTP 400, 404 or 422
    whose body names the loss, as SkyRL's server answers a loss it does not offer), else None."""
    status = getattr(exc, "status_code", None)
    if status not in (400, 404, 422):
        return None
    body = str(getattr(exc, "body", None) or exc)
    if loss_fn not in body and "loss_fn" not in body:
        return None
    where = other_server() or "Thinking Machines' Tinker service"
    return (f"the Tinker server at {where} does not offer training.loss_fn '{loss_fn}' (HTTP {status}): set "
            "training.loss_fn to one it offers (SkyRL's server: importance_sampling, ppo, cispo) and run again "
            "with --resume")
