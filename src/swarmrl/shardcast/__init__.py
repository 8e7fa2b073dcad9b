"""SHARDCAST: broadcast checkpoints from an origin through a tree of HTTP relays (docs/architecture.md §4.4).

layout     the wire format (distribution.txt, shard names, manifest)
archive    the version file: the deterministic tar of a checkpoint directory
delta      delta checkpoints: format, encoding, bounded rebuild
store      a server root on disk (install, announce, retire)
integrity  check shards on disk against a manifest (resume, the relay's guard)
server     serve a root over HTTP (sendfile, Range, byte counters, optional guard)
origin     publish checkpoint directories as versions (and as deltas)
relay      mirror upstream versions, serve them on, repair damaged shards
transfer   one blocking HTTP GET with bounded buffers
errors     what a failed download raises
discovery  which servers list which version, its manifest, its deltas
choice     which server to ask for the next shard
downloader fetch a set of shards from several servers at once
assembly   all shards into one file, whole-file hash
resume     what an interrupted download left behind
patch      a version as a delta against one held, rebuilt and checked
unpack     a verified tar into the checkpoint directory
client     ``fetch`` (and ``latest_version``): the whole download
cli        the origin / relay / fetch commands
"""
