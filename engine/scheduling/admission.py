"""What a request must satisfy before the engine stores anything of it (LLMEngine.add_request).

Pure checks of one request against the model and the KV pool; each raises the engine's typed
error naming what is wrong (InvalidParameterError with the parameter, ContextLengthExceededError
with the numbers), so that ``add_request`` either succeeds whole or leaves nothing behind.
"""

from __future__ import annotations

from engine.errors import ContextLengthExceededError, InvalidParameterError
from engine.sampling_params import SamplingParams
from engine.tenancy import Tenant


def check_request(request_id: object, params: SamplingParams | None, priority: object) -> SamplingParams:
    """The request's own fields; returns its parameters (the defaults when None)."""
    if not isinstance(request_id, str):
        raise InvalidParameterError("request_id", "must be a string")
    params = params or SamplingParams()
    if not isinstance(params, SamplingParams):
        raise InvalidParameterError("params", "must be a SamplingParams")
    params.validate()  # again: a field may have been set after construction
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise InvalidParameterError("priority", f"must be an integer, got {priority!r}")
    return params


def encode_prompt(tokenizer, prompt: str | list[int], vocab_size: int) -> list[int]:
    """Text through the tokenizer, or token ids checked against the vocabulary; never empty."""
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt, add_special_tokens=True)
    elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool)
                                                   for t in prompt):
        ids = list(prompt)
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidParameterError("prompt", f"token ids out of range [0, {vocab_size}): {bad[:5]}")
    else:
        raise InvalidParameterError("prompt", "must be a string or a list of token ids")
    if not ids:
        raise InvalidParameterError("prompt", "must not be empty")
    return ids


def check_tenancy(tenant: object, shared_prefix_len: object, num_prompt: int) -> Tenant:
    """The request's tenant (the engine's single one when None); its shared prefix must lie within
    the prompt (refused, not clamped: the serving layer computed it from this very prompt)."""
    tenant = Tenant() if tenant is None else tenant
    if not isinstance(tenant, Tenant):
        raise InvalidParameterError("tenant", f"must be an engine.tenancy.Tenant, got {type(tenant).__name__}")
    if (isinstance(shared_prefix_len, bool) or not isinstance(shared_prefix_len, int)
            or not 0 <= shared_prefix_len <= num_prompt):
        raise InvalidParameterError("shared_prefix_len", f"must be an integer from 0 to the prompt's "
                                    f"{num_prompt} tokens, got {shared_prefix_len!r}")
    return tenant


def check_token_ids(params: SamplingParams, vocab_size: int) -> None:
    """Token ids the parameters name (stop_token_ids, logit_bias) exist in the vocabulary."""
    if any(t >= vocab_size for t in params.stop_token_ids):
        raise InvalidParameterError("stop_token_ids", f"token ids must be below the vocabulary size {vocab_size}")
    if params.logit_bias and max(params.logit_bias) >= vocab_size:
        raise InvalidParameterError("logit_bias", f"token ids must be below the vocabulary size {vocab_size}")


def check_length(num_prompt: int, max_tokens: int | None, *, max_model_len: int, block_size: int,
                 num_blocks: int) -> int:
    """The request's max_tokens (the rest of the context when None) if it fits both the context
    and the whole KV pool; ContextLengthExceededError otherwise."""
    if max_tokens is None:
        max_tokens = max_model_len - num_prompt
    if num_prompt + max_tokens > max_model_len or max_tokens < 1:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt + max(max_tokens, 1)} tokens ({num_prompt} in the prompt, "
            f"{max(max_tokens, 1)} in the completion). Please reduce the length of the prompt "
            f"or completion.")
    if -(-(num_prompt + max_tokens) // block_size) > num_blocks:
        raise ContextLengthExceededError(
            f"The KV cache holds {num_blocks * block_size} tokens in all, but this request needs up to "
            f"{num_prompt + max_tokens} ({num_prompt} in the prompt, {max_tokens} in the "
            f"completion). Please reduce the length of the prompt or completion.")
    return max_tokens
