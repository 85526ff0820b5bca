"""The console's forms: DLQ filters (kept in the URL) and the choices of a replay.

Filter fields travel as query-string parameters, so a filtered view can be
bookmarked or pasted into a chat at 3 a.m.; the same names are posted back,
hidden, with a bulk action so that "all matching" means exactly the filter
the operator was looking at.
"""

from __future__ import annotations

from datetime import datetime, UTC
from typing import Any

from django import forms
from django.utils import timezone

from chasqui_core.engine.dlq.entries import REASONS
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.services import dlq as dlq_service
from chasqui_core.services.common import InvalidInput

DATETIME_FORMATS = ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"]

FILTER_FIELDS = ("task", "reason", "error_class", "q", "since", "until", "fp")
"""Query-string names of the DLQ filter (``q`` is the error text, ``fp`` an error group)."""


def _datetime_field(label: str, help_text: str = "") -> forms.DateTimeField:
    return forms.DateTimeField(
        required=False, label=label, input_formats=DATETIME_FORMATS, help_text=help_text,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )


class DLQFilterForm(forms.Form):
    task = forms.CharField(required=False, max_length=300, label="Task")
    reason = forms.ChoiceField(required=False, label="Reason",
                               choices=[("", "Any reason")] + [(r, r.replace("_", " ")) for r in REASONS])
    error_class = forms.CharField(required=False, max_length=300, label="Error class")
    q = forms.CharField(required=False, max_length=500, label="Error text")
    since = _datetime_field("Died after (UTC)")
    until = _datetime_field("Died before (UTC)")
    fp = forms.CharField(required=False, max_length=1000, widget=forms.HiddenInput)

    def __init__(self, *args: Any, tasks: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["task"].widget.attrs.update({"list": "known-tasks", "placeholder": "any task"})
        self.fields["error_class"].widget.attrs["placeholder"] = "e.g. TimeoutError"
        self.fields["q"].widget.attrs.update({"placeholder": "text in any error message", "type": "search"})
        self.tasks = tasks or []

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and since > until:
            raise forms.ValidationError("\u201cDied after\u201d is later than \u201cDied before\u201d: "
                                        "the time range is empty.")
        if not self.errors:
            try:
                self.engine_filter = dlq_service.build_filter(
                    task=data.get("task") or None, reason=data.get("reason") or None,
                    error_class=data.get("error_class") or None, error_text=data.get("q") or None,
                    fingerprint=data.get("fp") or None, since=_aware(since), until=_aware(until),
                )
            except InvalidInput as exc:
                raise forms.ValidationError(str(exc)) from None
        return data

    @property
    def dlq_filter(self) -> DLQFilter:
        """The engine filter (empty when the form is invalid: the page then shows the errors)."""
        return getattr(self, "engine_filter", DLQFilter())

    @property
    def fingerprint(self) -> str:
        return (self.cleaned_data.get("fp") or "") if self.is_valid() else ""

    def params(self) -> dict[str, str]:
        """The filter as query-string parameters, blanks left out."""
        if not self.is_valid():
            return {}
        out = {}
        for name in FILTER_FIELDS:
            value = self.cleaned_data.get(name)
            if isinstance(value, datetime):
                out[name] = timezone.localtime(value).strftime("%Y-%m-%dT%H:%M")
            elif value:
                out[name] = str(value)
        return out

    @property
    def active(self) -> bool:
        return bool(self.params())


FILTER_LABELS = {"task": "task", "reason": "reason", "error_class": "error class", "q": "error text",
                 "since": "died after", "until": "died before", "fp": "error group",
                 "error_text": "error text", "fingerprint": "error group", "since_ms": "died after",
                 "until_ms": "died before"}


def describe_filter(params: dict[str, object]) -> list[tuple[str, str]]:
    """(label, value) pairs for showing a filter to a person; engine field names are understood too."""
    out = []
    for key, value in params.items():
        if key in ("since_ms", "until_ms") and isinstance(value, int):
            value = datetime.fromtimestamp(value / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
        out.append((FILTER_LABELS.get(key, key), str(value)))
    return out


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and timezone.is_naive(value):
        return timezone.make_aware(value)
    return value


class BulkForm(forms.Form):
    """What a bulk button posts: which action, on what (ticked rows, or everything matching)."""

    INTENTS = {
        "replay-selected": ("replay", "selected"),
        "discard-selected": ("discard", "selected"),
        "replay-matching": ("replay", "matching"),
        "discard-matching": ("discard", "matching"),
    }

    intent = forms.ChoiceField(choices=[(k, k) for k in INTENTS])
    ids = forms.MultipleChoiceField(required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Ids are checked by the engine (in words) when acted on; any text may be posted here.
        self.fields["ids"].valid_value = lambda value: True  # type: ignore[method-assign]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if "intent" not in data:
            return data
        data["action"], data["scope"] = self.INTENTS[data["intent"]]
        if data["scope"] == "selected" and not data.get("ids"):
            raise forms.ValidationError("Tick at least one entry first, or act on everything matching the filter.")
        if len(data.get("ids") or []) > 10_000:
            raise forms.ValidationError("Too many ticked entries at once: act on everything matching instead.")
        return data

    @property
    def action(self) -> str:
        return self.cleaned_data["action"]

    @property
    def scope(self) -> str:
        return self.cleaned_data["scope"]


class ReplayOptionsForm(forms.Form):
    attempts = forms.ChoiceField(
        choices=[("reset", "Reset attempts: a whole new retry budget"), ("one", "One more attempt only")],
        initial="reset", widget=forms.RadioSelect, label="Attempts",
    )
    when = forms.ChoiceField(choices=[("now", "Now"), ("at", "At a time")], initial="now",
                             widget=forms.RadioSelect, label="When")
    run_at = _datetime_field("Run at (UTC)")
    rate = forms.IntegerField(required=False, min_value=1, max_value=10_000_000, label="At most",
                              widget=forms.NumberInput(attrs={"placeholder": "no limit", "class": "num"}))
    """Jobs per second, for replays by filter (the confirmation offers it only there)."""

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("when") == "at":
            if not data.get("run_at"):
                self.add_error("run_at", "Give the date and time to run the replayed jobs at.")
            else:
                data["run_at"] = _aware(data["run_at"])
        else:
            data["run_at"] = None
        return data

    @property
    def reset_attempts(self) -> bool:
        return self.cleaned_data.get("attempts", "reset") == "reset"
