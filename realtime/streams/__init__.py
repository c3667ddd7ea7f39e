"""Streams as the service sees them: the desired set and its reconciler (registry), each stream's
runner (the graph's owner), its view, and the SSE fan-out. The registry sits here, below http,
webrtc and fleet, because all three write the desired set and none of them owns it."""
