"""Which leading prompt tokens a request may share with every user in the engine's prefix cache.

The engine scopes its prefix cache to the request's tenant (workers.protocol.GenerateRequest.tenant):
one user's prompts never produce a cache hit for another, so ``cached_tokens`` and time to first
token tell nothing across users. The one exception is a system prompt staff made public on purpose:
one of everyone's presets marked ``is_prefix_shared`` in the admin. When a request's first message
is exactly such a preset's text and its rendered prompt begins with exactly the tokens of that
system turn rendered alone, those tokens are its ``shared_prefix_len``; otherwise it is 0 (a
template that folds the system prompt into the first user turn, or adds tools to it, shares nothing).
"""

from __future__ import annotations

from webapp.chat.models import SystemPromptPreset
from webapp.registry.tokenizers import ChatTemplateError, ModelTokenizer


def shared_prefix_len(*, tokenizer: ModelTokenizer, messages: list[dict], prompt_ids: list[int]) -> int:
    """How many of ``prompt_ids`` (``messages`` rendered) are a shared system prompt's tokens."""
    first = messages[0] if messages else {}
    text = first.get("content")
    if first.get("role") != "system" or not isinstance(text, str) or not text:
        return 0
    if not SystemPromptPreset.objects.filter(user=None, is_prefix_shared=True, text=text).exists():
        return 0
    try:
        prefix = tokenizer.apply_chat_template([{"role": "system", "content": text}], add_generation_prompt=False)
    except ChatTemplateError:
        return 0
    return len(prefix) if prompt_ids[:len(prefix)] == prefix else 0
