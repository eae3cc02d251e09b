"""The configuration is declared once: the reference page is generated from the
declaration, the deploy manifests name only declared variables, and nothing outside
falcon_es/config reads the environment."""

from __future__ import annotations

import re
from pathlib import Path

from falcon_es.config.fields import variables_of
from falcon_es.config.reference import PAGE, reference
from falcon_es.config.settings import Settings
from falcon_es.config.source import groups_of

ROOT = Path(__file__).resolve().parent.parent


def declared_variables() -> set[str]:
    return {name for _, model in groups_of(Settings) for field in model.model_fields.values()
            for name in variables_of(field)}


def test_the_reference_page_is_the_generated_one() -> None:
    committed = (ROOT / PAGE).read_text(encoding="utf-8")
    assert committed == reference(), (
        "docs/reference/configuration.md is out of date: run "
        "python -m falcon_es.config.reference --write")


def test_every_variable_the_manifests_set_is_declared() -> None:
    used = {name for path in (ROOT / "deploy").rglob("*.yaml")
            for name in re.findall(r"\bFALCON_[A-Z0-9_]+", path.read_text(encoding="utf-8"))}
    runtime = {"FALCON_POD_NAME", "FALCON_LOG_DIR"}  # set in the tasks' pods, not read here
    assert used - runtime <= declared_variables(), used - runtime - declared_variables()


def test_only_the_config_package_reads_the_environment() -> None:
    readers = [str(path.relative_to(ROOT)) for path in (ROOT / "falcon_es").rglob("*.py")
               if "config" not in path.relative_to(ROOT / "falcon_es").parts
               and re.search(r"os\.environ|os\.getenv|envvar=", path.read_text(encoding="utf-8"))]
    assert readers == []


def test_each_setting_names_its_variable_and_says_what_it_does() -> None:
    for group, model in groups_of(Settings):
        for name, field in model.model_fields.items():
            assert variables_of(field), f"{group}.{name} has no variable"
            assert field.description, f"{group}.{name} has no doc line"
