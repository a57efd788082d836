"""One test item per rule over the whole tree: a rule's check runs on every module, notebook or row, and the
test fails once, naming each item that breaks it and why (not one test item per module: issue 50)."""

from collections.abc import Callable, Iterable
from typing import TypeVar

Item = TypeVar("Item")


def failures(check: Callable[[Item], object], items: Iterable[Item],
             name: Callable[[Item], str] = str) -> dict[str, str]:
    """Each item's AssertionError message, by the item's name; empty when every item passes."""
    found = {}
    for item in items:
        try:
            check(item)
        except AssertionError as error:
            found[name(item)] = str(error) or f"{check.__name__} failed"
    return found
