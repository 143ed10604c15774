"""A reviewer's email settings."""

from __future__ import annotations

from typing import Any

from django import forms

from notifications.models import NotificationPreference

NAMES_HELP = "Comma-separated, as the inbox names them; empty: all."


class NamesField(forms.CharField):
    """A list of names typed as "a, b": stored as a list, shown as the same text."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list):
            return ", ".join(value)
        return value

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = super().to_python(value)
        names = [name.strip() for name in str(text or "").split(",")]
        return list(dict.fromkeys(name for name in names if name))


class PreferenceForm(forms.ModelForm):
    agents = NamesField(required=False, max_length=2000, help_text=NAMES_HELP)
    tools = NamesField(required=False, max_length=2000, help_text=NAMES_HELP)

    class Meta:
        model = NotificationPreference
        fields = ["mode", "digest_minutes", "agents", "tools"]
        widgets = {"mode": forms.RadioSelect}
        labels = {"mode": "Email me", "digest_minutes": "Digest"}

    def clean_agents(self) -> list[str]:
        return self._names("agents")

    def clean_tools(self) -> list[str]:
        return self._names("tools")

    def _names(self, field: str) -> list[str]:
        names: list[str] = self.cleaned_data[field]
        if len(names) > 50 or any(len(name) > 200 for name in names):
            raise forms.ValidationError("At most 50 names of at most 200 characters each.")
        return names
