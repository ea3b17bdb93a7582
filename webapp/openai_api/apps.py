from django.apps import AppConfig


class OpenAIApiConfig(AppConfig):
    """The OpenAI-compatible REST API: /v1/models, /v1/chat/completions, /v1/completions."""

    name = "webapp.openai_api"
    label = "openai_api"
