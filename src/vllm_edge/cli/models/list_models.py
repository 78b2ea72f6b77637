"""`vllm-edge models list`: the embedded models, and every build in the cache."""

from __future__ import annotations

import argparse

NAME = "list"
HELP = "embedded models, and the builds cached under VLLM_EDGE_HOME: source, build, size, last use"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object per build")


def run(args: argparse.Namespace) -> int:
    import json

    from vllm_edge.models import cache, store

    found = cache.builds()
    if args.json:
        for b in found:
            print(json.dumps({"name": b.name, "path": str(b.path), "build": b.scheme, "converter": b.kind,
                              "source": b.source, "bytes": b.bytes, "last_use": b.last_use,
                              "problem": b.problem}))
        return 0
    for key, m in store.MODELS.items():
        path = store.prepared_dir(m)
        state = "prepared" if (path / "config.json").exists() else "not prepared"
        tag = " (default)" if key == store.DEFAULT else ""
        print(f"{key}{tag}: {m.description}; package {m.package}; {state} at {path}")
    print()
    if not found:
        print(f"no builds in {cache.root()}")
        return 0
    rows = [(b.name, b.scheme, f"{b.bytes / 1e6:.0f} MB", cache.age(b.last_use),
             b.source if not b.problem else f"{b.source} (BROKEN: {b.problem})") for b in found]
    head = ("build", "weights", "size", "last use", "source")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
    print(f"\n{len(found)} builds in {cache.root()}; `vllm-edge models rm BUILD` removes one")
    return 0
