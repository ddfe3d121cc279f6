"""The pure round engine: admission, de-duplication, the open round, pricing, the
downlink of each version and the checkpoint of it all. No I/O, no threads, no clock."""
