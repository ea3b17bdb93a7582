"""The console's chat defaults: per model, the sampling values and system prompt the chat page
starts from (webapp/chat/defaults.py)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from webapp.chat.defaults import chat_defaults_rows, chat_defaults_update
from webapp.chat.sampling import SamplingError
from webapp.console.access import staff_required
from webapp.registry.models import Model


class ChatDefaultsForm(forms.Form):
    temperature = forms.FloatField(required=False)
    top_p = forms.FloatField(required=False)
    top_k = forms.IntegerField(required=False)
    repetition_penalty = forms.FloatField(required=False)
    max_tokens = forms.IntegerField(required=False)
    system_prompt = forms.CharField(required=False, max_length=20_000)


@staff_required
def chat_defaults_page(request):
    return render(request, "console/chat_defaults.html", {"rows": chat_defaults_rows(), "page": "chat-defaults"})


@staff_required
@require_POST
def chat_defaults_save(request, model_id: int):
    model = get_object_or_404(Model, pk=model_id)
    form = ChatDefaultsForm(request.POST)
    if not form.is_valid():
        field, errors = next(iter(form.errors.items()))
        messages.error(request, f"Chat defaults of {model.slug} not changed: {field}: {' '.join(errors)}")
        return redirect("console:chat-defaults")
    data = dict(form.cleaned_data)
    try:
        chat_defaults_update(model=model, system_prompt=data.pop("system_prompt"), values=data)
    except SamplingError as exc:
        messages.error(request, f"Chat defaults of {model.slug} not changed: {exc.message}")
    else:
        messages.success(request, f"Chat defaults of {model.slug} saved.")
    return redirect("console:chat-defaults")
