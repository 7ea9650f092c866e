"""Compatibility path: the monitors live in the ``taskrl.monitors`` package; ``from taskrl.monitor import ...``
keeps working for every public name."""

from taskrl.monitors import *  # noqa: F403
from taskrl.monitors import __all__  # noqa: F401
