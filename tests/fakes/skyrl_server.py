"""SkyRL's Tinker API server on loopback, for tests and benchmarks: a real, independent server of the Tinker HTTP
API that the real ``tinker`` SDK talks to (docs/tinker-http.md).

SkyRL (``skyrl[tinker,jax]`` 0.4.0) needs Python 3.12, so it lives in a virtual environment of its own:
``SAILRL_SKYRL_PYTHON`` names that environment's interpreter (``.ci/run`` builds it and sets the variable; the
default is ``/work/skyrl-venv/bin/python``). Without one, `require_skyrl` skips the calling test with the reason,
and under ``CI=true`` fails it.

`export_model_folder` writes a built-in model (``sailrl/tiny-arith``) as a Hugging Face folder the server loads:
its weights with ``save_pretrained``, and a *fast* (``tokenizers``) byte-level tokenizer with the ids of the built-in
``ByT5Tokenizer(extra_ids=0)`` (0 pad, 1 ``</s>``, 2 unk, byte b -> b + 3): the server needs a fast tokenizer for
stop strings. The server serves it under the built-in name (``--base-model NAME --base-model-checkpoint-path
FOLDER``), so a spec that names ``sailrl/tiny-arith`` runs unchanged, with sailrl's byte tokenizer on the client.

`SkyRLServer` starts ``python -m skyrl.tinker.api`` (JAX on the CPU) on a free 127.0.0.1 port with its own
checkpoint folder and sqlite file under one folder, waits (bounded) for ``GET /api/v1/healthz``, and stops it
by killing its process group. The API server starts its engine as ``uv run <the uv flags of its parent> -m
skyrl.tinker.engine ...``, reading its parent's command line, so it is started under a ``uv`` stand-in
(`UV_STAND_IN`, written into the folder and put first on its ``PATH``) that runs ``-m MODULE ARGS`` with the
environment's interpreter as a child. JAX's compilation cache is a folder the caller may share between servers
(``jax_cache``), so a restarted server does not compile the same shapes again.

The pytest fixture `skyrl_server` (one server per test module) points the tinker SDK at it (``TINKER_BASE_URL``,
no ``TINKER_API_KEY``: sailrl gives the SDK a placeholder for another server). ``python -m tests.fakes.skyrl_server
FOLDER`` serves one in its own process (it prints its URL, then serves until stdin closes).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest

__all__ = ["DEFAULT_SKYRL_PYTHON", "MODEL", "SKYRL_PYTHON_ENV", "SkyRLServer", "export_model_folder", "require_skyrl",
           "skyrl_python", "skyrl_server", "skyrl_model_folder", "unpatch_sdk"]

SKYRL_PYTHON_ENV = "SAILRL_SKYRL_PYTHON"
DEFAULT_SKYRL_PYTHON = "/work/skyrl-venv/bin/python"
#: The model the tests serve: the quickstart's base.
MODEL = "sailrl/tiny-arith"
#: Seconds a server gets to answer its health check (measured: 12-26 s on 2 cores, most of it importing JAX).
START_TIMEOUT_S = 180.0
#: Seconds a stopped server gets to exit on SIGTERM before its process group is killed.
STOP_TIMEOUT_S = 10.0
#: LoRA slots and the largest rank the engine holds (the quickstart trains rank 16; a resume opens a second model).
BACKEND_CONFIG = '{"max_lora_adapters": 8, "max_lora_rank": 16}'

UV_STAND_IN = '''\
"""uv stand-in for SkyRL's Tinker API server: `uv run [FLAGS...] -m MODULE ARGS...` runs MODULE with this
interpreter as a child process (not exec: the API server reads its parent's command line)."""
import subprocess
import sys

args = sys.argv[1:]
child = subprocess.Popen([sys.executable, *args[args.index("-m"):]])
try:
    sys.exit(child.wait())
except KeyboardInterrupt:
    sys.exit(child.wait())
'''


def skyrl_python() -> Path:
    """The interpreter of SkyRL's environment: ``SAILRL_SKYRL_PYTHON``, else `DEFAULT_SKYRL_PYTHON`."""
    return Path(os.environ.get(SKYRL_PYTHON_ENV) or DEFAULT_SKYRL_PYTHON)


def _unavailable() -> str | None:
    python = skyrl_python()
    if not python.is_file():
        return (f"SkyRL's Tinker API server is not installed: no interpreter at {python} (set {SKYRL_PYTHON_ENV}; "
                ".ci/run builds the environment)")
    probe = subprocess.run([str(python), "-c", "import skyrl.tinker.api"], capture_output=True, text=True,
                           timeout=120)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"{python} cannot import skyrl.tinker.api: {last}"
    return None


def require_skyrl() -> None:
    """Skip the calling test (fail it under ``CI=true``) when SkyRL's server cannot run here."""
    reason = _unavailable()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and the Tinker HTTP tests cannot run: {reason}")
    pytest.skip(reason)


def unpatch_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tinker SDK's own functions for the calling test, and whatever was there put back after it:
    ``sailrl.runtime.backends.tinker_service.service_client`` wraps three of them in the process that calls it."""
    from tinker._base_client import AsyncAPIClient  # lazy: the SDK takes seconds; only tests of it need it
    from tinker.lib.api_future_impl import _APIFuture  # lazy: the same
    from tinker.lib.public_interfaces import sampling_client  # lazy: the same

    for owner, name in ((sampling_client, "_attach_sequence_ids"), (AsyncAPIClient, "request"),
                        (_APIFuture, "_handle_transport_error")):
        current = getattr(owner, name)
        monkeypatch.setattr(owner, name, getattr(current, "__wrapped__", current))


def byte_level_fast_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` with the built-in models' byte tokenizer's ids (``ByT5Tokenizer(extra_ids=0)``:
    0 ``<pad>``, 1 ``</s>`` = EOS, 2 ``<unk>``, byte b -> b + 3): a BPE with no merges over the GPT-2 byte-to-
    character map, so every byte is one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # lazy: only the export needs them
    from transformers import PreTrainedTokenizerFast  # lazy: the same

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b], extra = chr(256 + extra), extra + 1
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{chars[b]: b + 3 for b in range(256)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<pad>", "</s>", "<unk>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def export_model_folder(model_name: str, folder: Path) -> Path:
    """Write built-in ``model_name`` into ``folder`` as a Hugging Face model (config, safetensors weights, a fast
    byte-level tokenizer); returns ``folder``."""
    from sailrl.runtime.backends.local.weights.tiny import load_base_model, resolve_base_model  # lazy: torch

    folder.mkdir(parents=True, exist_ok=True)
    load_base_model(resolve_base_model(model_name, 0)).save_pretrained(folder)
    byte_level_fast_tokenizer().save_pretrained(folder)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SkyRLServer:
    """SkyRL's Tinker API server for ``model_name`` (weights in ``model_folder``), its files under ``folder``."""

    def __init__(self, model_folder: Path, folder: Path, *, model_name: str = MODEL, port: int | None = None,
                 jax_cache: Path | None = None, backend_config: str = BACKEND_CONFIG) -> None:
        self.model_folder, self.folder, self.model_name = Path(model_folder), Path(folder), model_name
        self.backend_config = backend_config
        self.port = port or free_port()
        self.jax_cache = jax_cache or self.folder / "jax-cache"
        self.process: subprocess.Popen | None = None
        self.log_path = self.folder / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [str(self.folder / "bin" / "uv"), "run", "-m", "skyrl.tinker.api",
                "--base-model", self.model_name, "--base-model-checkpoint-path", str(self.model_folder),
                "--backend", "jax", "--backend-config", self.backend_config,
                "--checkpoints-base", str(self.folder / "checkpoints"),
                "--database-url", f"sqlite:///{self.folder / 'server.sqlite'}",
                "--external-inference-lora-base", str(self.folder / "lora"),
                "--host", "127.0.0.1", "--port", str(self.port)]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TINKER_", "SAILRL_"))}
        env.update(PATH=f"{self.folder / 'bin'}{os.pathsep}{env.get('PATH', '')}", JAX_PLATFORMS="cpu",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", JAX_COMPILATION_CACHE_DIR=str(self.jax_cache),
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", no_proxy="127.0.0.1,localhost")
        return env

    def start(self) -> Self:
        """Start it and wait for its health check (at most `START_TIMEOUT_S`); raises RuntimeError with the log's
        end when it exits or does not answer in time."""
        (self.folder / "bin").mkdir(parents=True, exist_ok=True)
        (self.folder / "checkpoints").mkdir(exist_ok=True)
        self.jax_cache.mkdir(parents=True, exist_ok=True)
        (self.folder / "bin" / "uv").write_text(f"#!{skyrl_python()}\n{UV_STAND_IN}", encoding="utf-8")
        (self.folder / "bin" / "uv").chmod(0o755)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), cwd=self.folder, env=self.environment(),
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"SkyRL's server exited with {self.process.returncode}:\n{self.log_tail()}")
            if self.healthy():
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"SkyRL's server did not answer {self.url}/api/v1/healthz within "
                           f"{START_TIMEOUT_S:g} s:\n{self.log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/healthz", timeout=2) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 64_000))
                return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM to its process group (the stand-in, the API server, the engine), SIGKILL after
        `STOP_TIMEOUT_S`."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # the engine may outlive the stand-in by a moment: the group goes too
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def restart(self) -> Self:
        """Stop it and start it again on the same port, with the same checkpoints and database."""
        self.stop()
        return self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="session")
def skyrl_model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`MODEL` as a Hugging Face folder (written once per test session)."""
    require_skyrl()
    return export_model_folder(MODEL, tmp_path_factory.mktemp("skyrl-model") / "tiny-arith")


@pytest.fixture(scope="module")
def skyrl_server(skyrl_model_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SkyRLServer]:
    """A started `SkyRLServer` serving `MODEL`, one per test module; stopped at the module's end. Tests point the
    SDK at it with ``monkeypatch.setenv("TINKER_BASE_URL", server.url)``."""
    with SkyRLServer(skyrl_model_folder, tmp_path_factory.mktemp("skyrl-server")) as server:
        yield server


def _main() -> int:
    """Serve `MODEL` from FOLDER (exported there first when it has no config.json): print the URL, serve until stdin
    closes."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="Serve sailrl/tiny-arith with SkyRL's Tinker API server.")
    parser.add_argument("folder", type=Path, help="where the model folder, checkpoints and database go")
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args()
    model = args.folder / "tiny-arith"
    if not (model / "config.json").is_file():
        export_model_folder(MODEL, model)
    with SkyRLServer(model, Path(tempfile.mkdtemp(prefix="server-", dir=args.folder)), port=args.port) as server:
        print(server.url, flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
