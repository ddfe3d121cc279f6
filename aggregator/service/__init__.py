"""The service around the engine: settings, the ingest thread and transports, the
SQLite journal, history and checkpoints, and the log set-up."""
