"""Drafts by a smaller model that shares the target's vocabulary (``speculative_model``).

The draft model runs in an engine of its own (the same LLMEngine, its own KV pool and prefix
cache): to draft k tokens for a sequence, it is handed the sequence's tokens and decodes k
greedily; the sequences that draft in one step decode together, as rows of one batch. Its
prefix cache holds what it computed for a sequence on the step before, so each call reads only
the tokens added since (the verified ones) and the part of the last block it had not filled.
Drafts go through the same verification as prompt lookup's (verify.py): the step emits the
target's own tokens, so a draft model changes how many tokens a step yields, never which. A
greedy draft is a point proposal, for which accepting while the target's sample equals it keeps
a sampled answer the target's distribution exactly (it accepts less often than rejection
sampling over the draft's distribution would).

Cost: one prefill chunk and k - 1 decode steps of the draft model for a step's drafting
sequences together, on the engine's thread, before the target's step. It pays where the draft
model is several times cheaper than the target and agrees with it often.
"""

from __future__ import annotations

import itertools
import logging

from engine.errors import InvalidParameterError
from engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class DraftModel:
    """``propose(token_ids, k)``: the draft model's greedy continuation of ``token_ids``, k tokens
    at most ([] where they would not fit its context). ``engine``: an LLMEngine of the draft model."""

    def __init__(self, engine, *, target_tokenizer, target_vocab_size: int) -> None:
        check_vocabulary(engine, target_tokenizer, target_vocab_size)
        self.engine = engine
        self._ids = itertools.count()
        self._params = {}  # SamplingParams by draft length

    def propose(self, token_ids: list[int], num_tokens: int) -> list[int]:
        return self.propose_many([(token_ids, num_tokens)])[0]

    def propose_many(self, requests: list[tuple[list[int], int]]) -> list[list[int]]:
        """``propose`` for several sequences at once: their drafts decode as rows of one batch."""
        engine = self.engine
        ids: dict[str, int] = {}
        drafts: list[list[int]] = [[] for _ in requests]
        try:
            for i, (token_ids, num_tokens) in enumerate(requests):
                if 0 < num_tokens and len(token_ids) + num_tokens <= engine.max_model_len:
                    ids[request_id := f"draft-{next(self._ids)}"] = i
                    engine.add_request(request_id, list(token_ids), self._sampling(num_tokens))
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.error is not None:  # the draft's own failure: no draft, the target goes on
                        logger.warning("draft model failed: %s", out.error)
                        drafts[ids[out.request_id]] = []
                        ids.pop(out.request_id)
                    elif out.request_id in ids:
                        drafts[ids[out.request_id]].extend(out.token_ids_delta)
        finally:
            left = [request_id for request_id in ids if engine.has_request(request_id)]
            for request_id in left:
                engine.abort_request(request_id)
            if left:
                engine.step()
        return [tokens[:num_tokens] for tokens, (_, num_tokens) in zip(drafts, requests)]

    def _sampling(self, num_tokens: int) -> SamplingParams:
        params = self._params.get(num_tokens)
        if params is None:
            params = self._params[num_tokens] = SamplingParams(
                temperature=0.0, max_tokens=num_tokens, ignore_eos=True, skip_special_tokens=False)
        return params


def check_vocabulary(engine, target_tokenizer, target_vocab_size: int) -> None:
    """InvalidParameterError naming speculative_model unless the draft model's token ids mean what
    the target's do: the same vocabulary size and the same token for every id."""
    if engine.model_config.vocab_size != target_vocab_size:
        raise InvalidParameterError(
            "speculative_model", f"the draft model's vocabulary has {engine.model_config.vocab_size} "
            f"entries, this model's {target_vocab_size}: a draft model must share the vocabulary")
    draft_vocab, target_vocab = engine.tokenizer.get_vocab(), target_tokenizer.get_vocab()
    if draft_vocab != target_vocab:
        differing = sorted(set(draft_vocab.items()) ^ set(target_vocab.items()), key=lambda item: item[1])
        token, token_id = differing[0]
        raise InvalidParameterError(
            "speculative_model", f"the draft model's tokenizer differs from this model's (first at id "
            f"{token_id}, {token!r}): a draft model must share the vocabulary")
