"""The process of a keep-alive server: :func:`vllm_edge.serving.serve.main` with the options its
parent (:mod:`.keepalive`) passes as one JSON argument.

A serving entry point of its own, so that a `run` never enters the CLI a second time to start
its server: ``python -m vllm_edge.serving.keepalive_server '{"model": ..., "port": ...}'``.
With ``"graph": "build"`` it is the builder of a server's compiled graph (:mod:`.graph_cache`),
at the lowest CPU priority.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def options_from_json(text: str) -> dict[str, Any]:
    """The parent's options: serve.main's keywords, with ``parallel`` as its fields."""
    from vllm_edge.serving.serve import Parallel

    options = json.loads(text)
    if not isinstance(options, dict) or "model" not in options:
        raise ValueError("expected a JSON object with at least 'model'")
    if options.get("parallel") is not None:
        options["parallel"] = Parallel(**options["parallel"])
    return options


def main(argv: list[str] | None = None) -> int:
    from vllm_edge.common.errors import EdgeError
    from vllm_edge.serving import serve

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m vllm_edge.serving.keepalive_server OPTIONS_JSON", file=sys.stderr)
        return 2
    options = options_from_json(argv[0])
    if options.get("graph") == "build":
        from vllm_edge.serving import graph_cache

        # the build lock its server claimed for it, by descriptor
        options["graph_spec"] = {"lock_fd": options.pop("lock_fd", None)}

        # a builder of the next start's graph yields to everything else
        print(f"[vllm-edge] compiled graph builder: {graph_cache.yield_cpu()}", file=sys.stderr,
              flush=True)
    elif options.get("graph") == "background":
        import os

        # the builder gets this server's options, not its socket, and the environment it was
        # started with: vLLM sets variables of its own as it starts, and its compile cache is
        # keyed on its variables
        options["graph_spec"] = {
            "options": {k: v for k, v in json.loads(argv[0]).items() if k not in ("sock_fd", "graph")},
            "env": dict(os.environ)}
    fd = options.pop("sock_fd", None)
    if fd is not None:  # the parent's bound, listening socket: no port race
        import socket

        options["sock"] = socket.socket(fileno=int(fd))
    try:
        return serve.main(options.pop("model"), **options)
    except EdgeError as exc:  # the parent shows the log's tail
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
