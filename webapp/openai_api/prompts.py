"""A completion's list of prompts as one request: one engine request per prompt, their chunks
merged into the one chunk stream a request with ``n`` samples gives.

Why several engine requests rather than one: the engine's unit is a prompt (its ``n`` samples
share that prompt's KV blocks); prompts share nothing, so each is scheduled, prefix-cached,
queued and aborted as any request is, and the engine and the workers stay unchanged. Everything
above the engine sees one request: one request id (the engine requests are ``<id>-<prompt
index>``), one admission and concurrency slot, one reservation covering every prompt's worst case
(services.generation_prepare), one usage record whose prompt tokens are all the prompts'.

The merged stream is what webapp/usage/outcome.py and webapp/openai_api/events.py already read
for n > 1: every chunk carries ``samples``, a sample's ``index`` being prompt index x n + its own
index (OpenAI's choice index), and the request's totals so far (prompt, output and cached tokens
summed over the prompts). It ends when every prompt has ended. The first prompt to fail ends it
with that failure, and the others are aborted then: closing the merged stream (the client gone,
a failure, the server shutting down) closes every prompt's stream, which aborts its engine request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

from django.conf import settings

from webapp.openai_api.services import Generation
from workers.connect import get_engine_client
from workers.protocol import Chunk


def generation_chunks(gen: Generation) -> AsyncIterator[Chunk]:
    """The request's chunks: its one engine request's own, or its prompts' merged."""
    client = get_engine_client(settings.REDIS_URL)
    requests = gen.engine_requests()
    if len(requests) == 1:
        return client.generate(requests[0])
    return _merged(gen, [client.generate(r) for r in requests])


async def generation_abort(gen: Generation) -> None:
    """Abort every engine request of the request (shutting down, when cancelling did not end it)."""
    client = get_engine_client(settings.REDIS_URL)
    for request_id in gen.engine_request_ids():
        await client.abort(gen.model.slug, request_id)


class ChunkMerge:
    """The prompts' chunks as the merged request's, one at a time."""

    def __init__(self, request_id: str, n: int, num_prompts: int):
        self.request_id, self.n = request_id, n
        self.totals = [(0, 0, 0)] * num_prompts  # per prompt: prompt, output and cached tokens so far
        self.is_done = [False] * num_prompts
        self.time_to_first_token: float | None = None

    @property
    def finished(self) -> bool:
        return all(self.is_done)

    def add(self, prompt_index: int, chunk: Chunk) -> Chunk:
        if chunk.error is not None:  # the request fails with its first failing prompt
            self.is_done = [True] * len(self.is_done)
            return Chunk.failure(self.request_id, chunk.error)
        self.is_done[prompt_index] = chunk.finished
        self.totals[prompt_index] = (chunk.num_prompt_tokens, chunk.num_output_tokens, chunk.num_cached_tokens)
        if chunk.time_to_first_token is not None and self.time_to_first_token is None:
            self.time_to_first_token = chunk.time_to_first_token
        offset = prompt_index * self.n
        if chunk.samples is not None:
            samples = [{**s, "index": offset + s["index"]} for s in chunk.samples]
        else:
            samples = [{"index": offset, "text": chunk.text, "token_ids": chunk.token_ids, "logprobs": chunk.logprobs,
                        "finish_reason": chunk.finish_reason if chunk.finished else None,
                        "stop_reason": chunk.stop_reason if chunk.finished else None,
                        "num_output_tokens": chunk.num_output_tokens}]
        prompt, output, cached = (sum(t[i] for t in self.totals) for i in range(3))
        return Chunk(self.request_id, "", [], None, self.finished, chunk.finish_reason if self.finished else None,
                     prompt, output, cached, self.time_to_first_token, version=chunk.version, samples=samples)


async def _merged(gen: Generation, streams: list[AsyncIterator[Chunk]]) -> AsyncIterator[Chunk]:
    merge = ChunkMerge(gen.request_id, gen.n, len(streams))
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(prompt_index: int, stream: AsyncIterator[Chunk]) -> None:
        try:
            async with aclosing(stream):  # cancelled: the stream's own clean-up aborts its engine request
                async for chunk in stream:
                    await queue.put((prompt_index, chunk))
        except Exception as exc:  # handed on: the merged stream raises it
            await queue.put((prompt_index, exc))

    pumps = [asyncio.create_task(pump(i, stream)) for i, stream in enumerate(streams)]
    try:
        while not merge.finished:
            prompt_index, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            yield merge.add(prompt_index, item)
    finally:  # every way out: the prompts still running are aborted
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
