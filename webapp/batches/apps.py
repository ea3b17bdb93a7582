from django.apps import AppConfig


class BatchesConfig(AppConfig):
    """OpenAI's Batch API: uploaded JSONL files of requests, run as a background job at the
    engine's lowest priority; in embedded mode the server also resumes batches a restart cut short."""

    name = "webapp.batches"
    label = "batches"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from webapp.config.embedded_jobs import embedded_server

        if embedded_server():  # the only runner of a batch is this process: any unfinished one was cut short
            from webapp.batches.resume import resume_batches_when_ready

            resume_batches_when_ready()
