"""Live captions: a stage per stream that turns its audio into `partials` and `captions`
events with faster-whisper, through one speech recognizer shared by every stream."""
