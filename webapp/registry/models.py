"""Served models and their versions (a checkpoint path plus the engine settings to run it with)."""

from django.db import models
from django.db.models import Q


class Model(models.Model):
    """What clients name in ``"model": "<slug>"``; at most one version serves it at a time."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class ModelVersion(models.Model):
    class Format(models.TextChoices):
        GGUF = "gguf", "GGUF file"
        HF = "hf", "Hugging Face directory"

    class Status(models.TextChoices):
        REGISTERED = "registered"  # known, not served
        ACTIVE = "active"  # served: embedded/distributed workers load it
        INACTIVE = "inactive"  # was served, replaced or switched off
        FAILED = "failed"  # preparation or validation failed; see `error`
        VALIDATING = "validating"  # uploaded; registry.validate_model_version is checking it
        READY = "ready"  # uploaded and validated, not served yet

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()  # 1, 2, ... per model
    path = models.CharField(max_length=1024)
    # Stored by Pagoda (an upload, under MEDIA_ROOT/models/<slug>/v<number>/): its files go with the
    # version. False for a registered path, whose files are never deleted, wherever they are.
    is_uploaded = models.BooleanField(default=False)
    format = models.CharField(max_length=8, choices=Format.choices)
    # EngineConfig keyword arguments (validated by registry.engine_settings).
    engine_settings = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.REGISTERED)
    # tokenizer.json + tokenizer_config.json exported once by `python -m engine.cli.tokenizer_export`.
    tokenizer_dir = models.CharField(max_length=1024, blank=True)
    # A chat template staff set for this version (registry/chat_templates.py): a preset's name,
    # "custom" with ``chat_template``, or "" for the checkpoint's own.
    chat_template_preset = models.CharField(max_length=16, blank=True)
    chat_template = models.TextField(blank=True)
    error = models.TextField(blank=True)
    # Validation of an upload (python -m engine.cli.validate): current step, 0..1, and its final report
    # {"parameters", "context_length", "size_bytes", "checksum"}.
    step = models.CharField(max_length=100, blank=True)
    progress = models.FloatField(default=0.0)
    validation = models.JSONField(default=dict, blank=True)
    # When the validation job (a conversion first, if asked) started and ended: the console's jobs page.
    job_started_at = models.DateTimeField(null=True, blank=True)
    job_finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    activated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["model__slug", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["model", "number"], name="registry_version_number_unique"),
            models.UniqueConstraint(fields=["model"], condition=Q(status="active"),
                                    name="registry_one_active_version_per_model"),
        ]

    def __str__(self) -> str:
        return f"{self.model.slug} v{self.number}"

    @property
    def label(self) -> str:
        """The version as workers announce it (WorkerInfo.version)."""
        return str(self.number)


class Adapter(models.Model):
    """A LoRA adapter of a model (a PEFT folder, checked against the base's active version at
    upload). Clients name it ``"<base>:<name>"`` or ``"<name>"``; the base's workers serve it."""

    base = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="adapters")
    # Unique across adapters and never a model's slug (webapp/registry/adapters.py checks), so a
    # bare name resolves to one thing.
    name = models.SlugField(max_length=64, unique=True)
    path = models.CharField(max_length=1024)  # MEDIA_ROOT/adapters/<base>/<name>-<id>/, one per upload
    rank = models.PositiveIntegerField()
    target_modules = models.JSONField(default=list)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["base__slug", "name"]

    def __str__(self) -> str:
        return f"{self.base.slug}:{self.name}"
