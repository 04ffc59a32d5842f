"""A proxy's clients are limited one by one (by the proxy), not all together by the
broker: one client's opens through a proxy leave a bystander's untouched. The broker
holds a proxy to the proxy bounds, and only a token that may be a proxy's gets them."""

from __future__ import annotations

from pathlib import Path

import pytest

from holdfast.proto import pb
from holdfast.sdk import LimitExceededError, Session, SessionOptions
from tests.security.conftest import token
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST
from tests.support.wire_client import WireClient

CASES = {
    "open queues, tokens": (["--max-open-queues", "3"], True),
    "new queues a minute, tokens": (["--new-queues-per-minute", "3"], True),
    "open queues, no auth file": (["--max-open-queues", "3"], False),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_client_through_a_proxy_does_not_use_up_a_bystanders_limits(
    case: str, auth_file: Path, tmp_path: Path
) -> None:
    limits, tokens = CASES[case]
    upstream_token = tmp_path / "proxy.token"
    upstream_token.write_text(token("proxy") + "\n")
    auth = ["--auth-file", str(auth_file)] if tokens else []
    with BrokerProcess([*limits, *auth]) as broker:
        upstream = ["--upstream", broker.address, "--upstream-token-file", str(upstream_token)]
        with (
            ProxyProcess([*upstream, *limits, *auth]) as proxy,
            Session(proxy.address, options=_options("writer" if tokens else None)) as x,
            Session(proxy.address, options=_options("billing" if tokens else None)) as y,
        ):
            held = [x.open_queue(f"hf://orders/x{i}", write=True) for i in range(3)]
            with pytest.raises(LimitExceededError):  # x's own limit
                x.open_queue("hf://orders/x3", write=True, timeout=10)
            first = y.open_queue("hf://billing/first", write=True, timeout=10)
            first.post(b"from the bystander")
            held[0].post(b"from x")
            assert y.flush(timeout=10)
            assert x.flush(timeout=10)


@pytest.mark.timeout(60)
def test_the_broker_holds_a_proxy_to_the_proxy_bounds_and_a_client_to_its_own(
    auth_file: Path,
) -> None:
    limits = ["--max-open-queues", "2", "--proxy-max-open-queues", "4"]
    with BrokerProcess(["--auth-file", str(auth_file), *limits]) as broker:
        # "writer" says it relays clients, but its token may not: a client's limits.
        for name, bound in (("writer", 2), ("proxy", 4)):
            with WireClient(broker.address, token=token(name)) as client:
                client.hello(relays_clients=True)
                for queue_id in range(1, bound + 1):
                    opened = client.open(queue_id, f"hf://orders/{name}{queue_id}", write=True)
                    assert opened.status == pb.STATUS_OK
                refused = client.open(bound + 1, f"hf://orders/{name}-past", write=True)
                assert refused.status == pb.STATUS_LIMIT_EXCEEDED, (name, refused)
                assert f"{bound} open queues" in refused.message


@pytest.mark.timeout(60)
def test_a_proxy_token_has_its_own_new_queue_rate(auth_file: Path) -> None:
    limits = ["--new-queues-per-minute", "2", "--proxy-new-queues-per-minute", "3"]
    with BrokerProcess(["--auth-file", str(auth_file), *limits]) as broker:
        with WireClient(broker.address, token=token("proxy")) as proxy:
            proxy.hello(relays_clients=True)
            for queue_id in range(1, 4):
                opened = proxy.open(queue_id, f"hf://o/p{queue_id}", write=True)
                assert opened.status == pb.STATUS_OK
            refused = proxy.open(4, "hf://o/p4", write=True)
            assert refused.status == pb.STATUS_LIMIT_EXCEEDED
            assert "3 new queues a minute" in refused.message
        # The same token without the claim is a client, with a client's rate.
        with WireClient(broker.address, token=token("proxy")) as plain:
            plain.hello()
            for queue_id in range(1, 3):
                opened = plain.open(queue_id, f"hf://o/c{queue_id}", write=True)
                assert opened.status == pb.STATUS_OK
            assert plain.open(3, "hf://o/c3", write=True).status == pb.STATUS_LIMIT_EXCEEDED


def _options(name: str | None) -> SessionOptions:
    return SessionOptions(reconnect=FAST.reconnect, token=None if name is None else token(name))
