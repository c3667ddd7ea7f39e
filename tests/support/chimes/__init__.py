"""Chimes: a capability that exists only in the tests, to prove that a capability is its own
package plus its one registry line. It hears a chime every few frames of a stream (a `chimes`
event), alerts on the chimes a `chime` rule names, has a `chimes:` config section and a per-stream
`chimes` switch, lists each stream's recent chimes over HTTP
(`GET /api/streams/{stream_id}/chimes`) and shows the last on a card of the page (chimes.js).
Nothing outside this package names it: its registry line is
`pipelines.capabilities.installed(CAPABILITY)`, for the duration of a test."""
