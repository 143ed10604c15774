"""Who may see traces, and the one way a view finds the trace it shows.

For operators: staff, or users with the permission `tracing.view_trace`
(`engine.permissions.can_view_traces`). Every page of the trace viewer stacks
`trace_viewer_required` under `login_required`.
"""

from __future__ import annotations

from django.http import Http404, HttpRequest

from engine import permissions
from engine.models import AgentRun
from tracing.models import Trace, trace_status

# 403 for a signed-in user who may not see traces (stack under login_required).
trace_viewer_required = permissions.allowed_only(
    permissions.can_view_traces, "Only operators can see traces."
)


def get_trace_for_viewer(request: HttpRequest, trace_id: str) -> Trace:
    """The trace `trace_id`, or 404. Every operator sees every trace, so the access check
    is the view's `trace_viewer_required`.

    A run's trace has no row until its first spans are stored (a second or so after it
    starts): until then it is shown empty, unsaved, so that a link to a run that just
    started opens a page that fills in live rather than a 404.
    """
    trace = Trace.objects.filter(trace_id=trace_id).first()
    if trace is not None:
        return trace
    run = AgentRun.objects.filter(trace_id=trace_id).select_related("conversation").first()
    if run is None:
        raise Http404("No such trace.")
    return Trace(
        trace_id=trace_id,
        run=run,
        group_id=run.conversation.session_id,
        status=trace_status(run.status),
        metadata={"run_id": str(run.pk), "agent": run.agent_name},
    )
