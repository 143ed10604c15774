"""Model calls stored before their usage had columns (migration 0002) get them from their span
data, and their trace's agent (0005), so that the cost of the traces a site already holds is
shown rather than missing. Outcomes are not backfilled: a trace without one shows its status's."""

from django.db import migrations

BATCH = 1000


def _count(value):
    return (
        int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
    )


def backfill(apps, schema_editor):
    Span = apps.get_model("tracing", "Span")
    Trace = apps.get_model("tracing", "Trace")
    agents = {}
    calls = Span.objects.filter(span_type__in=["generation", "response"], model="").order_by("pk")
    last = 0
    while True:
        batch = list(calls.filter(pk__gt=last)[:BATCH])
        if not batch:
            return
        last = batch[-1].pk
        missing = {span.trace_id for span in batch} - set(agents)
        for trace_id, metadata, workflow in Trace.objects.filter(trace_id__in=missing).values_list(
            "trace_id", "metadata", "workflow_name"
        ):
            agent = metadata.get("agent") if isinstance(metadata, dict) else None
            agents[trace_id] = str(agent)[:255] if agent else workflow[:255]
        for span in batch:
            data = span.span_data if isinstance(span.span_data, dict) else {}
            usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
            model = data.get("model")
            details = usage.get("input_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            span.model = (
                model.strip()[:200] if isinstance(model, str) and model.strip() else "unknown model"
            )
            span.input_tokens = _count(usage.get("input_tokens"))
            span.cached_tokens = min(_count(cached), span.input_tokens)
            span.output_tokens = _count(usage.get("output_tokens"))
            span.agent = agents.get(span.trace_id, "")
        Span.objects.bulk_update(
            batch, ["model", "input_tokens", "cached_tokens", "output_tokens", "agent"]
        )


class Migration(migrations.Migration):
    dependencies = [("tracing", "0005_list_and_dashboard_indexes")]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
