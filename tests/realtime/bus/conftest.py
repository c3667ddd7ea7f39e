from tests.support.mqtt import mqtt_server
from tests.support.nats import nats_server, shared_nats_server

__all__ = ["mqtt_server", "nats_server", "shared_nats_server"]
