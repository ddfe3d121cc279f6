"""The protocol both sides share: the wire codec, the downlink messages, the JSON
control messages, topic names and the update MAC. Pure: no I/O, no network library."""
