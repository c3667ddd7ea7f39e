from tests.support.nats import nats_server, shared_nats_server

__all__ = ["nats_server", "shared_nats_server"]
