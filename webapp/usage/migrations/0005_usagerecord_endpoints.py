# The endpoints added in one wave: the embeddings, Anthropic's Messages and OpenAI's Responses.
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('usage', '0004_usagerecord_running'),
    ]

    operations = [
        migrations.AlterField(
            model_name='usagerecord',
            name='endpoint',
            field=models.CharField(choices=[('chat.completions', 'Chat Completions'), ('completions', 'Completions'), ('embeddings', 'Embeddings'), ('messages', 'Messages'), ('responses', 'Responses')], max_length=32),
        ),
    ]
