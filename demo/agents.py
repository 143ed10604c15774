"""The demo shop's agents.

None of them names a model: the model comes from `engine.providers.run_config()`, so the same
agents run on OpenAI, on an OpenAI-compatible server, or on the offline demo model.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from agents import Agent
from agents.mcp import MCPServerStdio
from django.conf import settings

from engine.registry import review

from .guardrails import no_card_numbers
from .tools import cancel_order, issue_refund, lookup_order, search_knowledge_base, send_email

researcher: Agent[Any] = Agent(
    name="Researcher",
    handoff_description="Looks up the shop's policies in the internal knowledge base.",
    instructions=(
        "You research questions about the shop's policies for a support agent. Search the "
        "knowledge base with a short query, then answer in two or three sentences using only "
        "what the articles say, naming the article you used. If no article covers the question, "
        "say so; never guess a policy."
    ),
    tools=[search_knowledge_base],
)

billing: Agent[Any] = Agent(
    name="Billing",
    handoff_description="Handles payments and refunds: questions about charges, refund amounts.",
    instructions=(
        "You are the billing specialist of an online shop. You answer questions about charges "
        "and refunds. Look an order up before refunding it, and refund at most what is left to "
        "refund. A refund that brings an order's refunds above $50 waits for a human reviewer: "
        "tell the customer so when that happens. You cannot cancel orders or send emails: say "
        "that the support desk handles those. Be brief and precise about amounts."
    ),
    tools=[lookup_order, issue_refund],
    input_guardrails=[no_card_numbers],
)

# The warehouse is an MCP server (demo/warehouse.py), a process each run that needs it starts
# over stdio and stops when it ends (engine/mcp.py). Restocking needs a person's approval.
warehouse_server = MCPServerStdio(
    params={
        "command": sys.executable,
        "args": ["-m", "demo.warehouse"],
        "env": {
            "AGENTSITE_WAREHOUSE_DATA": os.environ.get("AGENTSITE_WAREHOUSE_DATA")
            or str(settings.BASE_DIR / ".demo" / "warehouse.json"),
            "PATH": os.environ.get("PATH", ""),
        },
        "cwd": str(settings.BASE_DIR),
    },
    name="warehouse",
    require_approval={"always": {"tool_names": ["restock"]}},
    client_session_timeout_seconds=20,
)

warehouse: Agent[Any] = Agent(
    name="Warehouse",
    handoff_description="Checks the warehouse's stock of an item and orders restocks.",
    instructions=(
        "You look after the shop's warehouse: look up how many of an item it holds, and order "
        "a restock when asked (a person approves every restock before it is ordered). Say "
        "plainly what the warehouse replied. Customers' orders are the support desk's: hand "
        "those back."
    ),
    mcp_servers=[warehouse_server],
)

support_desk: Agent[Any] = Agent(
    name="Support desk",
    instructions=(
        "You are the support desk of an online shop. Help the customer you are talking to with "
        "their own orders: look up an order's status, cancel an order that has not been "
        "delivered, issue refunds and email them at their own address. Always use the order "
        "number the customer gives; never invent one. An order that is not theirs is not found. "
        "Cancellations, refunds that bring an order's refunds above $50, and emails about refunds "
        "wait for a human reviewer: "
        "when a tool call is not approved, tell the customer plainly and pass on the reviewer's "
        "message. For questions about the shop's policies, use the research tool. Hand billing "
        "questions to Billing. Answer in one or two short sentences."
    ),
    tools=[
        lookup_order,
        cancel_order,
        issue_refund,
        send_email,
        review(
            researcher.as_tool(
                tool_name="research",
                tool_description=(
                    "Ask the researcher about the shop's policies (refunds, cancellations, "
                    "shipping, returns, warranty). Input: the question, in a few words."
                ),
            ),
            risk="low",  # it only reads; its own gated search asks a reviewer itself
        ),
    ],
    handoffs=[billing, warehouse],
    input_guardrails=[no_card_numbers],
)

# Billing hands back what it cannot do ("I have a support desk question"): a conversation goes
# on with the agent that answered last, so without this it would stay with Billing.
billing.handoffs.append(support_desk)
warehouse.handoffs.append(support_desk)
