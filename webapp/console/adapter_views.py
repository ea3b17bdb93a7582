"""The console's LoRA adapters (staff only), on the models page: upload a zip of a PEFT adapter
folder for a model, checked against its active version before it is served; switch one off or on."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404

from webapp.console.model_views import _tell, staff_post
from webapp.registry.adapters import adapter_set_active, adapter_upload
from webapp.registry.models import Adapter


@staff_post
def adapter_upload_view(request):
    def attempt() -> str:
        base, name = request.POST.get("base", "").strip(), request.POST.get("name", "").strip()
        uploaded = request.FILES.get("file")
        if not base or not name or uploaded is None:
            raise ValidationError("choose a base model, a name and a .zip of the adapter folder")
        adapter = adapter_upload(base_slug=base, name=name, uploaded_file=uploaded)
        return (f"Adapter {adapter} (rank {adapter.rank}, {', '.join(adapter.target_modules)}) fits "
                f"{adapter.base.slug} and is served as {adapter.name!r} or {str(adapter)!r}.")

    return _tell(request, attempt, "Adapter refused")


@staff_post
def adapter_toggle(request, adapter_id: int):
    adapter = get_object_or_404(Adapter, pk=adapter_id)

    def attempt() -> str:
        adapter_set_active(adapter=adapter, is_active=not adapter.is_active)
        return f"Adapter {adapter} {'activated' if adapter.is_active else 'switched off'}."

    return _tell(request, attempt, "Adapter change refused")
