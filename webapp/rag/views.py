"""A cited passage for the chat page's side panel, as JSON; only the owner of its document sees it."""

from __future__ import annotations

from django.http import JsonResponse
from django.views.decorators.http import require_GET

from webapp.rag.selectors import passage_get


@require_GET
def passage_view(request, chunk_id: int):
    if not request.user.is_authenticated:
        return JsonResponse({"error": "Log in to read this passage."}, status=401)
    passage = passage_get(owner_id=request.user.pk, chunk_id=chunk_id)
    if passage is None:  # not there, or someone else's: the same answer
        return JsonResponse({"error": "This passage is not one of your documents'."}, status=404)
    return JsonResponse(passage)
