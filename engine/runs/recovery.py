"""What dead processes leave behind: runs of processes known to be gone, dealt with at once, and
runs quiet for too long; nothing that may have executed is ever run again."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from engine import events, executor, heartbeat
from engine.executor import Job
from engine.models import AgentRun, RunStatus, ServerProcess
from engine.runs import rows


@dataclass
class Recovery:
    failed: int = 0
    resubmitted: int = 0

    def fail(self, run_id: int, conversation_id: int, **still: Any) -> None:
        """Fail a running run a dead process left, if it still is as listed (`still`: the
        conditions of `rows.fail_sync`), and tell its pages."""
        if rows.fail_sync(run_id, RESTART_REASON, from_statuses=(RunStatus.RUNNING,), **still):
            self.failed += 1
            events.publish_sync(
                [rows.run_updated(run_id, conversation_id, RunStatus.FAILED, RESTART_REASON)]
            )

    def resubmit(self, job: Job, run_id: int, taken: int) -> None:
        """Submit `job` again if this process's conditional UPDATE took the run (`taken`
        rows): of the processes that sweep at once, one does."""
        if taken:
            executor.submit(job, run_id)
            self.resubmitted += 1


RESTART_REASON = "Interrupted by a restart: the process running it stopped. Nothing was retried."


def recover_orphans() -> Recovery:
    """Deal at once with the runs of processes that are gone (their row says stopped, or they
    have not beaten for AGENTSITE_PROCESS_TIMEOUT); every heartbeat and sweep does this.

    - running: its process died (or stopped) mid-run, perhaps mid-tool. It fails with
      "interrupted by a restart"; nothing is retried.
    - queued, with the in-process executor: its job was in that process's queue, never
      started. This process takes the run over (a conditional UPDATE of its owner: one
      process does) and submits it again; should the old process be alive after all, the
      claim lets exactly one copy of the job proceed.

    Right after a database outage that kept this process's own beats out, nothing: the
    others were cut off as well, and get two beats to be heard (`heartbeat.may_judge`).
    """
    recovery = Recovery()
    if not heartbeat.may_judge():
        return recovery
    gone = ServerProcess.objects.gone(heartbeat.silent_since()).values("identity")
    statuses = [RunStatus.RUNNING]
    inprocess = settings.AGENTSITE_EXECUTOR == "inprocess"
    if inprocess:
        statuses.append(RunStatus.QUEUED)
    orphans = AgentRun.objects.filter(status__in=statuses, process__in=gone).exclude(process="")
    for run_id, conversation_id, status, owner in list(
        orphans.values_list("pk", "conversation_id", "status", "process")
    ):
        if status == RunStatus.RUNNING:
            # Conditional again: still running, still that process's.
            recovery.fail(run_id, conversation_id, owned_by=owner)
        else:
            taken = AgentRun.objects.filter(pk=run_id, status=status, process=owner).update(
                process=heartbeat.owner(), updated=timezone.now()
            )
            recovery.resubmit("execute", run_id, taken)
    return recovery


def recover_stuck_runs(older_than: timedelta | None = None) -> Recovery:
    """Deal with runs that a dead process left behind; no tool ever runs twice.

    - whatever `recover_orphans` finds: runs of processes known to be gone, at once.
    - running, quiet for `older_than`, and owned by no live process (a run without an owner:
      its process kept no heartbeat): its process died mid-run, perhaps mid-tool. It fails
      with "interrupted by a restart"; nothing is retried. A run whose process beats is left
      alone however quiet it is.
    - queued or resuming, and quiet for `older_than`: its job was lost before it started
      (the in-process executor's queue dies with its process). Nothing of it has executed
      (a resuming run's state is unconsumed), so the job is submitted again, by one of the
      processes that sweep at once (a conditional UPDATE); the claim in `execute`/`resume`
      lets exactly one copy of a job proceed should the lost one turn up after all.

    Rows of processes gone for a day are deleted.
    """
    if older_than is None:
        older_than = timedelta(seconds=settings.AGENTSITE_STUCK_RUN_TIMEOUT)
    recovery = recover_orphans()
    cutoff = timezone.now() - older_than
    alive = ServerProcess.objects.alive(heartbeat.silent_since()).values("identity")
    stuck = AgentRun.objects.stuck(cutoff)
    dead = stuck.filter(status=RunStatus.RUNNING).exclude(process__in=alive)
    for run_id, conversation_id in list(dead.values_list("pk", "conversation_id")):
        # Conditional again: a run that beat since the listing is alive and stays so.
        recovery.fail(run_id, conversation_id, quiet_since=cutoff)
    lost = stuck.exclude(status=RunStatus.RUNNING).filter(state_consumed=False)
    inprocess = settings.AGENTSITE_EXECUTOR == "inprocess"
    for run_id, status in list(lost.values_list("pk", "status")):
        # Taken once: every process sweeps, and the one whose conditional UPDATE (still that
        # status, still quiet) wins submits the job; the run is then fresh until the next
        # timeout. A queued in-process job is in this process's queue now, so the run names
        # it, as `start_run` does: should this process go too, recovery takes it at once.
        changes: dict[str, Any] = {"updated": timezone.now()}
        if inprocess and status == RunStatus.QUEUED:
            changes["process"] = heartbeat.owner()
        still = AgentRun.objects.filter(pk=run_id, status=status, state_consumed=False)
        job: Job = "execute" if status == RunStatus.QUEUED else "resume"
        recovery.resubmit(job, run_id, still.stuck(cutoff).update(**changes))
    heartbeat.prune()
    return recovery
