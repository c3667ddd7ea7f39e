"""The capabilities' service plugins (realtime.service.plugin says what one is), one module each.

Found from the capabilities: a capability names its plugin's module (`Capability.service`), and
that module's `PLUGIN` is it. In the order of `pipelines.capabilities.CAPABILITIES`: their taps
see each event in this order. Adding a capability with service parts is its module; nothing here.
Before them come the plugins that belong to no capability, fed by events all the same
(`OWN_PLUGINS`): Home Assistant.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from typing import overload

from pipelines.capabilities import CAPABILITIES
from realtime.service.plugin import ServicePlugin

OWN_PLUGINS = ("realtime.service.plugins.homeassistant",)  # fed by events, of no capability


def service_plugins() -> tuple[ServicePlugin, ...]:
    """The service's own plugins, then every capability's, as the registry stands now."""
    plugins = [importlib.import_module(module).PLUGIN for module in OWN_PLUGINS]
    for capability in CAPABILITIES:
        if capability.service is None:
            continue
        plugin = getattr(importlib.import_module(capability.service), "PLUGIN", None)
        if not isinstance(plugin, ServicePlugin) or plugin.capability != capability.name:
            raise TypeError(f"{capability.service}.PLUGIN is not the service plugin of {capability.name!r}")
        plugins.append(plugin)
    return tuple(plugins)


class _Plugins(Sequence[ServicePlugin]):
    """`service_plugins()` whenever it is read: a capability installed later has its plugin here."""

    @overload
    def __getitem__(self, index: int) -> ServicePlugin: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[ServicePlugin]: ...

    def __getitem__(self, index: int | slice) -> ServicePlugin | Sequence[ServicePlugin]:
        return service_plugins()[index]

    def __iter__(self) -> Iterator[ServicePlugin]:
        return iter(service_plugins())

    def __len__(self) -> int:
        return len(service_plugins())


SERVICE_PLUGINS: Sequence[ServicePlugin] = _Plugins()
