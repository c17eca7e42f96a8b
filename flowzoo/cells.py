"""The ``task@variant`` name of a control cell, parsed in one place.

A suite's task may carry a variant after ``@`` (``counting@equal_batch``): the cell runs the task's prompts and reward
under another setting, and a study groups it with its task as ``algorithm@variant``. Every module that needs the task
or the variant of such a name calls :func:`split_task` or :func:`base_task` instead of splitting the string itself.
"""

from __future__ import annotations

VARIANT_SEP = "@"


def split_task(name: str) -> tuple[str, str]:
    """``(task, variant)`` of ``task@variant``; the variant is ``""`` for a plain task name."""
    task, _, variant = str(name).partition(VARIANT_SEP)
    return task, variant


def base_task(name: str) -> str:
    """The task of ``task@variant`` (the name itself when it has no variant)."""
    return split_task(name)[0]


def with_variant(name: str, variant: str) -> str:
    """``name@variant``, or ``name`` when ``variant`` is empty."""
    return f"{name}{VARIANT_SEP}{variant}" if variant else str(name)
