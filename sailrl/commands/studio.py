"""``sailrl studio SPEC [--run RUN_DIR] [--port N] [--open] [--host H]``: the reward-rule studio, a local web page.

Serves the page on 127.0.0.1 (a free port unless ``--port``), prints its URL with this session's token and waits;
``--open`` also opens it in a browser. Ctrl-C stops it (exit 130); a save in progress finishes first, and a save
is an atomic replace, so nothing is left half-written. ``--host`` serves on another address, only when given,
with a warning: anyone who can reach it and has the URL can edit the spec.

Exit codes: 130 stopped with Ctrl-C; 1 the spec file or the --run folder does not exist, or the port is taken;
2 usage error.
"""

from __future__ import annotations

import argparse
import errno
import socket
import sys
from pathlib import Path

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="the spec YAML file to edit")
    p.add_argument("--run", metavar="RUN_DIR", help="a run directory to read (metrics.jsonl, rollouts.jsonl)")
    p.add_argument("--port", type=int, default=0, metavar="N", help="port to serve on (default: a free one)")
    p.add_argument("--open", action="store_true", help="open the page in a browser")
    p.add_argument("--judge", action="store_true",
                   help="call the judge models of kind: judge rules (keys needed) when trying completions and "
                        "checking examples; without it only local judges are called and the others are shown as "
                        "not checked")
    p.add_argument("--host", default="127.0.0.1", metavar="H",
                   help="address to serve on (default 127.0.0.1; anything else is reachable from other machines)")


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say so, and without it a response's
    # body waits ~40 ms behind its headers (Nagle + delayed ACK) on every request
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def run(args: argparse.Namespace) -> int:
    # lazy: starlette, uvicorn and the studio load only for this command
    import uvicorn

    # lazy: starlette and uvicorn load only when the server starts; `sailrl studio --help` stays fast
    from sailrl.studio.app import build_app
    from sailrl.studio.security import new_token  # lazy: see above (spec.errors and its codes table)
    from sailrl.studio.session import Studio  # lazy: see above (the session imports jinja2 and the data readers)

    spec = Path(args.spec)
    if not spec.is_file():
        print(f"error: {args.spec}: {'is a folder, not a spec file' if spec.is_dir() else 'spec not found'} "
              "(write one with `sailrl init`)", file=sys.stderr)
        return 1
    run_dir = None
    if args.run is not None:
        run_dir = Path(args.run)
        if not run_dir.is_dir():
            print(f"error: {args.run}: no such run directory", file=sys.stderr)
            return 1
    if not 0 <= args.port <= 65535:
        print(f"error: --port {args.port}: a port is a number from 1 to 65535 (or leave it out)", file=sys.stderr)
        return 2
    host = args.host
    if host not in LOOPBACK:
        print(f"warning: serving on {host}, not only this machine: anyone who can reach it and has the URL can "
              "change the spec and read any file you can read (the data tab reads what dataset.source names)",
              file=sys.stderr)
    try:
        sock = _bind("127.0.0.1" if host == "localhost" else host, args.port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            print(f"error: port {args.port} on {host} is in use: pick another with --port N, or leave --port out for "
                  "a free one", file=sys.stderr)
        elif exc.errno in (errno.EACCES, errno.EPERM):
            print(f"error: port {args.port} on {host} needs more rights than this user has ({exc.strerror}): pick one "
                  "above 1023 with --port N, or leave --port out for a free one", file=sys.stderr)
        else:  # a name that does not resolve, an address that is not this machine's
            print(f"error: --host {host}: cannot serve there ({exc.strerror or exc}): give an address of this "
                  "machine, or leave --host out for 127.0.0.1", file=sys.stderr)
        return 1
    port = sock.getsockname()[1]
    token = new_token()
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/?token={token}"
    app = build_app(Studio(spec, run_dir, judge=args.judge), token=token, host=host, port=port)
    print(f"sailrl studio: {spec} at {url}", flush=True)
    print("(the link carries this session's token; press Ctrl-C to stop)", flush=True)
    if args.open:
        import webbrowser

        try:
            opened = webbrowser.open(url)
        except Exception:  # noqa: BLE001 -- no browser is one line, not a traceback
            opened = False
        if not opened:
            print("note: could not open a browser here: open the URL above yourself", file=sys.stderr)
    # On Ctrl-C uvicorn stops taking requests and lets running ones finish (a save takes milliseconds and is an atomic
    # replace anyway); a slow read (a preflight report) is not waited for past a few seconds.
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                           timeout_graceful_shutdown=3))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        print("sailrl studio: stopped", file=sys.stderr)
        return 130
    finally:
        sock.close()
    return 0
