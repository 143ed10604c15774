"""Agents written as docs/agents.md teaches; tests/demo/test_example_agent.py runs them."""
