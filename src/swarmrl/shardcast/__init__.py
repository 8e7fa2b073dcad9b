"""SHARDCAST: broadcast checkpoints from an origin through a tree of HTTP relays (docs/architecture.md §4.4).

layout  the wire format (distribution.txt, shard names, manifest)
store   a server root on disk (install, announce, retire)
server  serve a root over HTTP (sendfile, Range, byte counters)
origin  publish checkpoint directories as versions
relay   mirror upstream versions and serve them on
transfer, client  download a version from many servers, verify, resume, unpack
cli     the origin / relay / fetch commands
"""
