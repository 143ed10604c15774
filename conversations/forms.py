"""Forms of the chat pages. The run engine has the last word on messages (`runs.start_run`)."""

from __future__ import annotations

from typing import Any

from django import forms

from conversations.models import BRANCH_ID_MAX_LENGTH, Conversation
from engine import registry
from tracing.models import Feedback, FeedbackScore

TITLE_MAX_LENGTH = Conversation._meta.get_field("title").max_length or 200
COMMENT_MAX_LENGTH = Feedback._meta.get_field("comment").max_length or 2000


class NewConversationForm(forms.Form):
    agent = forms.ChoiceField(required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = registry.agent_names()
        field = self.fields["agent"]
        assert isinstance(field, forms.ChoiceField)
        # Each by its own name ("Support desk"), as the chat's header names it.
        field.choices = [(name, registry.display_name(name)) for name in names]
        self.show_choice = len(names) > 1

    def agent_name(self) -> str:
        return self.cleaned_data.get("agent") or registry.default_agent_name()


class MessageForm(forms.Form):
    # Emptiness and length are the run engine's rules; its ValueError becomes this field's error.
    text = forms.CharField(required=False, strip=False, widget=forms.Textarea)
    # The version of the conversation the page showed (none from a client that does not say:
    # the message goes on the current one).
    branch = forms.CharField(required=False, max_length=BRANCH_ID_MAX_LENGTH)


class EditForm(forms.Form):
    """An edited message, and the version of the conversation the page showed it in."""

    # Emptiness and length are the run engine's rules, as for a new message.
    text = forms.CharField(required=False, strip=False, widget=forms.Textarea)
    branch = forms.CharField(max_length=BRANCH_ID_MAX_LENGTH)


class SwitchForm(forms.Form):
    branch = forms.CharField(max_length=BRANCH_ID_MAX_LENGTH)


class RenameForm(forms.Form):
    title = forms.CharField(
        required=False,
        max_length=TITLE_MAX_LENGTH,
        error_messages={
            "max_length": f"A title has at most {TITLE_MAX_LENGTH} characters "
            "(this one has %(show_value)d)."
        },
    )


class CommentField(forms.CharField):
    """A comment, its line breaks as one character each: a browser counts a textarea's
    newline as one towards `maxlength` and sends it as two (CRLF)."""

    def to_python(self, value: Any) -> str:
        text = super().to_python(value) or ""
        return text.replace("\r\n", "\n").replace("\r", "\n")


class FeedbackForm(forms.Form):
    """A rating of a reply: thumbs up or down, and an optional comment."""

    score = forms.TypedChoiceField(
        choices=FeedbackScore.choices,
        coerce=int,
        error_messages={
            "required": "Choose thumbs up or thumbs down.",
            "invalid_choice": "Choose thumbs up or thumbs down.",
        },
    )
    comment = CommentField(
        required=False,
        max_length=COMMENT_MAX_LENGTH,
        widget=forms.Textarea,
        error_messages={
            "max_length": f"A comment has at most {COMMENT_MAX_LENGTH} characters "
            "(this one has %(show_value)d). Shorten it and send it again."
        },
    )
