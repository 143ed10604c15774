from __future__ import annotations

from django import forms

from api.models import Scope

MAX_TOKENS = 50


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What it is for, to tell it apart later.")
    scope = forms.ChoiceField(choices=Scope.choices, initial=Scope.READ)
    expires_in_days = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=3650,
        label="Expires in (days)",
        help_text="Empty: never; revoke it when you no longer need it.",
    )
