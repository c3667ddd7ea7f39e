"""Browser sessions over WebRTC: signalling, one peer connection per session, its media into
the stream graph and its events back over a DataChannel."""
