"""Agents for the Ray batch tests (importable by Ray's workers: the tests put this folder on their PYTHONPATH)."""
import os


class DyingAgent:
    """Kills its own process at its first step: a worker that crashes mid-task."""

    def act(self, obs):
        os._exit(3)
