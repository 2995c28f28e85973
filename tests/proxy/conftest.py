"""The proxy's tests need the [v5] extra; without it they are skipped with the command that installs it."""

import pytest

pytest.importorskip("grpc", reason="rmq-proxy needs the [v5] extra: pip install -e '.[v5]'")
pytest.importorskip("rocketmq.grpc_protocol", reason="rmq-proxy needs the [v5] extra: pip install -e '.[v5]'")
