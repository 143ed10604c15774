"""Tests of the test harness itself: the local model provider and the services it starts."""
