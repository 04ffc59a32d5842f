"""Network faults with TLS and tokens on every hop: SDK -> Toxiproxy -> proxy ->
Toxiproxy -> broker, both listeners TLS with ``--auth-file``, the proxy using its own
upstream token. Resets, a black hole and a link taken down while a producer posts:
nothing lost, nothing duplicated, one ACK per PUT."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from holdfast.sdk import ConnectionLost, Session, SessionOptions, StateRestored
from holdfast.sdk.options import ReconnectOptions
from tests.faults.network import PROXY_ARGS
from tests.faults.streams import black_hole, each
from tests.policies.support import Collector
from tests.redis.test_nodes import Acks
from tests.security.conftest import Pki, token
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.recorder import EventRecorder
from tests.support.toxics import down, link_address
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

URI = "hf://orders/faulty"


def test_resets_black_hole_and_outage_with_tls_and_tokens_on_every_hop(
    pki: Pki, auth_file: Path, tmp_path: Path, toxic_link: Any
) -> None:
    tls = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
    upstream_token = tmp_path / "proxy.token"
    upstream_token.write_text(token("proxy"))
    options = SessionOptions(
        tls_ca=str(pki.ca),
        token=token("writer"),
        keepalive_time=0.5,
        keepalive_timeout=1.0,
        reconnect=ReconnectOptions(initial=0.02, maximum=0.2),
    )
    with BrokerProcess([*tls, "--auth-file", str(auth_file)]) as broker:
        upstream = toxic_link("secure-upstream", broker.address)
        proxy_args = [
            "--upstream", link_address(upstream), *PROXY_ARGS, *tls,
            "--auth-file", str(auth_file), "--upstream-ca", str(pki.ca),
            "--upstream-token-file", str(upstream_token),
        ]  # fmt: skip
        with ProxyProcess(proxy_args) as proxy:
            client = toxic_link("secure-client", proxy.address)
            acks = Acks()
            guids: list[uuid.UUID] = []
            stop = threading.Event()
            events = EventRecorder()
            with Session(link_address(client), options=options, on_event=events) as session:
                queue = session.open_queue(URI, write=True, on_ack=acks)

                def produce() -> None:
                    while not stop.is_set():
                        guids.append(queue.post(b"m%d" % len(guids)))
                        time.sleep(0.001)

                producer = threading.Thread(target=produce)
                producer.start()
                try:

                    def more(count: int) -> None:
                        target = len(guids) + count
                        wait_until(lambda: len(guids) >= target, 30, f"{count} more posts")

                    def client_lost_and_back(count: int) -> None:
                        wait_until(lambda: len(events.of(ConnectionLost)) >= count, 30, "a loss")
                        more(200)

                    def restored(count: int) -> None:
                        wait_until(lambda: len(events.of(StateRestored)) >= count, 30, "a restore")

                    more(300)
                    with each([client], "reset_peer", stream="upstream", timeout=100):
                        client_lost_and_back(1)
                    restored(1)
                    more(300)
                    upstream_lost = proxy.count("ConnectionLost")
                    with black_hole([upstream]):  # only the proxy's keepalive can tell
                        wait_until(
                            lambda: proxy.count("ConnectionLost") > upstream_lost,
                            30,
                            "the proxy to notice the black hole",
                        )
                        more(300)
                    wait_until(lambda: proxy.count("StateRestored") > 0, 30, "the proxy's restore")
                    more(300)
                    with down(client, upstream):
                        client_lost_and_back(2)
                    restored(2)
                    more(300)
                finally:
                    stop.set()
                    producer.join(10)
                assert session.flush(timeout=60)
                got = Collector()
                session.open_queue(URI, read=True, on_message=got)
                got.wait_for(len(guids), timeout=60)
    acks.exactly_one_success(guids)
    assert Counter(got.guids()) == Counter({g: 1 for g in guids})
