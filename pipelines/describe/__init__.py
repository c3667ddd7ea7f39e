"""Rolling scene descriptions and VLM alert checks: a stage per stream that samples its frames,
keeps them in an append-only window laid out for vLLM's prefix cache, and asks the shared
vision-language model to describe the scene and to answer the stream's `vlm` rules."""
