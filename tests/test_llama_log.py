"""llama.cpp's fragmented log lines reach loguru whole, at their own level, filtered by threshold."""

from __future__ import annotations

import pytest
from loguru import logger

from skippy.native._lib import _LogRouter

DEBUG, INFO, WARN, ERROR, CONT = 1, 2, 3, 4, 5


@pytest.fixture
def records():
    seen: list[tuple[str, str]] = []
    logger.enable("skippy")  # the library is silent until its user enables it
    sink = logger.add(lambda m: seen.append((m.record["level"].name, m.record["message"])), level="DEBUG")
    yield seen
    logger.remove(sink)
    logger.disable("skippy")


def test_fragments_join_into_one_line_at_the_first_level(records):
    router = _LogRouter(threshold=WARN)
    router.feed(WARN, "cells are ")
    router.feed(CONT, "running low\nsecond")
    router.feed(CONT, " line\n")
    assert records == [("WARNING", "llama.cpp: cells are running low"), ("WARNING", "llama.cpp: second line")]


def test_messages_below_the_threshold_are_dropped_with_their_continuations(records):
    router = _LogRouter(threshold=WARN)
    router.feed(INFO, "load ")
    router.feed(CONT, "progress\n")
    router.feed(ERROR, "failed to load\n")
    assert records == [("ERROR", "llama.cpp: failed to load")]
