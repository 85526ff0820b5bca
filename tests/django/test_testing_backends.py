"""chasqui_core.testing: a project's tests run tasks declared with Chasqui's options under Django's backends."""

from __future__ import annotations

import importlib
import sys

import pytest
from django.tasks import TaskResultStatus, task_backends
from django.test import override_settings

MODULE = "tests.django.testing_tasks"


@pytest.mark.parametrize("backend, status", [("chasqui_core.testing.ImmediateBackend", TaskResultStatus.SUCCESSFUL),
                                             ("chasqui_core.testing.DummyBackend", TaskResultStatus.READY)])
def test_a_task_with_chasqui_options_runs_under_a_test_backend(backend, status):
    with override_settings(TASKS={"default": {"BACKEND": backend}}):
        sys.modules.pop(MODULE, None)
        try:
            tasks = importlib.import_module(MODULE)  # declared as a project's tasks.py declares it
            result = tasks.multiply.using(attempts=2).enqueue(6, 7)
        finally:
            sys.modules.pop(MODULE, None)
        assert result.status == status
        if status == TaskResultStatus.SUCCESSFUL:
            assert result.return_value == 42
        else:
            assert task_backends["default"].results == [result]


def test_django_s_own_backend_cannot_declare_such_a_task():
    """Why the module exists: Django's task class refuses Chasqui's options."""
    with override_settings(TASKS={"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}):
        sys.modules.pop(MODULE, None)
        try:
            with pytest.raises(TypeError, match="max_attempts"):
                importlib.import_module(MODULE)
        finally:
            sys.modules.pop(MODULE, None)


def test_a_task_using_chasquis_context_methods_runs_under_the_immediate_backend():
    with override_settings(TASKS={"default": {"BACKEND": "chasqui_core.testing.ImmediateBackend"}}):
        sys.modules.pop(MODULE, None)
        try:
            tasks = importlib.import_module(MODULE)
            result = tasks.steps.enqueue(2)
        finally:
            sys.modules.pop(MODULE, None)
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == [False, [[50.0, "step 1"], [100.0, "step 2"]]]
