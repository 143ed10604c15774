from __future__ import annotations

from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from common.admin import NoEditAdminMixin, ValuesListFilter, pretty_json
from conversations.models import Conversation, SessionItem


class SessionItemInline(NoEditAdminMixin, admin.TabularInline):
    model = SessionItem
    fields = ("id", "branch", "turn", "kind", "pretty_payload", "created")
    readonly_fields = fields
    # Each branch's items together, in their order.
    ordering = ["branch", "id"]
    extra = 0
    can_delete = False
    show_change_link = False

    @admin.display(description="kind")
    def kind(self, item: SessionItem) -> str:
        return item.kind

    @admin.display(description="payload")
    def pretty_payload(self, item: SessionItem) -> SafeString | str:
        # In the order the SDK wrote it: a message reads role, then content.
        return pretty_json(item.payload, sort_keys=False)


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ["session_id", "title", "owner", "agent_name", "item_count", "updated", "traces"]
    list_filter = [("agent_name", ValuesListFilter), "created", "updated"]
    search_fields = ["session_id", "title", "owner__username", "owner__email"]
    # The branch it is on changes through its session (the chat's Versions), which checks it.
    readonly_fields = ["current_branch", "created", "updated", "session_page"]
    raw_id_fields = ["owner"]
    date_hierarchy = "updated"
    inlines = [SessionItemInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Conversation]:
        return super().get_queryset(request).select_related("owner").annotate(_items=Count("items"))

    @admin.display(description="traces")
    def traces(self, conversation: Conversation) -> str:
        url = reverse("trace_list") + "?" + urlencode({"conversation": conversation.session_id})
        return format_html('<a href="{}">Traces</a>', url)

    @admin.display(description="operator's view")
    def session_page(self, conversation: Conversation) -> str:
        """Its turns as a session: input, reply, tools, approvals, cost, feedback."""
        if conversation.pk is None:
            return "-"
        url = reverse("trace_conversation", args=[conversation.session_id])
        return format_html('<a href="{}">The conversation\'s turns, tokens and cost</a>', url)

    @admin.display(description="items", ordering="_items")
    def item_count(self, conversation: Conversation) -> int:
        return conversation._items  # type: ignore[attr-defined]
