"""Staff's per-model chat defaults: what the console edits (services) and reads (selectors).

The chat page starts a new conversation from them and says, field by field, whether a value is
the model's default or the user's own (static/chat/settings.js); a turn's own values win over them
(services.turn_prepare)."""

from __future__ import annotations

from django.db import transaction

from webapp.chat.models import ModelChatDefaults
from webapp.chat.sampling import SamplingError, sampling_params
from webapp.registry.models import Model

# The fields the console's form edits; other sampling keys set in the admin are kept as they are.
EDITED = ("temperature", "top_p", "top_k", "repetition_penalty", "max_tokens")


def chat_defaults_rows() -> list[dict]:
    """Every registered model with its defaults (empty where staff set none)."""
    defaults = {d.model_id: d for d in ModelChatDefaults.objects.all()}
    rows = []
    for model in Model.objects.order_by("slug"):
        d = defaults.get(model.pk)
        sampling = d.sampling if d else {}
        rows.append({"model": model, "system_prompt": d.system_prompt if d else "",
                     "values": {name: sampling.get(name) for name in EDITED}})
    return rows


@transaction.atomic
def chat_defaults_update(*, model: Model, values: dict, system_prompt: str) -> ModelChatDefaults:
    """Set the edited fields (None: no default, the engine's) and the system prompt; SamplingError
    naming a value outside the API's limits."""
    defaults, _ = ModelChatDefaults.objects.select_for_update().get_or_create(model=model)
    sampling = {k: v for k, v in defaults.sampling.items() if k not in EDITED}
    sampling.update({k: v for k, v in values.items() if k in EDITED and v is not None})
    checked = sampling_params(sampling)  # raises for a value the API would refuse
    defaults.sampling = {k: checked.get(k, v) for k, v in sampling.items()}
    defaults.system_prompt = system_prompt.strip()
    defaults.save()
    return defaults
