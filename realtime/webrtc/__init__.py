"""Browser sessions over WebRTC: one peer connection per session, its media into the stream graph
and its events back over a DataChannel. The routes that make and end sessions (the signalling)
are HTTP and live with the other routes, in realtime.http.signalling."""
