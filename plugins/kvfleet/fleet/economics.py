"""L2 economics: the expected TTFT speedup for a prompt length, from the published curve (DOMAIN.md).

Pure. Stage 5 compares a measured speedup with ``expected_speedup``; a cross-pod hit that is full but slower
than the curve minus a tolerance is ``degraded``. Profiles per instance type are configurable; the default is
the blog's ml.g5.4xlarge table (Qwen2-7B, fp16, TP=1, two nodes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise

# (prompt tokens, speedup) — 0.99x at 500, 1.7x at 1,000, 2.7x at 2,500 (774 ms -> 287 ms), flat after.
PUBLISHED_G5: tuple[tuple[int, float], ...] = ((500, 0.99), (1000, 1.7), (2500, 2.7), (3000, 2.7))
# ml.g6e.4xlarge multi-turn: 1.22x at 530 tokens -> 1.34x at 2,114 tokens.
PUBLISHED_G6E: tuple[tuple[int, float], ...] = ((530, 1.22), (2114, 1.34), (3000, 1.34))
PROFILES: dict[str, tuple[tuple[int, float], ...]] = {
    "ml.g5.4xlarge": PUBLISHED_G5,
    "ml.g6e.4xlarge": PUBLISHED_G6E,
    "ml.g6.16xlarge": PUBLISHED_G6E,
}
MIN_USEFUL_TOKENS = 1000  # below ~1,000 tokens L2 does not pay off; prefer L0/L1 (prefix-aware routing)


def interpolate(curve: Sequence[tuple[int, float]], tokens: int) -> float:
    if tokens <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in pairwise(curve):
        if tokens <= x1:
            return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
    return curve[-1][1]


def expected_speedup(tokens: int, instance_type: str,
                     profiles: Mapping[str, Sequence[tuple[int, float]]] | None = None) -> float:
    table = (profiles or PROFILES).get(instance_type) or PUBLISHED_G5
    return round(interpolate(table, tokens), 3)
