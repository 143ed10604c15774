"""What the engine announces inside the transaction that makes it true, for an outbox
(the webhooks app's deliveries): a receiver's rows commit or roll back with the pause, the
decision or the run's end they announce. Events (`engine.events`) are hints sent after
commit and dropped in a Redis outage; these are not.

Receivers run in the engine's transaction: they must be quick (an insert, no network), and
an error one lets out rolls the engine's write back (the webhooks' receivers keep theirs in a
savepoint of their own). The engine imports nothing of theirs; they
connect in their own `AppConfig.ready`.
"""

from __future__ import annotations

from django.dispatch import Signal

# A request that waits for a person, just created (kwargs: `request`, an ApprovalRequest).
# Requests a policy decided at the pause are not announced as created, only as decided.
approval_created = Signal()
# A request decided: by a reviewer, a policy, its expiry or the asker's withdrawal
# (kwargs: `request`, `decision`, an ApprovalDecision).
approval_decided = Signal()
# A run completed (kwargs: `run_id`).
run_completed = Signal()
# A run ended without completing: failed, cancelled or stopped by a guardrail (kwargs:
# `run_id`, `status`, `reason`).
run_failed = Signal()
# Not transactional: the server's event loop is known (`engine.sweeper.start`), for work that
# runs on its timer there (kwargs: `loop`).
server_loop_started = Signal()
# Issue 16 part 4 (expiry policies): a request nobody decided in time whose expiry policy
# escalates it: its deadline was extended once and `group_name` (a Django auth Group) should
# be told (kwargs: `request`, `group_name`). In the sweep's transaction.
approval_escalated = Signal()
# A request that waits and expires soon: reviewers who opted in should be reminded (kwargs:
# `request`). In the sweep's transaction, once per request.
approval_reminder = Signal()
