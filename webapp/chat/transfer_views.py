"""Export (one conversation or all of the user's, as Markdown or JSON) and import of a JSON export."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from webapp.chat.markdown_export import conversations_markdown
from webapp.chat.selectors import conversation_get, conversation_list
from webapp.chat.transfer import MAX_IMPORT_BYTES, ImportRefused, conversations_export, conversations_import
from webapp.openai_api.body import JsonInputError, json_read

FORMATS = {"md": "text/markdown; charset=utf-8", "json": "application/json"}


def _download(request, conversations, fmt: str, name: str) -> HttpResponse:
    if fmt == "json":
        body = json.dumps(conversations_export(user=request.user, conversations=conversations), ensure_ascii=False,
                          indent=1)
    else:
        body = conversations_markdown(conversations)
    response = HttpResponse(body, content_type=FORMATS[fmt])
    response["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return response


@login_required
@require_GET
def conversation_export_view(request, conversation_id: int, fmt: str):
    conversation = conversation_get(user=request.user, conversation_id=conversation_id)
    if conversation is None or fmt not in FORMATS:
        raise Http404("no such conversation")
    return _download(request, [conversation], fmt, f"pagoda-conversation-{conversation.pk}")


@login_required
@require_GET
def conversations_export_view(request, fmt: str):
    if fmt not in FORMATS:
        raise Http404("no such format")
    stamp = timezone.localtime().strftime("%Y%m%d-%H%M")
    return _download(request, list(conversation_list(user=request.user)), fmt, f"pagoda-conversations-{stamp}")


def _refused(request, message: str) -> HttpResponse:
    return render(request, "chat/import_error.html", {"message": message}, status=400)


@login_required
@require_POST
def conversations_import_view(request):
    """POST a JSON export (multipart ``file``): its conversations recreated, then the first shown;
    a refusal (400) says why and creates nothing."""
    upload = request.FILES.get("file")
    if upload is None:
        return _refused(request, "No file was sent.")
    if upload.size > MAX_IMPORT_BYTES:
        return _refused(request, f"The file is larger than {MAX_IMPORT_BYTES // (1024 * 1024)} MiB.")
    try:
        document = json_read(upload.read())
        imported = conversations_import(user=request.user, document=document)
    except JsonInputError:
        return _refused(request, "This file is not a Pagoda conversations export (it is not JSON).")
    except ImportRefused as exc:
        return _refused(request, exc.message)
    return redirect("chat:conversation", conversation_id=imported[0].pk) if imported else redirect("chat:index")
