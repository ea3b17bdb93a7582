"""The search results page and the sidebar's live results (JSON for its dropdown)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from webapp.search.query import MAX_QUERY_CHARS
from webapp.search.selectors import conversation_search

DROPDOWN_RESULTS = 8


@login_required
@require_GET
def search_page(request):
    text = request.GET.get("q", "")[:MAX_QUERY_CHARS]
    hits = conversation_search(user=request.user, text=text) if text.strip() else []
    return render(request, "search/results.html", {"q": text, "hits": hits})


@require_GET
def search_suggest(request):
    if not request.user.is_authenticated:
        return JsonResponse({"error": {"message": "log in to search", "type": "invalid_request_error",
                                       "param": None, "code": "not_authenticated"}}, status=401)
    hits = conversation_search(user=request.user, text=request.GET.get("q", ""), limit=DROPDOWN_RESULTS)
    return JsonResponse({"results": [hit.to_dict() for hit in hits]})
