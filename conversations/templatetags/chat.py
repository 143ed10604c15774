"""Template filters of the chat pages."""

from __future__ import annotations

from django import template

from conversations import rendering
from conversations.models import Conversation

register = template.Library()


@register.filter
def answering_name(conversation: Conversation) -> str:
    """Who answers the conversation's next message, by its own name (`rendering.answering`),
    for fragments rendered without the page's context (the composer after a send)."""
    return rendering.answering(conversation) or "the agent"
