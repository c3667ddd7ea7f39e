"""Several `vidsentry serve` workers sharing one desired set of streams over NATS JetStream.

Enabled by `--fleet NAME` (config `fleet: NAME`, or `fleet: {name: NAME, ...}`); `--node NAME`
(config `node:`, default the host name) names the worker in events and listings. Without a
fleet name a worker keeps its streams to itself, as before.

State, all in the NATS the worker already publishes to (replicas: `nats.replicas`):
  bucket `vidsentry-fleet-<NAME>`         one key per stream id: the stream object as JSON, the
                                         same as in the config / the API. No TTL.
  bucket `vidsentry-fleet-<NAME>-leases`  `lease.<stream_id>`: {"node", "stream_id"}, and
                                         `node.<node>`: the worker's capacity, whether it is
                                         draining, and its streams' states. Max age = lease TTL.

Settings (config `fleet:` section; environment `VIDSENTRY_FLEET__<KEY>`):
  name              fleet name, [A-Za-z0-9_-]{1,32}; `--fleet` wins.
  capacity          streams this worker runs at most (default 2 per CPU core, never above
                    http.max_streams).
  lease_ttl_s       lease time-to-live, 1-300 s (default 9). The first worker creates the lease
                    bucket with it; a worker configured otherwise uses the bucket's and logs so.
  renew_interval_s  how often leases and the node record are renewed (default TTL/3; at most TTL/2).
  slack             streams a worker may hold above the even spread (default 0).
  max_streams       desired streams in the whole fleet (default 1024; POST past it: 429).

Behaviour:
  * Config-file streams are written into the bucket at start (the config wins for its ids);
    streams added through the API live in the bucket and survive restarts. POST / DELETE on any
    worker change the fleet's set; GET /api/streams on any worker lists every stream with
    `owner` (the node holding its lease, null when none) and `state` (the owner's, from its node
    record, refreshed every renewal). Browser (WebRTC) sessions stay on their worker.
  * A worker claims unowned streams (`create` on the lease key) while it holds fewer than
    ceil(desired / live workers) + slack, within its capacity; a stream unowned for two renewal
    intervals goes to any worker with room. A worker above its share hands one stream back per
    round when another worker has room. Leases are renewed by compare-and-set on their revision.
  * Fencing: a lease counts as valid locally until its last renewal was sent + TTL - margin
    (10 % of the TTL, at least 0.2 s), which ends before the server can expire it. Past that, or
    as soon as the bucket shows the lease expired or held by another worker, the stream's events
    are dropped and the stream is stopped within one renewal interval. A paused (SIGSTOP) or
    partitioned worker therefore never publishes as owner once another worker could hold the
    stream; when it wakes, its renewals fail and it gives the streams up without a fight.
  * Every event of a fleet stream carries the revision at which its lease was taken: body field
    `lease_revision` and CloudEvents extension header `ce-leaserev`. It grows with every new
    owner, so a consumer can drop events whose revision is below the largest it has seen.
  * Failures: a killed worker's streams start elsewhere within TTL + one renewal interval (plus
    the source's start-up). SIGTERM stops this worker's streams, then deletes its leases and node
    record, so others take over at once. If NATS is unreachable, /readyz fails (`nats`, and
    `fleet` while its watches are down), API writes answer 503, and leases that cannot be renewed
    fence their streams after the TTL. Metrics: vidsentry_fleet_* (streams owned, capacity, share,
    nodes, desired streams, lease events acquired/renewed/lost/released/contended/failed, fenced
    events).
"""
