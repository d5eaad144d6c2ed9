"""Publish an exported folder to the Hugging Face Hub with tinker_cookbook's ``weights.publish_to_hf_hub``.

The repository is private unless asked otherwise. The token is huggingface_hub's own (``HF_TOKEN`` or the cached
``hf auth login``): sailrl never reads, prints or writes it.
"""

from __future__ import annotations

from pathlib import Path

from sailrl.export.runinfo import ExportError


def push(folder: Path, repo_id: str, *, private: bool = True) -> str:
    """Upload ``folder`` (its README.md is the model card) to ``repo_id``; returns the repository URL."""
    from tinker_cookbook.weights import publish_to_hf_hub  # lazy: huggingface_hub and torch

    if repo_id.count("/") != 1 or any(not part for part in repo_id.split("/")):
        raise ExportError(f"--push takes a Hugging Face repository id like user/my-model, not {repo_id!r}")
    try:
        return publish_to_hf_hub(model_path=str(folder), repo_id=repo_id, private=private)
    except Exception as exc:  # noqa: BLE001 -- HfHubHTTPError (401, 403, 409), connection errors: one line
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ExportError(f"the export is in {folder}, but pushing it to {repo_id} failed: "
                          f"{type(exc).__name__}: {first} (log in with `hf auth login` or set HF_TOKEN)") from None
