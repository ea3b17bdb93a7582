"""One claimed request on the worker side: where it replies and the deltas not sent yet.

Deltas are batched: a chunk leaves when the request finishes, when its first token is ready
(time to first token is what users feel), when FLUSH_TOKENS tokens have piled up, or when
FLUSH_INTERVAL_S has passed since the last chunk. On a fast device that is a few tokens per
message instead of one message per token per step. A request with n > 1 samples sends the
deltas of every sample that moved in one chunk (Chunk.samples), each under its index.
"""

from __future__ import annotations

import base64

from workers.protocol import Chunk, GenerateRequest

FLUSH_INTERVAL_S = 0.02
FLUSH_TOKENS = 16


def embeddings_to_base64(vectors) -> list[str]:
    """[num_inputs, dimensions] float32 tensor -> each row as base64 of its little-endian bytes."""
    rows = vectors.float().contiguous().numpy().astype("<f4")
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in rows]


def logprob_to_dict(lp) -> dict:
    """engine.outputs.TokenLogprob -> the protocol's {"token_id", "logprob", "top"} dict."""
    return {"token_id": lp.token_id, "logprob": lp.logprob, "top": [list(t) for t in lp.top]}


class InFlight:
    def __init__(self, req: GenerateRequest):
        self.request = req  # to hand it back to the queue while nothing of it was produced
        self.request_id = req.request_id
        self.reply_to = req.reply_to
        self._text: list[str] = []
        self._token_ids: list[int] = []
        self._logprobs: list[dict] | None = None
        self._latest = None  # the newest engine.outputs.RequestOutput
        self._dirty = False  # something to send
        self.num_chunks_sent = 0
        self.last_sent = 0.0  # time.monotonic() of the last chunk
        self.ttft_seen = False
        # n > 1: index -> that sample's pending delta, and each sample's output token count.
        self._samples: dict[int, dict] | None = {} if req.n > 1 else None
        self._sample_tokens: dict[int, int] = {}
        self._embeddings: list[str] | None = None  # an embed request's vectors, once computed

    @property
    def finished(self) -> bool:
        return self._latest is not None and self._latest.finished

    @property
    def latest(self):
        return self._latest

    @property
    def num_output_tokens(self) -> int:
        """Output tokens so far, every sample's (the engine's outputs count their own sample's)."""
        if self._samples is None:
            return self._latest.num_output_tokens if self._latest is not None else 0
        return sum(self._sample_tokens.values())

    def add(self, out) -> None:
        """Accumulate one step's engine.outputs.RequestOutput."""
        self._latest = out
        self._dirty = True
        if out.embeddings is not None:
            self._embeddings = embeddings_to_base64(out.embeddings)
        if self._samples is not None:
            self._add_sample(out)
            return
        self._text.append(out.text_delta)
        self._token_ids.extend(out.token_ids_delta)
        if out.logprobs_delta is not None:
            if self._logprobs is None:
                self._logprobs = []
            self._logprobs.extend(logprob_to_dict(lp) for lp in out.logprobs_delta)

    def _add_sample(self, out) -> None:
        delta = self._samples.setdefault(out.index, {"index": out.index, "text": "", "token_ids": [],
                                                     "logprobs": None, "finish_reason": None})
        delta["text"] += out.text_delta
        delta["token_ids"].extend(out.token_ids_delta)
        if out.logprobs_delta is not None:
            delta["logprobs"] = (delta["logprobs"] or []) + [logprob_to_dict(lp) for lp in out.logprobs_delta]
        delta["finish_reason"] = out.finish_reason or delta["finish_reason"]
        if out.finish_reason is not None:
            delta["stop_reason"] = out.stop_reason
        delta["num_output_tokens"] = self._sample_tokens[out.index] = out.num_output_tokens
        self._token_ids.extend(out.token_ids_delta)  # counted for FLUSH_TOKENS only

    def is_due(self, now: float) -> bool:
        if not self._dirty:
            return False
        return (self.finished or self.num_chunks_sent == 0
                or len(self._token_ids) >= FLUSH_TOKENS or now - self.last_sent >= FLUSH_INTERVAL_S)

    def take_chunk(self, now: float) -> Chunk:
        out = self._latest
        ttft = out.metrics.time_to_first_token if out.metrics is not None else None
        chunk = Chunk(
            request_id=self.request_id, text="".join(self._text), token_ids=self._token_ids,
            logprobs=self._logprobs, finished=out.finished, finish_reason=out.finish_reason,
            num_prompt_tokens=out.num_prompt_tokens, num_output_tokens=out.num_output_tokens,
            num_cached_tokens=out.num_cached_tokens, time_to_first_token=ttft,
            embeddings=self._embeddings, stop_reason=out.stop_reason if out.finished else None)
        if self._samples is not None:
            chunk.token_ids = []
            chunk.num_output_tokens = self.num_output_tokens
            chunk.samples, self._samples = sorted(self._samples.values(), key=lambda d: d["index"]), {}
        self._text, self._token_ids, self._logprobs = [], [], None
        self._dirty = False
        self.num_chunks_sent += 1
        self.last_sent = now
        return chunk
