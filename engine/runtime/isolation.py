"""Finding the request that fails a step, and telling a broken engine from a bad request.

Used by LLMEngine.step only after a step has raised: ``bisect`` re-runs the step's sequences in
halves (about 2 * log2(batch) extra forward passes per failing request) and ``probe`` runs a
one-token greedy request through the model and sampler when nothing of the step could run.
"""

from __future__ import annotations

import logging

from engine.sampling_params import SamplingParams
from engine.scheduling.scheduler import ScheduledSequence
from engine.scheduling.sequence import Sequence

logger = logging.getLogger(__name__)


def bisect(runner, entries: list[ScheduledSequence]) -> tuple[list, list[ScheduledSequence]]:
    """Run each half of ``entries`` (which fail together); recurse into a half that fails.
    Returns (sampled tokens of the halves that ran, entries that fail alone)."""
    mid = len(entries) // 2
    sampled, failed = [], []
    for part in (entries[:mid], entries[mid:]):
        try:
            sampled += runner.execute(part)
        except Exception:
            if len(part) > 1:
                part_sampled, part_failed = bisect(runner, part)
                sampled += part_sampled
                failed += part_failed
            else:
                logger.exception("request %s fails a step on its own; failing it alone", part[0].seq.request_id)
                failed += part
    return sampled, failed


def probe(runner, block_manager) -> tuple[bool, str | None]:
    """(tried, what failed): whether a minimal request could be tried (it needs a free KV block:
    without one the engine is busy, so it is running) and what made it fail (None: it ran).
    Call it from the thread that steps the engine."""
    seq = Sequence("health-probe", [0], SamplingParams(temperature=0, max_tokens=1))
    if not block_manager.allocate(seq, 1):
        return False, None
    try:
        runner.execute([ScheduledSequence(seq, 1, 0)])
    except Exception as exc:
        logger.exception("the engine cannot run a minimal request: marking it unhealthy")
        return True, f"a minimal request fails: {type(exc).__name__}"
    finally:
        block_manager.free(seq)
    return True, None
