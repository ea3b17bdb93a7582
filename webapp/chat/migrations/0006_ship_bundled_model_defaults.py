"""Data: the bundled model's chat defaults (webapp/chat/shipped_defaults.py) on a site that has it.
A site that registers it later gets them from the registry's post_save (webapp/chat/apps.py)."""

from django.db import migrations

from webapp.chat.shipped_defaults import SHIPPED, defaults_ship


def ship(apps, schema_editor):
    Model = apps.get_model("registry", "Model")
    ModelChatDefaults = apps.get_model("chat", "ModelChatDefaults")
    for model in Model.objects.filter(slug__in=SHIPPED):
        defaults_ship(model=model, defaults_model=ModelChatDefaults)


def unship(apps, schema_editor):
    pass  # defaults staff may have edited since stay


class Migration(migrations.Migration):
    dependencies = [("chat", "0005_preset_prefix_sharing"), ("registry", "0003_version_is_uploaded")]
    operations = [migrations.RunPython(ship, unship)]
