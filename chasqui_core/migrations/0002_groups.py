"""Create Chasqui's permissions and the "Chasqui operators" / "Chasqui viewers" groups."""

from django.db import migrations


def create_groups(apps, schema_editor):
    from chasqui_core.access import ensure_groups

    ensure_groups(apps)


class Migration(migrations.Migration):
    dependencies = [
        ("chasqui_core", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(create_groups, migrations.RunPython.noop),
    ]
