"""Reciprocal rank fusion (Cormack, Clarke and Buettcher, 2009): one ranking from several, each
item scored sum(1 / (K + rank)) over the rankings it is in, so neither keyword scores nor cosine
similarities need to be comparable."""

from __future__ import annotations

K = 60


def reciprocal_rank_fusion(*rankings: list[int], k: int = K) -> list[int]:
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores, key=lambda item: (-scores[item], item))
