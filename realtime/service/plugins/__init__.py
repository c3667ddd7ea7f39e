"""The capabilities' service plugins (realtime.service.plugin says what one is), one module each.

Listed in the order of `pipelines.capabilities.CAPABILITIES`: their taps see each event in this
order. Adding a capability with service parts is one module here plus one line below. Before them,
the plugins that belong to no capability (fed by events all the same): Home Assistant.
"""

from __future__ import annotations

from realtime.service.plugin import ServicePlugin
from realtime.service.plugins import captions, clips, descriptions, homeassistant

SERVICE_PLUGINS: tuple[ServicePlugin, ...] = (
    homeassistant.PLUGIN,
    captions.PLUGIN,
    descriptions.PLUGIN,
    clips.PLUGIN,
)
