"""A snapshot of an engine's load and counters, for workers' heartbeats and metrics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    num_blocks: int
    num_free_blocks: int
    kv_cache_usage: float  # fraction of blocks held by live requests
    prefix_cache_queried_tokens: int
    prefix_cache_hit_tokens: int
    num_preemptions: int
    num_prompt_tokens: int  # prompt tokens computed (not served by the prefix cache), all time
    num_generation_tokens: int  # tokens generated, all time
    num_lora_resident: int = 0  # LoRA adapters resident now (at most max_loras)
    num_lora_loads: int = 0  # adapters made resident (first loads and reloads after eviction), all time
    # speculative decoding (engine/speculative/), all time: verifications (a sequence's draft in a
    # step), draft tokens proposed, and those accepted
    num_spec_drafts: int = 0
    num_spec_draft_tokens: int = 0
    num_spec_accepted_tokens: int = 0
    # steps paused between layers for a newcomer's own step (LLMEngine.step), all time
    num_paused_steps: int = 0


def engine_stats(scheduler, block_manager, *, num_prompt_tokens: int, num_generation_tokens: int,
                 num_paused_steps: int = 0) -> EngineStats:
    return EngineStats(
        num_running=scheduler.num_running, num_waiting=scheduler.num_waiting,
        num_blocks=block_manager.num_blocks, num_free_blocks=block_manager.num_free_blocks,
        kv_cache_usage=block_manager.usage,
        prefix_cache_queried_tokens=block_manager.num_prefix_queried_tokens,
        prefix_cache_hit_tokens=block_manager.num_prefix_hit_tokens,
        num_preemptions=scheduler.num_preemptions,
        num_prompt_tokens=num_prompt_tokens, num_generation_tokens=num_generation_tokens,
        num_lora_resident=len(slots.resident) if (slots := scheduler.lora_slots) else 0,
        num_lora_loads=slots.num_loads if slots else 0,
        num_spec_drafts=spec.num_drafts if (spec := scheduler.speculator) else 0,
        num_spec_draft_tokens=spec.num_draft_tokens if spec else 0,
        num_spec_accepted_tokens=spec.num_accepted_tokens if spec else 0,
        num_paused_steps=num_paused_steps)
