"""Leaf helpers every floor may use; they import nothing of agentsite's own."""
