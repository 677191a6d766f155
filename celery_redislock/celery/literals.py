"""The options that take one of a fixed set of strings, as ``Literal`` types.

So a type checker catches ``on_duplicate="bogus"`` where the option is written with a
type (a subclass's attribute, ``@singleton_task(...)``, ``@bounded_task(...)``,
``apply_async(...)``); the same value is refused at run time with a
``ConfigurationError`` wherever it comes from (``@app.task(...)`` keywords and
``task_annotations`` are not typed by Celery). The tuples of allowed values are
derived from the types, so the two never disagree.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

__all__ = [
    "MODES",
    "ON_DUPLICATE",
    "ON_RUNNING_DUPLICATE",
    "OnDuplicate",
    "OnRunningDuplicate",
    "SingletonMode",
]

OnDuplicate = Literal["existing", "raise", "drop", "replace"]
"""What ``apply_async`` does for a duplicate (option ``on_duplicate``)."""

OnRunningDuplicate = Literal["skip", "reschedule"]
"""What a worker does with a copy that starts while another holds the lock."""

SingletonMode = Literal[
    "until_done", "while_running", "until_started", "interval", "until_and_while_executing"
]
"""How long a singleton lock is held (option ``singleton_mode``)."""

ON_DUPLICATE: Final[tuple[OnDuplicate, ...]] = get_args(OnDuplicate)
"""The values of ``on_duplicate``."""

ON_RUNNING_DUPLICATE: Final[tuple[OnRunningDuplicate, ...]] = get_args(OnRunningDuplicate)
"""The values of ``on_running_duplicate``."""

MODES: Final[tuple[SingletonMode, ...]] = get_args(SingletonMode)
"""The values of ``singleton_mode``: from enqueue to the end of the run; only while
the run executes; from enqueue until the run starts; from enqueue until
``singleton_interval`` seconds after the run ended; one copy queued (from enqueue until
it starts) and one running (while it executes), each under a lock of its own."""
