from django.apps import AppConfig


class OpenAIApiConfig(AppConfig):
    """The OpenAI-compatible REST API: /v1/models, /v1/chat/completions, /v1/completions."""

    name = "webapp.openai_api"
    label = "openai_api"

    def ready(self):
        """Load shedding for every generation of this process (the API's and the chat's)."""
        from django.conf import settings

        from workers.connect import set_admission
        from workers.transport import Admission

        set_admission(Admission(max_queued=settings.PAGODA_MAX_QUEUED_PER_MODEL,
                                queue_timeout_s=settings.PAGODA_QUEUE_TIMEOUT_S,
                                request_timeout_s=settings.PAGODA_REQUEST_TIMEOUT_S))
