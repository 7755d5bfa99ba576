"""The L2 footprint of kvfleet's verification probes: a fresh nonce per probe vs the hourly DAG's bounded pool.

Run directly: ``python bench/probe_footprint.py [--json] [--days 30] [--endpoints 1000] ...``. Importable:
``main(argv) -> int`` (0 when the pooled footprint stops growing between pod generations, else 1).

What it counts (sources in tests/conformance/facts/probe_l2_footprint.yaml): every probe document
LMCache has not seen is written to Curvine once, as ``prompt_tokens x bytes per token`` (the fs:// connector keeps
one file per chunk and evicts nothing). The documents are the product's own: the nonce of a probe comes from
``kvfleet.stages.verify.ProbePool.nonce`` (hourly DAG) or is fresh every time (``uuid4``, what every probe did
before), and the bytes per token from ``kvfleet.fleet.economics.bytes_per_token_for`` (Qwen2-7B fp16: 57,344 B,
what LMCache's Stored line of the blog gives). One probe an hour per endpoint, cold on one pod whose uid changes
every ``--pod-lifetime-days`` (a rollout or a restart: the pool then starts fresh documents for the new pod).

It is a count, not a timing: no cluster is needed, and the twin test
``tests/integration/drift/test_advise.py::test_pooled_probes_do_not_grow_l2_and_a_fresh_probe_does`` shows the same
bound on the twin's Curvine files.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from kvfleet.fleet.economics import GIB, bytes_per_token_for
from kvfleet.stages.verify import PROBE_POOL_PERIOD_S, PROBE_POOL_SLOTS, ProbePool

START = datetime(2026, 12, 1, tzinfo=UTC)


def distinct_documents(days: int, pool: ProbePool | None, pod_lifetime_days: float, prompt_tokens: int,
                       endpoint: str = "ns/endpoint") -> list[int]:
    """Distinct probe documents written by the end of each day for one endpoint (hourly probes)."""
    seen: set[str] = set()
    per_day = []
    lifetime_h = max(1, round(pod_lifetime_days * 24))
    for hour in range(days * 24):
        at = START + timedelta(hours=hour)
        uid = f"pod-generation-{hour // lifetime_h}"
        nonce = pool.nonce(endpoint, uid, prompt_tokens, at) if pool is not None else uuid.uuid4().hex[:12]
        seen.add(nonce)
        if hour % 24 == 23:
            per_day.append(len(seen))
    return per_day


def run(days: int, endpoints: int, prompt_tokens: int, pod_lifetime_days: float, slots: int) -> dict[str, Any]:
    bpt, source = bytes_per_token_for(model_id="Qwen/Qwen2-7B-Instruct")
    probe_bytes = prompt_tokens * bpt
    pooled = distinct_documents(days, ProbePool(slots=slots, period_s=PROBE_POOL_PERIOD_S), pod_lifetime_days,
                                prompt_tokens)
    fresh = distinct_documents(days, None, pod_lifetime_days, prompt_tokens)

    def gib(docs: int, n: int = 1) -> float:
        return round(docs * probe_bytes * n / GIB, 2)

    marks = sorted({1, min(7, days), days})
    rows = [{"day": d, "fresh_nonce_gib_per_endpoint": gib(fresh[d - 1]), "pooled_gib_per_endpoint": gib(pooled[d - 1]),
             "fresh_nonce_tib_fleet": round(gib(fresh[d - 1], endpoints) / 1024, 3),
             "pooled_tib_fleet": round(gib(pooled[d - 1], endpoints) / 1024, 3)} for d in marks]
    per_generation = min(slots, round(pod_lifetime_days * 24))
    return {
        "method": "distinct probe documents x prompt tokens x bytes per token; nonces from the product's ProbePool",
        "prompt_tokens": prompt_tokens, "bytes_per_token": round(bpt, 1), "bytes_per_token_source": source,
        "probe_gib": round(probe_bytes / GIB, 4), "probes_per_endpoint_per_day": 24, "endpoints": endpoints,
        "pool_slots": slots, "pod_lifetime_days": pod_lifetime_days, "days": days,
        "fresh_nonce_gib_per_endpoint_per_day": gib(24),
        "pooled_gib_per_pod_generation": gib(per_generation),
        "pooled_live_bound_gib_per_endpoint": gib(slots),
        "rows": rows,
        "bounded": pooled[-1] <= per_generation * (int(days / pod_lifetime_days) + 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--days", type=int, default=30, choices=range(1, 366), metavar="1-365")
    p.add_argument("--endpoints", type=int, default=1000, choices=range(1, 100_001), metavar="1-100000")
    p.add_argument("--prompt-tokens", type=int, default=2000, choices=range(512, 32_769), metavar="512-32768")
    p.add_argument("--pod-lifetime-days", type=float, default=7.0, help="days between rollouts/restarts (0.05-365)")
    p.add_argument("--slots", type=int, default=PROBE_POOL_SLOTS, choices=range(1, 1001), metavar="1-1000")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not 0.05 <= args.pod_lifetime_days <= 365:
        p.error(f"--pod-lifetime-days: {args.pod_lifetime_days} is outside 0.05-365; give days between restarts")
    out = run(args.days, args.endpoints, args.prompt_tokens, args.pod_lifetime_days, args.slots)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"probe: {out['prompt_tokens']} tokens x {out['bytes_per_token']:.0f} B = {out['probe_gib']} GiB "
              f"({out['bytes_per_token_source']}); one probe/h/endpoint; pool {out['pool_slots']} slots; pods "
              f"restart every {out['pod_lifetime_days']} days; {out['endpoints']} endpoints")
        print(f"{'day':>5} {'fresh GiB/ep':>13} {'pooled GiB/ep':>14} {'fresh TiB fleet':>16} {'pooled TiB fleet':>17}")
        for r in out["rows"]:
            print(f"{r['day']:>5} {r['fresh_nonce_gib_per_endpoint']:>13} {r['pooled_gib_per_endpoint']:>14} "
                  f"{r['fresh_nonce_tib_fleet']:>16} {r['pooled_tib_fleet']:>17}")
        print(f"pooled: at most {out['pooled_live_bound_gib_per_endpoint']} GiB per endpoint per live cold pod "
              f"({out['pooled_gib_per_pod_generation']} GiB per pod generation, left behind at a restart); fresh "
              f"nonce: +{out['fresh_nonce_gib_per_endpoint_per_day']} GiB per endpoint every day, never removed")
    return 0 if out["bounded"] else 1


if __name__ == "__main__":
    sys.exit(main())
