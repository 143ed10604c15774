"""The demo shop: agents, tools and the offline demo model.

A real deployment replaces it by pointing AGENTSITE_AGENTS at its own agents.
"""
