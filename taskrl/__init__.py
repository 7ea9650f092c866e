"""taskrl: train task-oriented LLM agents with RL in environments that match production."""

from taskrl import moved as _moved

__version__ = "0.1.0"

_moved.install()  # an old import path (e.g. taskrl.trainer) fails with an error naming the new one
