"""`vllm-edge ps`: the keep-alive model servers that are running."""

from __future__ import annotations

import argparse
import json

from vllm_edge.cli.args import add_output

NAME = "ps"
HELP = "list the running keep-alive model servers: model, port, pid, idle time, RssAnon"


def add_args(p: argparse.ArgumentParser) -> None:
    add_output(p)


def rows() -> list[dict]:
    from vllm_edge.common.procmem import tree_rss_anon_mb
    from vllm_edge.serving import keepalive

    out = []
    for rec, st in keepalive.records():
        mb, procs = tree_rss_anon_mb(rec.pid)
        out.append({"model": rec.model, "quant": rec.quant, "port": rec.port, "pid": rec.pid,
                    "idle_s": st.get("idle_s"), "in_flight": st.get("in_flight"),
                    "keep_alive_s": rec.keep_alive_s, "rss_anon_mb": round(mb, 1),
                    "processes": procs, "log": rec.log})
    return out


def run(args: argparse.Namespace) -> int:
    found = rows()
    if args.output == "json":
        print(json.dumps(found))
        return 0
    if not found:
        print("no model servers running")
        return 0
    print(f"{'MODEL':<24} {'QUANT':<6} {'PORT':>6} {'PID':>8} {'IDLE':>8} {'STOPS IN':>9} {'RSSANON':>9}")
    for r in found:
        left = max(0.0, r["keep_alive_s"] - (r["idle_s"] or 0))
        print(f"{r['model']:<24} {r['quant']:<6} {r['port']:>6} {r['pid']:>8} {r['idle_s']:>7.0f}s "
              f"{left:>8.0f}s {r['rss_anon_mb']:>6.0f} MB")
    return 0
