"""Chat templates staff set for a model version whose checkpoint has none (Gemma 3 270M's GGUF)
or the wrong one: a named preset, which carries the tokens that end its turns, or a custom
jinja template, checked on save by rendering a short conversation."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ValidationError

from webapp.registry.tokenizers import ChatTemplateError, ModelTokenizer

CUSTOM = "custom"


@dataclass(frozen=True)
class Preset:
    label: str
    template: str
    stop_tokens: tuple[str, ...]  # the turn's end: each request stops at these tokens


PRESETS = {
    "chatml": Preset("ChatML", (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
        " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\n' }}{% endif %}"), ("<|im_end|>",)),
    # Gemma's own: no system role, the system prompt opens the first user turn
    "gemma": Preset("Gemma", (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
        "{% set first = messages[0]['content'] + '\n\n' %}{% set messages = messages[1:] %}"
        "{% else %}{% set first = '' %}{% endif %}"
        "{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant'"
        " else message['role'] %}{{ '<start_of_turn>' + role + '\n' + (first if loop.first else '')"
        " + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"),
        ("<end_of_turn>",)),
    "llama3": Preset("Llama 3", (
        "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] +"
        " '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
        "{% endif %}"), ("<|eot_id|>",)),
}
CHOICES = [("", "the checkpoint's own")] + [(k, p.label) for k, p in PRESETS.items()] + [
    (CUSTOM, "custom (jinja)")]
SAMPLE = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
          {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Bye"}]


def chat_template_of(preset: str, template: str) -> tuple[str, tuple[str, ...]]:
    """(jinja text, stop tokens) of a version's choice; ("", ()) for the checkpoint's own."""
    if preset in PRESETS:
        return PRESETS[preset].template, PRESETS[preset].stop_tokens
    return (template, ()) if preset == CUSTOM else ("", ())


def chat_template_validate(*, preset: str, template: str, tokenizer: ModelTokenizer | None) -> None:
    """ValidationError naming the field: an unknown preset, an empty or broken custom template,
    a preset whose stop tokens the model's vocabulary lacks."""
    if preset not in PRESETS and preset not in ("", CUSTOM):
        raise ValidationError({"chat_template_preset": f"unknown preset {preset!r}; choose one of "
                               f"{', '.join(PRESETS)} or {CUSTOM}"})
    if preset == CUSTOM and not template.strip():
        raise ValidationError({"chat_template": "a custom chat template is empty"})
    text, stops = chat_template_of(preset, template)
    if not text or tokenizer is None:
        return
    try:
        tokenizer.with_chat_template(text, stops).render_chat(SAMPLE)
    except ChatTemplateError as exc:
        raise ValidationError({"chat_template": f"the template does not render a conversation: {exc}"})
    except KeyError as exc:
        raise ValidationError({"chat_template_preset": f"{exc.args[0]}"})


def add_turn_ends(params: dict, tokenizer: ModelTokenizer) -> dict:
    """A chat request's sampling keywords, stopping also at the staff-set template's turn end."""
    if tokenizer.chat_stop_token_ids:
        params["stop_token_ids"] = list(dict.fromkeys([*(params.get("stop_token_ids") or []),
                                                       *tokenizer.chat_stop_token_ids]))
    return params
