"""Fixtures of the container tests: a Docker engine and the lab's image, or a failure saying why.

Without an engine these tests fail rather than skip, so that CI cannot pass without having run them
(scripts/test.sh installs and starts an engine where it can, and builds the image in the background
while the other tests run: ``RMQ_IMAGE_BUILD`` names its status and log files). ``RMQ_DOCKER=off``
skips them on a developer's machine that has none.
"""

from __future__ import annotations

import os

import pytest
from kit.docker import wait_for_build

from rmqlab.chaos.container import IMAGE, BackendError, ImageInfo, check_image, engine_problem


@pytest.fixture(scope="session")
def engine() -> None:
    problem = engine_problem()
    if problem is None:
        return
    if os.environ.get("RMQ_DOCKER") == "off":
        pytest.skip(f"RMQ_DOCKER=off: {problem}")
    pytest.fail(f"the container tests need a Docker engine: {problem} (scripts/test.sh starts one)")


@pytest.fixture(scope="session")
def image(engine: None) -> ImageInfo:
    if os.environ.get("RMQ_IMAGE_BUILD"):
        wait_for_build(os.environ["RMQ_IMAGE_BUILD"])
    try:
        return check_image(IMAGE)
    except BackendError as e:
        pytest.fail(str(e))
