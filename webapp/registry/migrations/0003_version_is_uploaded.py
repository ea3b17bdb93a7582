"""ModelVersion.is_uploaded: which versions' files Pagoda stored (and so may delete)."""

from pathlib import Path

from django.conf import settings
from django.db import migrations, models


def mark_existing_uploads(apps, schema_editor):
    """An existing version whose path is its own upload folder (or a file in it) was uploaded;
    anything else was registered in place and keeps its files."""
    ModelVersion = apps.get_model("registry", "ModelVersion")
    uploads_root = (Path(settings.MEDIA_ROOT) / "models").resolve()
    for version in ModelVersion.objects.select_related("model"):
        upload_dir = uploads_root / version.model.slug / f"v{version.number}"
        path = Path(version.path)
        if path == upload_dir or path.parent == upload_dir:
            ModelVersion.objects.filter(pk=version.pk).update(is_uploaded=True)


class Migration(migrations.Migration):
    dependencies = [("registry", "0002_upload_validation")]

    operations = [
        migrations.AddField(model_name="modelversion", name="is_uploaded", field=models.BooleanField(default=False)),
        migrations.RunPython(mark_existing_uploads, migrations.RunPython.noop),
    ]
