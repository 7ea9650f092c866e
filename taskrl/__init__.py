"""taskrl: train task-oriented LLM agents with RL in environments that match production."""

__version__ = "0.1.0"
