"""The chat defaults Pagoda ships for its bundled model (staff change them in the console).

At temperature 1, the API's default, the 135M SmolLM2 rambles and drifts off topic; at 0.3 (top p
0.9, 512 tokens at most) it stays on point. The system prompt is the one its chat template adds when
a conversation has none, the one it was tuned with: now shown in the settings panel and editable,
with the same tokens as before (greedy answers and the prefix cache are unchanged). No repetition
penalty: it counts the prompt's tokens too, and pushed the model off quoting an attached document
(tests/e2e/test_chat_documents_browser.py failed with 1.1). Applied by the data migration chat 0006 to a site that already has the model, and by
``defaults_ship`` when the model is registered later (``make run``'s ensure_bundled_model runs
after migrate on a fresh site); never over defaults staff have set.
"""

from __future__ import annotations

SHIPPED = {
    "smollm2": {
        "sampling": {"temperature": 0.3, "top_p": 0.9, "max_tokens": 512},
        "system_prompt": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    },
}


def defaults_ship(*, model, defaults_model) -> bool:
    """Give ``model`` its shipped chat defaults unless it has some; True if it got them.
    ``defaults_model`` is ModelChatDefaults (the migration passes its historical one)."""
    shipped = SHIPPED.get(model.slug)
    if shipped is None or defaults_model.objects.filter(model_id=model.pk).exists():
        return False
    defaults_model.objects.create(model_id=model.pk, sampling=dict(shipped["sampling"]),
                                  system_prompt=shipped["system_prompt"])
    return True
