"""The chat page, the sidebar's rename / delete and a PDF's text for the page to attach; the
conversation itself runs over the WebSocket."""

from __future__ import annotations

from pathlib import PurePosixPath

from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from webapp.chat.documents import MAX_NAME_CHARS, MAX_PDF_BYTES, DocumentError, pdf_text
from webapp.chat.boards import get_answer_board
from webapp.chat.selectors import (chat_defaults_by_model, conversation_get, conversation_list, message_path_dicts,
                                   preset_list)
from webapp.chat.services import conversation_delete, conversation_rename
from webapp.keys.selectors import chatlimits_allowed_slugs
from webapp.keys.services import chatlimits_get_or_create
from webapp.rag.selectors import readable_knowledge_bases
from webapp.registry.selectors import modelversion_list_active


def _owned(request, conversation_id: int):
    conversation = conversation_get(user=request.user, conversation_id=conversation_id)
    if conversation is None:
        raise Http404("no such conversation")
    return conversation


@login_required
def chat_page(request, conversation_id: int | None = None):
    conversation = _owned(request, conversation_id) if conversation_id is not None else None
    models = chatlimits_allowed_slugs(limits=chatlimits_get_or_create(user=request.user),
                                      slugs=[version.model.slug for version in modelversion_list_active()])
    running = get_answer_board().running_ids(user=request.user)  # answers still being written
    bases = list(readable_knowledge_bases(user_id=request.user.pk).select_related("team"))
    state = {
        "conversation": {"id": conversation.pk, "title": conversation.title} if conversation else None,
        "messages": message_path_dicts(conversation=conversation) if conversation else [],
        "models": models,
        "model": conversation.model_name if conversation and conversation.model_name in models
        else (models[0] if models else ""),
        "system_prompt": conversation.system_prompt if conversation else "",
        "running": bool(conversation and conversation.pk in running),
        "sampling": conversation.sampling if conversation else {},
        "defaults": chat_defaults_by_model(slugs=models),  # staff's, per model
        "presets": preset_list(user=request.user),
        # The knowledge bases this user may read, and which of them the conversation has attached.
        "knowledge_bases": [{"id": b.pk, "name": b.name, "team": b.team.name if b.team else None}
                            for b in bases],
        "attached_bases": [b.pk for b in bases if conversation and b.conversations.filter(pk=conversation.pk).exists()],
    }
    return render(request, "chat/index.html", {
        "conversations": conversation_list(user=request.user), "conversation": conversation,
        "models": models, "state": state,
        "running": running})


@login_required
@require_POST
def conversation_rename_view(request, conversation_id: int):
    conversation = _owned(request, conversation_id)
    title = request.POST.get("title", "").strip()
    if title:
        conversation_rename(conversation=conversation, title=title)
    return redirect("chat:conversation", conversation_id=conversation.pk)


@login_required
@require_POST
def conversation_delete_view(request, conversation_id: int):
    conversation_delete(conversation=_owned(request, conversation_id))
    return redirect("chat:index")


@login_required
@require_POST
def document_text_view(request):
    """POST a PDF (multipart ``file``): its text as {"name", "text"}, or 400 {"error"} saying why not."""
    upload = request.FILES.get("file")
    if upload is None:
        return JsonResponse({"error": "No file was sent."}, status=400)
    name = PurePosixPath(upload.name.replace("\\", "/")).name[:MAX_NAME_CHARS]
    if upload.size > MAX_PDF_BYTES:
        return JsonResponse({"error": f"{name} is larger than {MAX_PDF_BYTES // (1024 * 1024)} MiB."}, status=400)
    try:
        text = pdf_text(name, upload.read())
    except DocumentError as exc:
        return JsonResponse({"error": exc.message}, status=400)
    return JsonResponse({"name": name, "text": text})
