"""Writes of usage records."""

from __future__ import annotations

from webapp.usage.models import UsageRecord


def usage_record_create(*, request_id: str, endpoint: str, status: str, latency: float, api_key=None,
                        user=None, model=None, version=None, model_name: str = "", prompt_tokens: int = 0,
                        completion_tokens: int = 0, cached_prompt_tokens: int = 0,
                        time_to_first_token: float | None = None, finish_reason: str | None = None,
                        error_code: str | None = None) -> UsageRecord:
    record = UsageRecord(
        api_key=api_key, user=user, model=model, version=version, model_name=model_name,
        request_id=request_id, endpoint=endpoint, prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens, cached_prompt_tokens=cached_prompt_tokens,
        time_to_first_token=time_to_first_token, latency=latency, status=status,
        finish_reason=finish_reason or "", error_code=error_code or "")
    record.full_clean(exclude=["api_key", "user", "model", "version"])  # links were just loaded
    record.save()
    return record
