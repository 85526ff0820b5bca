"""What the package index shows and what the wheel ships: the distribution's name, its links, no demo commands."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_distribution_is_django_chasqui_with_its_project_urls():
    project = PYPROJECT["project"]
    assert project["name"] == "django-chasqui"  # "chasqui" on the index is an unrelated project
    urls = project["urls"]
    assert {"Homepage", "Documentation", "Source", "Changelog", "Issues"} <= set(urls)
    assert all(url.startswith("https://") for url in urls.values())


def test_the_readme_installs_django_chasqui_and_its_links_work_on_the_index_page():
    readme = (ROOT / "README.md").read_text()
    assert "pip install django-chasqui\n" in readme and "pip install chasqui\n" not in readme
    relative = re.findall(r"\]\((?!https?://|#|mailto:)([^)]+)\)", readme)
    assert relative == [], f"links that only work inside the repository: {relative}"
    source = PYPROJECT["project"]["urls"]["Source"]
    for target in re.findall(rf"\]\({re.escape(source)}/blob/main/([^)#]+)", readme):
        assert (ROOT / target).exists(), f"the README links to {target}, which is not in the repository"


def test_the_wheel_ships_no_demo_command():
    tool = PYPROJECT["tool"]["setuptools"]
    folders = {name: ROOT / tool["package-dir"].get(name, name.replace(".", "/")) for name in tool["packages"]}
    shipped = {path.stem for folder in folders.values() for path in folder.glob("*.py")}
    assert "config" not in {name.split(".")[0] for name in tool["packages"]}
    assert {"devstack", "ensure_admin"} & shipped == set()
    assert {"runworker", "chasqui"} <= shipped
