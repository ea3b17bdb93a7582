"""The offline Python API: ``LLM("smollm2").generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence

from engine.config import EngineConfig
from engine.errors import InvalidParameterError
from engine.llm_engine import LLMEngine
from engine.lora.request import LoRARequest
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams
from engine.text.tokenizer import apply_chat_template

class LLM:
    def __init__(self, model: str, *, progress: Callable[[int, int], None] | None = None, **config):
        self.engine = LLMEngine(EngineConfig.from_settings(model, config), progress=progress)
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | list[int] | Sequence[str | list[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None, *, n: int = 1,
                 adapters: LoRARequest | None | Sequence[LoRARequest | None] = None
                 ) -> list[CompletionOutput]:
        """Run every prompt to completion in one continuous batch; results in input order.

        ``adapters``: one LoRA adapter for every prompt, or one per prompt (None: the base model).

        With ``n`` > 1, each prompt gives n samples (sharing its prompt's KV blocks), listed
        one after the other with their ``index``.
        """
        prompts = _as_prompt_list(prompts)
        params_list = _as_params_list(params, len(prompts))
        ids = [f"gen-{next(self._ids)}" for _ in prompts]
        adapter_list = (list(adapters) if isinstance(adapters, (list, tuple))
                        else [adapters] * len(prompts))
        if len(adapter_list) != len(prompts):
            raise InvalidParameterError("adapters", f"got {len(adapter_list)} adapters for {len(prompts)} prompts")
        results: dict[tuple[str, int], CompletionOutput] = {}
        for rid, prompt, p, adapter in zip(ids, prompts, params_list, adapter_list):
            prompt_ids = self.engine.encode_prompt(prompt)
            self.engine.add_request(rid, prompt_ids, p, n=n, adapter=adapter)
            for i in range(n):
                results[rid, i] = CompletionOutput(rid, prompt if isinstance(prompt, str) else None,
                                                   prompt_ids, "", [], None, index=i,
                                                   logprobs=[] if p.logprobs is not None else None)
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                _accumulate(results[out.request_id, out.index], out)
        return [results[rid, i] for rid in ids for i in range(n)]

    def chat(self, messages: list[dict] | Sequence[list[dict]],
             params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[CompletionOutput]:
        """Apply the model's chat template to one conversation or several, then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [apply_chat_template(self.tokenizer, conv) for conv in conversations]
        return self.generate(prompts, params)

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None, *,
               adapter: LoRARequest | None = None) -> Iterator[RequestOutput]:
        """Yield one request's deltas as they are produced (under ``adapter``, a LoRA adapter)."""
        rid = f"stream-{next(self._ids)}"
        self.engine.add_request(rid, prompt, params, adapter=adapter)
        try:
            while True:
                for out in self.engine.step():
                    if out.request_id == rid:
                        yield out
                        if out.finished:
                            return
        finally:
            if self.engine.has_request(rid):
                self.engine.abort_request(rid)
                self.engine.step()


def _accumulate(result: CompletionOutput, out: RequestOutput) -> None:
    result.text += out.text_delta
    result.token_ids.extend(out.token_ids_delta)
    if result.logprobs is not None and out.logprobs_delta:
        result.logprobs.extend(out.logprobs_delta)
    result.num_cached_tokens = out.num_cached_tokens
    result.metrics = out.metrics
    if out.finish_reason is not None:
        result.finish_reason = out.finish_reason
        result.stop_reason = out.stop_reason


def _as_prompt_list(prompts) -> list[str | list[int]]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise InvalidParameterError("prompts", "must be a string, a list of token ids, or a non-empty list of those")
    return list(prompts)


def _as_params_list(params, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise InvalidParameterError("params", f"got {len(params)} SamplingParams for {n} prompts")
    return params
