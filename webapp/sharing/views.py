"""Sharing pages: create a link, the owner's "shared links" list and revoke, the read-only page, and
the staff setting. The shared page has no socket and no input: it only renders the snapshot."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from webapp.chat.selectors import conversation_get
from webapp.console.access import staff_required
from webapp.sharing.selectors import (share_get_live, share_get_owned, share_list, share_may_view,
                                      sharing_settings_get)
from webapp.sharing.services import (ShareInputError, parse_message_ids, share_create, share_revoke,
                                     sharing_settings_update)


def _share_url(request, share) -> str:
    return request.build_absolute_uri(reverse("sharing:view", args=[share.token]))


@login_required
@require_POST
def share_create_view(request):
    conversation = conversation_get(user=request.user, conversation_id=request.POST.get("conversation"))
    if conversation is None:
        raise Http404("no such conversation")
    try:
        share = share_create(conversation=conversation, message_ids=parse_message_ids(request.POST.get("messages", "")))
    except ShareInputError as error:
        return render(request, "sharing/error.html", {"param": error.param, "message": str(error)}, status=400)
    return redirect(f"{reverse('sharing:list')}?created={share.pk}")


@login_required
@require_GET
def share_list_view(request):
    created = request.GET.get("created", "")
    shares = [{"share": s, "url": _share_url(request, s), "is_new": str(s.pk) == created}
              for s in share_list(user=request.user)]
    return render(request, "sharing/list.html", {"shares": shares,
                                                 "allow_anonymous": sharing_settings_get().allow_anonymous})


@login_required
@require_POST
def share_revoke_view(request, share_id: int):
    share = share_get_owned(user=request.user, share_id=share_id)
    if share is None:
        raise Http404("no such shared link")
    share_revoke(share=share)
    return redirect("sharing:list")


@require_GET
def shared_page(request, token: str):
    share = share_get_live(token=token)
    if share is None:
        raise Http404("no such shared conversation")  # unknown and revoked read the same
    if not share_may_view(user=request.user):
        return redirect_to_login(request.get_full_path())
    state = {"title": str(share.title), "messages": share.messages}
    response = render(request, "sharing/shared.html", {"share": share, "state": state})
    response["X-Robots-Tag"] = "noindex, nofollow"
    response["Cache-Control"] = "private, no-store"  # a revoke must not be outlived by a cached copy
    return response


@staff_required
@require_http_methods(["GET", "POST"])
def sharing_settings_view(request):
    if request.method == "POST":
        sharing_settings_update(allow_anonymous=request.POST.get("allow_anonymous") == "on")
        return redirect("sharing:settings")
    return render(request, "sharing/settings.html", {"settings": sharing_settings_get(), "page": "sharing"})
