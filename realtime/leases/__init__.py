"""Leases in a JetStream key-value bucket: who holds what, for how long, and how a holder knows it
still does.

A package of its own because two floors hold leases and neither may import the other: the fleet
leases streams to workers (realtime.fleet), and the timeline leases its indexer role to one
worker of the fleet (realtime.timeline.role). Both sit above this package; it knows neither.

  records  the buckets' and keys' names and the small JSON records kept in them
  buckets  the buckets, created if missing, with the lease TTL as their max age
  keeper   the leases this worker holds: taken, renewed, handed back, fenced
  options  a worker's fleet settings, resolved from the config and the --fleet / --node flags
"""
