"""The demo shop's warehouse: a small MCP server, made with the `mcp` package.

Its two tools: `stock_level` reads how many of an item the warehouse holds, `restock` orders
more of it (a write: the demo's Warehouse agent asks a reviewer first, through the server's
`require_approval`). Its state is a JSON file (`AGENTSITE_WAREHOUSE_DATA`, else
`.demo/warehouse.json` in the checkout) that also logs every call it served, so a test can
count them; a process that starts it per run (stdio) finds the stock as the last one left it.

    python -m demo.warehouse                 # over stdio, as the demo's agent starts it
    python -m demo.warehouse --http 8765     # over streamable HTTP on 127.0.0.1:8765/mcp

Nothing here imports Django: it runs as a process of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer

DEFAULT_DATA = Path(__file__).resolve().parent.parent / ".demo" / "warehouse.json"
STOCK = {"grinder": 12, "kettle": 4, "mug": 40, "filter": 150}
MAX_RESTOCK = 1000


def data_path() -> Path:
    return Path(os.environ.get("AGENTSITE_WAREHOUSE_DATA") or DEFAULT_DATA)


@contextlib.contextmanager
def _state() -> Iterator[dict[str, Any]]:
    """The warehouse's state, locked against the other processes that serve it, written back
    when the block ends."""
    path = data_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            state = {}
        state.setdefault("stock", dict(STOCK))
        state.setdefault("calls", [])
        yield state
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state, indent=1, sort_keys=True))
        temporary.replace(path)


def read_state() -> dict[str, Any]:
    with _state() as state:
        return state


def _known(sku: str, state: dict[str, Any]) -> str | None:
    sku = sku.strip().lower().removesuffix("s")
    return sku if sku in state["stock"] else None


def build() -> MCPServer:
    server: MCPServer = MCPServer(
        "warehouse",
        instructions="The shop warehouse: stock levels, and restocking (a person approves it).",
    )

    @server.tool()
    def stock_level(sku: str) -> str:
        """Look up how many of an item the warehouse holds (grinder, kettle, mug, filter)."""
        with _state() as state:
            state["calls"].append({"tool": "stock_level", "arguments": {"sku": sku}})
            known = _known(sku, state)
            if known is None:
                return f"The warehouse does not stock {sku!r}."
            return f"The warehouse holds {state['stock'][known]} × {known}."

    def ordered(sku: str, quantity: int, reason: str = "") -> str:
        with _state() as state:
            arguments: dict[str, Any] = {"sku": sku, "quantity": quantity}
            if reason:
                arguments["reason"] = reason
            state["calls"].append({"tool": "restock", "arguments": arguments})
            known = _known(sku, state)
            if known is None:
                return f"The warehouse does not stock {sku!r}; nothing was ordered."
            if not 0 < quantity <= MAX_RESTOCK:
                return f"A restock orders 1 to {MAX_RESTOCK} units; nothing was ordered."
            state["stock"][known] += quantity
            return f"Ordered {quantity} × {known}: the warehouse will hold {state['stock'][known]}."

    if os.environ.get("AGENTSITE_WAREHOUSE_REASONS"):
        # A newer version of the server, whose restock also takes a reason: its input schema
        # differs, its name does not.

        @server.tool(name="restock")
        def restock_with_reason(sku: str, quantity: int, reason: str = "") -> str:
            """Order more of an item for the warehouse: add quantity units of the item's stock."""
            return ordered(sku, quantity, reason)

    else:

        @server.tool()
        def restock(sku: str, quantity: int) -> str:
            """Order more of an item for the warehouse: add quantity units of the item's stock."""
            return ordered(sku, quantity)

    if os.environ.get("AGENTSITE_WAREHOUSE_AUDIT"):

        @server.tool()
        def audit(sku: str) -> str:
            """Count an item's stock by hand (a tool some warehouses add)."""
            return f"Counted {sku}."

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve HTTP on 127.0.0.1:PORT")
    options = parser.parse_args(argv)
    server = build()
    if options.http:
        server.run("streamable-http", host="127.0.0.1", port=options.http)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
