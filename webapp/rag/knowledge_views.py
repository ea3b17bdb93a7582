"""The knowledge-base pages under /account/knowledge/: a user's and their teams' bases, made and
filled there (webapp.rag.knowledge decides who may); the chat page attaches them to a conversation."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from webapp.orgs.access import MANAGERS
from webapp.orgs.models import Membership
from webapp.rag.knowledge import (KnowledgeError, base_create, base_delete, base_get_readable, can_write,
                                  document_add, document_delete)
from webapp.rag.models import KnowledgeBase
from webapp.rag.selectors import readable_knowledge_bases
from webapp.rag.vectors import active_embedder


def _base(request, base_id: int) -> KnowledgeBase:
    base = base_get_readable(user=request.user, base_id=base_id)
    if base is None:  # not there, or not readable: the same answer
        raise Http404("no such knowledge base")
    return base


@login_required
def knowledge_list(request):
    if request.method == "POST":
        team = None
        if request.POST.get("team"):
            membership = (Membership.objects.filter(user=request.user, team_id=request.POST["team"])
                          .select_related("team").first())
            if membership is None:
                raise Http404("no such team")
            team = membership.team
        try:
            base = base_create(user=request.user, name=request.POST.get("name", ""), team=team)
        except KnowledgeError as exc:
            messages.error(request, exc.message)
            return redirect("rag:knowledge")
        return redirect("rag:knowledge-base", base_id=base.pk)
    bases = readable_knowledge_bases(user_id=request.user.pk).select_related("team")
    teams = [m.team for m in Membership.objects.filter(user=request.user, role__in=MANAGERS).select_related("team")]
    return render(request, "rag/knowledge_list.html", {"page": "knowledge", "bases": bases, "teams": teams})


@login_required
def knowledge_base(request, base_id: int):
    base = _base(request, base_id)
    if request.method == "POST":
        upload = request.FILES.get("file")
        if upload is None:
            messages.error(request, "Choose a file to add.")
        else:
            try:
                document = document_add(user=request.user, base=base, name=upload.name, data=upload.read(),
                                        embedder=active_embedder(owner_id=request.user.pk))
                messages.success(request, f"Added {document.name}: {document.chunks.count()} passages indexed.")
            except KnowledgeError as exc:
                messages.error(request, f"Not added: {exc.message}")
        return redirect("rag:knowledge-base", base_id=base.pk)
    documents = base.documents.order_by("name", "id")
    return render(request, "rag/knowledge_base.html", {"page": "knowledge", "base": base, "documents": documents,
                                                       "can_write": can_write(user=request.user, base=base)})


@login_required
@require_POST
def knowledge_document_delete(request, base_id: int, document_id: int):
    base = _base(request, base_id)
    try:
        document_delete(user=request.user, base=base, document_id=document_id)
    except KnowledgeError as exc:
        messages.error(request, exc.message)
    return redirect("rag:knowledge-base", base_id=base.pk)


@login_required
@require_POST
def knowledge_base_delete(request, base_id: int):
    base = _base(request, base_id)
    try:
        base_delete(user=request.user, base=base)
    except KnowledgeError as exc:
        messages.error(request, exc.message)
        return redirect("rag:knowledge-base", base_id=base.pk)
    messages.success(request, f"Deleted the knowledge base {base.name}.")
    return redirect("rag:knowledge")
