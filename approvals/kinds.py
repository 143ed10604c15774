"""What a shell call and a patch are, for reviewers: the views `explain.py` adds to a call of
those kinds (`ApprovalRequest.kind`).

A shell call's stored arguments are its action (`engine/calls.py`): a `shell_call`'s commands
with their timeout and output limit, or a `local_shell_call`'s argv with its environment and
working directory. A patch's are its operation: create, update or delete a file, with a diff
(the SDK's V4A format: `@@` anchors, or unified `@@ -1,3 +1,4 @@` hunk headers, then lines
that start with "+", "-" or a space). Everything here is text for templates, which escape it:
a diff and a command are untrusted, whatever they hold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from common import formatting
from conversations.items import PATCH_VERBS, patch_target, shell_lines

# A diff longer than this is cut on the request page (the raw arguments hold all of it); a
# row or a bulk confirmation shows its first PREVIEW_LINES.
MAX_DIFF_LINES = 2000
PREVIEW_LINES = 12
UNIFIED_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


@dataclass(frozen=True)
class ShellView:
    """A shell call: its commands, one shell line each, and what bounds them."""

    commands: list[str]
    # A `local_shell_call` (one argv, run with `env` in `working_directory`).
    local: bool = False
    timeout: str = ""
    output_limit: str = ""
    working_directory: str = ""
    user: str = ""
    env: list[tuple[str, str]] | None = None


@dataclass(frozen=True)
class DiffLine:
    # "add", "del", "context", "hunk" (a hunk's header or anchor), "meta" (file headers,
    # "*** End of File", "\\ No newline at end of file")
    kind: str
    sign: str
    text: str
    # Its line numbers in the old and the new file, where the diff says them.
    old: int | None = None
    new: int | None = None


@dataclass(frozen=True)
class PatchView:
    """A patch: which file, what happens to it, and its diff line by line."""

    operation: str  # create_file, update_file, delete_file
    path: str
    lines: list[DiffLine]
    added: int
    removed: int
    # Lines of the diff not in `lines` (past MAX_DIFF_LINES).
    cut: int = 0
    # Where an update moves the file to ("" when it stays where it is).
    move_to: str = ""

    @property
    def verb(self) -> str:
        return PATCH_VERBS[self.operation]

    @property
    def is_delete(self) -> bool:
        return self.operation == "delete_file"

    @property
    def numbered(self) -> bool:
        return any(line.old is not None or line.new is not None for line in self.lines)

    @property
    def preview(self) -> list[DiffLine]:
        return self.lines[:PREVIEW_LINES]

    @property
    def beyond_preview(self) -> int:
        """How many lines of the diff the preview leaves out."""
        return max(len(self.lines) - PREVIEW_LINES, 0) + self.cut


def shell_view(arguments: Any) -> ShellView | None:
    """A shell call's action for people; None when the arguments are not one."""
    commands = shell_lines(arguments)
    if commands is None:
        return None
    assert isinstance(arguments, dict)  # shell_lines read it
    limit = arguments.get("max_output_length")
    output_limit = (
        f"{limit:,} characters"
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0
        else ""
    )
    env = arguments.get("env")
    directory = arguments.get("working_directory")
    user = arguments.get("user")
    return ShellView(
        commands=commands,
        local="command" in arguments and "commands" not in arguments,
        timeout=formatting.time_limit_ms(arguments.get("timeout_ms")),
        output_limit=output_limit,
        working_directory=directory if isinstance(directory, str) else "",
        user=user if isinstance(user, str) else "",
        env=sorted((str(k), str(v)) for k, v in env.items()) if isinstance(env, dict) else None,
    )


def diff_lines(diff: str, operation: str) -> list[DiffLine]:
    """`diff` line by line, each with its kind and, where the diff says them, its line
    numbers: from unified hunk headers, or from the top for a new file (whose diff is all
    added lines). A V4A anchor (`@@ def total():`) says no number."""
    lines = re.split(r"\r?\n", diff)
    if lines and lines[-1] == "":
        lines.pop()
    old: int | None = None
    new: int | None = 1 if operation == "create_file" else None
    # A unified diff's file headers ("--- a/x" then "+++ b/x") before its first hunk; a
    # removed line "--- x" anywhere else is a line of the file.
    headers: set[int] = set()
    if operation != "create_file":
        for index, line in enumerate(lines[:-1]):
            if line.startswith("@@"):
                break
            if line.startswith("--- ") and lines[index + 1].startswith("+++ "):
                headers |= {index, index + 1}
    shown: list[DiffLine] = []
    for index, line in enumerate(lines):
        if index in headers:
            shown.append(DiffLine("meta", "", line))
        elif line.startswith("@@"):
            numbers = UNIFIED_HUNK.match(line)
            old, new = (int(numbers[1]), int(numbers[2])) if numbers else (None, None)
            shown.append(DiffLine("hunk", "", line))
        elif line.startswith("***") or line.startswith("\\"):
            shown.append(DiffLine("meta", "", line))
        elif line.startswith("+"):
            shown.append(DiffLine("add", "+", line[1:], None, new))
            new = new + 1 if new is not None else None
        elif line.startswith("-"):
            shown.append(DiffLine("del", "-", line[1:], old, None))
            old = old + 1 if old is not None else None
        else:
            # Context: " text", or a blank line whose space was trimmed.
            text = line[1:] if line.startswith(" ") else line
            shown.append(DiffLine("context", "", text, old, new))
            old = old + 1 if old is not None else None
            new = new + 1 if new is not None else None
    return shown


def patch_view(arguments: Any) -> PatchView | None:
    """A patch operation for people; None when the arguments are not one."""
    target = patch_target(arguments)
    if target is None:
        return None
    assert isinstance(arguments, dict)  # patch_target read it
    operation, path = target
    diff = arguments.get("diff")
    lines = diff_lines(diff, operation) if isinstance(diff, str) and diff else []
    return PatchView(
        operation=operation,
        path=path,
        lines=lines[:MAX_DIFF_LINES],
        added=sum(1 for line in lines if line.kind == "add"),
        removed=sum(1 for line in lines if line.kind == "del"),
        cut=max(len(lines) - MAX_DIFF_LINES, 0),
        move_to=move_to if isinstance(move_to := arguments.get("move_to"), str) else "",
    )
